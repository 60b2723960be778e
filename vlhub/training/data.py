"""Where training data comes from: the embedded shapes world, a `datasets` dataset, or a region store + captions.

Every source ends as a `CaptionCorpus` — `(image_id, caption)` pairs per split plus a mapping image_id →
`RegionFeatures` — or, for VQA, question rows plus the same mapping. The model never knows which source it was.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..processing.processor_base import check_text
from ..processing.regions import RegionFeatures
from ..utils.errors import VlhubUserError, named_input, one_line

if TYPE_CHECKING:
    import datasets
    import pyarrow as pa

    from ..data.shapes import ShapesWorld
    from ..processing.stores import RegionStore

__all__ = [
    "CaptionCorpus",
    "RegionCache",
    "DEFAULT_REGION_CACHE_MB",
    "InlineRegions",
    "load_caption_corpus",
    "load_table",
    "open_region_source",
    "shapes_world",
    "shapes_region_store",
    "shapes_store_key",
    "cached_shapes_world",
    "caption_pairs",
    "SHAPES",
    "default_cache_dir",
]

logger = logging.getLogger(__name__)

SHAPES = "shapes"
_CAPTION_COLUMNS = ("caption", "text", "sentence")
_INLINE_REGION_COLUMNS = ("features", "boxes", "image_size")


def default_cache_dir() -> Path:
    """`$VLHUB_CACHE`, else `$HF_HOME/vlhub`, else `~/.cache/vlhub` (region stores of the shapes world live here)."""
    if os.environ.get("VLHUB_CACHE"):
        return Path(os.environ["VLHUB_CACHE"])
    hf_home = os.environ.get("HF_HOME")
    return Path(hf_home) / "vlhub" if hf_home else Path.home() / ".cache" / "vlhub"


DEFAULT_REGION_CACHE_MB = 256


class RegionCache(Mapping):
    """The most recently read `RegionFeatures` of a store, bounded in bytes (per process).

    Training revisits every image each epoch in a new order, so a cache can only help a data set that fits in it;
    beyond that the OS page cache over the store's memory-mapped shards does the work. The bound keeps a process's
    memory independent of how many images it has read.

    Args:
        store: image_id → RegionFeatures (a `RegionStore`, ...).
        max_bytes: the cache's size bound; 0 disables caching.
    """

    def __init__(self, store: Mapping[str, RegionFeatures], max_bytes: int = DEFAULT_REGION_CACHE_MB << 20) -> None:
        if max_bytes < 0:
            raise ValueError(f"the region cache size must be >= 0 bytes, got {max_bytes}")
        self.store = store
        self.max_bytes = max_bytes
        self._cache: "OrderedDict[str, tuple[RegionFeatures, int]]" = OrderedDict()
        self.cached_bytes = 0

    def __getitem__(self, image_id: str) -> RegionFeatures:
        entry = self._cache.get(image_id)
        if entry is not None:
            self._cache.move_to_end(image_id)
            return entry[0]
        regions = self.store[image_id]
        size = _nbytes(regions)
        if 0 < size <= self.max_bytes:
            self._cache[image_id] = (regions, size)
            self.cached_bytes += size
            while self.cached_bytes > self.max_bytes:
                _, (_, evicted) = self._cache.popitem(last=False)
                self.cached_bytes -= evicted
        return regions

    def __iter__(self) -> Iterator[str]:
        return iter(self.store)

    def __len__(self) -> int:
        return len(self.store)

    def __contains__(self, image_id) -> bool:
        return image_id in self._cache or image_id in self.store

    def __getstate__(self):
        # A DataLoader worker starts with an empty cache of its own rather than a copy of the parent's.
        state = dict(self.__dict__)
        state["_cache"], state["cached_bytes"] = OrderedDict(), 0
        return state


def _nbytes(regions: RegionFeatures) -> int:
    tensors = (regions.features, regions.boxes, regions.class_probs, regions.scores, regions.attribute_probs)
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class InlineRegions(Mapping):
    """Regions stored as columns of a `datasets.Dataset` (`features`, `boxes`, `image_size`, optionally `scores`,
    `class_probs`, `attribute_probs`), one row per image, looked up by its `image_id` column."""

    def __init__(self, dataset: datasets.Dataset, id_column: str = "image_id") -> None:
        self.dataset = dataset.with_format("numpy")
        self.index = {image_id: row for row, image_id in enumerate(dataset[id_column])}

    def __getitem__(self, image_id: str) -> RegionFeatures:
        row = self.dataset[self.index[image_id]]
        return RegionFeatures.from_dict(
            {k: row[k] for k in row if k in (*_INLINE_REGION_COLUMNS, "scores", "class_probs", "attribute_probs")}
        )

    def __iter__(self):
        return iter(self.index)

    def __len__(self):
        return len(self.index)


@dataclass
class CaptionCorpus:
    """Captions per split (sequences of `(image_id, caption)`, e.g. `CaptionPairs`) and the regions of their images;
    `contradict`, when the data knows its images' contents, makes a caption false of an image (hard ITM negatives)."""

    train: Sequence[tuple[str, str]]
    validation: Sequence[tuple[str, str]]
    regions: Mapping[str, RegionFeatures]
    name: str
    description: str
    extras: dict = field(default_factory=dict)
    contradict: Callable[[str, str, np.random.Generator], str | None] | None = None

    def sample_regions(self) -> RegionFeatures:
        return self.regions[self.train[0][0]]


@functools.lru_cache(maxsize=2)
def shapes_world(seed: int = 0) -> ShapesWorld:
    """The embedded shapes world (`vlhub.data.shapes.ShapesWorld`) with its default sizes; one instance per seed and
    process. Drawn once per cache (`default_cache_dir()`): the first process saves it (`ShapesWorld.save`, under
    the key of `shapes_store_key`), later ones and the other processes of a launch read it back."""
    from ..data.shapes import ShapesWorld

    return cached_shapes_world(ShapesWorld(seed=seed), default_cache_dir())


def cached_shapes_world(world: ShapesWorld, cache_dir: str | os.PathLike) -> ShapesWorld:
    """`world` as saved in `cache_dir` (`shapes-seed<seed>-<key>.world.safetensors`), saving it first when absent:
    one process draws it, under a file lock that the processes sharing the cache (a launch's, parallel test
    workers') wait on."""
    from ..data.shapes import ShapesWorld

    path = Path(cache_dir) / f"{_shapes_cache_name(world)}.world.safetensors"
    with _shapes_cache_lock(path.with_name(f"{_shapes_cache_name(world)}.lock")):
        if path.is_file():
            return ShapesWorld.load(path)
        world.save(path)
    return world


def _shapes_cache_name(world: ShapesWorld) -> str:
    return f"shapes-seed{world.seed}-{shapes_store_key(world)}"


@contextlib.contextmanager
def _shapes_cache_lock(lock_file: Path):
    """The main process of a launch first (accelerate), and one process of the machine at a time (`lock_file`, next
    to what it guards): every process enters both, so none waits on a barrier that another skipped."""
    from accelerate import PartialState
    from filelock import FileLock

    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with PartialState().main_process_first(), FileLock(lock_file):
        yield


_SHAPES_SOURCES = Path(__file__).parents[1] / "data"


def shapes_store_key(world: ShapesWorld) -> str:
    """A digest of what the world and its region store are made from, computed without drawing a scene.

    The world is a function of its `settings` and of the code in `vlhub/data/shapes*.py` (the scene sampler, the
    caption and question writers, the feature extractor, all drawing from numpy's generators), run on numpy (its
    `Generator` draws) and torch (the extractor's convolutions and RoIAlign); the store adds the extractor's settings
    and the store format (`STORE_VERSION`). The key digests all of these — the sources byte for byte, the libraries
    by version — so whatever could change one image, text or feature gives a new key and a new cache, never a stale
    one (an edit that changes nothing, a comment, costs one redraw)."""
    import hashlib

    import torch

    from ..data import ShapesRegionExtractor
    from ..processing.stores.shards import STORE_VERSION

    extractor = ShapesRegionExtractor()
    recipe = {
        "world": world.settings,
        "extractor": {
            "feature_dim": extractor.feature_dim,
            "pool_size": extractor.pool_size,
            "include_whole_image": extractor.include_whole_image,
            "class_smoothing": extractor.class_smoothing,
            "projection_seed": extractor.projection_seed,
        },
        "store format": STORE_VERSION,
        "libraries": {"numpy": np.__version__, "torch": torch.__version__},
    }
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode())
    for source in sorted(_SHAPES_SOURCES.glob("shapes*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:16]


def shapes_region_store(world: ShapesWorld, cache_dir: str | os.PathLike | None = None, seed: int = 0) -> RegionStore:
    """The world's region store, written once to `cache_dir` (default `<cache>/shapes-seed<seed>-<key>`, see
    `shapes_store_key`) and reused: one process writes it while the others sharing it wait (on `<folder>.lock`).
    `seed` is the world's own (`world.seed` names the default folder)."""
    from ..processing.stores import RegionStore

    directory = Path(cache_dir) if cache_dir else default_cache_dir() / _shapes_cache_name(world)
    with _shapes_cache_lock(directory.with_name(f"{directory.name}.lock")):
        if (directory / "store.json").exists():
            # Reuse a finished store without running the feature extractor again.
            store = RegionStore(directory)
            captions = world.captions()
            stored = set(store)  # one query for the store's ids, not one per image id checked
            # [:] reads each column at once (iterating a datasets Column reads it row by row: 0.13 s for 12k ids)
            if all(image_id in stored for split in captions.values() for image_id in split["image_id"][:]):
                return store
        return world.write_region_store(directory)


def open_region_source(
    path: str | os.PathLike, cache_mb: int = DEFAULT_REGION_CACHE_MB
) -> Mapping[str, RegionFeatures]:
    """A region store folder as image_id → RegionFeatures, with a per-process cache of at most `cache_mb` MiB when
    the whole store fits in it.

    Training reads every image once per epoch in a new order, so a cache smaller than the store hits about
    `cache_mb / store size` of its reads and pays for the rest with evictions (freed and newly allocated tensors:
    measured, 2-3 ms of a 20 ms batch of 32 on a 20k-image store). Such a store is read through the OS page cache
    alone. The store's size on disk is a lower bound of its decoded size (float16 features decode to float32)."""
    from ..processing.stores import RegionStore

    store = RegionStore(path)
    if cache_mb > 0 and sum(shard.stat().st_size for shard in store.shard_files) > cache_mb << 20:
        logger.info(
            f"region store {path} is larger than --region_cache_mb {cache_mb}: reads go through the OS page "
            "cache only (a smaller cache would mostly miss)"
        )
        return store
    return RegionCache(store, cache_mb << 20)


def load_table(source: str, split_names: tuple[str, ...] = ("train", "validation")) -> datasets.DatasetDict:
    """A `datasets.DatasetDict` from a folder saved with `save_to_disk`, a data file (json/jsonl/csv/parquet), or a
    Hub dataset name."""
    import datasets

    path = Path(source)
    if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
        loaded = datasets.load_from_disk(str(path))
        return loaded if isinstance(loaded, datasets.DatasetDict) else datasets.DatasetDict({"train": loaded})
    if path.is_file():
        kind = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}.get(path.suffix)
        if kind is None:
            raise ValueError(f"cannot read {path}: expected a .jsonl, .json, .csv or .parquet file")
        try:
            with named_input(path, f"a {kind} data file"):
                return datasets.load_dataset(kind, data_files={"train": str(path)})
        except datasets.exceptions.DatasetGenerationError as err:
            # datasets says only "An error occurred while generating the dataset"; the cause names the problem.
            cause = err.__cause__ or err
            raise VlhubUserError(
                f"{path} (a {kind} data file) cannot be read: {type(cause).__name__}: {one_line(cause)}"
            ) from err
    if path.exists():
        raise ValueError(f"{path} is neither a `datasets` folder (save_to_disk) nor a data file")
    from ..utils.network import with_deadline

    return with_deadline(f"loading the dataset {source}", lambda: datasets.load_dataset(source))


def arrow_slice(data: pa.Array | pa.Table, index: slice, length: int, what: str) -> pa.Array | pa.Table:
    """`data[index]` of an Arrow array or table (zero-copy) for a Python slice of step 1 over `length` rows."""
    start, stop, step = index.indices(length)
    if step != 1:
        raise ValueError(f"{what} slices take a step of 1")
    return data.slice(start, max(0, stop - start))


class ArrowStrings(Sequence):
    """A read-only sequence of `str` over an Arrow string column (memory-mapped when it comes from a `datasets`
    cache file): millions of strings cost no Python objects until one is read."""

    def __init__(self, column: pa.Array | pa.ChunkedArray | Iterable[str]) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        elif not isinstance(column, pa.Array):
            column = pa.array(list(column))
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            column = pc.cast(column, pa.string())
        self.column = column

    def __len__(self) -> int:
        return len(self.column)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return ArrowStrings(arrow_slice(self.column, index, len(self), "ArrowStrings"))
        return self.column[index].as_py()

    def unique_sorted(self) -> "ArrowStrings":
        import pyarrow.compute as pc

        unique = pc.unique(self.column)
        return ArrowStrings(unique.take(pc.sort_indices(unique)))


class CaptionPairs(Sequence):
    """`(image_id, caption)` pairs held as two Arrow string columns (see `ArrowStrings`); reads like a list of
    tuples."""

    def __init__(
        self,
        image_ids: pa.Array | pa.ChunkedArray | Iterable[str],
        captions: pa.Array | pa.ChunkedArray | Iterable[str],
    ) -> None:
        self.image_ids, self.captions = ArrowStrings(image_ids), ArrowStrings(captions)
        if len(self.image_ids) != len(self.captions):
            raise ValueError(f"{len(self.image_ids)} image ids but {len(self.captions)} captions")

    def __len__(self) -> int:
        return len(self.image_ids)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return CaptionPairs(self.image_ids[index].column, self.captions[index].column)
        return self.image_ids[index], self.captions[index]


def caption_pairs(split: datasets.Dataset, where: str) -> CaptionPairs:
    """The `(image_id, caption)` pairs of a `datasets` split, kept as Arrow columns (no Python list per row). Every
    caption is checked at load time, naming the row, rather than failing mid-training."""
    import pyarrow.compute as pc

    columns = split.column_names
    caption_column = next((c for c in _CAPTION_COLUMNS if c in columns), None)
    if "image_id" not in columns or caption_column is None:
        raise ValueError(
            f"{where} needs an 'image_id' column and a caption column ({' / '.join(_CAPTION_COLUMNS)}); "
            f"it has {columns}"
        )
    table = split.select_columns(["image_id", caption_column]).with_format("arrow")[:]  # zero-copy without indices
    pairs = CaptionPairs(table.column("image_id"), table.column(caption_column))
    captions = pairs.captions.column
    # Arrow strings are valid UTF-8 (no lone surrogates); what is left to refuse is missing or blank text.
    bad = pc.or_kleene(pc.is_null(captions), pc.equal(pc.utf8_trim_whitespace(captions), ""))
    if pc.any(bad).as_py():
        row = pc.index(bad, True).as_py()
        check_text(
            captions[row].as_py(), f"{where}: the {caption_column} of row {row} (image {pairs.image_ids[row]!r})"
        )
    if pairs.image_ids.column.null_count:
        row = pc.index(pc.is_null(pairs.image_ids.column), True).as_py()
        raise ValueError(f"{where}: row {row} has no image_id")
    return pairs


def _splits(table, where: str):
    if "train" not in table:
        raise ValueError(f"{where} has no 'train' split (splits: {list(table)})")
    validation = next((table[s] for s in ("validation", "val", "dev") if s in table), None)
    return table["train"], validation


def load_caption_corpus(
    dataset: str = SHAPES,
    region_store: str | None = None,
    caption_file: str | None = None,
    cache_dir: str | None = None,
    shapes_seed: int = 0,
    region_cache_mb: int = DEFAULT_REGION_CACHE_MB,
) -> CaptionCorpus:
    """Captions + regions for pre-training.

    dataset: `"shapes"` (the embedded world); a folder holding a region store (`store.json` + shards) and a caption
        file (`captions.jsonl`, or `caption_file`); a `datasets` folder/file/Hub name with `image_id` and `caption`
        columns, whose regions are inline columns (`features`, `boxes`, `image_size`, ...) or in `region_store`.
    """
    if dataset == SHAPES:
        world = shapes_world(seed=shapes_seed)
        table = world.captions()
        regions = RegionCache(shapes_region_store(world, region_store or cache_dir, shapes_seed), region_cache_mb << 20)
        train, validation = _splits(table, "the shapes world")
        return CaptionCorpus(
            train=caption_pairs(train, "shapes captions"),
            validation=caption_pairs(validation, "shapes captions"),
            regions=regions,
            name="vlhub/shapes",
            description=_shapes_description(world, len(train), len(validation)),
            extras={"world": world},
            contradict=world.contradicting_caption,
        )
    path = Path(dataset)
    if path.is_dir() and (path / "store.json").exists():
        captions = Path(caption_file) if caption_file else path / "captions.jsonl"
        if not captions.exists():
            raise FileNotFoundError(
                f"{path} is a region store; its captions are expected in {captions} (jsonl rows "
                "with image_id and caption) or in the file given by --caption_file"
            )
        table = load_table(str(captions))
        regions = open_region_source(path, region_cache_mb)
        where = f"{captions}"
    else:
        table = load_table(dataset)
        where = f"dataset {dataset!r}"
        if region_store:
            regions = open_region_source(region_store, region_cache_mb)
        elif all(c in table["train"].column_names for c in _INLINE_REGION_COLUMNS):
            regions = InlineRegions(table["train"])
        else:
            raise ValueError(
                f"{where} has no region columns {_INLINE_REGION_COLUMNS}; pass --region_store with a "
                "region store folder holding the features of its images"
            )
    train, validation = _splits(table, where)
    corpus = CaptionCorpus(
        train=caption_pairs(train, where),
        validation=caption_pairs(validation, where) if validation else [],
        regions=regions,
        name=str(dataset),
        description=f"`{dataset}`: {len(train)} training captions"
        + (f", {len(validation)} validation captions" if validation is not None else "")
        + ".",
    )
    missing = [i for i, _ in corpus.train[:1000] if i not in regions]  # a sample: a wrong store shows at once
    if missing:
        raise KeyError(
            f"{len(missing)} of the first training images have no regions (e.g. {missing[0]!r}); the "
            "region store does not match the captions"
        )
    return corpus


def _shapes_description(world, num_train: int, num_validation: int) -> str:
    details = getattr(world, "description", None)
    text = (
        f"The embedded **shapes world** of vlhub (`vlhub.data.shapes.ShapesWorld`, seed {world.seed}): "
        f"procedurally generated images of coloured shapes with ground-truth boxes; region features are RoI-pooled "
        f"from a convolutional backbone over the boxes. {num_train} training and {num_validation} validation "
        "captions."
    )
    return text + (f" {details}" if isinstance(details, str) else "")


def write_jsonl(path: str | os.PathLike, rows: Iterable[Mapping[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
