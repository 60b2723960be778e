"""The training loop on a tiny synthetic corpus: losses fall, exact resumption, checkpoints load with Auto classes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from accelerate.utils import set_seed

from tests.training_helpers import TINY_CONFIG, reset_accelerate_state, synthetic_corpus, tiny_tokenizer
from vlhub.training import (
    ObjectiveMix,
    PretrainingTask,
    TrainingArguments,
    build_pretraining_model,
    objectives_for,
    resolve_checkpoint,
    train,
)


pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def make_task(tmp_path: Path, objectives: dict | None = None, seed: int = 0) -> PretrainingTask:
    corpus = synthetic_corpus()
    set_seed(seed)
    model, processor = build_pretraining_model(None, TINY_CONFIG, tiny_tokenizer(tmp_path), corpus)
    mix = ObjectiveMix(objectives, objectives_for("uniter")) if objectives else None
    return PretrainingTask(model, processor, corpus, mix)


def read_log(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "log_history.jsonl").read_text().splitlines()]


class SimulatedCrash(RuntimeError):
    pass


def test_losses_fall_on_a_tiny_run(tmp_path):
    args = TrainingArguments(
        output_dir=str(tmp_path / "run"),
        max_steps=40,
        per_device_batch_size=8,
        logging_steps=10,
        learning_rate=2e-3,
        warmup_steps=2,
    )
    result = train(make_task(tmp_path, {"mlm": 1, "mrfr": 1}), args)
    train_logs = [r for r in result.log_history if "loss" in r]
    assert [r["step"] for r in train_logs] == [10, 20, 30, 40]
    assert train_logs[-1]["mlm_loss"] < 0.85 * train_logs[0]["mlm_loss"]
    assert train_logs[-1]["mrfr_loss"] < train_logs[0]["mrfr_loss"]
    assert train_logs[-1]["learning_rate"] == 0.0  # linear decay ends at zero
    assert read_log(tmp_path / "run") == result.log_history


@pytest.mark.parametrize("accumulation, workers", [(1, 0), (2, 0), (1, 2)])
def test_resume_reproduces_an_uninterrupted_run(tmp_path, accumulation, workers):
    # 48 captions / (6 x accumulation) per step: with accumulation 2 the resumed run also crosses an epoch boundary.
    # With workers, the interrupted and resumed runs load in 2 DataLoader worker processes and must still log exactly
    # what the uninterrupted run, loading in the training loop, logged.
    common = dict(
        max_steps=8,
        per_device_batch_size=6,
        logging_steps=1,
        save_steps=3,
        learning_rate=1e-3,
        eval_steps=4,
        max_eval_samples=8,
        seed=3,
        gradient_accumulation_steps=accumulation,
    )
    straight = train(make_task(tmp_path, seed=3), TrainingArguments(output_dir=str(tmp_path / "a"), **common))
    common["dataloader_num_workers"] = workers

    def crash_after_step_5(state):
        if state.step == 5:
            raise SimulatedCrash

    interrupted = TrainingArguments(output_dir=str(tmp_path / "b"), **common)
    with pytest.raises(SimulatedCrash):
        train(make_task(tmp_path, seed=3), interrupted, callbacks=[crash_after_step_5])
    assert [r["step"] for r in read_log(tmp_path / "b") if "loss" in r] == [1, 2, 3, 4, 5]
    assert resolve_checkpoint("latest", tmp_path / "b").name == "checkpoint-3"

    reset_accelerate_state()
    # A different initialisation seed for the resumed process: everything must come from the checkpoint.
    resumed = TrainingArguments(output_dir=str(tmp_path / "b"), resume_from_checkpoint="latest", **common)
    result = train(make_task(tmp_path, seed=99), resumed)
    assert result.global_step == 8
    expected, got = read_log(tmp_path / "a"), read_log(tmp_path / "b")
    assert [r["step"] for r in got] == [r["step"] for r in expected]
    for want, have in zip(expected, got):
        assert want.keys() == have.keys()
        for key in want:
            assert have[key] == want[key], (want["step"], key)  # exactly: same arithmetic, same order
    assert straight.log_history == read_log(tmp_path / "a")


def test_checkpoint_is_a_complete_pretrained_folder(tmp_path):
    from transformers import AutoModel, AutoModelForPreTraining, AutoProcessor

    import vlhub  # noqa: F401  (registers the Auto classes)

    args = TrainingArguments(
        output_dir=str(tmp_path / "run"), max_steps=2, per_device_batch_size=4, save_steps=2, logging_steps=1
    )
    task = make_task(tmp_path, {"mlm": 1})
    train(task, args)
    folder = tmp_path / "run" / "checkpoint-2"
    assert {"config.json", "model.safetensors", "processor_config.json", "README.md", "trainer_state.json"} <= {
        p.name for p in folder.iterdir()
    }
    model = AutoModelForPreTraining.from_pretrained(folder)
    trained = task.model.state_dict()
    for key, value in model.state_dict().items():
        assert torch.equal(value, trained[key]), key
    assert type(AutoModel.from_pretrained(folder)).__name__ == "UniterModel"
    processor = AutoProcessor.from_pretrained(folder)
    regions = task.corpus.regions[task.corpus.train[0][0]]
    inputs = processor(text=["a red circle"], regions=[regions], return_tensors="pt")
    assert model(**inputs).itm_logits.shape == (1, 2)
    card = (folder / "README.md").read_text()
    assert "synthetic test corpus" in card and "checkpoint" not in card.split("## How it was trained")[0].lower()


def test_bad_resume_folder_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a vlhub training checkpoint"):
        resolve_checkpoint(str(tmp_path), tmp_path)
    with pytest.raises(FileNotFoundError, match="no checkpoint-<step> folder"):
        resolve_checkpoint("latest", tmp_path)
