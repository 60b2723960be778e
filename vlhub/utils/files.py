"""Writing files so that a crash never leaves half a file that reads as whole, and checking them later.

`atomic_write` writes through a temporary name in the same folder and renames it into place (readers see the old
file or the new one, never a mix); `staging_folder` does the same for a whole folder; `sha256_file` and
`file_checksums` record what a complete folder held, so a later reader can tell truncated or altered files.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator

__all__ = [
    "read_yaml",
    "atomic_write",
    "atomic_write_text",
    "atomic_write_json",
    "sha256_file",
    "file_checksums",
    "staging_folder",
]

logger = logging.getLogger(__name__)


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Call `write(temporary_path)`, flush it to disk, then rename it to `path`; the temporary file never survives."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(temporary)
        with open(temporary, "rb+") as handle:  # the rename must not land before the data
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))


def atomic_write_json(path: str | os.PathLike, value: object, indent: int | None = 1) -> Path:
    return atomic_write_text(path, json.dumps(value, indent=indent) + "\n")


def sha256_file(path: str | os.PathLike, chunk_size: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def file_checksums(folder: str | os.PathLike, exclude: tuple[str, ...] = ()) -> dict[str, dict]:
    """`{relative path: {"sha256", "size"}}` of every file under `folder` (sorted), except the names in `exclude`."""
    folder = Path(folder)
    found = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder).as_posix()
        if relative in exclude or path.name.endswith(".tmp"):
            continue
        found[relative] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    return found


@contextlib.contextmanager
def staging_folder(output_dir: str | os.PathLike, keep_replaced: tuple[str, ...] = ()) -> Iterator[Path]:
    """A temporary folder beside `output_dir` to write into; on success its files are moved into `output_dir`.

    Until the block ends without an error, `output_dir` is untouched: a failure (or a crash) leaves no half-written
    files there, only a `.<name>.staging-*` folder that a crash could not clean up. Files already in `output_dir`
    that the block did not write are kept; files it wrote replace theirs one rename at a time, except that an
    existing file named in `keep_replaced` (e.g. a hand-written README.md) that differs from the new one is first
    renamed to `<name>.orig` (numbered if that exists too), with a warning.
    """
    output_dir = Path(output_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.staging-", dir=output_dir.parent))
    try:
        yield staging
        output_dir.mkdir(exist_ok=True)
        for path in sorted(staging.rglob("*")):
            if path.is_file():
                target = output_dir / path.relative_to(staging)
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.name in keep_replaced and target.is_file() and target.read_bytes() != path.read_bytes():
                    backup = _free_name(target.with_name(target.name + ".orig"))
                    os.replace(target, backup)
                    logger.warning(f"{target} existed and differed from the new one: kept as {backup.name}")
                os.replace(path, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _free_name(path: Path) -> Path:
    candidate, number = path, 1
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.{number}")
        number += 1
    return candidate


def read_yaml(path: str | os.PathLike, what: str = "a YAML file") -> object:
    """`yaml.safe_load` of a file; a file that is not YAML, or that asks to construct objects (`!!python/...` tags,
    refused by the safe loader), is a `VlhubUserError` naming the file."""
    import yaml

    from .errors import named_input

    with named_input(path, what), open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)
