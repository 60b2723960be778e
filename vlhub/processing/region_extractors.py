"""Region extractors by registry: which class wrote a region-extractor folder, and loading it back.

A *region extractor* turns images into `RegionFeatures` (the bottom-up-attention detector, the shapes world's
fixed extractor, a user's own). Each kind writes `"region_extractor_type": "<type>"` into the `config.json` of the
folder it saves, and registers its class under that type:

    register_region_extractor("my_detector", "my_package.detector:MyDetector")   # lazy: nothing imported yet
    extractor = load_region_extractor("path/to/folder")                           # dispatches on config.json

A registered class needs `from_pretrained(folder)`, `save_pretrained(folder)` and `__call__(images)` returning
`RegionFeatures` (one image) or a list of them. A processor carries its extractor in the sub-folder
`region_extractor/` (`REGION_EXTRACTOR_FOLDER`). Folders whose `config.json` has no `region_extractor_type`
(written before the field existed) are the detector's.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .regions import RegionFeatures

__all__ = [
    "DEFAULT_REGION_EXTRACTOR_TYPE",
    "REGION_EXTRACTOR_FOLDER",
    "REGION_EXTRACTOR_TYPE_KEY",
    "RegionExtractorLike",
    "load_region_extractor",
    "read_region_extractor_config",
    "region_extractor_class",
    "region_extractor_fingerprint",
    "resolve_region_extractor_folder",
    "register_region_extractor",
    "registered_region_extractor_types",
]

REGION_EXTRACTOR_FOLDER = "region_extractor"  # sub-folder of a processor/model folder holding its region extractor
REGION_EXTRACTOR_TYPE_KEY = "region_extractor_type"  # config.json field naming the registered type
DEFAULT_REGION_EXTRACTOR_TYPE = "bottom_up_attention"  # folders without the field: the detector
CONFIG_NAME = "config.json"
HUB_KWARGS = ("revision", "token", "cache_dir", "local_files_only")


class RegionExtractorLike(Protocol):
    """What a registered region extractor provides (the module docstring): the images it takes depend on the kind."""

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike) -> "RegionExtractorLike": ...

    def save_pretrained(self, folder: str | os.PathLike) -> None: ...

    def __call__(self, images: Any) -> RegionFeatures | list[RegionFeatures]: ...


_REGISTRY: dict[str, type | str] = {}  # as registered
_RESOLVED: dict[str, type] = {}  # lazy registrations once imported


def register_region_extractor(region_extractor_type: str, cls_or_path: type | str, exist_ok: bool = False) -> None:
    """Register the class that loads folders whose `config.json` says `"region_extractor_type": region_extractor_type`.

    `cls_or_path` is the class, or a lazy `"module:Class"` string imported only when such a folder is loaded.
    Registering a type again with a different class raises unless `exist_ok=True` (then the new class wins).
    """
    if not isinstance(region_extractor_type, str) or not region_extractor_type:
        raise ValueError(f"region_extractor_type must be a non-empty string, got {region_extractor_type!r}")
    if isinstance(cls_or_path, str):
        module, _, name = cls_or_path.partition(":")
        if not module or not name:
            raise ValueError(f"a lazy region extractor must be written 'module:Class', got {cls_or_path!r}")
    elif not isinstance(cls_or_path, type):
        raise TypeError(f"register a class or a 'module:Class' string, got {type(cls_or_path).__name__}")
    known = _REGISTRY.get(region_extractor_type)
    if known is not None and not exist_ok and _qualified(known) != _qualified(cls_or_path):
        raise ValueError(
            f"region extractor type {region_extractor_type!r} is already registered to {_qualified(known)}; pass "
            "exist_ok=True to replace it"
        )
    _REGISTRY[region_extractor_type] = cls_or_path
    _RESOLVED.pop(region_extractor_type, None)


def registered_region_extractor_types() -> list[str]:
    return sorted(_REGISTRY)


def region_extractor_class(region_extractor_type: str) -> type:
    """The class registered for `region_extractor_type` (a lazy registration is imported now)."""
    if region_extractor_type not in _REGISTRY:
        raise ValueError(
            f"unknown region_extractor_type {region_extractor_type!r}; registered types: "
            f"{', '.join(registered_region_extractor_types())}. Import the package that defines it (it registers "
            "itself with vlhub.processing.register_region_extractor), or register it yourself"
        )
    if region_extractor_type not in _RESOLVED:
        cls = _REGISTRY[region_extractor_type]
        if isinstance(cls, str):
            module, _, name = cls.partition(":")
            cls = getattr(importlib.import_module(module), name)
        _RESOLVED[region_extractor_type] = cls
    return _RESOLVED[region_extractor_type]


def read_region_extractor_config(folder: str | os.PathLike, expected_type: str | None = None) -> tuple[str, dict]:
    """`(region_extractor_type, settings)` from the `config.json` of a region-extractor `folder`: the type it names
    (the detector's when the field is absent) and the other fields. With `expected_type`, a folder of another type
    is an error naming both."""
    path = Path(folder) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{str(folder)!r} has no {CONFIG_NAME}; is it a vlhub region extractor folder?")
    settings = json.loads(path.read_text(encoding="utf-8"))
    kind = settings.pop(REGION_EXTRACTOR_TYPE_KEY, DEFAULT_REGION_EXTRACTOR_TYPE)
    if expected_type is not None and kind != expected_type:
        raise ValueError(f"{path} describes a region extractor of type {kind!r}, not {expected_type!r}")
    return kind, settings


def load_region_extractor(
    name_or_path: str | os.PathLike, subfolder: str | None = None, **hub_kwargs: Any
) -> RegionExtractorLike:
    """The region extractor saved at `name_or_path`, built by the class registered for its config.json's
    `region_extractor_type` (the detector when the field is absent).

    `name_or_path`: a region-extractor folder, or a processor/model folder (local or a Hub repo) that carries one
    in `region_extractor/`. `subfolder`: the sub-folder to read instead (the processor passes the one its
    settings name). `hub_kwargs`: `revision`, `token`, `cache_dir`, `local_files_only` for Hub downloads.
    """
    folder = resolve_region_extractor_folder(name_or_path, subfolder, **hub_kwargs)
    kind, _ = read_region_extractor_config(folder)
    return region_extractor_class(kind).from_pretrained(folder)


def resolve_region_extractor_folder(
    name_or_path: str | os.PathLike, subfolder: str | None = None, **hub_kwargs: Any
) -> Path:
    """The local folder `load_region_extractor(name_or_path, subfolder, **hub_kwargs)` loads (a Hub repo's is
    downloaded first)."""
    unknown = sorted(set(hub_kwargs) - set(HUB_KWARGS))
    if unknown:
        raise TypeError(f"unexpected argument(s) {unknown}; load_region_extractor takes {list(HUB_KWARGS)}")
    path = Path(name_or_path)
    if path.is_dir():
        if subfolder:
            return path / subfolder
        return path / REGION_EXTRACTOR_FOLDER if (path / REGION_EXTRACTOR_FOLDER).is_dir() else path
    repo = str(name_or_path)
    if path.exists() or path.is_absolute() or repo.startswith(".") or repo.count("/") > 1:  # not a Hub repo id
        raise FileNotFoundError(f"no region extractor folder at {repo!r}")
    from ..utils.network import download_snapshot

    carried = subfolder or REGION_EXTRACTOR_FOLDER
    root = download_snapshot(repo, "the region extractor", allow_patterns=[f"{carried}/*"], **hub_kwargs)
    if subfolder or (root / carried).is_dir():
        return root / carried
    return download_snapshot(repo, "the region extractor", **hub_kwargs)  # the repository is the extractor itself


# Files of a region-extractor folder that do not change what it extracts.
_NOT_FINGERPRINTED = ("README.md", ".gitattributes")


def region_extractor_fingerprint(folder: str | os.PathLike) -> str:
    """`"sha256:<hex>"` over the path and bytes of every file of a region-extractor `folder`, sub-folders included
    (its config, weights and vocabularies; not hidden files or READMEs): folders with the same fingerprint extract the
    same features. It reads every byte once (~0.3 s for the released detector's 250 MB of weights)."""
    folder = Path(folder)
    digest = hashlib.sha256()
    files = sorted(
        path
        for path in folder.rglob("*")
        if path.is_file()
        and path.name not in _NOT_FINGERPRINTED
        and not any(part.startswith(".") for part in path.relative_to(folder).parts)
    )
    if not files:
        raise FileNotFoundError(f"{str(folder)!r} holds no files: is it a vlhub region extractor folder?")
    for path in files:
        name = path.relative_to(folder).as_posix()
        digest.update(f"{name}\0{path.stat().st_size}\0".encode())  # paths and sizes frame the bytes
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
    return f"sha256:{digest.hexdigest()}"


def _qualified(cls_or_path: type | str) -> str:
    return cls_or_path if isinstance(cls_or_path, str) else f"{cls_or_path.__module__}:{cls_or_path.__qualname__}"


# The detector is processing's own extractor; registered lazily so that nothing heavy is imported until a folder
# of this type is loaded.
register_region_extractor(DEFAULT_REGION_EXTRACTOR_TYPE, "vlhub.processing.detector:RegionExtractor")
