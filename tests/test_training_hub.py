"""--push_to_hub against a real HTTP server on loopback, and a Hub that cannot be reached or refuses uploads."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from accelerate.state import AcceleratorState, GradientState

from tests.hub_server import FakeHub
import vlhub.training.hub
from tests.test_training_loop import make_task
from vlhub.training import HubError, TrainingArguments, train


@pytest.fixture(autouse=True)
def online_towards_loopback(monkeypatch):
    # The suite runs with HF_HUB_OFFLINE=1; these tests talk to a server on 127.0.0.1 only.
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def push_args(tmp_path, **overrides) -> TrainingArguments:
    settings = dict(
        output_dir=str(tmp_path / "run"),
        max_steps=4,
        per_device_batch_size=4,
        save_steps=2,
        logging_steps=1,
        push_to_hub=True,
        hub_model_id="tester/uniter-tiny",
        hub_token="hf_fake",
    )
    return TrainingArguments(**{**settings, **overrides})


def test_push_to_hub_uploads_checkpoints_and_the_final_model(tmp_path, monkeypatch):
    with FakeHub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        result = train(make_task(tmp_path, {"mlm": 1}), push_args(tmp_path), command="python pretrain.py --push_to_hub")
    assert hub.unknown == []
    assert result.hub_failures == []
    messages = [message for _, message, _ in hub.commits]
    assert messages == ["Training in progress, step 2", "Training in progress, step 4", "End of training (step 4)"]
    files = hub.repos["tester/uniter-tiny"]
    local = tmp_path / "run"
    for name in (
        "config.json",
        "model.safetensors",
        "processor_config.json",
        "tokenizer.json",
        "README.md",
        "trainer_state.json",
        "log_history.jsonl",
    ):
        assert files[name] == (local / name).read_bytes(), name
    # Optimizer/RNG state and the checkpoint folders stay local.
    assert not [path for path in files if path.startswith(("training_state", "checkpoint-"))]
    for _, _, paths in hub.commits[:2]:
        assert "model.safetensors" in paths and not any(p.startswith("training_state") for p in paths)
    assert b"python pretrain.py --push_to_hub" in files["README.md"]


def test_unreachable_hub_is_a_clear_error_before_training(tmp_path, monkeypatch):
    with FakeHub() as hub:
        closed = hub.url
    monkeypatch.setenv("HF_ENDPOINT", closed)  # the server is gone: connection refused
    # The pauses between tries are recorded, not slept (1 s + 2 s of waiting that checks nothing more).
    pauses = []
    monkeypatch.setattr(vlhub.training.hub, "time", SimpleNamespace(sleep=pauses.append, monotonic=time.monotonic))
    with pytest.raises(HubError) as error:
        train(make_task(tmp_path, {"mlm": 1}), push_args(tmp_path))
    message = str(error.value)
    assert "tester/uniter-tiny" in message and closed in message and "--push_to_hub" in message
    assert pauses == [1.0, 2.0]  # three tries, each pause twice the one before
    assert not (tmp_path / "run").exists()  # nothing was trained, so nothing is lost


def test_failing_uploads_keep_every_local_checkpoint(tmp_path, monkeypatch):
    from transformers import AutoModelForPreTraining

    with FakeHub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)

        def revoke_after_first_checkpoint(state):
            if state.step == 3:
                hub.refuse_uploads = True

        with pytest.raises(HubError) as error:
            train(make_task(tmp_path, {"mlm": 1}), push_args(tmp_path), callbacks=[revoke_after_first_checkpoint])
    assert "403" in str(error.value) and str((tmp_path / "run").resolve()) in str(error.value)
    for folder in (tmp_path / "run" / "checkpoint-2", tmp_path / "run" / "checkpoint-4", tmp_path / "run"):
        assert (folder / "model.safetensors").is_file() and (folder / "README.md").is_file()
        AutoModelForPreTraining.from_pretrained(folder)
    assert (tmp_path / "run" / "checkpoint-4" / "training_state" / "optimizer.bin").is_file()
