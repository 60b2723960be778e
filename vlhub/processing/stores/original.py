"""Readers of the feature files the original projects published, each yielding `RegionFeatures`: the shared ones
and the pieces every reader is built from.

| reader                  | files                                              | written by                                     |
| ----------------------- | -------------------------------------------------- | ---------------------------------------------- |
| `ButdTsvReader`         | TSV, base64 fields (BUTD and LXMERT field lists)   | bottom-up-attention `generate_tsv.py`, LXMERT   |
| `NpzFolderReader`       | one npz per image                                  | X-modaler `generate_npz.py`                    |

The files only one architecture's release uses are read by that architecture's own reader, in its folder of
`vlhub.modeling`, which registers the format by name (`register_feature_format`); `FEATURE_FORMATS` lists every
registered format and `open_feature_file(name, path)` opens one. Readers build on `FeatureReader` (or
`LmdbReader`, `FolderReader`) and the field helpers here (`feature_array`, `record_field`, `butd_record`,
`make_regions`), so every format converts the same way.

Every reader is a read-only mapping `image_id -> RegionFeatures` (`reader.ids`, `len(reader)`, `reader[id]`,
iteration over ids). Conventions are converted, never guessed silently: class probabilities keep background
first (as every one of these files stores them), boxes are pixels `(x1, y1, x2, y2)`, and a file that lacks a
field a reader needs raises an error naming the field and the file.
"""

from __future__ import annotations

import base64
import csv
import functools
import importlib
import os
import sys
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO, Callable, Iterator, Sequence

import numpy as np
import numpy.typing as npt

from ...utils.limits import check_declared_array
from ..regions import RegionFeatures

__all__ = [
    "FeatureFileError",
    "ButdTsvReader",
    "NpzFolderReader",
    "BUTD_TSV_FIELDS",
    "LXMERT_TSV_FIELDS",
    "FEATURE_FORMATS",
    "open_feature_file",
    "register_feature_format",
    "FeatureReader",
    "FolderReader",
    "LmdbReader",
    "as_text",
    "butd_record",
    "feature_array",
    "load_npz",
    "make_regions",
    "record_field",
    "require_package",
]

BUTD_TSV_FIELDS = ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features")
LXMERT_TSV_FIELDS = (
    "img_id",
    "img_h",
    "img_w",
    "objects_id",
    "objects_conf",
    "attrs_id",
    "attrs_conf",
    "num_boxes",
    "boxes",
    "features",
)


class FeatureFileError(ValueError):
    """A feature file is malformed or lacks a field; the message names the file, the image and the field."""


def require_package(module: str) -> ModuleType:
    """The optional package `module` (lmdb, h5py, msgpack), or an ImportError saying how to install it."""
    try:
        return __import__(module)
    except ImportError as err:
        raise ImportError(
            f"reading this feature format needs the `{module}` package: pip install 'vlhub[stores]'"
        ) from err


def as_text(value: object) -> str:
    """A stored id or name (bytes, a numpy scalar or a string) as a string."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray):
        return as_text(value.reshape(-1)[0].item() if value.size == 1 else value.tolist())
    return str(value)


def _scalar(value, source: str, name: str) -> int:
    array = np.asarray(value).reshape(-1)
    if array.size != 1:
        raise FeatureFileError(f"{source}: field {name!r} should be one number, got shape {np.shape(value)}")
    try:
        return int(array[0])
    except (TypeError, ValueError) as err:
        raise FeatureFileError(f"{source}: field {name!r} should be a number, got {array[0]!r}") from err


def feature_array(
    value: str | bytes | npt.ArrayLike,
    source: str,
    name: str,
    dtype: npt.DTypeLike,
    rows: int | None = None,
    columns: int | None = None,
) -> np.ndarray:
    """A field as a numpy array; base64 strings (the TSV convention) are decoded as `dtype`."""
    if isinstance(value, (str, bytes)):
        try:
            raw = base64.b64decode(value, validate=False)
        except (ValueError, TypeError) as err:
            raise FeatureFileError(f"{source}: field {name!r} is not valid base64 ({err})") from err
        if len(raw) % np.dtype(dtype).itemsize:
            raise FeatureFileError(f"{source}: field {name!r} holds {len(raw)} bytes, not a whole number of {dtype}")
        array = np.frombuffer(raw, dtype=dtype)
        if rows is not None:
            if rows < 1:
                raise FeatureFileError(f"{source}: num_boxes is {rows}; an image needs at least one region")
            if array.size % rows:
                raise FeatureFileError(
                    f"{source}: field {name!r} holds {array.size} values, not a multiple of num_boxes={rows}"
                )
            array = array.reshape(rows, -1)
    else:
        array = np.asarray(value)
    if columns is not None and (array.ndim != 2 or array.shape[1] != columns):
        raise FeatureFileError(f"{source}: field {name!r} should have shape (N, {columns}), got {array.shape}")
    if rows is not None and array.shape[0] != rows:
        raise FeatureFileError(f"{source}: field {name!r} has {array.shape[0]} rows but num_boxes is {rows}")
    return np.asarray(array, dtype=np.float32) if np.issubdtype(array.dtype, np.floating) else array


def record_field(record: Mapping, name: str, source: str) -> Any:
    """`record[name]` (str or, as python-2 pickles keep them, bytes keys); a missing field is a `FeatureFileError`
    naming `source` and the fields the record has."""
    if name in record:
        return record[name]
    if name.encode() in record:  # python-2 pickles keep bytes keys
        return record[name.encode()]
    fields = sorted(as_text(k) for k in record)
    raise FeatureFileError(f"{source}: missing field {name!r} (the record has {fields})")


def make_regions(source: str, **fields: Any) -> RegionFeatures:
    """`RegionFeatures(**fields)`, its validation errors as `FeatureFileError`s naming `source`."""
    try:
        return RegionFeatures(**fields)
    except (ValueError, TypeError) as err:
        raise FeatureFileError(f"{source}: {err}") from err


class FeatureReader(Mapping):
    """Mapping `image_id -> RegionFeatures` over one feature file or folder. A subclass sets `path`, `_ids` (the
    ids in file order) and `_index` (a container of them) and defines `_read(image_id)`."""

    path: Path

    def __init__(self) -> None:
        self._ids: list[str] = []

    @property
    def ids(self) -> list[str]:
        return list(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __contains__(self, image_id) -> bool:
        return image_id in self._index

    def __getitem__(self, image_id: str) -> RegionFeatures:
        if image_id not in self._index:
            raise KeyError(f"image {image_id!r} is not in {self.path}")
        regions = self._read(image_id)
        regions.metadata.setdefault("image_id", image_id)
        return regions

    def _read(self, image_id: str) -> RegionFeatures:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, {len(self)} images)"


# --------------------------------------------------------------------------------------------------- TSV
def butd_record(record: Mapping, source: str, fields: Sequence[str]) -> RegionFeatures:
    """One bottom-up-attention row (BUTD or LXMERT field names) as RegionFeatures."""
    lxmert = "img_h" in fields
    height = _scalar(record_field(record, "img_h" if lxmert else "image_h", source), source, "image_h")
    width = _scalar(record_field(record, "img_w" if lxmert else "image_w", source), source, "image_w")
    num_boxes = _scalar(record_field(record, "num_boxes", source), source, "num_boxes")
    boxes = feature_array(record_field(record, "boxes", source), source, "boxes", np.float32, num_boxes, 4)
    features = feature_array(record_field(record, "features", source), source, "features", np.float32, num_boxes)
    extra = {}
    if "cls_prob" in record or b"cls_prob" in record:
        extra["class_probs"] = feature_array(
            record_field(record, "cls_prob", source), source, "cls_prob", np.float32, num_boxes
        )
    metadata = {}
    if lxmert:
        # LXMERT stores only the argmax object/attribute (0-based, background excluded) and its confidence.
        extra["scores"] = feature_array(
            record_field(record, "objects_conf", source), source, "objects_conf", np.float32
        ).reshape(-1)
        for name, dtype in (("objects_id", np.int64), ("attrs_id", np.int64), ("attrs_conf", np.float32)):
            metadata[name] = feature_array(record_field(record, name, source), source, name, dtype).reshape(-1)
    regions = make_regions(source, features=features, boxes=boxes, image_size=(height, width), **extra)
    regions.metadata.update(metadata)
    return regions


class ButdTsvReader(FeatureReader):
    """The bottom-up-attention TSV: one image per line, arrays as base64 float32 (ids as base64 int64).

    Args:
        path: the `.tsv` file.
        fields: the column names in order: `"butd"` (`image_id, image_w, image_h, num_boxes, boxes, features`,
            as `generate_tsv.py` writes; a 7th `cls_prob` column is read when present), `"lxmert"` (the LXMERT
            field list with object/attribute ids and confidences), or an explicit sequence of names.

    The file is scanned once to index line offsets, so `reader[image_id]` reads just that line.
    """

    def __init__(self, path: str | os.PathLike, fields: str | Sequence[str] = "butd") -> None:
        super().__init__()
        self.path = Path(path)
        if isinstance(fields, str):
            presets = {"butd": BUTD_TSV_FIELDS, "lxmert": LXMERT_TSV_FIELDS}
            if fields not in presets:
                raise ValueError(f"fields must be 'butd', 'lxmert' or a list of column names, got {fields!r}")
            fields = presets[fields]
        self.fields = tuple(fields)
        self._id_field = "img_id" if "img_id" in self.fields else "image_id"
        csv.field_size_limit(sys.maxsize)  # one line holds a whole base64 feature matrix
        self._index: dict[str, int] = {}
        with open(self.path, "rb") as handle:
            offset = 0
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    image_id = line.split(b"\t", 1)[0].decode("utf-8")
                    if image_id in self._index:
                        raise FeatureFileError(f"{self.path}: image {image_id!r} appears twice (line {number})")
                    self._index[image_id] = offset
                    self._ids.append(image_id)
                offset += len(line)

    def _read(self, image_id: str) -> RegionFeatures:
        with open(self.path, "rb") as handle:
            handle.seek(self._index[image_id])
            line = handle.readline().decode("utf-8").rstrip("\r\n")
        values = next(csv.reader([line], delimiter="\t"))
        source = f"{self.path} (image {image_id})"
        fields = list(self.fields)
        if len(values) == len(fields) + 1 and fields == list(BUTD_TSV_FIELDS):
            fields.append("cls_prob")  # some variants (X-modaler's) append the class probabilities
        if len(values) != len(fields):
            raise FeatureFileError(
                f"{source}: line has {len(values)} tab-separated columns but the field list {fields} has "
                f"{len(fields)}; pass fields= matching the file"
            )
        return butd_record(dict(zip(fields, values)), source, fields)


# --------------------------------------------------------------------------------------------------- LMDB
class LmdbReader(FeatureReader):
    """A read-only LMDB (a folder or a single file) with `_value(key)` and `_all_keys()`; needs `lmdb`."""

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__()
        lmdb = require_package("lmdb")
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"no LMDB at {self.path}")
        try:
            self._env = lmdb.open(
                str(self.path), readonly=True, lock=False, readahead=False, meminit=False, subdir=self.path.is_dir()
            )
        except lmdb.Error as err:
            raise FeatureFileError(f"{self.path} is not a readable LMDB ({err})") from err
        self._check_size()

    def _check_size(self) -> None:
        """Refuse a data file shorter than the pages its meta page counts. LMDB maps the file and reads pages
        through the map, so a page past the end of a truncated file is a SIGBUS that kills the process."""
        data_file = self.path / "data.mdb" if self.path.is_dir() else self.path
        pages, page_size = self._env.info()["last_pgno"] + 1, self._env.stat()["psize"]
        size = data_file.stat().st_size
        if size < pages * page_size:
            self._env.close()
            raise FeatureFileError(
                f"{self.path}: the LMDB is truncated: its header counts {pages} pages of {page_size} bytes "
                f"({pages * page_size} bytes) but {data_file.name} holds {size} bytes"
            )

    def _value(self, key: bytes) -> bytes | None:
        with self._env.begin(write=False) as txn:
            return txn.get(key)

    def _image_value(self, image_id: str, listed_in: str) -> bytes:
        """The stored bytes of `image_id`; an id listed (in the entry `listed_in`) without a value is an error."""
        data = self._value(image_id.encode())
        if data is None:
            raise FeatureFileError(f"{self.path} (image {image_id}): listed in {listed_in} but has no value")
        return data

    def _all_keys(self) -> list[bytes]:
        with self._env.begin(write=False) as txn:
            return [key for key, _ in txn.cursor()]


# --------------------------------------------------------------------------------------------------- npz
def load_npz(file: str | os.PathLike | BinaryIO, source: str) -> dict[str, np.ndarray]:
    """The arrays of an npz (a path or a file object), each member's header checked before its array is allocated:
    a declared size beyond the bytes the member holds or beyond `MAX_ARRAY_BYTES`, an object array (which only
    pickle can read), or a damaged member is a `FeatureFileError` naming `source` and the member."""
    try:
        arrays = {}
        with zipfile.ZipFile(file) as archive:
            for info in archive.infolist():
                with archive.open(info) as member:
                    version = np.lib.format.read_magic(member)
                    if version == (1, 0):
                        shape, _, dtype = np.lib.format.read_array_header_1_0(member)
                    elif version == (2, 0):
                        shape, _, dtype = np.lib.format.read_array_header_2_0(member)
                    else:
                        raise ValueError(f"npy format version {version} is not supported")
                    header_size = member.tell()
                if dtype.hasobject:
                    raise FeatureFileError(
                        f"{source}: member {info.filename!r} is an object array, which cannot be "
                        "read without pickle (refused: unpickling can run code)"
                    )
                try:
                    check_declared_array(shape, dtype, f"member {info.filename!r}", info.file_size - header_size)
                except ValueError as err:
                    raise FeatureFileError(f"{source}: {err}") from err
                with archive.open(info) as member:
                    arrays[info.filename.removesuffix(".npy")] = np.lib.format.read_array(member, allow_pickle=False)
        return arrays
    except FeatureFileError:
        raise
    except ValueError as err:
        raise FeatureFileError(f"{source}: cannot be read without pickle, or is corrupt ({err})") from err
    except (OSError, EOFError, zipfile.BadZipFile) as err:
        raise FeatureFileError(f"{source}: not a readable npz file ({err})") from err


class FolderReader(FeatureReader):
    """A folder of one `<image_id><suffix>` file per image."""

    suffix: str
    kind: str

    def __init__(self, directory: str | os.PathLike) -> None:
        super().__init__()
        self.path = Path(directory)
        if not self.path.is_dir():
            raise FileNotFoundError(f"no folder of {self.kind} feature files at {self.path}")
        self._ids = sorted(p.stem for p in self.path.glob(f"*{self.suffix}"))
        if not self._ids:
            raise FeatureFileError(f"{self.path} holds no {self.suffix} files")
        self._index = set(self._ids)


class NpzFolderReader(FolderReader):
    """X-modaler's layout: one `<image_id>.npz` per image with `features` (N, 2048), `boxes` (N, 4) pixels,
    `cls_prob` (N, 1601, background first), `image_h`, `image_w`, `num_boxes` (arrays of length 1). Files are
    read with `allow_pickle=False`; an npz whose fields need pickle is refused."""

    suffix, kind = ".npz", "npz"

    def _read(self, image_id: str) -> RegionFeatures:
        path = self.path / f"{image_id}.npz"
        record = {name: value for name, value in load_npz(path, str(path)).items() if name != "image_id"}
        return butd_record(record, str(path), BUTD_TSV_FIELDS)


# --------------------------------------------------------------------------------------------------- by name
# name → description, and name → how to open it: a callable `(path, **options) -> reader` or "module:attribute"
# (imported when first used). Architectures register the formats of their own releases' files when their package is
# imported; `import vlhub` (which any `import vlhub.<module>` runs first) imports every architecture package, so the
# registry is complete before anything can call `open_feature_file`.
FEATURE_FORMATS: dict[str, str] = {}
_OPENERS: dict[str, object] = {}


def register_feature_format(
    name: str, description: str, opener: Callable[..., Mapping[str, RegionFeatures]] | str
) -> None:
    """Make `open_feature_file(name, path)` (and `vlhub import-features --format name`) open `path` with `opener`:
    a callable `(path, **options) -> reader` (a mapping image_id → RegionFeatures) or a "module:attribute" string
    naming one, imported on first use."""
    if name in _OPENERS and _OPENERS[name] != opener:
        raise ValueError(f"feature format {name!r} is already registered")
    FEATURE_FORMATS[name] = description
    _OPENERS[name] = opener


def open_feature_file(format: str, path: str | os.PathLike, **options: Any) -> FeatureReader:
    """The reader for `format` (one of `FEATURE_FORMATS`) on `path`; `options` go to the reader (see the reader's
    own arguments: e.g. the HDF5 formats whose boxes and class probabilities are separate files take them here)."""
    opener = _OPENERS.get(format)
    if opener is None:
        raise ValueError(f"unknown feature format {format!r}; expected one of {sorted(FEATURE_FORMATS)}")
    if isinstance(opener, str):
        module, _, attribute = opener.partition(":")
        opener = getattr(importlib.import_module(module), attribute)
    return opener(path, **options)


def moved_reader(name: str) -> type | None:
    """The reader class `name` that a registered format opens by "module:attribute" (an architecture's own reader),
    with a FutureWarning: such readers were once importable from `vlhub.processing.stores` and now live with their
    architecture. None when no registered format names it."""
    for opener in list(_OPENERS.values()):
        if isinstance(opener, str) and opener.rpartition(":")[2] == name:
            module = opener.partition(":")[0]
            warnings.warn(
                f"{name} lives with its architecture now: import it from {module.rpartition('.')[0]} "
                f"(importing it from vlhub.processing.stores will stop working)",
                FutureWarning,
                stacklevel=3,
            )
            return getattr(importlib.import_module(module), name)
    return None


def __getattr__(name: str):
    reader = moved_reader(name)
    if reader is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return reader


for _name, _description, _opener in (
    (
        "butd-tsv",
        "bottom-up-attention TSV (image_id, image_w, image_h, num_boxes, boxes, features[, cls_prob])",
        functools.partial(ButdTsvReader, fields="butd"),
    ),
    (
        "lxmert-tsv",
        "LXMERT TSV (img_id, img_h, img_w, objects_id, objects_conf, attrs_id, attrs_conf, ...)",
        functools.partial(ButdTsvReader, fields="lxmert"),
    ),
    ("npz", "a folder of per-image npz files (X-modaler's layout)", NpzFolderReader),
    (
        "vlhub",
        "a vlhub region store folder (any format version: copying one upgrades it to the current layout)",
        "vlhub.processing.stores.shards:RegionStore",
    ),
):
    register_feature_format(_name, _description, _opener)
