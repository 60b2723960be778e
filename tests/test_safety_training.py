"""What a checkpoint folder and a Hub push must survive: secrets never written or uploaded, another run's checkpoints
never mixed in, damaged checkpoints named (and skipped by `latest`), and a Hub that never answers."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.hub_server import FakeHub, SilentServer
from tests.test_training_cli import write_store_dataset
from tests.test_training_loop import make_task, read_log
from tests.training_helpers import TINY_CONFIG, reset_accelerate_state, write_vocab
from vlhub.training import HubError, VlhubTrainingArguments, train
from vlhub.training.cli import pretrain_main
from vlhub.training.loop import DamagedCheckpointError, resolve_checkpoint, verify_checkpoint
from vlhub.utils.secrets import scrub_secrets, secret_values


pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


@pytest.fixture
def online_towards_loopback(monkeypatch):
    # The suite runs with HF_HUB_OFFLINE=1; these tests talk to servers on 127.0.0.1 only.
    import huggingface_hub.constants
    import huggingface_hub.utils._http as hub_http

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    # huggingface_hub's retries wait up to 8 s between tries; the number of tries is what is tested, not the waits.
    monkeypatch.setattr(hub_http.time, "sleep", lambda seconds: None)
    yield
    from huggingface_hub.utils import close_session

    close_session()  # the next test gets a fresh client (these tests set its timeout)


def arguments(tmp_path, name="run", **overrides) -> VlhubTrainingArguments:
    settings = dict(
        output_dir=str(tmp_path / name),
        max_steps=4,
        per_device_train_batch_size=4,
        save_steps=2,
        logging_steps=1,
        learning_rate=1e-3,
    )
    return VlhubTrainingArguments(**{**settings, **overrides})


# -- 1. secrets ------------------------------------------------------------------------------------------------------


def test_a_pushed_run_writes_and_uploads_no_token(tmp_path, monkeypatch, online_towards_loopback):
    flag_token, env_token = "hf_FlagTokenValue123456", "hf_EnvironmentToken654321"
    monkeypatch.setenv("HF_TOKEN", env_token)
    store = write_store_dataset(tmp_path / "data")
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_CONFIG))
    with FakeHub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        pretrain_main(
            [
                "--model_type",
                "uniter",
                "--config_name",
                str(config),
                "--tokenizer_name",
                str(write_vocab(tmp_path)),
                "--dataset",
                str(store),
                "--max_steps",
                "4",
                "--per_device_train_batch_size",
                "4",
                "--objectives",
                "mlm",
                "--logging_steps",
                "1",
                "--save_steps",
                "2",
                "--output_dir",
                str(tmp_path / "run"),
                "--push_to_hub",
                "--hub_model_id",
                "tester/leak-check",
                "--hub_token",
                flag_token,
                "--report_to",
                "none",
            ]
        )
    received = hub.repos["tester/leak-check"]
    assert "README.md" in received and "trainer_state.json" in received and len(hub.commits) == 3
    for name, content in received.items():
        for secret in (flag_token, env_token):
            assert secret.encode() not in content, f"{secret} uploaded in {name}"
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            content = path.read_bytes()
            assert flag_token.encode() not in content and env_token.encode() not in content, path
    assert "--hub_token '***'" in received["README.md"].decode()


def test_known_secret_values_are_scrubbed_from_any_text(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "wandb-key-0123456789")
    monkeypatch.setenv("MY_PASSWORD", "correct-horse")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # named like a token setting, but not a secret word-end
    text = "python pretrain.py --hub_tok hf_abbreviated_flag --note wandb-key-0123456789 correct-horse false"
    scrubbed = scrub_secrets(text, ["hf_abbreviated_flag"])
    assert scrubbed == "python pretrain.py --hub_tok *** --note *** *** false"
    assert "false" not in secret_values()


# -- 3. one run per output_dir ---------------------------------------------------------------------------------------


def test_a_fresh_run_refuses_a_folder_holding_another_run(tmp_path):
    train(make_task(tmp_path), arguments(tmp_path, max_steps=6))
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == [
        "checkpoint-2",
        "checkpoint-4",
        "checkpoint-6",
    ]
    reset_accelerate_state()
    with pytest.raises(FileExistsError, match="checkpoint-6.*--overwrite_output_dir"):
        train(make_task(tmp_path), arguments(tmp_path, max_steps=4))

    # With --overwrite_output_dir the old checkpoints go first, so resume and rotation only see the new run.
    reset_accelerate_state()
    result = train(
        make_task(tmp_path, seed=1), arguments(tmp_path, max_steps=4, save_total_limit=2, overwrite_output_dir=True)
    )
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert resolve_checkpoint("latest", tmp_path / "run").name == "checkpoint-4"
    assert json.loads((tmp_path / "run" / "checkpoint-4" / "trainer_state.json").read_text())["max_steps"] == 4
    assert [r["step"] for r in read_log(tmp_path / "run") if "loss" in r] == [1, 2, 3, 4]
    assert result.global_step == 4


# -- 4. damaged checkpoints ------------------------------------------------------------------------------------------


@functools.cache
def _crashed_run_template() -> Path:
    """One crashed run per test process for `crashed_run` to copy (training it was most of each user's time)."""
    folder = Path(tempfile.mkdtemp(prefix="vlhub-crashed-run-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)

    class Crash(RuntimeError):
        pass

    def crash(state):
        if state.step == 5:
            raise Crash

    with pytest.raises(Crash):
        train(make_task(folder), arguments(folder, max_steps=6), callbacks=[crash])
    reset_accelerate_state()
    return folder / "run"


def crashed_run(tmp_path):
    """`tmp_path / "run"`: a run interrupted after step 5 with checkpoints at steps 2 and 4 (a copy of one run)."""
    shutil.copytree(_crashed_run_template(), tmp_path / "run")
    return tmp_path / "run"


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, file, problem",
    [
        (truncate, "model.safetensors", "model.safetensors has .* bytes"),
        (truncate, "training_state/optimizer.bin", "training_state/optimizer.bin has .* bytes"),
        (flip_a_byte, "training_state/optimizer.bin", "content of training_state/optimizer.bin differs"),
        (lambda path: path.unlink(), "training_state/random_states_0.pkl", "random_states_0.pkl is missing"),
        (lambda path: path.unlink(), "checksums.json", "incomplete"),
    ],
)
def test_a_damaged_checkpoint_is_named_and_latest_falls_back(tmp_path, caplog, damage, file, problem):
    run = crashed_run(tmp_path)
    verify_checkpoint(run / "checkpoint-4")
    damage(run / "checkpoint-4" / file)
    with pytest.raises(DamagedCheckpointError, match=f"checkpoint-4.*{problem}"):
        train(make_task(tmp_path), arguments(tmp_path, max_steps=6, resume_from_checkpoint=str(run / "checkpoint-4")))
    reset_accelerate_state()
    with caplog.at_level("WARNING"):
        result = train(make_task(tmp_path), arguments(tmp_path, max_steps=6, resume_from_checkpoint="latest"))
    assert result.global_step == 6
    assert "skipping damaged checkpoints" in caplog.text and "checkpoint-4" in caplog.text
    assert "resuming from" in caplog.text and "checkpoint-2" in caplog.text


def test_missing_rng_state_is_an_error_even_without_checksums(tmp_path):
    run = crashed_run(tmp_path)
    (run / "checkpoint-4" / "training_state" / "random_states_0.pkl").unlink()
    manifest = json.loads((run / "checkpoint-4" / "checksums.json").read_text())
    del manifest["files"]["training_state/random_states_0.pkl"]  # as if it had never been saved
    (run / "checkpoint-4" / "checksums.json").write_text(json.dumps(manifest))
    with pytest.raises(DamagedCheckpointError, match="no RNG state for process 0"):
        train(make_task(tmp_path), arguments(tmp_path, max_steps=6, resume_from_checkpoint="latest"))


def test_no_damaged_checkpoint_anywhere_is_an_error_listing_each(tmp_path):
    run = crashed_run(tmp_path)
    truncate(run / "checkpoint-2" / "model.safetensors")
    flip_a_byte(run / "checkpoint-4" / "trainer_state.json")
    with pytest.raises(DamagedCheckpointError, match="no intact checkpoint.*checkpoint-4.*checkpoint-2"):
        resolve_checkpoint("latest", run)


def test_state_files_are_written_through_a_rename(tmp_path, monkeypatch):
    replaced = []
    real_replace = os.replace

    def recording_replace(source, target):
        replaced.append(os.path.basename(target))
        return real_replace(source, target)

    monkeypatch.setattr(os, "replace", recording_replace)
    train(make_task(tmp_path), arguments(tmp_path, max_steps=2))
    for name in ("trainer_state.json", "vlhub_state.json", "checksums.json"):
        assert name in replaced, name
    assert not [p for p in (tmp_path / "run").rglob("*.tmp")]


# -- 5. a Hub that never answers -------------------------------------------------------------------------------------


def stalled_hub_arguments(tmp_path):
    """A pushing run whose Hub calls give up fast: 0.5 s per read, 1 s in all per operation."""
    return arguments(
        tmp_path,
        push_to_hub=True,
        hub_model_id="tester/stalled",
        hub_token="hf_fake",
        hub_timeout=0.5,
        hub_total_timeout=1,
    )


def test_a_hub_that_never_answers_fails_before_training(tmp_path, monkeypatch, online_towards_loopback):
    with SilentServer() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        with pytest.raises(HubError, match="tester/stalled.*Timeout"):
            train(make_task(tmp_path), stalled_hub_arguments(tmp_path))
    assert not (tmp_path / "run").exists()


def test_a_stalled_upload_ends_in_an_error_after_training_with_local_checkpoints_intact(
    tmp_path, monkeypatch, online_towards_loopback
):
    with FakeHub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)

        def stall_after_creation(state):
            hub.stall_uploads = True

        with pytest.raises(HubError) as error:
            train(make_task(tmp_path), stalled_hub_arguments(tmp_path), callbacks=[stall_after_creation])
        assert hub.stalled >= 1 and hub.commits == []
    assert "Timeout" in str(error.value) and str((tmp_path / "run").resolve()) in str(error.value)
    for step in (2, 4):
        verify_checkpoint(tmp_path / "run" / f"checkpoint-{step}")
    assert (tmp_path / "run" / "model.safetensors").is_file()
