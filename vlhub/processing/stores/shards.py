"""vlhub's own region store: Parquet shards that `datasets` can load and stream, keyed by image id.

Layout of a store folder::

    store.json                                   format version and the column layout (feature size, dtypes, ...)
    shard-p00000-00000.parquet                   rows: image_id, features, boxes, image_size [, scores,
    shard-p00000-00001.parquet                         class_probs, attribute_probs]
    shard-p00001-00000.parquet                   (one series of shards per writing process)

A shard is written under a temporary name and renamed when complete, so an interrupted write never leaves a
file that reads as a finished shard; a writer reopened on the same folder skips nothing silently: it reports
the ids already stored (`completed_ids`) and refuses to store an id twice.

`datasets` sees the shards as a plain Parquet dataset with typed columns (`Array2D` features), e.g.
`datasets.load_dataset("parquet", data_files=RegionStore(folder).shard_files, streaming=True)`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections import OrderedDict
from pathlib import Path
from typing import Iterator

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..regions import RegionFeatures, check_float16_range

__all__ = ["RegionStore", "RegionStoreWriter", "StoreLayout", "import_features"]

STORE_FORMAT = "vlhub-region-store"
STORE_VERSION = 1
STORE_INDEX_FILE = "store.json"
_SHARD_PATTERN = re.compile(r"^shard-p(\d{5})-(\d{5})\.parquet$")
_OPTIONAL_FIELDS = ("scores", "class_probs", "attribute_probs")
_FEATURE_DTYPES = ("float32", "float16")


class StoreLayout:
    """Which columns a store holds and their sizes; every image of a store shares one layout."""

    def __init__(
        self,
        feature_dim: int,
        feature_dtype: str = "float32",
        has_scores: bool = False,
        num_classes: int | None = None,
        num_attributes: int | None = None,
    ):
        if feature_dtype not in _FEATURE_DTYPES:
            raise ValueError(f"feature_dtype must be one of {_FEATURE_DTYPES}, got {feature_dtype!r}")
        self.feature_dim = int(feature_dim)
        self.feature_dtype = feature_dtype
        self.has_scores = bool(has_scores)
        self.num_classes = None if num_classes is None else int(num_classes)
        self.num_attributes = None if num_attributes is None else int(num_attributes)

    @classmethod
    def of(cls, regions: RegionFeatures, feature_dtype: str = "float32") -> "StoreLayout":
        return cls(
            feature_dim=regions.feature_dim,
            feature_dtype=feature_dtype,
            has_scores=regions.scores is not None,
            num_classes=None if regions.class_probs is None else regions.class_probs.shape[1],
            num_attributes=None if regions.attribute_probs is None else regions.attribute_probs.shape[1],
        )

    def to_dict(self) -> dict:
        return {
            "feature_dim": self.feature_dim,
            "feature_dtype": self.feature_dtype,
            "has_scores": self.has_scores,
            "num_classes": self.num_classes,
            "num_attributes": self.num_attributes,
        }

    def __eq__(self, other) -> bool:
        return isinstance(other, StoreLayout) and self.to_dict() == other.to_dict()

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.to_dict().items())

    def check(self, image_id: str, regions: RegionFeatures):
        """Raise when `regions` does not fit this layout (the shards' schema cannot hold it)."""
        found = StoreLayout.of(regions, self.feature_dtype)
        if found != self:
            raise ValueError(
                f"regions of image {image_id!r} do not match this store's layout: the store holds "
                f"({self.describe()}) but these regions have ({found.describe()})"
            )

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
        return datasets.Features(columns)


def _read_index(directory: Path) -> StoreLayout | None:
    path = directory / STORE_INDEX_FILE
    if not path.exists():
        return None
    try:
        index = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); it should describe a vlhub region store") from err
    if index.get("format") != STORE_FORMAT:
        raise ValueError(f"{path} does not describe a vlhub region store (format={index.get('format')!r})")
    if index.get("version") != STORE_VERSION:
        raise ValueError(f"{path} is store format version {index.get('version')}; this vlhub reads {STORE_VERSION}")
    return StoreLayout(**index["layout"])


def _write_atomically(path: Path, write):
    """Write through a temporary file in the same folder, then rename: readers see all or nothing."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()


def _shard_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if _SHARD_PATTERN.match(p.name))


def _stored_ids(shard: Path) -> list[str]:
    with _reading_shard(shard):
        table = pq.read_table(shard, columns=["image_id"], page_checksum_verification=True)
        return table.column("image_id").to_pylist()


@contextlib.contextmanager
def _quiet_datasets():
    was_enabled = datasets.utils.logging.is_progress_bar_enabled()
    datasets.utils.logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            datasets.utils.logging.enable_progress_bar()


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
        feature_dtype: "float32", or "float16" to halve the size (as UNITER's released stores do).
        process_index: this writer's index when several processes write one store (e.g.
            `accelerator.process_index`); each process writes its own series of shards.
        row_group_size: rows per Parquet row group, the unit `RegionStore` reads for one image.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        shard_size: int = 512,
        feature_dtype: str = "float32",
        process_index: int = 0,
        row_group_size: int = 16,
    ):
        if shard_size < 1:
            raise ValueError(f"shard_size must be at least 1, got {shard_size}")
        if not 0 <= process_index < 100000:
            raise ValueError(f"process_index must be in [0, 99999], got {process_index}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.shard_size = shard_size
        self.feature_dtype = feature_dtype
        self.process_index = process_index
        self.row_group_size = row_group_size
        self.layout = _read_index(self.directory)
        if self.layout is not None and self.layout.feature_dtype != feature_dtype:
            raise ValueError(
                f"the store in {self.directory} holds {self.layout.feature_dtype} features; open it with "
                f"feature_dtype={self.layout.feature_dtype!r} (got {feature_dtype!r})"
            )
        shards = _shard_files(self.directory)
        self.completed_ids: set[str] = set()
        for shard in shards:
            self.completed_ids.update(_stored_ids(shard))
        mine = [int(_SHARD_PATTERN.match(p.name).group(2)) for p in shards]
        mine = [n for p, n in zip(shards, mine) if int(_SHARD_PATTERN.match(p.name).group(1)) == process_index]
        self._next_shard = max(mine, default=-1) + 1
        self._pending: "OrderedDict[str, RegionFeatures]" = OrderedDict()
        self.written_shards: list[Path] = []

    def __enter__(self) -> "RegionStoreWriter":
        return self

    def __exit__(self, *exc_info):
        self.close()

    def add(self, image_id: str, regions: RegionFeatures):
        """Queue one image's regions; a shard is written each time `shard_size` images are queued."""
        if not isinstance(image_id, str) or not image_id:
            raise ValueError(f"image_id must be a non-empty string, got {image_id!r}")
        if not isinstance(regions, RegionFeatures):
            raise TypeError(f"regions must be a vlhub.RegionFeatures, got {type(regions).__name__}")
        if image_id in self.completed_ids or image_id in self._pending:
            raise ValueError(f"image {image_id!r} is already in the store {self.directory}; ids must be unique")
        if self.layout is None:
            self.layout = StoreLayout.of(regions, self.feature_dtype)
            self._write_index()
        self.layout.check(image_id, regions)
        if self.feature_dtype == "float16":  # refused now: written as inf, the row could never be read back
            check_float16_range(regions.features, f"features of image {image_id!r}")
        self._pending[image_id] = regions
        if len(self._pending) >= self.shard_size:
            self.flush()

    def flush(self):
        """Write the queued images as one shard (nothing happens when none are queued)."""
        if not self._pending:
            return
        path = self.directory / f"shard-p{self.process_index:05d}-{self._next_shard:05d}.parquet"
        columns = self._columns(self._pending)
        dataset = datasets.Dataset.from_dict(columns, features=self.layout.datasets_features())

        def write(temporary: Path):
            with _quiet_datasets():
                # page checksums: a flipped byte in a shard is an error when read, not silently different features
                dataset.to_parquet(str(temporary), batch_size=self.row_group_size, write_page_checksum=True)

        _write_atomically(path, write)
        self.completed_ids.update(self._pending)
        self._pending.clear()
        self._next_shard += 1
        self.written_shards.append(path)

    def close(self):
        self.flush()

    def _columns(self, pending: "OrderedDict[str, RegionFeatures]") -> dict:
        dtype = np.float16 if self.feature_dtype == "float16" else np.float32
        columns = {
            "image_id": list(pending),
            "features": [r.features.numpy().astype(dtype) for r in pending.values()],
            "boxes": [r.boxes.numpy() for r in pending.values()],
            "image_size": [[float(v) for v in r.image_size] for r in pending.values()],
        }
        if self.layout.has_scores:
            columns["scores"] = [r.scores.numpy() for r in pending.values()]
        if self.layout.num_classes is not None:
            columns["class_probs"] = [r.class_probs.numpy() for r in pending.values()]
        if self.layout.num_attributes is not None:
            columns["attribute_probs"] = [r.attribute_probs.numpy() for r in pending.values()]
        return columns

    def _write_index(self):
        index = {"format": STORE_FORMAT, "version": STORE_VERSION, "layout": self.layout.to_dict()}
        _write_atomically(self.directory / STORE_INDEX_FILE, lambda p: p.write_text(json.dumps(index, indent=2)))


def _array2d(column: pa.ChunkedArray | pa.Array, width: int) -> np.ndarray:
    """The one row of an `Array2D` column (extension or plain list<list<>>) as an `(rows, width)` array."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if isinstance(column, pa.ExtensionArray):
        column = column.storage
    values = column.flatten().flatten().to_numpy(zero_copy_only=False)
    return values.reshape(-1, width)


class RegionStore:
    """Read access to a store folder by image id: `store[image_id]` → `RegionFeatures`.

    Reads one Parquet row group per lookup (recently read groups are cached), so random access stays cheap
    for stores much larger than memory. `dataset` / `streaming_dataset` give the `datasets` views.
    """

    def __init__(self, directory: str | os.PathLike, cache_row_groups: int = 8):
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise FileNotFoundError(f"no region store folder at {self.directory}")
        self.layout = _read_index(self.directory)
        if self.layout is None:
            raise FileNotFoundError(
                f"{self.directory} has no {STORE_INDEX_FILE}: it is not a vlhub region store (write one with "
                "RegionStoreWriter or `vlhub extract`)"
            )
        self.shard_files = _shard_files(self.directory)
        self._location: dict[str, tuple[int, int, int]] = {}
        for shard_number, shard in enumerate(self.shard_files):
            with _reading_shard(shard):
                parquet = pq.ParquetFile(shard, page_checksum_verification=True)
                groups = [parquet.read_row_group(g, columns=["image_id"]).column("image_id").to_pylist()
                          for g in range(parquet.metadata.num_row_groups)]
            for group, ids in enumerate(groups):
                for row, image_id in enumerate(ids):
                    if image_id in self._location:
                        raise ValueError(f"image {image_id!r} is stored twice in {self.directory}")
                    self._location[image_id] = (shard_number, group, row)
        self._cache: "OrderedDict[tuple[int, int], pa.Table]" = OrderedDict()
        self._cache_size = cache_row_groups

    def __len__(self) -> int:
        return len(self._location)

    def __contains__(self, image_id) -> bool:
        return image_id in self._location

    def __iter__(self) -> Iterator[str]:
        return iter(self._location)

    @property
    def ids(self) -> list[str]:
        return list(self._location)

    def __getitem__(self, image_id: str) -> RegionFeatures:
        try:
            shard_number, group, row = self._location[image_id]
        except KeyError:
            raise KeyError(f"image {image_id!r} is not in the region store {self.directory}") from None
        with _reading_shard(self.shard_files[shard_number], image_id):
            table = self._row_group(shard_number, group).slice(row, 1)
            layout = self.layout
            fields = {
                "features": _array2d(table.column("features"), layout.feature_dim).astype(np.float32),
                "boxes": _array2d(table.column("boxes"), 4),
                "image_size": tuple(table.column("image_size")[0].as_py()),
            }
            if layout.has_scores:
                fields["scores"] = np.asarray(table.column("scores")[0].as_py(), dtype=np.float32)
            if layout.num_classes is not None:
                fields["class_probs"] = _array2d(table.column("class_probs"), layout.num_classes)
            if layout.num_attributes is not None:
                fields["attribute_probs"] = _array2d(table.column("attribute_probs"), layout.num_attributes)
            regions = RegionFeatures.from_dict(fields)
        regions.metadata["image_id"] = image_id
        return regions

    def get(self, image_id: str, default=None):
        return self[image_id] if image_id in self else default

    def _row_group(self, shard_number: int, group: int) -> pa.Table:
        key = (shard_number, group)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        table = pq.ParquetFile(self.shard_files[shard_number], page_checksum_verification=True).read_row_group(group)
        self._cache[key] = table
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return table

    @property
    def dataset(self) -> datasets.Dataset:
        """All shards as one `datasets.Dataset` (prepared into the `datasets` cache on first use)."""
        with _quiet_datasets():
            return datasets.load_dataset(
                "parquet", data_files=[str(p) for p in self.shard_files], split="train",
                features=self.layout.datasets_features(),
            )

    @staticmethod
    def streaming_dataset(directory: str | os.PathLike) -> datasets.IterableDataset:
        """The shards as a streaming `datasets.IterableDataset` (nothing is copied or cached)."""
        store = Path(directory)
        layout = _read_index(store)
        if layout is None:
            raise FileNotFoundError(f"{store} has no {STORE_INDEX_FILE}: it is not a vlhub region store")
        return datasets.load_dataset(
            "parquet", data_files=[str(p) for p in _shard_files(store)], split="train", streaming=True,
            features=layout.datasets_features(),
        )


def import_features(reader, output, shard_size: int = 512, feature_dtype: str = "float32", progress: bool = True) -> int:
    """Copy every image of a reader (any `open_feature_file` reader, or a mapping id → RegionFeatures) into the
    vlhub store at `output`; images already there are skipped, so an interrupted import can be rerun. Returns
    the number of images written."""
    from tqdm.auto import tqdm

    written = 0
    with RegionStoreWriter(output, shard_size=shard_size, feature_dtype=feature_dtype) as writer:
        for image_id in tqdm(list(reader), desc="importing", unit="img", disable=not progress):
            if image_id not in writer.completed_ids:
                writer.add(image_id, reader[image_id])
                written += 1
    return written


@contextlib.contextmanager
def _reading_shard(shard: Path, image_id: str | None = None):
    """Name the shard (and image) in any error from reading it: a damaged shard must not surface as an anonymous
    Arrow error. A shard that vanished stays a FileNotFoundError."""
    try:
        yield
    except FileNotFoundError:
        raise
    except (pa.ArrowException, OSError, ValueError, KeyError) as err:
        what = f"image {image_id!r} from " if image_id is not None else ""
        raise ValueError(
            f"cannot read {what}region store shard {shard}: it is truncated or corrupt ({err}). Restore the shard, or "
            "delete it: its images are then missing from the store and a resumed writer computes them again"
        ) from err
