"""Training conventions a transformers user already knows: transformers-style flag names (old names still work),
epochs beside steps, a trainer_state.json that `TrainerState.load_from_json` reads, and no secret in any file."""

from __future__ import annotations

import json

import pytest
from transformers import TrainerState

from tests.test_training_cli import write_store_dataset
from tests.training_helpers import TINY_CONFIG, write_vocab
from vlhub.training.cli import launch_command, pretrain_main, redact_secrets


pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def test_epochs_state_file_and_transformers_flag_names(tmp_path):
    store = write_store_dataset(tmp_path / "data")
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_CONFIG))
    result = pretrain_main(
        [
            "--model_type",
            "uniter",
            "--config_name",
            str(config),
            "--tokenizer_name",
            str(write_vocab(tmp_path)),
            "--dataset",
            str(store),
            "--num_train_epochs",
            "2",
            "--per_device_train_batch_size",
            "8",
            "--per_device_eval_batch_size",
            "4",
            "--objectives",
            "mlm",
            "--logging_steps",
            "1",
            "--save_steps",
            "3",
            "--output_dir",
            str(tmp_path / "run"),
            "--hub_token",
            "hf_secret_value",
            "--hub_model_id",
            "u/r",
        ]
    )
    # 48 training captions / batch 8 = 6 steps per epoch, 2 epochs.
    assert result.global_step == 12
    for folder in (tmp_path / "run", tmp_path / "run" / "checkpoint-3"):
        state = TrainerState.load_from_json(str(folder / "trainer_state.json"))
        assert state.max_steps == 12 and state.train_batch_size == 8
    assert TrainerState.load_from_json(str(tmp_path / "run" / "checkpoint-3" / "trainer_state.json")).global_step == 3
    written = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert written and not [p for p in written if b"hf_secret_value" in p.read_bytes()]


def test_secret_flags_are_redacted_in_the_recorded_command():
    argv = ["--hub_token", "hf_abc", "--password=pw", "--api-key", "k", "--tokenizer_name", "vocab.txt"]
    assert redact_secrets(argv) == [
        "--hub_token",
        "***",
        "--password=***",
        "--api-key",
        "***",
        "--tokenizer_name",
        "vocab.txt",
    ]
    assert "hf_abc" not in launch_command("pretrain.py", argv)
