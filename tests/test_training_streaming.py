"""`--streaming`: region-store shards read as a `datasets.IterableDataset`, split by node, shuffled in blocks, resumed
exactly (the stream itself, the stateful loader with workers, the training loop, and 2 processes through accelerate)."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from tests.training_helpers import TINY_CONFIG, crash_then_resume, logged_losses, synthetic_corpus, write_vocab
from vlhub.processing.stores import RegionStore, RegionStoreWriter
from vlhub.training.data import write_jsonl
from vlhub.training.sampling import FixedObjective
from vlhub.training.streaming import CaptionIndex, StreamedCaptionBatches

REPO = Path(__file__).resolve().parents[1]


def write_store(folder: Path, shard_size: int = 4) -> tuple[Path, list]:
    """24 images in shards of `shard_size` (6 shards by default), 2 captions each, as captions.jsonl."""
    corpus = synthetic_corpus()
    with RegionStoreWriter(folder, shard_size=shard_size) as writer:
        for image_id, regions in corpus.regions.items():
            if any(i == image_id for i, _ in corpus.train):
                writer.add(image_id, regions)
    write_jsonl(folder / "captions.jsonl", [{"image_id": i, "caption": c} for i, c in corpus.train])
    return folder, corpus.train


def stream(
    store: Path,
    pairs,
    rank: int = 0,
    world: int = 1,
    buffer: int = 8,
    batch: int = 4,
    workers: int = 0,
    seed: int = 0,
    accumulation: int = 1,
):
    return StreamedCaptionBatches(
        RegionStore(store),
        CaptionIndex(pairs),
        batch,
        FixedObjective("mlm"),
        seed,
        gradient_accumulation_steps=accumulation,
        process_index=rank,
        num_processes=world,
        shuffle_buffer_size=buffer,
        num_workers=workers,
    )


def identity(batch):
    return batch


def keys(batch) -> list[tuple]:
    return [(e["image_id"], e["caption"], tuple(e["seed"]), e["objective"]) for e in batch]


def test_caption_index_finds_every_caption_of_an_image():
    pairs = [("b", "one"), ("a", "two"), ("b", "three"), ("c", "four"), ("a", "five")]
    index = CaptionIndex(pairs)
    assert index.rows("a") == [1, 4] and index.rows("b") == [0, 2] and index.rows("c") == [3]
    assert index.rows("zz") == [] and index.rows("") == []
    assert [index.caption(r) for r in index.rows("b")] == ["one", "three"]


def test_two_processes_read_disjoint_shards_and_one_epoch_visits_every_caption_once(tmp_path):
    store, pairs = write_store(tmp_path / "store")
    seen, images = Counter(), []
    for rank in (0, 1):
        batches = iter(stream(store, pairs, rank=rank, world=2))
        mine = set()
        while True:
            batch = next(batches)
            first_epoch = [e for e in batch if e["seed"][1] == 0]
            seen.update((e["image_id"], e["caption"]) for e in first_epoch)
            mine |= {e["image_id"] for e in first_epoch}
            if len(first_epoch) < len(batch):  # the epoch ended inside this batch
                break
        images.append(mine)
    assert not images[0] & images[1]  # disjoint shards, so disjoint images
    assert len(images[0]) == len(images[1]) == 12  # 6 shards of 4 images: 3 shards each
    assert seen == Counter(pairs)  # every caption exactly once across the two processes


def test_shards_that_do_not_divide_among_processes_are_still_read_once(tmp_path):
    store, pairs = write_store(tmp_path / "store", shard_size=5)  # 5 shards for 2 processes: 3 + 2
    seen, images = Counter(), []
    for rank in (0, 1):
        batches = iter(stream(store, pairs, rank=rank, world=2, batch=2))
        first_epoch = []
        while not first_epoch or first_epoch[-1]["seed"][1] == 0:
            first_epoch += next(batches)
        first_epoch = [e for e in first_epoch if e["seed"][1] == 0]
        seen.update((e["image_id"], e["caption"]) for e in first_epoch)
        images.append({e["image_id"] for e in first_epoch})
    assert not images[0] & images[1] and sorted(map(len, images)) in ([9, 15], [10, 14])
    assert seen == Counter(pairs)


def test_the_stream_is_shuffled_per_epoch_and_reproducible(tmp_path):
    store, pairs = write_store(tmp_path / "store")
    first = [keys(next(iter(stream(store, pairs)))) for _ in range(2)]
    assert first[0] == first[1]  # a pure function of the seed

    batches = iter(stream(store, pairs))
    epochs: dict[int, list] = {0: [], 1: []}
    while len(epochs[1]) < len(pairs):
        for example in next(batches):
            epochs.setdefault(example["seed"][1], []).append((example["image_id"], example["caption"]))
    assert sorted(epochs[0]) == sorted(epochs[1][: len(pairs)]) == sorted(pairs)
    assert epochs[0] != epochs[1][: len(pairs)]  # another shard order and other blocks
    assert epochs[0] != [tuple(p) for p in pairs]  # shuffled, not in store order
    other_seed = [e["image_id"] for e in next(iter(stream(store, pairs, seed=1)))]
    assert other_seed != [e["image_id"] for e in next(iter(stream(store, pairs)))]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_restored_stateful_loader_continues_exactly(tmp_path, workers):
    """Across block and epoch boundaries, with and without worker processes."""
    store, pairs = write_store(tmp_path / "store")

    def loader():
        return StatefulDataLoader(
            stream(store, pairs, buffer=6, batch=5, workers=workers),
            batch_size=None,
            collate_fn=identity,
            num_workers=workers,
        )

    straight = iter(loader())
    expected = [keys(next(straight)) for _ in range(30)]  # 150 examples: more than 3 epochs of 48
    interrupted = loader()
    batches = iter(interrupted)
    assert [keys(next(batches)) for _ in range(13)] == expected[:13]
    state = json.loads(json.dumps(interrupted.state_dict()))  # what the checkpoint holds
    del batches
    other_process = StatefulDataLoader(
        stream(store, pairs, rank=1, world=2, buffer=6, batch=5), batch_size=None, collate_fn=identity
    )
    if workers == 0:
        with pytest.raises(ValueError, match="state of process 0 cannot resume process 1"):
            other_process.load_state_dict(state)
            next(iter(other_process))
    resumed = loader()
    resumed.load_state_dict(state)
    batches = iter(resumed)
    assert [keys(next(batches)) for _ in range(17)] == expected[13:]


def test_batches_carry_their_regions_and_one_objective_per_optimizer_step(tmp_path):
    from vlhub.training.objectives import ObjectiveMix, objectives_for

    store, pairs = write_store(tmp_path / "store")
    mix = ObjectiveMix({"mlm": 1, "itm": 1}, objectives_for("uniter"))
    batches = iter(
        StreamedCaptionBatches(
            RegionStore(store), CaptionIndex(pairs), 4, mix, 0, gradient_accumulation_steps=2, shuffle_buffer_size=8
        )
    )
    objectives = []
    reference = RegionStore(store)
    for _ in range(12):
        batch = next(batches)
        assert len({e["objective"] for e in batch}) == 1
        objectives.append(batch[0]["objective"])
        for example in batch:
            assert example["regions"].features.equal(reference[example["image_id"]].features)
    assert objectives[0::2] == objectives[1::2]  # accumulated batches share their step's objective
    assert set(objectives) == {"mlm", "itm"}


def test_bad_streaming_settings_are_refused(tmp_path):
    store, pairs = write_store(tmp_path / "store", shard_size=12)  # 2 shards
    with pytest.raises(ValueError, match="2 shards for 3 processes"):
        stream(store, pairs, world=3)
    with pytest.raises(ValueError, match="fewer than its 2 DataLoader workers"):
        stream(store, pairs, world=2, workers=2)
    with pytest.raises(ValueError, match="shuffle_buffer_size"):
        stream(store, pairs, buffer=0)
    with pytest.raises(TypeError, match="max_steps"):
        len(stream(store, pairs))


def pretrain_arguments(tmp_path: Path, store: Path, *extra: str) -> list[str]:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_CONFIG))
    return [
        "--dataset",
        str(store),
        "--tokenizer",
        str(write_vocab(tmp_path)),
        "--config",
        str(config),
        "--per_device_train_batch_size",
        "4",
        "--logging_steps",
        "1",
        "--objectives",
        "mlm:1",
        "itm:1",
        "--streaming",
        "--shuffle_buffer_size",
        "8",
        *extra,
    ]


# With loader workers (~2.5 s) in the full suite only: the fast loop keeps the training loop's resume without them
# and test_a_restored_stateful_loader_continues_exactly[2] (the loader's workers resume exactly).
@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_streamed_pretraining_resumes_exactly(tmp_path, workers):
    from vlhub.training.cli import pretrain_main

    store, _ = write_store(tmp_path / "store")
    common = pretrain_arguments(
        tmp_path, store, "--max_steps", "16", "--save_steps", "5", "--dataloader_num_workers", str(workers)
    )
    pretrain_main([*common, "--output_dir", str(tmp_path / "straight")])

    def run(*extra, callbacks=()):
        return pretrain_main([*common, "--output_dir", str(tmp_path / "resumed"), *extra], callbacks=callbacks)

    crash_then_resume(run, crash_step=12)  # resumes from checkpoint-10, after more than one epoch (12 steps)
    names = {p.name for p in (tmp_path / "resumed" / "checkpoint-10" / "training_state").iterdir()}
    assert "stream_state_0.json" in names
    expected, got = logged_losses(tmp_path / "straight"), logged_losses(tmp_path / "resumed")
    assert sorted(got) == list(range(1, 17))
    for step in expected:
        assert got[step] == expected[step], step  # exactly: same batches, same arithmetic

    if workers == 0:  # a checkpoint without this process's stream state is refused, naming the file
        from tests.training_helpers import reset_accelerate_state
        from vlhub.training.loop import CHECKSUMS, DamagedCheckpointError
        from vlhub.utils.files import atomic_write_json, file_checksums

        checkpoint = tmp_path / "resumed" / "checkpoint-15"
        (checkpoint / "training_state" / "stream_state_0.json").unlink()
        atomic_write_json(checkpoint / CHECKSUMS, {"files": file_checksums(checkpoint, exclude=(CHECKSUMS,))})
        reset_accelerate_state()
        with pytest.raises(DamagedCheckpointError, match=r"no stream state for process 0 \(stream_state_0.json\)"):
            pretrain_main(
                [*common, "--output_dir", str(tmp_path / "again"), "--resume_from_checkpoint", str(checkpoint)]
            )


def test_streaming_a_non_store_dataset_is_refused(tmp_path):
    import datasets

    from vlhub.training.cli import pretrain_main

    corpus = synthetic_corpus(num_images=6, validation_images=0)
    rows = [
        {
            "image_id": i,
            "caption": c,
            "features": corpus.regions[i].features.tolist(),
            "boxes": corpus.regions[i].boxes.tolist(),
            "image_size": list(corpus.regions[i].image_size),
        }
        for i, c in corpus.train
    ]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "inline"))
    arguments = pretrain_arguments(
        tmp_path, tmp_path / "inline", "--max_steps", "2", "--output_dir", str(tmp_path / "run")
    )
    with pytest.raises(ValueError, match="--streaming reads the shards of a vlhub region store"):
        pretrain_main(
            [
                *arguments[: arguments.index("--objectives")],
                "--objectives",
                "mlm:1",
                *arguments[arguments.index("--streaming") :],
            ]
        )


@pytest.mark.slow
def test_two_process_streaming_reads_disjoint_shards_and_resumes_exactly(tmp_path):
    """`pretrain.py --streaming` in 2 processes (forked from preloaded code as `accelerate launch --num_processes 2`
    starts them: tests/process_group.py): each process streams its own shards (its stream state names what it
    read), and a run resumed from checkpoint-4 logs what the uninterrupted run logged."""
    from tests.process_group import run_processes

    store, _ = write_store(tmp_path / "store")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    base = pretrain_arguments(tmp_path, store, "--max_steps", "8", "--save_steps", "4")
    for process in run_processes(
        str(REPO / "pretrain.py"), [*base, "--output_dir", str(tmp_path / "run")], env, tmp_path
    ):
        assert process.returncode == 0, process.stderr[-4000:]
    states = [
        json.loads((tmp_path / "run" / "checkpoint-4" / "training_state" / f"stream_state_{rank}.json").read_text())
        for rank in (0, 1)
    ]
    assert [state["dataset_state"]["process"] for state in states] == [0, 1]  # each its own stream
    resumed = [
        *base,
        "--output_dir",
        str(tmp_path / "resumed"),
        "--resume_from_checkpoint",
        str(tmp_path / "run" / "checkpoint-4"),
    ]
    for process in run_processes(str(REPO / "pretrain.py"), resumed, env, tmp_path):
        assert process.returncode == 0, process.stderr[-4000:]
    expected, got = logged_losses(tmp_path / "run"), logged_losses(tmp_path / "resumed")
    assert sorted(got) == list(range(1, 9))
    for step in expected:
        assert got[step]["loss"] == pytest.approx(expected[step]["loss"], rel=1e-6), step
