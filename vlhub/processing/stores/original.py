"""Readers of the feature files the original projects published, each yielding `RegionFeatures`.

| reader                  | files                                              | written by                                     |
| ----------------------- | -------------------------------------------------- | ---------------------------------------------- |
| `ButdTsvReader`         | TSV, base64 fields (BUTD and LXMERT field lists)   | bottom-up-attention `generate_tsv.py`, LXMERT   |
| `UniterLmdbReader`      | LMDB of compressed npz (or msgpack) per image      | UNITER `convert_imgdir.py`                     |
| `VilbertLmdbReader`     | LMDB of pickled rows (base64 strings or arrays)    | ViLBERT beta / multi-task `convert_*_lmdb.py`   |
| `VlpH5Reader`           | h5 shards: fc6 features, class probs, 6-col boxes  | Unified VLP's detectron-vlp extractor          |
| `NpzFolderReader`       | one npz per image                                  | X-modaler / TDEN `generate_npz.py`             |

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
import io
import json
import os
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ...utils.safe_pickle import UnsafePickleError, safe_loads
from ..regions import RegionFeatures

__all__ = [
    "FeatureFileError",
    "ButdTsvReader",
    "UniterLmdbReader",
    "VilbertLmdbReader",
    "VlpH5Reader",
    "NpzFolderReader",
    "BUTD_TSV_FIELDS",
    "LXMERT_TSV_FIELDS",
    "FEATURE_FORMATS",
    "open_feature_file",
    "register_feature_format",
    "FolderReader",
    "butd_record",
    "feature_array",
]

BUTD_TSV_FIELDS = ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features")
LXMERT_TSV_FIELDS = (
    "img_id", "img_h", "img_w", "objects_id", "objects_conf", "attrs_id", "attrs_conf", "num_boxes", "boxes",
    "features",
)


class FeatureFileError(ValueError):
    """A feature file is malformed or lacks a field; the message names the file, the image and the field."""


def _require(module: str):
    try:
        return __import__(module)
    except ImportError as err:
        raise ImportError(
            f"reading this feature format needs the `{module}` package: pip install 'vlhub[stores]'"
        ) from err


def _text(value) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray):
        return _text(value.reshape(-1)[0].item() if value.size == 1 else value.tolist())
    return str(value)


def _scalar(value, source: str, name: str) -> int:
    array = np.asarray(value).reshape(-1)
    if array.size != 1:
        raise FeatureFileError(f"{source}: field {name!r} should be one number, got shape {np.shape(value)}")
    return int(array[0])


def feature_array(value, source: str, name: str, dtype, rows: int | None = None, columns: int | None = None) -> np.ndarray:
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


def _get(record: Mapping, name: str, source: str):
    if name in record:
        return record[name]
    if name.encode() in record:  # python-2 pickles keep bytes keys
        return record[name.encode()]
    fields = sorted(_text(k) for k in record)
    raise FeatureFileError(f"{source}: missing field {name!r} (the record has {fields})")


def _regions(source: str, **fields) -> RegionFeatures:
    try:
        return RegionFeatures(**fields)
    except (ValueError, TypeError) as err:
        raise FeatureFileError(f"{source}: {err}") from err


class _Reader(Mapping):
    """Mapping `image_id -> RegionFeatures` over one feature file or folder."""

    path: Path

    def __init__(self):
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
    height = _scalar(_get(record, "img_h" if lxmert else "image_h", source), source, "image_h")
    width = _scalar(_get(record, "img_w" if lxmert else "image_w", source), source, "image_w")
    num_boxes = _scalar(_get(record, "num_boxes", source), source, "num_boxes")
    boxes = feature_array(_get(record, "boxes", source), source, "boxes", np.float32, num_boxes, 4)
    features = feature_array(_get(record, "features", source), source, "features", np.float32, num_boxes)
    extra = {}
    if "cls_prob" in record or b"cls_prob" in record:
        extra["class_probs"] = feature_array(_get(record, "cls_prob", source), source, "cls_prob", np.float32, num_boxes)
    metadata = {}
    if lxmert:
        # LXMERT stores only the argmax object/attribute (0-based, background excluded) and its confidence.
        extra["scores"] = feature_array(_get(record, "objects_conf", source), source, "objects_conf", np.float32).reshape(-1)
        for name, dtype in (("objects_id", np.int64), ("attrs_id", np.int64), ("attrs_conf", np.float32)):
            metadata[name] = feature_array(_get(record, name, source), source, name, dtype).reshape(-1)
    regions = _regions(source, features=features, boxes=boxes, image_size=(height, width), **extra)
    regions.metadata.update(metadata)
    return regions


class ButdTsvReader(_Reader):
    """The bottom-up-attention TSV: one image per line, arrays as base64 float32 (ids as base64 int64).

    Args:
        path: the `.tsv` file.
        fields: the column names in order: `"butd"` (`image_id, image_w, image_h, num_boxes, boxes, features`,
            as `generate_tsv.py` writes; a 7th `cls_prob` column is read when present), `"lxmert"` (the LXMERT
            field list with object/attribute ids and confidences), or an explicit sequence of names.

    The file is scanned once to index line offsets, so `reader[image_id]` reads just that line.
    """

    def __init__(self, path: str | os.PathLike, fields: str | Sequence[str] = "butd"):
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
            fields.append("cls_prob")  # UNITER/X-modaler variants append the class probabilities
        if len(values) != len(fields):
            raise FeatureFileError(
                f"{source}: line has {len(values)} tab-separated columns but the field list {fields} has "
                f"{len(fields)}; pass fields= matching the file"
            )
        return butd_record(dict(zip(fields, values)), source, fields)


# --------------------------------------------------------------------------------------------------- LMDB
class _LmdbReader(_Reader):
    def __init__(self, path: str | os.PathLike):
        super().__init__()
        lmdb = _require("lmdb")
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"no LMDB at {self.path}")
        try:
            self._env = lmdb.open(str(self.path), readonly=True, lock=False, readahead=False, meminit=False,
                                  subdir=self.path.is_dir())
        except lmdb.Error as err:
            raise FeatureFileError(f"{self.path} is not a readable LMDB ({err})") from err

    def _value(self, key: bytes) -> bytes | None:
        with self._env.begin(write=False) as txn:
            return txn.get(key)

    def _all_keys(self) -> list[bytes]:
        with self._env.begin(write=False) as txn:
            return [key for key, _ in txn.cursor()]


def _decode_msgpack(data: bytes, source: str) -> dict:
    msgpack = _require("msgpack")

    def numpy_hook(obj):
        # msgpack-numpy's encoding of an ndarray: {nd: True, type: dtype str, shape, data: raw bytes}
        if obj.get(b"nd") is True or obj.get("nd") is True:
            get = lambda k: obj[k.encode()] if k.encode() in obj else obj[k]  # noqa: E731
            return np.frombuffer(get("data"), dtype=np.dtype(_text(get("type")))).reshape(get("shape"))
        return obj

    try:
        return msgpack.unpackb(data, object_hook=numpy_hook, raw=False, strict_map_key=False)
    except Exception as err:  # msgpack raises several unrelated exception types for corrupt data
        raise FeatureFileError(f"{source}: value is neither a compressed npz nor msgpack ({err})") from err


class UniterLmdbReader(_LmdbReader):
    """UNITER's image database (`img_db/<split>/feat_th0.2_max100_min10[_compressed]`).

    Keys are npz file names (e.g. `coco_val2014_000000000139.npz`, the image id); values are
    `np.savez_compressed` bytes, or msgpack-numpy in the uncompressed variant. Fields: `features` (N, 2048) fp16,
    `norm_bb` (N, 6) fp16 `[x1/W, y1/H, x2/W, y2/H, w/W, h/H]`, `conf` (N, 1) and `soft_labels` (N, 1601,
    background first). UNITER stores no image size, so boxes stay normalised: `image_size` is (1, 1) and UNITER's
    processor computes exactly the original 7-d locations from them. The rows are already selected
    (confidence ≥ 0.2, 10–100 boxes) and ordered by confidence; readers keep that order.
    """

    _RESERVED_KEYS = {b"__keys__"}

    def __init__(self, path: str | os.PathLike):
        super().__init__(path)
        stored = self._value(b"__keys__")
        keys = json.loads(stored) if stored is not None else [k.decode() for k in self._all_keys()
                                                              if k not in self._RESERVED_KEYS]
        self._ids = [_text(k) for k in keys]
        self._index = set(self._ids)

    def _read(self, image_id: str) -> RegionFeatures:
        source = f"{self.path} (image {image_id})"
        data = self._value(image_id.encode())
        if data is None:
            raise FeatureFileError(f"{source}: listed in __keys__ but has no value")
        if data[:2] == b"PK":  # a zip archive: np.savez_compressed
            try:
                with np.load(io.BytesIO(data), allow_pickle=False) as archive:
                    record = {name: archive[name] for name in archive.files}
            except (ValueError, OSError, zipfile.BadZipFile) as err:
                raise FeatureFileError(f"{source}: corrupt compressed npz ({err})") from err
        else:
            record = _decode_msgpack(data, source)
        features = feature_array(_get(record, "features", source), source, "features", np.float32)
        norm_bb = feature_array(_get(record, "norm_bb", source), source, "norm_bb", np.float32, len(features))
        if norm_bb.shape[1] < 4:
            raise FeatureFileError(f"{source}: norm_bb should have 6 columns, got {norm_bb.shape}")
        extra = {}
        if "conf" in record:
            extra["scores"] = feature_array(record["conf"], source, "conf", np.float32).reshape(-1)
        if "soft_labels" in record:
            extra["class_probs"] = feature_array(record["soft_labels"], source, "soft_labels", np.float32, len(features))
        try:
            return RegionFeatures.from_normalized_boxes(features, norm_bb[:, :4], **extra)
        except (ValueError, TypeError) as err:
            raise FeatureFileError(f"{source}: {err}") from err


def _unpickle(data: bytes, source: str):
    """`safe_loads` with errors that name the file and entry: a refused global stays an `UnsafePickleError`, any
    other failure (a damaged pickle) is a `FeatureFileError`."""
    try:
        return safe_loads(data)
    except UnsafePickleError as err:
        raise UnsafePickleError(f"{source}: {err}") from None
    except Exception as err:  # pickle raises many types for damaged data (EOFError, UnpicklingError, ValueError...)
        raise FeatureFileError(f"{source}: not a readable pickle, the entry is truncated or corrupt ({err!r})") from err


class VilbertLmdbReader(_LmdbReader):
    """ViLBERT's LMDBs: key `keys` holds the pickled id list; each id holds a pickled row.

    Rows are dicts `{image_id, image_w, image_h, num_boxes, boxes, features[, cls_prob]}` with base64 strings
    (the beta release, converted from BUTD TSVs) or numpy arrays (the multi-task release); the Conceptual
    Captions beta LMDB stores lists `[features, cls_prob, boxes, num_boxes, image_h, image_w, image_id,
    caption]`. Pickles are read with a restricted unpickler (numpy arrays and builtin containers only).
    """

    _CC_LIST_FIELDS = ("features", "cls_prob", "boxes", "num_boxes", "image_h", "image_w", "image_id", "caption")

    def __init__(self, path: str | os.PathLike):
        super().__init__(path)
        stored = self._value(b"keys")
        if stored is None:
            raise FeatureFileError(f"{self.path}: no `keys` entry; this is not a ViLBERT feature LMDB")
        self._ids = [_text(k) for k in _unpickle(stored, f"{self.path} (entry `keys`)")]
        self._index = set(self._ids)

    def _read(self, image_id: str) -> RegionFeatures:
        source = f"{self.path} (image {image_id})"
        data = self._value(image_id.encode())
        if data is None:
            raise FeatureFileError(f"{source}: listed in `keys` but has no value")
        record = _unpickle(data, source)
        if isinstance(record, (list, tuple)):
            if len(record) != len(self._CC_LIST_FIELDS):
                raise FeatureFileError(
                    f"{source}: a list row should hold {list(self._CC_LIST_FIELDS)}, got {len(record)} items"
                )
            record = dict(zip(self._CC_LIST_FIELDS, record))
        if not isinstance(record, Mapping):
            raise FeatureFileError(f"{source}: expected a dict row, got {type(record).__name__}")
        if "num_boxes" not in record and b"num_boxes" not in record:
            record = {**record, "num_boxes": len(np.asarray(_get(record, "features", source)))}
        return butd_record(record, source, BUTD_TSV_FIELDS)


# --------------------------------------------------------------------------------------------------- HDF5
def _plain_h5_dataset(h5py, handle, name: str, path) -> np.ndarray:
    """The dataset `name` of an open h5 file, read only when its data lives in that file.

    HDF5 can point elsewhere: a soft or external link, a virtual dataset mapped onto other files, or "external
    storage" whose raw bytes are any file on disk. Reading such a dataset would copy another file's bytes into the
    features, so each of these is refused with an error naming the file and the dataset."""
    link = handle.get(name, getlink=True)
    kinds = {h5py.SoftLink: "a soft link", h5py.ExternalLink: "an external link"}
    if type(link) in kinds:
        target = f"{link.filename}:{link.path}" if isinstance(link, h5py.ExternalLink) else link.path
        raise FeatureFileError(
            f"{path}: dataset {name!r} is {kinds[type(link)]} (to {target}); only datasets stored in the file itself "
            "are read"
        )
    dataset = handle.get(name)
    if not isinstance(dataset, h5py.Dataset):
        raise FeatureFileError(f"{path}: {name!r} is not a dataset (it is a {type(dataset).__name__})")
    create_plist = dataset.id.get_create_plist()
    if create_plist.get_layout() == h5py.h5d.VIRTUAL:
        raise FeatureFileError(
            f"{path}: dataset {name!r} is a virtual dataset (its data lives in other files); only datasets stored in "
            "the file itself are read"
        )
    if create_plist.get_external_count() > 0:
        raise FeatureFileError(
            f"{path}: dataset {name!r} uses external storage (its raw data is the file "
            f"{create_plist.get_external(0)[0].decode(errors='replace')!r}); only datasets stored in the file itself "
            "are read"
        )
    return dataset[()]


class VlpH5Reader(_Reader):
    """Unified VLP's detectron-vlp features: fc6 features, class probabilities and boxes in h5 files.

    Args:
        features: the feature h5 file, or a pattern with `{shard}` for the 1000-shard layout
            (`..._feat{shard}.h5`, shard = the id's last 3 characters).
        class_probs: the class-probability h5 file or pattern (`..._cls{shard}.h5`), (100, 1601) with
            background first; optional.
        boxes: the bbox h5 (100, 6) = `[x1, y1, x2, y2, class_idx, max_conf]` in pixels; it lists the ids.
        image_sizes: `{image_id: (height, width)}`. VLP never stored image sizes (its loader normalises by the
            largest box coordinate instead); without them, pass `image_size_from_boxes=True` to use
            `(max y2, max x2)` of each image's boxes — recorded as `metadata["image_size_from_boxes"]`.
    """

    def __init__(
        self,
        features: str | os.PathLike,
        boxes: str | os.PathLike,
        class_probs: str | os.PathLike | None = None,
        image_sizes: Mapping[str, tuple[int, int]] | None = None,
        image_size_from_boxes: bool = False,
    ):
        super().__init__()
        self._h5py = _require("h5py")
        self.path = Path(boxes)
        self.features_pattern = str(features)
        self.class_probs_pattern = None if class_probs is None else str(class_probs)
        if image_sizes is None and not image_size_from_boxes:
            raise ValueError(
                "VLP feature files hold no image sizes: pass image_sizes={image_id: (height, width)}, or "
                "image_size_from_boxes=True to use each image's largest box coordinates"
            )
        self.image_sizes = image_sizes
        with self._h5py.File(self.path, "r") as bbox_file:
            self._ids = list(bbox_file.keys())
        self._index = set(self._ids)

    def _dataset(self, pattern: str, image_id: str, what: str) -> np.ndarray:
        path = pattern.format(shard=image_id[-3:]) if "{shard}" in pattern else pattern
        if not os.path.exists(path):
            raise FeatureFileError(f"{what} file {path} for image {image_id!r} does not exist")
        with self._h5py.File(path, "r") as handle:
            if image_id not in handle:
                raise FeatureFileError(f"{path}: no {what} for image {image_id!r}")
            return _plain_h5_dataset(self._h5py, handle, image_id, path)

    def _read(self, image_id: str) -> RegionFeatures:
        source = f"VLP features of image {image_id!r}"
        with self._h5py.File(self.path, "r") as bbox_file:
            bbox = np.asarray(_plain_h5_dataset(self._h5py, bbox_file, image_id, self.path), dtype=np.float32)
        if bbox.ndim != 2 or bbox.shape[1] != 6:
            raise FeatureFileError(f"{self.path}: boxes of {image_id!r} should be (N, 6), got {bbox.shape}")
        features = feature_array(self._dataset(self.features_pattern, image_id, "feature"), source, "features",
                          np.float32, len(bbox))
        extra = {"scores": bbox[:, 5]}
        if self.class_probs_pattern is not None:
            extra["class_probs"] = feature_array(self._dataset(self.class_probs_pattern, image_id, "class-probability"),
                                          source, "class_probs", np.float32, len(bbox))
        boxes = bbox[:, :4]
        if self.image_sizes is not None:
            if image_id not in self.image_sizes:
                raise FeatureFileError(f"image_sizes has no entry for {image_id!r}")
            image_size = tuple(self.image_sizes[image_id])
        else:
            image_size = (float(boxes[:, 3].max()), float(boxes[:, 2].max()))
        regions = _regions(source, features=features, boxes=boxes, image_size=image_size, **extra)
        regions.metadata["class_ids"] = bbox[:, 4].astype(np.int64)
        if self.image_sizes is None:
            regions.metadata["image_size_from_boxes"] = True
        return regions


# --------------------------------------------------------------------------------------------------- npz
class FolderReader(_Reader):
    """A folder of one `<image_id><suffix>` file per image."""

    suffix: str
    kind: str

    def __init__(self, directory: str | os.PathLike):
        super().__init__()
        self.path = Path(directory)
        if not self.path.is_dir():
            raise FileNotFoundError(f"no folder of {self.kind} feature files at {self.path}")
        self._ids = sorted(p.stem for p in self.path.glob(f"*{self.suffix}"))
        if not self._ids:
            raise FeatureFileError(f"{self.path} holds no {self.suffix} files")
        self._index = set(self._ids)


class NpzFolderReader(FolderReader):
    """X-modaler / TDEN: one `<image_id>.npz` per image with `features` (N, 2048), `boxes` (N, 4) pixels,
    `cls_prob` (N, 1601, background first), `image_h`, `image_w`, `num_boxes` (arrays of length 1). Files are
    read with `allow_pickle=False`; an npz whose fields need pickle is refused."""

    suffix, kind = ".npz", "npz"

    def _read(self, image_id: str) -> RegionFeatures:
        path = self.path / f"{image_id}.npz"
        try:
            with np.load(path, allow_pickle=False) as archive:
                record = {name: archive[name] for name in archive.files if name != "image_id"}
        except ValueError as err:
            raise FeatureFileError(f"{path}: cannot be read without pickle, or is corrupt ({err})") from err
        except (OSError, EOFError, zipfile.BadZipFile) as err:
            raise FeatureFileError(f"{path}: not a readable npz file ({err})") from err
        return butd_record(record, str(path), BUTD_TSV_FIELDS)


# --------------------------------------------------------------------------------------------------- by name
# name → description, and name → how to open it: a callable `(path, **options) -> reader` or "module:attribute"
# (imported when first used). Architectures register the formats of their own releases' files.
FEATURE_FORMATS: dict[str, str] = {}
_OPENERS: dict[str, object] = {}


def register_feature_format(name: str, description: str, opener) -> None:
    """Make `open_feature_file(name, path)` (and `vlhub import-features --format name`) open `path` with `opener`:
    a callable `(path, **options) -> reader` (a mapping image_id → RegionFeatures) or a "module:attribute" string
    naming one, imported on first use."""
    if name in _OPENERS and _OPENERS[name] != opener:
        raise ValueError(f"feature format {name!r} is already registered")
    FEATURE_FORMATS[name] = description
    _OPENERS[name] = opener


def open_feature_file(format: str, path: str | os.PathLike, **options) -> _Reader:
    """The reader for `format` (one of `FEATURE_FORMATS`) on `path`; `options` go to the reader (for "vlp-h5":
    `boxes=`, `class_probs=`, `image_sizes=` / `image_size_from_boxes=`, with `path` the feature file)."""
    opener = _OPENERS.get(format)
    if opener is None:
        raise ValueError(f"unknown feature format {format!r}; expected one of {sorted(FEATURE_FORMATS)}")
    if isinstance(opener, str):
        module, _, attribute = opener.partition(":")
        opener = getattr(importlib.import_module(module), attribute)
    return opener(path, **options)


for _name, _description, _opener in (
    ("butd-tsv", "bottom-up-attention TSV (image_id, image_w, image_h, num_boxes, boxes, features[, cls_prob])",
     functools.partial(ButdTsvReader, fields="butd")),
    ("lxmert-tsv", "LXMERT TSV (img_id, img_h, img_w, objects_id, objects_conf, attrs_id, attrs_conf, ...)",
     functools.partial(ButdTsvReader, fields="lxmert")),
    ("uniter-lmdb", "UNITER image LMDB (compressed npz or msgpack per image)", UniterLmdbReader),
    ("vilbert-lmdb", "ViLBERT beta / multi-task LMDB (pickled rows)", VilbertLmdbReader),
    ("vlp-h5", "Unified VLP h5 files (features, class probabilities, 6-column boxes)", VlpH5Reader),
    ("npz", "a folder of per-image npz files (X-modaler / TDEN)", NpzFolderReader),
    ("vlhub", "a vlhub region store folder (any format version: copying one upgrades it to the current layout)",
     "vlhub.processing.stores.shards:RegionStore"),
):
    register_feature_format(_name, _description, _opener)
