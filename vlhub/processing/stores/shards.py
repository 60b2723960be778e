"""vlhub's own region store: memory-mapped Arrow shards plus an SQLite index of image ids, for random access at any size.

Layout of a store folder (format version 2)::

    store.json                          format version, the column layout (feature size, dtype, optional fields)
                                          and, where the writer stated it, the extraction that made the features
    index.sqlite                        image_id → (shard, row), in the order images were added
    shard-p00000-00000.arrow            Arrow IPC files, uncompressed: image_id, features, boxes, image_size
    shard-p00000-00001.arrow              [, scores, class_probs, attribute_probs, image_box_feature]; one series
                                          per writing process
    shard-p00001-00000.arrow

Why this layout (measured by `bench/bench_data.py`): reading one image costs one index lookup (a B-tree, ~10 µs)
and a zero-copy slice of a memory-mapped file, so it costs about one image's bytes whatever the store's size, and
opening a store reads nothing but `store.json`. The OS page cache holds what is hot; nothing in the process grows
with the number of images read. Compressed Parquet row groups (format version 1) decoded 16 images to return one
and needed a scan of every row group at open; version-1 stores are still read (slowly, with a warning), and
`vlhub import-features --format vlhub OLD --output NEW` copies one into the new layout.

Writing: a shard is written under a temporary name and published when complete: its ids go into the index and the
file is renamed, in one SQLite transaction, so readers see whole shards only. The index's unique key refuses an id
that is already stored, also one another process stored meanwhile, when the shard is written. Several processes may
write one store at once, each with its own `process_index` (its own shard series); a writer holds an exclusive lock
on its series (`.lock-pNNNNN`, released when it closes or its process dies), so a second writer of the same series
is refused. The next writer of a series removes, with a warning, what a killed writer left: a temporary shard, or a
shard renamed but never indexed.

Values are validated once, when written (finite, within float16's range for a float16 store, boxes inside the
image); reads trust them, but check each row's 64-bit xxh3 checksum (a few µs per image), so a flipped byte or a
truncated shard is an error naming the shard and image, never silently different features. `datasets` reads the shards as an Arrow dataset with typed columns, e.g.
`RegionStore(folder).dataset` or `RegionStore.streaming_dataset(folder)`.
"""

from __future__ import annotations

import bisect
import fcntl
import json
import logging
import os
import re
import sqlite3
import warnings
from collections import OrderedDict
from collections.abc import Set
from pathlib import Path
from typing import Iterator, Mapping, NamedTuple

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import xxhash

from ...utils.arguments import check_positive_int
from ...utils.errors import VlhubUserError, named_input
from ...utils.files import atomic_write_json
from ...utils.resources import open_file_limit
from ...utils.tensors import float32_tensor, single_threaded
from ._exports import SHARDS_EXPORTS
from ..regions import FLOAT16_FEATURES, FLOAT16_MAX, RegionFeatures, check_float16_range

__all__ = list(SHARDS_EXPORTS)

STORE_FORMAT = "vlhub-region-store"
STORE_VERSION = 2
STORE_INDEX_FILE = "store.json"
ID_INDEX_FILE = "index.sqlite"
_SHARD_PATTERN = re.compile(r"^shard-p(\d{5})-(\d{5})\.arrow$")
_V1_SHARD_PATTERN = re.compile(r"^shard-p(\d{5})-(\d{5})\.parquet$")
_OPTIONAL_FIELDS = ("scores", "class_probs", "attribute_probs")
# The one per-image metadata field a store keeps: a whole-image feature (some architectures' feature files carry one), read back
# into `RegionFeatures.metadata` under the same name; null for an image without one.
IMAGE_BOX_FEATURE = "image_box_feature"
_FEATURE_DTYPES = ("float32", "float16")
_SQLITE_TIMEOUT = 600.0  # seconds a writer waits for another one's short publishing transaction
logger = logging.getLogger(__name__)


class StoreSourceMismatchError(VlhubUserError, ValueError):
    """A writer states another source (extractor and its settings) than the one the store records: continuing would
    mix two extractions' features in one store."""


class StoreLockedError(VlhubUserError, RuntimeError):
    """Another live writer holds the shard series this writer needs (a user error: the command lines show it as one
    line)."""


class StoreLayout:
    """Which columns a store holds and their sizes; every image of a store shares one layout."""

    def __init__(
        self,
        feature_dim: int,
        feature_dtype: str = "float32",
        has_scores: bool = False,
        num_classes: int | None = None,
        num_attributes: int | None = None,
        has_image_box_feature: bool = False,
    ) -> None:
        if feature_dtype not in _FEATURE_DTYPES:
            raise ValueError(f"feature_dtype must be one of {_FEATURE_DTYPES}, got {feature_dtype!r}")
        self.feature_dim = int(feature_dim)
        self.feature_dtype = feature_dtype
        self.has_scores = bool(has_scores)
        self.num_classes = None if num_classes is None else int(num_classes)
        self.num_attributes = None if num_attributes is None else int(num_attributes)
        self.has_image_box_feature = bool(has_image_box_feature)

    @classmethod
    def of(cls, regions: RegionFeatures, feature_dtype: str = "float32") -> "StoreLayout":
        return cls(
            feature_dim=regions.feature_dim,
            feature_dtype=feature_dtype,
            has_scores=regions.scores is not None,
            num_classes=None if regions.class_probs is None else regions.class_probs.shape[1],
            num_attributes=None if regions.attribute_probs is None else regions.attribute_probs.shape[1],
            has_image_box_feature=IMAGE_BOX_FEATURE in regions.metadata,
        )

    def to_dict(self) -> dict:
        layout = {
            "feature_dim": self.feature_dim,
            "feature_dtype": self.feature_dtype,
            "has_scores": self.has_scores,
            "num_classes": self.num_classes,
            "num_attributes": self.num_attributes,
        }
        if self.has_image_box_feature:  # only then: a store without the column stays readable by older vlhub
            layout["has_image_box_feature"] = True
        return layout

    def __eq__(self, other) -> bool:
        return isinstance(other, StoreLayout) and self.to_dict() == other.to_dict()

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.to_dict().items())

    def check(self, image_id: str, regions: RegionFeatures) -> None:
        """Raise when `regions` does not fit this layout (the shards' schema cannot hold it) or its values do not
        survive the store's dtype."""
        found = StoreLayout.of(regions, self.feature_dtype)
        # Not a column's shape: an image without a whole-image feature stores null, and a store without the column
        # does not keep one (`import_features` says so).
        found.has_image_box_feature = self.has_image_box_feature
        if found != self:
            raise ValueError(
                f"regions of image {image_id!r} do not match this store's layout: the store holds "
                f"({self.describe()}) but these regions have ({found.describe()})"
            )
        # Refused now: written as inf, the row could never be read back. (numpy's max is one pass on this thread.)
        if self.feature_dtype == "float16" and np.abs(regions.features.numpy()).max() > FLOAT16_MAX:
            check_float16_range(regions.features, f"the features of image {image_id!r}")
        if self.has_image_box_feature and IMAGE_BOX_FEATURE in regions.metadata:
            self.image_box_feature(image_id, regions)

    def image_box_feature(self, image_id: str, regions: RegionFeatures) -> np.ndarray:
        """`(0 or 1, feature_dim)`: the image's whole-image feature as stored (none: an empty matrix), checked."""
        given = regions.metadata.get(IMAGE_BOX_FEATURE)
        if given is None:
            return np.zeros((0, self.feature_dim), dtype=self.feature_dtype)
        values = torch.as_tensor(np.array(given, dtype=np.float32)).reshape(-1)  # a copy: readers give read-only views
        what = f"metadata[{IMAGE_BOX_FEATURE!r}] of image {image_id!r}"
        if values.numel() != self.feature_dim:
            raise ValueError(f"{what} has {values.numel()} values; the store's features have {self.feature_dim}")
        if not torch.isfinite(values).all():
            raise ValueError(f"{what} has NaN or infinite values")
        if self.feature_dtype == "float16":
            check_float16_range(values, what)
        return values.to(getattr(torch, self.feature_dtype)).numpy().reshape(1, -1)

    def arrow_schema(self) -> pa.Schema:
        """The shard columns: per image, a (regions, dim) matrix is a list of fixed-size lists (what `datasets`
        calls `Array2D(shape=(None, dim))`)."""
        fields = [
            ("image_id", pa.string()),
            ("features", pa.list_(pa.list_(getattr(pa, self.feature_dtype)(), self.feature_dim))),
            ("boxes", pa.list_(pa.list_(pa.float32(), 4))),
            ("image_size", pa.list_(pa.float64(), 2)),
        ]
        if self.has_scores:
            fields.append(("scores", pa.list_(pa.float32())))
        if self.num_classes is not None:
            fields.append(("class_probs", pa.list_(pa.list_(pa.float32(), self.num_classes))))
        if self.num_attributes is not None:
            fields.append(("attribute_probs", pa.list_(pa.list_(pa.float32(), self.num_attributes))))
        if self.has_image_box_feature:  # one per image, null where an image has none
            fields.append((IMAGE_BOX_FEATURE, pa.list_(getattr(pa, self.feature_dtype)(), self.feature_dim)))
        fields.append(("checksum", pa.uint64()))
        return pa.schema(fields)

    def matrix_fields(self) -> list[tuple[str, int]]:
        """(name, width) of the per-region columns this layout stores, in the order their bytes are checksummed."""
        fields = [("features", self.feature_dim), ("boxes", 4)]
        if self.has_scores:
            fields.append(("scores", 1))
        if self.num_classes is not None:
            fields.append(("class_probs", self.num_classes))
        if self.num_attributes is not None:
            fields.append(("attribute_probs", self.num_attributes))
        return fields

    def datasets_features(self) -> datasets.Features:
        """The typed columns of a shard, as `datasets` reads them."""
        columns = {
            "image_id": datasets.Value("string"),
            "features": datasets.Array2D(shape=(None, self.feature_dim), dtype=self.feature_dtype),
            "boxes": datasets.Array2D(shape=(None, 4), dtype="float32"),
            "image_size": datasets.Sequence(datasets.Value("float64"), length=2),
        }
        if self.has_scores:
            columns["scores"] = datasets.Sequence(datasets.Value("float32"))
        if self.num_classes is not None:
            columns["class_probs"] = datasets.Array2D(shape=(None, self.num_classes), dtype="float32")
        if self.num_attributes is not None:
            columns["attribute_probs"] = datasets.Array2D(shape=(None, self.num_attributes), dtype="float32")
        if self.has_image_box_feature:
            columns[IMAGE_BOX_FEATURE] = datasets.Sequence(datasets.Value(self.feature_dtype), length=self.feature_dim)
        columns["checksum"] = datasets.Value("uint64")
        return datasets.Features(columns)


class _StoreIndex(NamedTuple):
    layout: StoreLayout
    version: int
    source: dict | None  # what made the features, as the first writer stated it (None: not stated)


def _read_index(directory: Path) -> _StoreIndex | None:
    """What store.json says, or None when the folder has none."""
    path = directory / STORE_INDEX_FILE
    if not path.exists():
        return None
    try:
        index = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); it should describe a vlhub region store") from err
    if index.get("format") != STORE_FORMAT:
        raise ValueError(f"{path} does not describe a vlhub region store (format={index.get('format')!r})")
    if index.get("version") not in (1, STORE_VERSION):
        raise ValueError(
            f"{path} is store format version {index.get('version')}; this vlhub reads versions 1 and {STORE_VERSION}"
        )
    return _StoreIndex(StoreLayout(**index["layout"]), index["version"], index.get("source"))


def _checked_source(source: Mapping | None) -> dict | None:
    """`source` as store.json will hold it: a mapping of names to JSON values, compared after a JSON round trip (so
    that a tuple given now equals the list read back later)."""
    if source is None:
        return None
    if not isinstance(source, Mapping) or not all(isinstance(key, str) for key in source):
        raise TypeError(f"source must be a mapping with string keys, got {source!r}")
    try:
        return json.loads(json.dumps(dict(source), allow_nan=False))
    except (TypeError, ValueError) as err:
        raise ValueError(f"source must hold JSON values only ({err}): {source!r}") from err


def _check_same_source(directory: Path, recorded: dict | None, stated: dict | None) -> None:
    """Refuse to add features of another extraction than the one the store records (`StoreSourceMismatchError`)."""
    if stated is None or recorded is None or stated == recorded:
        return
    differing = sorted(key for key in recorded.keys() | stated.keys() if recorded.get(key) != stated.get(key))
    details = "; ".join(
        f"{key}: the store has {recorded.get(key)!r}, the new features {stated.get(key)!r}" for key in differing
    )
    raise StoreSourceMismatchError(
        f"the region store {directory} holds features of another extraction ({details}). Adding these would mix two "
        "extractions' features in one store: continue it with the extractor and settings it records, or write to a "
        "new folder"
    )


def _lock(path: Path, blocking: bool) -> int:
    """An exclusive `flock` on `path` (created if missing); returns the open descriptor that holds it. The kernel
    releases it when the descriptor closes, also when the process is killed."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(descriptor)
        raise
    return descriptor


_DAMAGED_INDEX_ADVICE = (
    "it is damaged: write the store again (vlhub extract or vlhub import-features into a new folder)"
)


class _IndexConnection(sqlite3.Connection):
    """A connection to a store's id index whose errors of a damaged file (sqlite3.DatabaseError: "file is not a
    database", "database disk image is malformed") name the file, as a `VlhubUserError`."""

    path: Path

    def execute(self, *args, **kwargs):
        with named_input(self.path, "the region store's id index", _DAMAGED_INDEX_ADVICE):
            return super().execute(*args, **kwargs)

    def executemany(self, *args, **kwargs):
        with named_input(self.path, "the region store's id index", _DAMAGED_INDEX_ADVICE):
            return super().executemany(*args, **kwargs)


def _connect(directory: Path, readonly: bool) -> sqlite3.Connection:
    path = directory / ID_INDEX_FILE
    if readonly:
        if not path.exists():
            raise FileNotFoundError(
                f"the region store {directory} has no {ID_INDEX_FILE} (its id index); it was not "
                "written completely, or by a vlhub older than store format 2"
            )
        connection = sqlite3.connect(
            f"file:{path}?mode=ro", uri=True, timeout=_SQLITE_TIMEOUT, check_same_thread=False, factory=_IndexConnection
        )
        connection.path = path
    else:
        connection = sqlite3.connect(path, timeout=_SQLITE_TIMEOUT, isolation_level=None, factory=_IndexConnection)
        connection.path = path
        connection.execute(
            "CREATE TABLE IF NOT EXISTS images (seq INTEGER PRIMARY KEY, image_id TEXT NOT NULL UNIQUE,"
            " shard TEXT NOT NULL, row INTEGER NOT NULL)"
        )
        connection.execute("CREATE INDEX IF NOT EXISTS images_by_shard ON images (shard)")
    return connection


def _default_open_shards() -> int:
    """A quarter of the open-file limit: the rest stays for the process's other files, sockets and workers' pipes."""
    limit = open_file_limit()
    return max(16, (limit or 4096) // 4)


def _column_matrix(column: pa.Array, width: int) -> np.ndarray:
    """The one row of a list<fixed_size_list<width>> (or list<value>, width 1) column, as sliced from a table, as a
    `(rows, width)` array, without copying. The nesting is unwrapped through offsets and slices (no compute kernel
    per level: those cost more than the read itself)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    if isinstance(column, pa.ExtensionArray):
        column = column.storage
    while True:
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            offsets = column.offsets  # of this slice's rows only
            start, stop = offsets[0].as_py(), offsets[len(offsets) - 1].as_py()
            column = column.values.slice(start, stop - start)
        elif pa.types.is_fixed_size_list(column.type):
            size = column.type.list_size
            column = column.values.slice(column.offset * size, len(column) * size)
        else:
            break
    return column.to_numpy(zero_copy_only=False).reshape(-1, width)


class _ShardColumns:
    """One shard's columns as numpy views of its memory map, made once per shard and process: reading a row is then
    a few numpy slices (~5 µs) instead of Arrow calls per column and row (~40 µs). Nothing is copied; the views
    keep the memory map alive. The values are exactly what `_column_matrix` gives for a one-row slice."""

    def __init__(self, table: pa.Table, layout: StoreLayout):
        self.fields = layout.matrix_fields()
        self.feature_dim = layout.feature_dim if layout.has_image_box_feature else None
        self.num_rows = table.num_rows
        self._starts: list[int] = []  # first row of each record batch
        self._batches: list[tuple] = []
        start = 0
        for batch in table.to_batches():
            if batch.num_rows == 0:
                continue
            matrices = []
            for name, width in self.fields:
                column = batch.column(name)
                offsets = column.offsets.to_numpy()
                matrices.append((offsets - offsets[0], _column_matrix(column, width)))
            sizes = batch.column("image_size")
            sizes = sizes.values.slice(sizes.offset * 2, len(sizes) * 2).to_numpy().reshape(-1, 2)
            whole = (
                None
                if self.feature_dim is None
                else _image_box_matrices(batch.column(IMAGE_BOX_FEATURE), self.feature_dim)
            )
            self._batches.append(
                (batch.column("image_id"), sizes, batch.column("checksum").to_numpy(), matrices, whole)
            )
            self._starts.append(start)
            start += batch.num_rows
        if start != self.num_rows:
            raise ValueError(f"its record batches hold {start} rows, its table {self.num_rows}")

    def row(self, row: int) -> tuple[str, np.ndarray, int, dict[str, np.ndarray]]:
        """(stored image id, image size, stored checksum, {field: (regions, width) array}) of row `row`; with the
        whole-image feature column, its `(0 or 1, feature_dim)` matrix last, as `IMAGE_BOX_FEATURE`."""
        index = bisect.bisect_right(self._starts, row) - 1
        ids, sizes, checksums, matrices, whole = self._batches[index]
        row -= self._starts[index]
        arrays = {
            name: values[offsets[row] : offsets[row + 1]] for (name, _), (offsets, values) in zip(self.fields, matrices)
        }
        if whole is not None:
            values, valid = whole
            arrays[IMAGE_BOX_FEATURE] = values[row : row + 1] if valid[row] else values[:0]
        return ids[row].as_py(), sizes[row], int(checksums[row]), arrays


def _image_box_matrices(column: pa.Array, width: int) -> tuple[np.ndarray, np.ndarray]:
    """A fixed_size_list<width> column (null where an image has no whole-image feature) as `(rows, width)` values
    (a null row's are meaningless) and `(rows,)` validity, without copying the values."""
    if isinstance(column, pa.ChunkedArray):
        column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    values = column.values.slice(column.offset * width, len(column) * width)
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    return values.to_numpy(zero_copy_only=False).reshape(-1, width), valid


def _row_checksum(image_id: str, image_size: np.ndarray, matrices: list[np.ndarray]) -> int:
    """xxh3-64 of one stored row: its id, image size and every per-region array, as stored (dtype and all)."""
    digest = xxhash.xxh3_64(image_id.encode())
    digest.update(np.ascontiguousarray(image_size, dtype=np.float64))
    for matrix in matrices:
        digest.update(np.ascontiguousarray(matrix))
    return digest.intdigest()


class _StoredIds(Set):
    """The ids a store holds, looked up in its index (a set-like view; nothing is loaded into memory)."""

    def __init__(self, connection_source):
        self._connection = connection_source

    def __contains__(self, image_id) -> bool:
        if not isinstance(image_id, str):
            return False
        row = self._connection().execute("SELECT 1 FROM images WHERE image_id = ?", (image_id,)).fetchone()
        return row is not None

    def __iter__(self) -> Iterator[str]:
        for (image_id,) in self._connection().execute("SELECT image_id FROM images ORDER BY seq"):
            yield image_id

    def __len__(self) -> int:
        return self._connection().execute("SELECT COUNT(*) FROM images").fetchone()[0]

    def __repr__(self) -> str:
        return f"<{len(self)} stored image ids>"


class RegionStoreWriter:
    """Writes `RegionFeatures` into a store folder, `shard_size` images per shard.

    Use as a context manager (the last, partial shard is written on exit, also after an exception in the
    caller's loop, so finished work is kept)::

        with RegionStoreWriter("features/", shard_size=512) as writer:
            for image_id, regions in ...:
                if image_id not in writer.completed_ids:
                    writer.add(image_id, regions)

    Args:
        directory: the store folder (created if missing; an existing store is continued).
        shard_size: images per shard file.
        feature_dtype: "float32", or "float16" to halve the size (as some of the original releases' feature files do).
        process_index: this writer's index when several processes write one store (e.g.
            `accelerator.process_index`); each process writes its own series of shards.
        row_group_size: images per Arrow record batch inside a shard.
        source: what makes the features (e.g. the extractor's fingerprint and compute dtype, as `vlhub extract`
            states it), JSON values by name. A new store records it in store.json; a store that records another
            source refuses this writer (`StoreSourceMismatchError`), so that one store never mixes two extractions.
            A store that records none (written before sources were kept, or by a writer that stated none) cannot be
            checked: it is continued with a warning, and keeps recording none. A writer that states none (`None`,
            the default) is not checked either: the caller vouches for its features.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        shard_size: int = 512,
        feature_dtype: str = "float32",
        process_index: int = 0,
        row_group_size: int = 64,
        source: Mapping | None = None,
    ) -> None:
        shard_size = check_positive_int(shard_size, "shard_size")
        row_group_size = check_positive_int(row_group_size, "row_group_size")
        if not 0 <= process_index < 100000:
            raise ValueError(f"process_index must be in [0, 99999], got {process_index}")
        if feature_dtype not in _FEATURE_DTYPES:
            raise ValueError(f"feature_dtype must be one of {_FEATURE_DTYPES}, got {feature_dtype!r}")
        self.source = _checked_source(source)
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._series_lock: int | None = None
        self._connection: sqlite3.Connection | None = None
        found = _read_index(self.directory)
        if found is not None and found.version != STORE_VERSION:
            raise ValueError(
                f"{self.directory} is a store of format version {found.version}; continue it after copying it into "
                f"the current layout: vlhub import-features --format vlhub {self.directory} --output NEW_FOLDER"
            )
        self.layout = found.layout if found else None
        if found is not None:
            self._adopt_recorded_source(found.source)
        if self.layout is not None and self.layout.feature_dtype != feature_dtype:
            raise ValueError(
                f"the store in {self.directory} holds {self.layout.feature_dtype} features; open it with "
                f"feature_dtype={self.layout.feature_dtype!r} (got {feature_dtype!r})"
            )
        series_lock = self.directory / f".lock-p{process_index:05d}"
        try:
            self._series_lock = _lock(series_lock, blocking=False)
        except BlockingIOError:
            holder = series_lock.read_text().strip() or "unknown"
            raise StoreLockedError(
                f"another writer (process id {holder}) is writing shard series p{process_index:05d} of the region "
                f"store {self.directory}: two writers of one series would overwrite each other's shards. Give each "
                "process its own process_index, or wait for the other writer to finish."
            ) from None
        os.ftruncate(self._series_lock, 0)
        os.pwrite(self._series_lock, str(os.getpid()).encode(), 0)
        self.shard_size = shard_size
        self.feature_dtype = feature_dtype
        self.process_index = process_index
        self.row_group_size = row_group_size
        self._connection = _connect(self.directory, readonly=False)
        self.completed_ids = _StoredIds(lambda: self._connection)
        self._remove_leftovers()
        self._pending: "OrderedDict[str, RegionFeatures]" = OrderedDict()
        self.written_shards: list[Path] = []

    def _adopt_recorded_source(self, recorded: dict | None) -> None:
        """Check this writer's source against the one the store records (see the class docstring)."""
        _check_same_source(self.directory, recorded, self.source)
        if recorded is None and self.source is not None:
            logger.warning(
                f"the region store {self.directory} records no source (it was written before vlhub kept one, or by a "
                "writer that stated none), so whether its features come from the same extractor and settings cannot "
                "be checked"
            )
        self.source = recorded

    def __enter__(self) -> "RegionStoreWriter":
        return self

    def __exit__(self, *exc_info):
        self.close()

    def _series_prefix(self) -> str:
        return f"shard-p{self.process_index:05d}-"

    def _remove_leftovers(self):
        """What a killed writer of this series left (this writer holds the series' lock, so nobody is writing it)."""
        for leftover in self.directory.glob(f".{self._series_prefix()}*.tmp"):
            logger.warning(
                f"removing {leftover.name} from {self.directory}: a temporary shard an interrupted writer "
                "left unfinished (its images are not in the store and will be written again)"
            )
            leftover.unlink()
        indexed = {
            name
            for (name,) in self._connection.execute(
                "SELECT DISTINCT shard FROM images WHERE shard LIKE ?", (self._series_prefix() + "%",)
            )
        }
        for shard in self.directory.glob(self._series_prefix() + "*.arrow"):
            if shard.name not in indexed:
                logger.warning(
                    f"removing {shard.name} from {self.directory}: an interrupted writer renamed it but "
                    "never indexed it (its images are not in the store and will be written again)"
                )
                shard.unlink()
        for name in indexed:
            if not (self.directory / name).exists():
                logger.warning(
                    f"the index of {self.directory} lists images in {name}, which is missing: they are "
                    "removed from the index and will be written again"
                )
                self._connection.execute("DELETE FROM images WHERE shard = ?", (name,))

    def add(self, image_id: str, regions: RegionFeatures) -> None:
        """Queue one image's regions; a shard is written each time `shard_size` images are queued."""
        if not isinstance(image_id, str) or not image_id:
            raise ValueError(f"image_id must be a non-empty string, got {image_id!r}")
        if not isinstance(regions, RegionFeatures):
            raise TypeError(f"regions must be a vlhub.RegionFeatures, got {type(regions).__name__}")
        if self._connection is None:
            raise ValueError(f"this writer of {self.directory} is closed")
        if image_id in self._pending or image_id in self.completed_ids:
            raise ValueError(f"image {image_id!r} is already in the store {self.directory}; ids must be unique")
        if self.layout is None:
            self._claim_layout(StoreLayout.of(regions, self.feature_dtype))
        self.layout.check(image_id, regions)
        self._pending[image_id] = regions
        if len(self._pending) >= self.shard_size:
            self.flush()

    def flush(self) -> None:
        """Write the queued images as one shard (nothing happens when none are queued).

        Raises `ValueError` naming the ids another process stored meanwhile; the other queued images are written.
        """
        if not self._pending:
            return
        if self._connection is None:
            raise ValueError(f"this writer of {self.directory} is closed")
        path = self._next_shard_path()
        temporary = self.directory / f".{path.name}.{os.getpid()}.tmp"
        refused: list[str] = []
        try:
            self._write_shard(temporary, self._pending)
            connection = self._connection
            connection.execute("BEGIN IMMEDIATE")  # one publisher at a time, across processes
            try:
                refused = [image_id for image_id in self._pending if image_id in self.completed_ids]
                for image_id in refused:
                    del self._pending[image_id]
                if refused and self._pending:
                    self._write_shard(temporary, self._pending)
                if self._pending:
                    connection.executemany(
                        "INSERT INTO images (image_id, shard, row) VALUES (?, ?, ?)",
                        ((image_id, path.name, row) for row, image_id in enumerate(self._pending)),
                    )
                    os.replace(temporary, path)  # the series lock makes `path` this writer's alone
                connection.execute("COMMIT")
            except BaseException:
                connection.execute("ROLLBACK")
                if path.exists() and not refused:
                    path.unlink()  # renamed but not indexed: readers never saw it
                raise
            if self._pending:
                self.written_shards.append(path)
            self._pending.clear()
        finally:
            if temporary.exists():
                temporary.unlink()
        if refused:
            raise ValueError(
                f"image ids {refused} were stored in {self.directory} by another writer while this one queued "
                f"them: they are refused (ids must be unique); {path.name if path.exists() else 'no shard'} holds "
                "the other images of this batch"
            )

    def _next_shard_path(self) -> Path:
        numbers = [
            int(m.group(2))
            for p in self.directory.glob(self._series_prefix() + "*.arrow")
            if (m := _SHARD_PATTERN.match(p.name))
        ]
        return self.directory / f"{self._series_prefix()}{max(numbers, default=-1) + 1:05d}.arrow"

    def _write_shard(self, temporary: Path, pending: "OrderedDict[str, RegionFeatures]"):
        schema = self.layout.arrow_schema()
        items = list(pending.items())
        with pa.OSFile(str(temporary), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            for start in range(0, len(items), self.row_group_size):
                writer.write_batch(self._record_batch(items[start : start + self.row_group_size], schema))
        with open(temporary, "rb+") as handle:  # on disk before it is renamed into the store
            os.fsync(handle.fileno())

    def _record_batch(self, items: list[tuple[str, RegionFeatures]], schema: pa.Schema) -> pa.RecordBatch:
        counts = np.array([len(regions) for _, regions in items])
        offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
        widths = dict(self.layout.matrix_fields())
        dtypes = {
            name: torch.float16 if name == "features" and self.feature_dtype == "float16" else torch.float32
            for name in widths
        }
        # Each image's arrays in their stored dtype, converted once (by PyTorch on this thread: numpy's float16
        # conversion is ~20x slower), for both the column and the row checksum.
        with single_threaded():
            stored = [
                {
                    name: getattr(regions, name).to(dtypes[name]).numpy().reshape(-1, width)
                    for name, width in widths.items()
                }
                for _, regions in items
            ]
            if self.layout.has_image_box_feature:  # last, as the reader checksums it
                for (image_id, regions), arrays in zip(items, stored):
                    arrays[IMAGE_BOX_FEATURE] = self.layout.image_box_feature(image_id, regions)

        def flat(name: str) -> pa.Array:
            return pa.array(np.concatenate([arrays[name] for arrays in stored]).reshape(-1))

        def matrices(name: str) -> pa.Array:
            return pa.ListArray.from_arrays(offsets, pa.FixedSizeListArray.from_arrays(flat(name), widths[name]))

        columns = {
            "image_id": pa.array([image_id for image_id, _ in items], pa.string()),
            "features": matrices("features"),
            "boxes": matrices("boxes"),
            "image_size": pa.FixedSizeListArray.from_arrays(
                pa.array(np.array([[float(v) for v in regions.image_size] for _, regions in items]).reshape(-1)), 2
            ),
        }
        if self.layout.has_scores:
            columns["scores"] = pa.ListArray.from_arrays(offsets, flat("scores"))
        if self.layout.num_classes is not None:
            columns["class_probs"] = matrices("class_probs")
        if self.layout.num_attributes is not None:
            columns["attribute_probs"] = matrices("attribute_probs")
        if self.layout.has_image_box_feature:
            whole = [arrays[IMAGE_BOX_FEATURE] for arrays in stored]
            dim, dtype = self.layout.feature_dim, np.dtype(self.feature_dtype)
            values = np.concatenate([w if len(w) else np.zeros((1, dim), dtype) for w in whole]).reshape(-1)
            columns[IMAGE_BOX_FEATURE] = pa.FixedSizeListArray.from_arrays(
                pa.array(values), dim, mask=pa.array([not len(w) for w in whole])
            )
        columns["checksum"] = pa.array(
            [
                _row_checksum(image_id, np.array(regions.image_size, dtype=np.float64), list(arrays.values()))
                for (image_id, regions), arrays in zip(items, stored)
            ],
            pa.uint64(),
        )
        return pa.record_batch([columns[field.name] for field in schema], schema=schema)

    def _claim_layout(self, layout: StoreLayout):
        """Write store.json for the first image, unless another writer of this store did meanwhile (then its
        layout is this store's, and `add` checks the image against it)."""
        self._connection.execute("BEGIN IMMEDIATE")  # the index's write lock serialises writers of store.json too
        try:
            found = _read_index(self.directory)
            if found is None:
                index = {"format": STORE_FORMAT, "version": STORE_VERSION, "layout": layout.to_dict()}
                if self.source is not None:
                    index["source"] = self.source
                atomic_write_json(self.directory / STORE_INDEX_FILE, index, indent=2)
                self.layout = layout
            else:
                self.layout = found.layout
                self._adopt_recorded_source(found.source)
        finally:
            self._connection.execute("COMMIT")

    def close(self) -> None:
        """Write the last, partial shard and release the series lock (also when that write fails)."""
        try:
            if self._connection is not None:
                self.flush()
        finally:
            self._release()

    def _release(self):
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        if self._series_lock is not None:
            os.close(self._series_lock)
            self._series_lock = None

    def __del__(self):
        if getattr(self, "_series_lock", None) is not None:
            self._release()


class RegionStore:
    """Read access to a store folder by image id: `store[image_id]` → `RegionFeatures`.

    Opening reads `store.json` only; each lookup is one index query and a zero-copy slice of a memory-mapped shard.
    Safe to use from DataLoader workers: the index connection and the memory maps are opened again in each process.
    `dataset` / `streaming_dataset` give the `datasets` views.

    Args:
        directory: the store folder.
        max_open_shards: memory-mapped shards kept open per process (least recently used are closed); each holds a
            file descriptor. Default: a quarter of the process's open-file limit (256 under the common limit of 1,024;
            every shard of a store of millions of images once `vlhub.utils.resources.raise_open_file_limit` has
            raised it, as the training scripts do). Reopening a shard costs milliseconds, so random reads slow down
            badly when a store has more shards than this.
    """

    def __init__(self, directory: str | os.PathLike, max_open_shards: int | None = None) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise FileNotFoundError(f"no region store folder at {self.directory}")
        found = _read_index(self.directory)
        if found is None:
            raise FileNotFoundError(
                f"{self.directory} has no {STORE_INDEX_FILE}: it is not a vlhub region store (write one with "
                "RegionStoreWriter or `vlhub extract`)"
            )
        self.layout, self.version, self.source = found
        if max_open_shards is not None and max_open_shards < 1:
            raise ValueError(f"max_open_shards must be at least 1 (or None for the default), got {max_open_shards}")
        self.max_open_shards = max_open_shards
        self._v1 = _ParquetStoreV1(self.directory) if self.version == 1 else None
        if self._v1 is None and not (self.directory / ID_INDEX_FILE).exists():
            raise FileNotFoundError(
                f"the region store {self.directory} has no {ID_INDEX_FILE} (its id index): no "
                "image was ever published to it"
            )
        self._process: int | None = None

    # -- per-process handles (a DataLoader worker gets its own after fork or spawn) ---------------------------------
    def _handles(self):
        if self._process != os.getpid():
            self._db = _connect(self.directory, readonly=True)
            self._shards: "OrderedDict[str, _ShardColumns]" = OrderedDict()
            self._process = os.getpid()
        return self._db

    def __getstate__(self):
        state = dict(self.__dict__)
        for name in ("_db", "_shards"):
            state.pop(name, None)
        state["_process"] = None
        return state

    def _shard(self, name: str) -> "_ShardColumns":
        shards = self._shards
        if name in shards:
            shards.move_to_end(name)
            return shards[name]
        path = self.directory / name
        try:
            table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
            # Offsets and lengths are checked once per shard and process (it touches no feature values): a damaged
            # offset must be an error here, not an out-of-bounds read in a later slice.
            table.validate(full=True)
        except (OSError, pa.ArrowException) as err:
            raise ValueError(f"shard {path} of the region store cannot be read ({err}): it is damaged") from err
        if not table.schema.equals(self.layout.arrow_schema()):
            raise ValueError(
                f"shard {path} of the region store does not hold this store's columns (it has "
                f"{table.schema.names}): it is damaged or comes from another store"
            )
        try:
            columns = _ShardColumns(table, self.layout)
        except (pa.ArrowException, ValueError, IndexError, TypeError) as err:
            raise ValueError(f"shard {path} of the region store cannot be read ({err}): it is damaged") from err
        shards[name] = columns
        if len(shards) > (self.max_open_shards or _default_open_shards()):
            shards.popitem(last=False)
        return columns

    # -- mapping interface ---------------------------------------------------------------------------------------
    @property
    def ids(self) -> list[str]:
        return list(self)

    def __len__(self) -> int:
        if self._v1 is not None:
            return len(self._v1.location)
        return self._handles().execute("SELECT COUNT(*) FROM images").fetchone()[0]

    def __contains__(self, image_id) -> bool:
        if self._v1 is not None:
            return image_id in self._v1.location
        if not isinstance(image_id, str):
            return False
        return self._handles().execute("SELECT 1 FROM images WHERE image_id = ?", (image_id,)).fetchone() is not None

    def __iter__(self) -> Iterator[str]:
        if self._v1 is not None:
            return iter(list(self._v1.location))
        return (image_id for (image_id,) in self._handles().execute("SELECT image_id FROM images ORDER BY seq"))

    def __getitem__(self, image_id: str) -> RegionFeatures:
        if self._v1 is not None:
            shard, table = self._v1.row(image_id)
        else:
            found = (
                self._handles().execute("SELECT shard, row FROM images WHERE image_id = ?", (image_id,)).fetchone()
                if isinstance(image_id, str)
                else None
            )
            if found is None:
                raise KeyError(f"image {image_id!r} is not in the region store {self.directory}")
            shard, row = found
            columns = self._shard(shard)
            if row >= columns.num_rows:
                raise ValueError(
                    f"region store shard {self.directory / shard} has {columns.num_rows} images but the "
                    f"index puts image {image_id!r} at row {row}: the shard is damaged or was replaced"
                )
            return self._decode(image_id, *columns.row(row), shard)
        return self._regions(image_id, table, shard)

    def get(self, image_id: str, default: RegionFeatures | None = None) -> RegionFeatures | None:
        return self[image_id] if image_id in self else default

    def decode_row(self, table: pa.Table, shard: str = "(streamed)") -> RegionFeatures:
        """A one-row slice of one of this store's shards (as `streaming_dataset(...).with_format("arrow")` yields
        them) as `RegionFeatures`, its checksum verified; `shard` names where it came from in errors."""
        try:
            image_id = table.column("image_id")[0].as_py()
        except (pa.ArrowException, KeyError, IndexError) as err:
            raise ValueError(f"a row of region store shard {self.directory / shard} has no image id: {err}") from err
        return self._regions(image_id, table, shard)

    def _regions(self, image_id: str, table: pa.Table, shard: str) -> RegionFeatures:
        """The image of a one-row slice of a shard (a streamed row, or a version-1 row group's row)."""
        try:
            arrays = {name: _column_matrix(table.column(name), width) for name, width in self.layout.matrix_fields()}
            if self.layout.has_image_box_feature:
                values, valid = _image_box_matrices(table.column(IMAGE_BOX_FEATURE), self.layout.feature_dim)
                arrays[IMAGE_BOX_FEATURE] = values[:1] if valid[0] else values[:0]
            size = np.asarray(table.column("image_size")[0].as_py(), dtype=np.float64)
            stored_id = table.column("image_id")[0].as_py()
            expected = table.column("checksum")[0].as_py() if self._v1 is None else None
        except (pa.ArrowException, ValueError, IndexError, TypeError, KeyError) as err:
            raise ValueError(
                f"cannot read image {image_id!r} from region store shard {self.directory / shard}: it "
                f"is damaged ({err})"
            ) from err
        return self._decode(image_id, stored_id, size, expected, arrays, shard)

    def _decode(
        self,
        image_id: str,
        stored_id: str,
        size: np.ndarray,
        expected: int | None,
        arrays: dict[str, np.ndarray],
        shard: str,
    ) -> RegionFeatures:
        """One stored row's arrays (as stored: `(regions, width)` each, in `matrix_fields` order), checked against
        its id and checksum (`expected`; None for a version-1 store, which has none), as `RegionFeatures`."""
        layout = self.layout
        checksummed = list(arrays.values())
        whole = arrays.pop(IMAGE_BOX_FEATURE, None)
        lengths = {len(array) for array in arrays.values()}
        damaged = stored_id != image_id or len(lengths) != 1 or size.shape != (2,)
        if not damaged and expected is not None:
            damaged = _row_checksum(stored_id, size, checksummed) != expected
        if damaged:
            raise ValueError(
                f"image {image_id!r} in region store shard {self.directory / shard} is damaged (its bytes differ from "
                "what was written: checksum mismatch). Restore the shard, or delete it and run the writer again: its "
                "images are then written anew"
            )
        # Validated when written; a version-1 store was too, with the same rules.
        regions = RegionFeatures.from_validated(
            features=float32_tensor(arrays.pop("features")),
            boxes=float32_tensor(arrays.pop("boxes")),
            image_size=tuple(int(v) if float(v).is_integer() else float(v) for v in size),
            **{
                name: float32_tensor(array.reshape(-1) if name == "scores" else array) for name, array in arrays.items()
            },
        )
        regions.metadata["image_id"] = image_id
        if whole is not None and len(whole):
            regions.metadata[IMAGE_BOX_FEATURE] = whole.reshape(-1).astype(np.float32)  # as the readers give it
        if layout.feature_dtype == "float16":
            regions.metadata[FLOAT16_FEATURES] = True
        return regions

    def summary(self) -> dict:
        """What the store holds, for a person or a script (`vlhub store-info`): its folder, format version, image and
        shard counts, the shards' bytes on disk, its layout and its source (None: not recorded)."""
        shards = self.shard_files
        return {
            "folder": str(self.directory),
            "format_version": self.version,
            "images": len(self),
            "shards": len(shards),
            "bytes": sum(path.stat().st_size for path in shards),
            "layout": self.layout.to_dict(),
            "source": self.source,
        }

    # -- datasets views ------------------------------------------------------------------------------------------
    @property
    def shard_files(self) -> list[Path]:
        """The published shards (a shard renamed by a writer killed before indexing it is not one)."""
        if self._v1 is not None:
            return list(self._v1.shard_files)
        names = [name for (name,) in self._handles().execute("SELECT DISTINCT shard FROM images")]
        return sorted(self.directory / name for name in names)

    @property
    def dataset(self) -> datasets.Dataset:
        """All shards as one `datasets.Dataset` (prepared into the `datasets` cache on first use)."""
        with _quiet_datasets():
            return datasets.load_dataset(
                "arrow" if self._v1 is None else "parquet",
                data_files=[str(p) for p in self.shard_files],
                split="train",
                features=self.layout.datasets_features(),
            )

    @staticmethod
    def streaming_dataset(directory: str | os.PathLike) -> datasets.IterableDataset:
        """The shards as a streaming `datasets.IterableDataset` (nothing is copied or cached)."""
        store = RegionStore(directory)
        return datasets.load_dataset(
            "arrow" if store._v1 is None else "parquet",
            data_files=[str(p) for p in store.shard_files],
            split="train",
            streaming=True,
            features=store.layout.datasets_features(),
        )


class _quiet_datasets:
    """Silence `datasets`' progress bars inside the block."""

    def __enter__(self):
        self.was_enabled = datasets.utils.logging.is_progress_bar_enabled()
        datasets.utils.logging.disable_progress_bar()

    def __exit__(self, *exc):
        if self.was_enabled:
            datasets.utils.logging.enable_progress_bar()


class _ParquetStoreV1:
    """Read-only access to a format-version-1 store (Parquet shards, no id index): kept so that old stores still
    open; every open scans all row groups and every lookup decodes a whole row group."""

    def __init__(self, directory: Path):
        warnings.warn(
            f"{directory} is a version-1 region store (Parquet): slow to open and to read at random. Copy "
            f"it into the current layout with `vlhub import-features --format vlhub {directory} --output "
            "NEW_FOLDER`",
            stacklevel=3,
        )
        self.shard_files = sorted(p for p in directory.iterdir() if _V1_SHARD_PATTERN.match(p.name))
        self.location: dict[str, tuple[int, int, int]] = {}
        for number, shard in enumerate(self.shard_files):
            with named_input(shard, "a Parquet shard of a version-1 region store", "it is damaged"):
                parquet = pq.ParquetFile(shard)
                groups = [
                    parquet.read_row_group(group, columns=["image_id"]).column("image_id").to_pylist()
                    for group in range(parquet.metadata.num_row_groups)
                ]
            for group, ids in enumerate(groups):
                for row, image_id in enumerate(ids):
                    if image_id in self.location:
                        raise ValueError(f"image {image_id!r} is stored twice in {directory}")
                    self.location[image_id] = (number, group, row)

    def row(self, image_id: str) -> tuple[str, pa.Table]:
        try:
            number, group, row = self.location[image_id]
        except KeyError:
            raise KeyError(f"image {image_id!r} is not in the region store {self.shard_files[0].parent}") from None
        shard = self.shard_files[number]
        try:
            return shard.name, pq.ParquetFile(shard).read_row_group(group).slice(row, 1)
        except (pa.ArrowException, OSError) as err:
            raise ValueError(
                f"cannot read image {image_id!r} from region store shard {shard}: it is damaged ({err})"
            ) from err


def stored_image_ids(directory: str | os.PathLike) -> set[str]:
    """The ids a store folder holds (empty when there is no store yet), read without taking any writer's lock."""
    directory = Path(directory)
    found = _read_index(directory)
    if found is None or (found.version == STORE_VERSION and not (directory / ID_INDEX_FILE).exists()):
        return set()  # no store yet, or one no image was ever published to
    return set(RegionStore(directory))


def recorded_source(directory: str | os.PathLike) -> dict | None:
    """The source (extractor and settings) the store at `directory` records; None where there is no store yet or it
    records none (see `RegionStoreWriter`)."""
    found = _read_index(Path(directory))
    return None if found is None else found.source


def check_store_source(directory: str | os.PathLike, source: Mapping) -> None:
    """Raise `StoreSourceMismatchError` where the store at `directory` records another source than `source`, as a
    `RegionStoreWriter` stating it would: to refuse before any work, not at the first write."""
    _check_same_source(Path(directory), recorded_source(directory), _checked_source(source))


def import_features(
    reader: Mapping[str, RegionFeatures],
    output: str | os.PathLike,
    shard_size: int = 512,
    feature_dtype: str = "float32",
    progress: bool = True,
    source: Mapping | None = None,
) -> int:
    """Copy every image of a reader (any `open_feature_file` reader, a `RegionStore`, or a mapping id →
    RegionFeatures) into the vlhub store at `output`; images already there are skipped, so an interrupted import can
    be rerun. Returns the number of images written.

    `source` (what made the features, e.g. `{"imported_from": "butd-tsv"}`) is recorded and checked as
    `RegionStoreWriter` does; by default a copied `RegionStore` keeps the source it records."""
    from tqdm.auto import tqdm

    if source is None and isinstance(reader, RegionStore):
        source = reader.source
    written = 0
    not_kept: set[str] = set()
    with RegionStoreWriter(output, shard_size=shard_size, feature_dtype=feature_dtype, source=source) as writer:
        for image_id in tqdm(list(reader), desc="importing", unit="img", disable=not progress):
            if image_id not in writer.completed_ids:
                regions = reader[image_id]
                writer.add(image_id, regions)
                kept = ("image_id", IMAGE_BOX_FEATURE) if writer.layout.has_image_box_feature else ("image_id",)
                not_kept.update(k for k in regions.metadata if k not in kept and not k.startswith("vlhub_"))
                written += 1
    if not_kept:  # e.g. a whole-image feature of a store whose first image had none: the processor then averages
        logger.warning(
            f"the region store at {output} keeps features, boxes, image sizes, detector outputs and a "
            f"whole-image feature of every image if its first has one; the "
            f"source's other per-image fields {sorted(not_kept)} were not imported"
        )
    return written
