"""A tiny synthetic caption corpus whose captions are predictable from the regions (so losses can fall)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import BertTokenizer

import vlhub
from vlhub.training import CaptionCorpus

COLOURS = ["red", "blue", "green", "yellow"]
SHAPES = ["circle", "square", "triangle"]
WORDS = ["a", "an", "the", "and", "left", "right", "of", "image", "with", "big", "small"]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_vocab(folder: Path) -> Path:
    path = folder / "vocab.txt"
    path.write_text("\n".join(SPECIALS + COLOURS + SHAPES + WORDS) + "\n", encoding="utf-8")
    return path


def synthetic_corpus(
    num_images: int = 24, feature_dim: int = 12, seed: int = 0, captions_per_image: int = 2, validation_images: int = 8
) -> CaptionCorpus:
    """Images of 2-3 objects; a region's features encode its colour and shape; class_probs its shape."""
    generator = torch.Generator().manual_seed(seed)
    regions, train, validation = {}, [], []
    num_classes = len(SHAPES) + 1
    for image in range(num_images + validation_images):
        count = int(torch.randint(2, 4, (1,), generator=generator))
        colours = torch.randint(len(COLOURS), (count,), generator=generator)
        shapes = torch.randint(len(SHAPES), (count,), generator=generator)
        features = torch.rand(count, feature_dim, generator=generator) * 0.1
        features[torch.arange(count), colours] += 1.0
        features[torch.arange(count), len(COLOURS) + shapes] += 1.0
        xy = torch.rand(count, 2, generator=generator) * 20
        boxes = torch.cat([xy, xy + 5 + torch.rand(count, 2, generator=generator) * 10], dim=1)
        class_probs = torch.full((count, num_classes), 0.02)
        class_probs[torch.arange(count), shapes + 1] = 1 - 0.02 * (num_classes - 1)
        image_id = f"img{image:03d}"
        regions[image_id] = vlhub.RegionFeatures(
            features=features, boxes=boxes, image_size=(40, 40), class_probs=class_probs, scores=torch.ones(count)
        )
        target = train if image < num_images else validation
        for k in range(captions_per_image):
            obj = k % count
            target.append(
                (
                    image_id,
                    f"a {COLOURS[colours[obj]]} {SHAPES[shapes[obj]]} and a "
                    f"{COLOURS[colours[(obj + 1) % count]]} {SHAPES[shapes[(obj + 1) % count]]}",
                )
            )
    return CaptionCorpus(
        train=train, validation=validation, regions=regions, name="synthetic", description="synthetic test corpus"
    )


def tiny_tokenizer(folder: Path) -> BertTokenizer:
    return BertTokenizer(vocab=str(write_vocab(folder)), do_lower_case=True)


TINY_CONFIG = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=32
)


class SimulatedCrash(RuntimeError):
    """Raised by `crash_then_resume`'s callback to interrupt a run."""


def reset_accelerate_state() -> None:
    """Forget accelerate's process-wide singletons (a Trainer/Accelerator leaves them set), so that the next test
    builds its own."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def tiny_pretraining_run(tmp_path: Path, model_type: str):
    """`vlhub-pretrain` (pretrain_main) of `model_type`'s "tiny" config on the synthetic store dataset: 3 steps of
    batch 4, logging every step, into tmp_path/run. Returns pretrain_main's result."""
    from tests.test_training_cli import write_store_dataset
    from vlhub.training.cli import pretrain_main

    store = write_store_dataset(tmp_path / "data")
    return pretrain_main(
        [
            "--model_type",
            model_type,
            "--config_name",
            "tiny",
            "--dataset",
            str(store),
            "--tokenizer_name",
            str(write_vocab(tmp_path)),
            "--max_steps",
            "3",
            "--per_device_train_batch_size",
            "4",
            "--logging_steps",
            "1",
            "--output_dir",
            str(tmp_path / "run"),
        ]
    )


def logged_losses(folder: Path) -> dict[int, dict]:
    """step → the logged row with a loss, read from a run's log_history.jsonl."""
    import json

    rows = [json.loads(line) for line in (folder / "log_history.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if "loss" in r}


def crash_then_resume(run, crash_step: int) -> None:
    """`run(*extra_args, callbacks=...)` is interrupted after `crash_step`, then resumed from its latest checkpoint
    (`--resume_from_checkpoint latest`), with accelerate's state reset around each run."""
    import pytest

    def crash(state):
        if state.step == crash_step:
            raise SimulatedCrash

    reset_accelerate_state()
    with pytest.raises(SimulatedCrash):
        run(callbacks=[crash])
    reset_accelerate_state()
    run("--resume_from_checkpoint", "latest")


def evaluate_pretraining(model, processor, corpus, ratios: dict, model_type: str) -> dict:
    """`PretrainingTask.evaluate` of `model` on `corpus`'s validation captions with the objectives `ratios`
    (batches of 4, one CPU process)."""
    from types import SimpleNamespace

    from accelerate import Accelerator

    from vlhub.training.objectives import ObjectiveMix, objectives_for
    from vlhub.training.pretraining import PretrainingTask

    task = PretrainingTask(model, processor, corpus, ObjectiveMix(ratios, objectives_for(model_type)))
    args = SimpleNamespace(
        max_eval_samples=0,
        per_device_eval_batch_size=4,
        seed=0,
        dataloader_num_workers=0,
        dataloader_prefetch_factor=None,
        dataloader_pin_memory=False,
        dataloader_persistent_workers=False,
    )
    return task.evaluate(Accelerator(cpu=True), model.eval(), args)


def captioning_finetune_run(tmp_path: Path, store: Path, pretrained: Path, metrics, steps: int = 2):
    """`finetune.py --task captioning` (finetune_main) from `pretrained` on the synthetic corpus's captions (a
    `datasets` folder with train and validation splits, regions from `store`): batches of 4, at most 6 caption
    tokens, into tmp_path/cap. Returns finetune_main's result."""
    import datasets

    from vlhub.training.cli import finetune_main

    corpus = synthetic_corpus()
    splits = {
        name: datasets.Dataset.from_dict({"image_id": [i for i, _ in pairs], "caption": [c for _, c in pairs]})
        for name, pairs in (("train", corpus.train), ("validation", corpus.validation))
    }
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "captions"))
    return finetune_main(
        [
            "--task",
            "captioning",
            "--model_name_or_path",
            str(pretrained),
            "--dataset",
            str(tmp_path / "captions"),
            "--region_store",
            str(store),
            "--caption_metrics",
            *metrics,
            "--max_caption_tokens",
            "6",
            "--max_steps",
            str(steps),
            "--per_device_train_batch_size",
            "4",
            "--logging_steps",
            "1",
            "--output_dir",
            str(tmp_path / "cap"),
        ]
    )


def assert_resume_reproduces(run, expected: Path, resumed: Path, crash_step: int, keys=("loss",)) -> None:
    """`run("--output_dir", resumed, ...)` crashed after `crash_step` and resumed (`crash_then_resume`) logs exactly
    the `keys` the uninterrupted run in `expected` logged, at every step."""
    crash_then_resume(
        lambda *extra, callbacks=(): run("--output_dir", str(resumed), *extra, callbacks=callbacks),
        crash_step=crash_step,
    )
    want, got = logged_losses(expected), logged_losses(resumed)
    assert want and sorted(got) == sorted(want)
    for step in want:
        for key in keys:
            assert got[step][key] == want[step][key], (step, key)
