"""Pre-training batches streamed from a region store's shards (`--streaming`): for stores larger than a machine's
disk and for many nodes.

Map-style training reads images by id, in a random order over the whole store, so every process needs every shard.
Streaming reads the shards front to back instead, as a `datasets.IterableDataset`:

- **Nodes.** Each epoch the shard list is permuted (seeded by the run's seed and the epoch, the same on every
  process) and `datasets.distributed.split_dataset_by_node` gives each process its own shards: processes read
  disjoint shards and together visit every image once per epoch (a process only needs its own shards on disk). With
  DataLoader workers, `datasets` splits a process's shards between its workers in the same way.
- **Shuffling.** Within a process the stream is shuffled in blocks: `shuffle_buffer_size` examples are read, permuted
  (seeded by seed, epoch, process, worker and block), then batched. `datasets`' own shuffle buffer is not part of its
  `state_dict()` (a resumed stream would refill it from later rows), so vlhub shuffles blocks it can rebuild.
- **Exact resumption.** A stream's state is the `datasets` state at the start of the current block plus the
  position in it; resuming re-reads that one block (at most `shuffle_buffer_size` examples), permutes it the same way
  and continues at the same example. torchdata's `StatefulDataLoader` (the loader accelerate uses for
  `use_stateful_dataloader`) collects the state of every worker with each batch; the training loop saves it per
  process in each checkpoint (`training_state/stream_state_<process>.json`).
- **Captions.** Each image of the stream yields one example per caption (`CaptionIndex`: the caption table sorted by
  image id, binary-searched, no per-caption Python objects). Images without captions are skipped.
- **Batches** are made in the stream (one objective per batch, a pure function of the run's seed and the batch's
  position, the same on every process, so one optimizer step shares one objective) and carry their images' regions:
  objectives that pair a caption with another image draw it from the same batch.

The stream never ends: epochs follow one another (a batch may hold the end of one and the start of the next), and a
run is measured in `--max_steps`.
"""

from __future__ import annotations

import bisect
import copy
import logging
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from .data import CaptionPairs

if TYPE_CHECKING:
    import datasets

    from ..processing.stores import RegionStore
    from .objectives import ObjectiveMix
    from .sampling import FixedObjective

__all__ = ["CaptionIndex", "StreamedCaptionBatches", "DEFAULT_SHUFFLE_BUFFER", "shard_stream"]

logger = logging.getLogger(__name__)

DEFAULT_SHUFFLE_BUFFER = 1024
# Seed streams, apart from `sampling`'s (1: objectives, 2: examples).
_OBJECTIVE_STREAM, _EXAMPLE_STREAM, _SHARD_ORDER_STREAM, _BLOCK_STREAM = 1, 2, 3, 4


class CaptionIndex:
    """image id → the rows of its captions in a `CaptionPairs` table, by binary search over the table's row order
    sorted by image id (one int64 per caption; no Python object per caption).

    Args:
        pairs: the `(image_id, caption)` table (`CaptionPairs`, Arrow-backed, or any sequence of pairs).
    """

    def __init__(self, pairs: Sequence[tuple[str, str]]) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        if not isinstance(pairs, CaptionPairs):
            pairs = CaptionPairs(
                pa.array([p[0] for p in pairs], pa.string()), pa.array([p[1] for p in pairs], pa.string())
            )
        self.pairs = pairs
        ids = pairs.image_ids.column
        self.order = pc.sort_indices(ids).to_numpy()
        self.sorted_ids = ids.take(pa.array(self.order))

    def __len__(self) -> int:
        return len(self.pairs)

    def rows(self, image_id: str) -> list[int]:
        """The table rows holding `image_id`'s captions, in table order (empty when it has none)."""
        keys = _ArrowKeys(self.sorted_ids)
        start = bisect.bisect_left(keys, image_id)
        stop = bisect.bisect_right(keys, image_id, lo=start)
        return sorted(int(row) for row in self.order[start:stop])

    def caption(self, row: int) -> str:
        return self.pairs.captions[row]


class _ArrowKeys(Sequence):
    """A sorted Arrow string array seen as a sequence of `str`, for `bisect`."""

    def __init__(self, array):
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, index: int) -> str:
        return self.array[index].as_py()


def shard_stream(
    shard_files: Sequence[str], seed: int, epoch: int, process_index: int, num_processes: int
) -> datasets.IterableDataset:
    """This process's part of one epoch of the shards, as a `datasets.IterableDataset` yielding one-row Arrow
    tables: the shard list permuted by (seed, epoch), then `split_dataset_by_node`."""
    import datasets
    from datasets.distributed import split_dataset_by_node

    order = np.random.default_rng((seed, epoch, _SHARD_ORDER_STREAM)).permutation(len(shard_files))
    was_enabled = datasets.utils.logging.is_progress_bar_enabled()
    datasets.utils.logging.disable_progress_bar()
    try:
        stream = datasets.load_dataset(
            "arrow", data_files=[str(shard_files[i]) for i in order], split="train", streaming=True
        )
    finally:
        if was_enabled:
            datasets.utils.logging.enable_progress_bar()
    if num_processes > 1:
        stream = split_dataset_by_node(stream, rank=process_index, world_size=num_processes, strategy="shards")
    return stream.with_format("arrow")


class StreamedCaptionBatches(IterableDataset):
    """Endless pre-training batches (lists of examples with their regions) streamed from a region store's shards.

    Each example is `{"image_id", "caption", "objective", "seed", "regions"}`; `seed` is the one the map-style
    sampler gives the same caption (`(seed, epoch, caption row, 2)`), so masking draws stay per-example streams.
    Read it with `batch_size=None` in a (stateful) DataLoader; `state_dict()`/`load_state_dict()` resume it exactly.

    Args:
        store: the `RegionStore` whose shards are streamed (only its layout, shard list and row decoding are used).
        captions: the captions to pair with the streamed images.
        batch_size: examples per batch.
        mix: chooses each batch's objective (`ObjectiveMix` or `FixedObjective`).
        seed: the run's seed.
        gradient_accumulation_steps: batches that share one objective (one optimizer step).
        process_index, num_processes: this process and the number of processes (nodes x GPUs).
        shuffle_buffer_size: examples permuted together (the block).
        num_workers: DataLoader workers that read this stream (each reads its own shards).
    """

    def __init__(
        self,
        store: RegionStore,
        captions: CaptionIndex,
        batch_size: int,
        mix: ObjectiveMix | FixedObjective,
        seed: int,
        gradient_accumulation_steps: int = 1,
        process_index: int = 0,
        num_processes: int = 1,
        shuffle_buffer_size: int = DEFAULT_SHUFFLE_BUFFER,
        num_workers: int = 0,
    ) -> None:
        if batch_size < 1 or shuffle_buffer_size < 1 or gradient_accumulation_steps < 1:
            raise ValueError(
                f"batch_size ({batch_size}), shuffle_buffer_size ({shuffle_buffer_size}) and "
                f"gradient_accumulation_steps ({gradient_accumulation_steps}) must be positive"
            )
        self.store = store
        self.captions = captions
        self.batch_size = batch_size
        self.mix = mix
        self.seed = int(seed)
        self.accumulation = gradient_accumulation_steps
        self.process_index, self.num_processes = process_index, num_processes
        self.shuffle_buffer_size = shuffle_buffer_size
        self.shard_files = [str(path) for path in store.shard_files]
        if len(self.shard_files) < num_processes:
            raise ValueError(
                f"--streaming: the region store {store.directory} has {len(self.shard_files)} shards for "
                f"{num_processes} processes; every process needs at least one shard of its own (write the store with "
                "a smaller shard size, or stream with fewer processes)"
            )
        if len(self.shard_files) % num_processes:
            logger.warning(
                f"--streaming: {len(self.shard_files)} shards do not divide evenly among {num_processes} "
                "processes; some processes read one shard more per epoch (their epochs end later)"
            )
        per_process = len(self.shard_files) // num_processes
        if num_workers > per_process:
            raise ValueError(
                f"--streaming: each process reads {per_process} shard(s) per epoch, fewer than its "
                f"{num_workers} DataLoader workers; use at most {per_process} workers"
            )
        self._state = self._fresh_state()

    def _fresh_state(self) -> dict:
        # the process whose stream this is; epoch; datasets' state at the start of the current block (None: the
        # epoch's start); block number in the epoch; examples of the block already used; batches this worker made.
        return {"process": self.process_index, "epoch": 0, "block_start": None, "block": 0, "offset": 0, "batches": 0}

    # -- stateful-DataLoader protocol ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return copy.deepcopy(self._state)

    def load_state_dict(self, state: dict) -> None:
        missing = set(self._fresh_state()) - set(state)
        if missing:
            raise ValueError(f"not a streamed-batches state (missing {sorted(missing)}): {state}")
        if state["process"] != self.process_index:
            raise ValueError(
                f"the stream state of process {state['process']} cannot resume process {self.process_index}'s stream"
            )
        self._state = copy.deepcopy(state)

    # -- the stream ---------------------------------------------------------------------------------------------
    def __len__(self):
        raise TypeError("a streamed dataset has no length; train with --max_steps")

    def approximate_steps_per_epoch(self) -> int:
        """Optimizer steps one epoch of this process's share of the captions makes (for logging and epochs)."""
        per_step = self.batch_size * self.accumulation * self.num_processes
        return max(1, len(self.captions) // per_step)

    def __iter__(self) -> Iterator[list[dict]]:
        worker = get_worker_info()
        worker_id, num_workers = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        state = self._state
        pending: list[dict] = []
        while True:
            stream = shard_stream(self.shard_files, self.seed, state["epoch"], self.process_index, self.num_processes)
            if state["block_start"] is not None:
                stream.load_state_dict(state["block_start"])
            rows = iter(stream)
            while True:
                block = self._read_block(rows, state["epoch"])
                if not block:
                    break
                order = np.random.default_rng(
                    (self.seed, state["epoch"], self.process_index, worker_id, state["block"], _BLOCK_STREAM)
                ).permutation(len(block))
                for position in range(state["offset"], len(block)):
                    pending.append(block[order[position]])
                    if len(pending) == self.batch_size:
                        state["offset"] = position + 1
                        batch = self._finish_batch(pending, state["batches"] * num_workers + worker_id)
                        state["batches"] += 1
                        pending = []
                        yield batch
                state["block_start"] = copy.deepcopy(stream.state_dict())
                state["block"] += 1
                state["offset"] = 0
            state.update(epoch=state["epoch"] + 1, block_start=None, block=0, offset=0)

    def _read_block(self, rows: Iterator, epoch: int) -> list[dict]:
        """The next `shuffle_buffer_size` examples (fewer at the end of the epoch's stream): one per caption of
        each streamed image, with the image's Arrow row (decoded when its batch is made)."""
        block: list[dict] = []
        while len(block) < self.shuffle_buffer_size:
            try:
                row = next(rows)
            except StopIteration:
                break
            image_id = row.column("image_id")[0].as_py()
            caption_rows = self.captions.rows(image_id)
            if not caption_rows:
                continue
            for caption_row in caption_rows:
                # The row stays an Arrow slice (of a memory-mapped shard, or of a streamed record batch) until its
                # batch is made, so a block costs no decoded features.
                block.append(
                    {
                        "image_id": image_id,
                        "caption": self.captions.caption(caption_row),
                        "seed": (self.seed, epoch, caption_row, _EXAMPLE_STREAM),
                        "row": row,
                    }
                )
        return block

    def _finish_batch(self, examples: list[dict], batch_index: int) -> list[dict]:
        """Give the batch its objective: one per group of `gradient_accumulation_steps` batches, from the batch's
        position in this process's loader (the same position on every process)."""
        group = batch_index // self.accumulation
        objective = self.mix.choose(np.random.default_rng((self.seed, group, _OBJECTIVE_STREAM)))
        decoded: dict[str, object] = {}
        batch = []
        for example in examples:
            example = dict(example)
            row = example.pop("row")
            if example["image_id"] not in decoded:
                decoded[example["image_id"]] = self.store.decode_row(row)
            batch.append({**example, "objective": objective, "regions": decoded[example["image_id"]]})
        return batch
