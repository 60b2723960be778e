"""The pre-training data path at growing store sizes: open time, random reads, data-path throughput, steps/s, memory.

    python bench/bench_data.py [--sizes 2000 20000 100000] [--cache-dir DIR] [--workers 0 2] [--steps 40]
                               [--device cpu|cuda] [--warmup-batches 20] [--timed-batches N] [--read-seconds 5]
                               [--peak-size 2048] [--json PATH]

For each size N it builds once (in --cache-dir, default `<vlhub cache>/bench-data`) a region store of N synthetic
images with realistic rows — 36 regions × 2048 float16 features, boxes, scores — one caption per image, and the same
rows as an LMDB in UNITER's format (msgpack per image, read by vlhub's `UniterLmdbReader`: the original format, as
the anchor). Then, in a process of its own per size (so peak memory is that size's own: on a CPU forked from this one,
which builds in a child too; with CUDA a fresh interpreter), it reports:

- store writing speed (images/s, when the store is built);
- store open time (`RegionStore(folder)` plus its first read, before anything else touched the store);
- random reads/s (`store[id]` for random ids), and the same reads from the LMDB;
- the data path alone (region reads + processor + collation of UNITER pre-training batches of 32) in examples/s,
  with 0 and with 2 DataLoader workers, reading by id, and the same with `--streaming` (shards read in order). As
  in a training run: the loop's collate function (`loader_collate`), the process settings `pretrain.py` makes
  (`retain_freed_memory`, `raise_open_file_limit`), and the steady state after 20 batches;
- `pretrain.py`'s start-up (from calling it to its first optimizer step: captions, store, model, first batch) and
  tiny-model pre-training steps/s (batch 32; `mlm`, `mrfr` and `itm`: the synthetic rows have no class
  probabilities), and the process's memory: the largest anonymous resident memory seen after each phase (what the
  process itself holds) and, apart, the resident pages of mapped files (the store's and the LMDB's shards: page
  cache the kernel reclaims at will), with the kernel's peak RSS, which counts both.

Random reads are measured with a warm page cache, as training runs once the store has been read: the store's files
are read through once first (`store_warm_mb_per_s`: that sequential read), and the LMDB's only after every store
figure (at 100k images the store and the LMDB together, ~30 GB, do not fit a 24 GB machine's page cache at once).

Timings depend on the machine and on what else runs; the matmul peak is printed for scale. The data path runs on the
CPU wherever the model trains; `--device cuda` trains `pretrain.py`'s steps on the GPU (bf16 mixed precision, steps
timed after `torch.cuda.synchronize`). `--json PATH` writes every size's figures for bench/run_all.sh; small
`--sizes` with fewer `--warmup-batches`/`--timed-batches` are a wiring check, not a figure.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: timing, device

from device import add_device_arguments, describe, machine, prepare_device, write_figures  # noqa: E402
from timing import synchronize  # noqa: E402

REGIONS, FEATURE_DIM, BATCH = 36, 2048, 32
WARMUP_BATCHES = 20
WORDS = (
    "a red blue green small large circle square triangle left right above below of the near next to and with "
    "two three one shape picture shows there is are"
).split()


def synthetic_rows(count: int, start: int, seed: int = 0):
    """(image_id, RegionFeatures) of `count` images; features are random float16-representable values."""
    import torch

    from vlhub import RegionFeatures

    rng = np.random.default_rng(seed + start)
    pool = rng.standard_normal((16, REGIONS, FEATURE_DIM)).astype(np.float16).astype(np.float32)
    for index in range(start, start + count):
        x1 = rng.uniform(0, 500, REGIONS)
        y1 = rng.uniform(0, 380, REGIONS)
        boxes = np.stack([x1, y1, x1 + rng.uniform(10, 140, REGIONS), y1 + rng.uniform(10, 100, REGIONS)], 1)
        features = pool[index % 16] * np.float32(1 + (index % 7) / 10)
        yield (
            f"img{index:08d}",
            RegionFeatures.from_validated(
                features=torch.from_numpy(features),
                boxes=torch.from_numpy(boxes.astype(np.float32)),
                image_size=(480, 640),
                scores=torch.from_numpy(rng.uniform(0.2, 1, REGIONS).astype(np.float32)),
            ),
        )


def caption(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14)))


def build(folder: Path, size: int) -> dict:
    """Write the store, captions, vocabulary and LMDB for `size` images (once); returns the build figures."""
    from vlhub.processing.stores import RegionStoreWriter

    done = folder / "built.json"
    if done.exists():
        return json.loads(done.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    store = folder / "store"
    start = time.perf_counter()
    with RegionStoreWriter(store, shard_size=1024, feature_dtype="float16") as writer:
        for image_id, regions in synthetic_rows(size, 0):
            writer.add(image_id, regions)
    write_seconds = time.perf_counter() - start
    rng = random.Random(0)
    with open(store / "captions.jsonl", "w") as handle:
        for index in range(size):
            handle.write(json.dumps({"image_id": f"img{index:08d}", "caption": caption(rng)}) + "\n")
    specials = ["[PAD]", *(f"[unused{i}]" for i in range(99)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    (folder / "vocab.txt").write_text("\n".join(specials + sorted(set(WORDS))) + "\n")
    write_uniter_lmdb(folder / "uniter.lmdb", size)
    figures = {"images": size, "store_write_images_per_s": size / write_seconds}
    done.write_text(json.dumps(figures))
    return figures


def write_uniter_lmdb(path: Path, size: int):
    """The same rows in UNITER's uncompressed image-DB layout: msgpack-numpy per image, keyed by image id."""
    import lmdb
    import msgpack

    def packed(array: np.ndarray) -> dict:
        return {b"nd": True, b"type": array.dtype.str, b"shape": array.shape, b"data": array.tobytes()}

    environment = lmdb.open(str(path), map_size=size * 200_000 + (1 << 26))
    keys = []
    with environment.begin(write=True) as txn:
        for image_id, regions in synthetic_rows(size, 0):
            boxes = regions.normalized_boxes().numpy()
            norm_bb = np.concatenate([boxes, boxes[:, 2:] - boxes[:, :2]], 1).astype(np.float16)
            record = {
                "features": packed(regions.features.numpy().astype(np.float16)),
                "norm_bb": packed(norm_bb),
                "conf": packed(regions.scores.numpy().astype(np.float16)[:, None]),
            }
            txn.put(image_id.encode(), msgpack.packb(record, use_bin_type=True))
            keys.append(image_id)
        txn.put(b"__keys__", json.dumps(keys).encode())
    environment.close()


def resident_mb() -> dict[str, float]:
    """RssAnon and RssFile of this process, in MiB (Linux)."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("RssAnon", "RssFile"):
            fields[name] = int(value.split()[0]) / 1024
    return fields


def reads_per_second(reader, ids: list[str], seconds: float = 5.0) -> float:
    rng = random.Random(1)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        reader[ids[rng.randrange(len(ids))]]
        count += 1
    return count / (time.perf_counter() - start)


def read_through(paths) -> float:
    """Read files once, front to back (into the page cache); returns MB/s."""
    total, start = 0, time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as handle:
            while chunk := handle.read(16 << 20):
                total += len(chunk)
    return total / 1e6 / (time.perf_counter() - start)


def data_path(dataset, loader_kwargs: dict, count: int, steps: int, warmup: int) -> float:
    """Examples/s of a DataLoader over the data path alone, in the steady state of a training run: after `warmup`
    batches (workers started, each with the store's shards opened: a new worker opens each shard once, 5-6 ms a
    shard, which persistent workers pay once per run)."""
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, num_workers=count, persistent_workers=False, **loader_kwargs)
    iterator = iter(loader)
    for _ in range(warmup):
        next(iterator)
    start = time.perf_counter()
    for _ in range(steps):
        next(iterator)
    seconds = time.perf_counter() - start
    del iterator, loader
    return steps * BATCH / seconds


def measure(folder: Path, workers: list[int], steps: int, options: argparse.Namespace) -> dict:
    """Every figure for one built size, in this (fresh) process (`options`: device, warmup_batches, timed_batches,
    read_seconds)."""
    import torch
    from accelerate.state import AcceleratorState, GradientState

    from vlhub.modeling.uniter import UniterLmdbReader
    from vlhub.processing.stores import RegionStore
    from vlhub.training import VlhubTrainingArguments
    from vlhub.training.cli import _load_tokenizer, pretrain_main
    from vlhub.training.data import load_caption_corpus
    from vlhub.training.objectives import ObjectiveMix, objectives_for
    from vlhub.training.loop import loader_collate
    from vlhub.training.pretraining import PretrainingTask, build_pretraining_model
    from vlhub.utils.resources import raise_open_file_limit, retain_freed_memory

    retain_freed_memory()  # as pretrain.py does
    raise_open_file_limit()
    figures: dict = {}
    anonymous = []

    def sample_memory():
        anonymous.append(resident_mb())

    start = time.perf_counter()
    store = RegionStore(folder / "store")
    first = next(iter(store))
    store[first]
    figures["open_s"] = time.perf_counter() - start
    figures["store_warm_mb_per_s"] = read_through(sorted((folder / "store").glob("shard-*.arrow")))
    ids = [f"img{i:08d}" for i in range(len(store))]
    figures["store_reads_per_s"] = reads_per_second(store, ids, options.read_seconds)
    sample_memory()

    torch.manual_seed(0)
    corpus = load_caption_corpus(str(folder / "store"))
    model, processor = build_pretraining_model(
        None, "tiny", _load_tokenizer(str(folder / "vocab.txt"), "x", True), corpus, model_type="uniter"
    )
    mix = ObjectiveMix.parse(["mlm:1", "mrfr:1", "itm:1"], objectives_for("uniter"))
    task = PretrainingTask(model, processor, corpus, mix)
    length = options.timed_batches or max(steps, 20)
    warmup = options.warmup_batches
    for count in workers:
        sampler = task.train_sampler(BATCH, 1, 0)
        figures[f"data_path_examples_per_s_{count}_workers"] = data_path(
            task.train_dataset,
            {"batch_sampler": sampler, "collate_fn": loader_collate(task.collate_fn, count)},
            count,
            min(length, len(sampler) - 1 - warmup),
            warmup,
        )
        sample_memory()
    for count in workers:
        args = VlhubTrainingArguments(
            output_dir=str(folder / "run"),
            per_device_train_batch_size=BATCH,
            dataloader_num_workers=count,
            shuffle_buffer_size=4096,
        )
        figures[f"streamed_examples_per_s_{count}_workers"] = data_path(
            task.train_stream(args, 0, 1),
            {"batch_size": None, "collate_fn": loader_collate(task.collate_fn, count)},
            count,
            length,
            warmup,
        )
        sample_memory()
    del task, model, corpus

    stamps = []
    start = time.perf_counter()
    pretrain_main(
        [
            "--dataset",
            str(folder / "store"),
            "--tokenizer",
            str(folder / "vocab.txt"),
            "--config",
            "tiny",
            "--objectives",
            "mlm:1",
            "mrfr:1",
            "itm:1",
            "--per_device_train_batch_size",
            str(BATCH),
            "--max_steps",
            str(steps + 5),
            "--logging_steps",
            "1000",
            "--learning_rate",
            "1e-4",
            "--output_dir",
            str(folder / "run"),
            "--overwrite_output_dir",
            *(["--use_cpu"] if options.device == "cpu" else ["--mixed_precision", "bf16"]),
        ],
        callbacks=[lambda state: (synchronize(options.device), stamps.append(time.perf_counter()))],
    )
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    figures["startup_s"] = stamps[0] - start
    figures["train_steps_per_s"] = (len(stamps) - 5) / (stamps[-1] - stamps[4])
    sample_memory()
    figures["anon_rss_mb"] = max(sample.get("RssAnon", 0) for sample in anonymous)
    figures["file_rss_mb"] = max(sample.get("RssFile", 0) for sample in anonymous)
    figures["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    figures["lmdb_warm_mb_per_s"] = read_through(sorted((folder / "uniter.lmdb").glob("*.mdb")))
    figures["lmdb_reads_per_s"] = reads_per_second(UniterLmdbReader(folder / "uniter.lmdb"), ids, options.read_seconds)
    return figures


def in_child(device: str, what: str, function, *arguments) -> dict:
    """`function(*arguments)` (a dict of figures) in a child process, its output on stderr. On a CPU the child is forked
    from this process, which stays as its imports left it (building happens in a child too: a forked child's peak RSS
    starts from its parent's); with CUDA, which a forked child cannot use once its parent has, a fresh interpreter."""
    context = multiprocessing.get_context("spawn" if device == "cuda" else "fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=send_figures, args=(sender, function, *arguments))
    child.start()
    sender.close()
    try:
        figures = receiver.recv()
    except EOFError:  # the child failed before sending (its traceback is on stderr)
        figures = None
    child.join()
    if child.exitcode != 0:
        sys.exit(f"{what} failed (exit {child.exitcode}); its traceback is above")
    return figures


def send_figures(pipe, function, *arguments) -> None:
    os.dup2(2, 1)  # the bench's stdout is its figures and table; the child's progress goes to stderr
    pipe.send(function(*arguments))


def main():
    from vlhub.training.data import default_cache_dir

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 20000, 100000])
    parser.add_argument("--cache-dir", type=Path, default=default_cache_dir() / "bench-data")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup-batches", type=int, default=WARMUP_BATCHES, help="data-path batches before timing")
    parser.add_argument(
        "--timed-batches", type=int, default=None, help="data-path batches timed (default max(steps, 20))"
    )
    parser.add_argument("--read-seconds", type=float, default=5.0, help="seconds of random reads per reader")
    parser.add_argument("--peak-size", type=int, default=2048, help="side of the fp32 matmul peak printed for scale")
    add_device_arguments(parser)
    args = parser.parse_args()
    prepare_device(args.device, parser)
    info = machine(args.device, peak_size=args.peak_size, peak_dtypes=("fp32",), peak_repeats=5)
    print(
        f"{describe(info)}; rows: {REGIONS} regions x "
        f"{FEATURE_DIM} float16 features; batch {BATCH}; tiny UNITER, objectives mlm, mrfr, itm"
    )
    rows = []
    for size in args.sizes:
        folder = args.cache_dir / f"n{size}"
        figures = in_child(args.device, f"building N={size}", build, folder, size)
        figures.update(in_child(args.device, f"measuring N={size}", measure, folder, args.workers, args.steps, args))
        rows.append(figures)
        print(json.dumps(figures), flush=True)
    columns = [
        "images",
        "store_write_images_per_s",
        "open_s",
        "store_reads_per_s",
        "lmdb_reads_per_s",
        *(f"data_path_examples_per_s_{w}_workers" for w in args.workers),
        *(f"streamed_examples_per_s_{w}_workers" for w in args.workers),
        "startup_s",
        "train_steps_per_s",
        "anon_rss_mb",
        "file_rss_mb",
        "peak_rss_mb",
    ]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for figures in rows:
        print("| " + " | ".join(f"{figures.get(c, float('nan')):.4g}" for c in columns) + " |")
    write_figures(args.json, "data", info, rows, workers=args.workers, steps=args.steps)


if __name__ == "__main__":
    main()
