"""Issue 25, findings 1, 2, 4 and 7: resume restores all state or names what it cannot; one run per --output_dir;
every Hub call has a deadline; a user's mistake is one line, a bug a traceback."""

from __future__ import annotations

import fractions
import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from vlhub.utils.errors import USER_ERROR_EXIT_CODE, VlhubUserError, named_input, run_command

from .helpers import random_regions, tiny_detector, write_test_image

REPO = Path(__file__).resolve().parents[1]


# ---- 7. one line for a user error, a traceback for a bug ----


def _error_lines(err: str, prefix: str) -> list[str]:
    # The rest is tqdm's progress bar (lines it redraws end in "\r").
    return [line for line in err.replace("\r", "\n").splitlines() if line.startswith(prefix)]


def test_a_user_error_is_one_line_a_bug_keeps_its_traceback(capsys, monkeypatch):
    def bad_input():
        raise VlhubUserError("data.bin: the header says 3 rows,\nthe file holds 2")

    monkeypatch.delenv("VLHUB_DEBUG", raising=False)
    assert run_command("tool", bad_input) == USER_ERROR_EXIT_CODE
    err = capsys.readouterr().err
    assert err == "tool: error: data.bin: the header says 3 rows, the file holds 2\n"

    def bug():
        raise ZeroDivisionError("a bug")

    with pytest.raises(ZeroDivisionError):
        run_command("tool", bug)

    monkeypatch.setenv("VLHUB_DEBUG", "1")
    assert run_command("tool", bad_input) == USER_ERROR_EXIT_CODE
    err = capsys.readouterr().err
    assert "Traceback" in err and err.endswith("tool: error: data.bin: the header says 3 rows, the file holds 2\n")


def test_vlhub_extract_on_a_non_image_is_one_line(tmp_path, capsys, monkeypatch):
    from vlhub.cli import main

    monkeypatch.delenv("VLHUB_DEBUG", raising=False)
    tiny_detector().save_pretrained(tmp_path / "detector")
    (tmp_path / "images").mkdir()
    write_test_image(tmp_path / "images" / "good.png", seed=0)
    (tmp_path / "images" / "fake.png").write_text("not an image")
    code = main(
        [
            "extract",
            str(tmp_path / "images"),
            "--extractor",
            str(tmp_path / "detector"),
            "--output",
            str(tmp_path / "store"),
        ]
    )
    err = capsys.readouterr().err
    assert code == USER_ERROR_EXIT_CODE and "Traceback" not in err
    lines = _error_lines(err, "vlhub extract: error:")
    assert len(lines) == 1 and "fake.png" in lines[0] and "not an image" in lines[0]


def test_a_second_writer_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    from vlhub.cli import main
    from vlhub.processing.stores import RegionStoreWriter

    monkeypatch.delenv("VLHUB_DEBUG", raising=False)
    tiny_detector().save_pretrained(tmp_path / "detector")
    write_test_image(tmp_path / "a.png", seed=0)
    with RegionStoreWriter(tmp_path / "store", shard_size=2):  # the first writer, still writing
        code = main(
            [
                "extract",
                str(tmp_path / "a.png"),
                "--extractor",
                str(tmp_path / "detector"),
                "--output",
                str(tmp_path / "store"),
            ]
        )
    err = capsys.readouterr().err
    assert code == USER_ERROR_EXIT_CODE and "Traceback" not in err
    lines = _error_lines(err, "vlhub extract: error:")
    assert len(lines) == 1 and "another writer" in lines[0] and str(tmp_path / "store") in lines[0]


@pytest.mark.parametrize("damage", [b"garbage" * 200, "flip"])
def test_a_damaged_store_index_names_the_file(tmp_path, damage):
    from vlhub.processing.stores import RegionStore, RegionStoreWriter

    with RegionStoreWriter(tmp_path / "store", shard_size=2) as writer:
        for i in range(3):
            writer.add(f"img{i}", random_regions(3, 8, seed=i))
    index = tmp_path / "store" / "index.sqlite"
    data = index.read_bytes()
    index.write_bytes(damage if isinstance(damage, bytes) else data[:100] + b"\xff" * 50 + data[150:])
    with pytest.raises(
        VlhubUserError,
        match=r"index\.sqlite \(the region store's id index\) cannot be read: "
        r"DatabaseError",
    ) as caught:
        store = RegionStore(tmp_path / "store")
        store["img0"]
    assert isinstance(caught.value.__cause__, sqlite3.DatabaseError)


@pytest.mark.parametrize(
    "name, content",
    [("captions.parquet", b"PAR1 not parquet PAR1"), ("captions.jsonl", b'{"caption": "a red' + b"\x00\x01")],
)
def test_a_damaged_caption_file_names_the_file(tmp_path, name, content):
    from vlhub.training.data import load_table

    (tmp_path / name).write_bytes(content)
    with pytest.raises(VlhubUserError, match=rf"{name} \(a (parquet|json) data file\) cannot be read: ArrowInvalid"):
        load_table(str(tmp_path / name))


def test_a_hostile_yaml_config_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    from vlhub.conversion.detector import config_from_yaml

    monkeypatch.delenv("VLHUB_DEBUG", raising=False)
    (tmp_path / "config.yaml").write_text("MODEL: !!python/object/apply:os.system ['touch pwned']\n")
    code = run_command("vlhub convert", lambda: config_from_yaml(tmp_path / "config.yaml", "frcnn"))
    err = capsys.readouterr().err
    assert code == USER_ERROR_EXIT_CODE and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(
        f"vlhub convert: error: {tmp_path / 'config.yaml'} (the detector config) cannot be read: ConstructorError"
    )
    assert not (tmp_path / "pwned").exists()


def test_memory_error_of_a_reader_names_the_file():
    with pytest.raises(VlhubUserError, match=r"huge\.npz \(a feature file\) cannot be read: MemoryError"):
        with named_input("huge.npz", "a feature file"):
            raise MemoryError()


# ---- 1. resume restores every generator or names the one it cannot ----


def _replace_rng_state(checkpoint, write):
    """Replace process 0's RNG file and record matching checksums, so only the content can tell it is wrong."""
    from vlhub.training.loop import CHECKSUMS
    from vlhub.utils.files import file_checksums

    write(checkpoint / "training_state" / "random_states_0.pkl")
    (checkpoint / CHECKSUMS).write_text(json.dumps({"files": file_checksums(checkpoint, exclude=(CHECKSUMS,))}))


def _torch_save(value):
    return lambda path: torch.save(value, path)


def _truncated(path):
    path.write_bytes(path.read_bytes()[:40])


@pytest.mark.usefixtures("fresh_accelerate_state")
@pytest.mark.parametrize(
    "write, problem",
    [
        (_truncated, r"random_states_0\.pkl cannot be read \("),
        (_torch_save({}), r"random_states_0\.pkl has no random_state \(Python's random generator\)"),
        (_torch_save([1, 2]), r"random_states_0\.pkl holds a list"),
        (_torch_save({"random_state": fractions.Fraction(1, 3)}), r"random_states_0\.pkl cannot be read \(Unpickling"),
        (
            _torch_save(
                {
                    "random_state": (3, tuple(range(625)), None),
                    "numpy_random_seed": "not a state",
                    "torch_manual_seed": torch.get_rng_state(),
                }
            ),
            r"random_states_0\.pkl: numpy_random_seed \(numpy's global generator\) cannot be restored",
        ),
    ],
    ids=["truncated", "empty-dict", "a-list", "refused-pickle", "bad-numpy-state"],
)
def test_an_unreadable_rng_state_stops_the_resume_naming_file_and_piece(tmp_path, write, problem):
    from tests.test_safety_training import arguments, crashed_run
    from tests.test_training_loop import make_task
    from vlhub.training import train
    from vlhub.training.loop import DamagedCheckpointError, verify_checkpoint

    run = crashed_run(tmp_path)
    _replace_rng_state(run / "checkpoint-4", write)
    verify_checkpoint(run / "checkpoint-4")  # the checksums match: only restoring can find the problem
    with pytest.raises(DamagedCheckpointError, match=r"checkpoint-4: the RNG state training_state/" + problem):
        train(make_task(tmp_path), arguments(tmp_path, max_steps=6, resume_from_checkpoint=str(run / "checkpoint-4")))


# ---- 2. one run per --output_dir ----

KILLED_OWNER = """
import sys, time
from vlhub.utils.locks import FolderLock
FolderLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(600)
"""


def test_a_second_owner_is_refused_naming_the_first(tmp_path):
    from vlhub.utils.locks import LOCK_FILE, FolderInUseError, FolderLock

    with FolderLock(tmp_path / "run", "--output_dir"):
        with pytest.raises(
            FolderInUseError,
            match=rf"--output_dir {tmp_path / 'run'} is in use by another run "
            rf"\(process {os.getpid()} on host {socket.gethostname()}, "
            r"started \d{4}-\d\d-\d\dT",
        ):
            FolderLock(tmp_path / "run", "--output_dir").acquire()
    assert not (tmp_path / "run").exists()  # released: no lock file, and the folder it created is gone
    with FolderLock(tmp_path / "run"):
        assert (tmp_path / "run" / LOCK_FILE).is_file()


def test_owners_started_together_never_both_get_the_folder(tmp_path):
    from vlhub.utils.locks import FolderInUseError, FolderLock

    for attempt in range(30):
        folder = tmp_path / f"run{attempt}"
        start, tried, outcomes = threading.Barrier(4), threading.Barrier(4), []

        def try_to_own():
            lock = FolderLock(folder)
            start.wait()
            try:
                lock.acquire()
                outcomes.append("owner")
            except FolderInUseError:
                outcomes.append("refused")
            tried.wait()  # the owner holds the folder until every other has tried
            lock.release()

        threads = [threading.Thread(target=try_to_own) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert sorted(outcomes) == ["owner", "refused", "refused", "refused"], attempt


def test_the_lock_of_a_killed_run_is_taken_over(tmp_path, caplog):
    from vlhub.utils.locks import FolderLock

    owner = subprocess.Popen(
        [sys.executable, "-c", KILLED_OWNER, str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert owner.stdout.readline().strip() == "locked"
    finally:
        owner.kill()  # SIGKILL: the lock file stays, with the dead process's id in it
        owner.wait(timeout=30)
    with caplog.at_level("WARNING"), FolderLock(tmp_path / "run", "--output_dir"):
        pass
    assert f"taking over the lock of a run that ended without releasing it (process {owner.pid}" in caplog.text
    assert "that process no longer exists" in caplog.text


@pytest.mark.usefixtures("fresh_accelerate_state")
def test_a_second_training_run_on_one_output_dir_is_refused_before_writing(tmp_path):
    from tests.test_safety_training import arguments
    from tests.test_training_loop import make_task
    from vlhub.training import train
    from vlhub.utils.locks import LOCK_FILE, FolderInUseError, FolderLock

    with FolderLock(tmp_path / "run"):  # a first run, still running
        with pytest.raises(FolderInUseError, match=f"process {os.getpid()} on host"):
            train(make_task(tmp_path), arguments(tmp_path, max_steps=2))
        assert [p.name for p in (tmp_path / "run").iterdir()] == [LOCK_FILE]
    result = train(make_task(tmp_path), arguments(tmp_path, max_steps=2))
    assert result.global_step == 2 and not (tmp_path / "run" / LOCK_FILE).exists()


# ---- 4. every Hub call has a deadline ----


@pytest.fixture
def loopback_hub(monkeypatch):
    """Downloads and uploads go to a server on 127.0.0.1 (the suite runs offline): returns a function that points
    huggingface_hub and datasets at a server's URL. Deadlines: 0.5 s per read, 1 s in total."""
    import datasets.config
    import huggingface_hub.constants
    import huggingface_hub.utils._http as hub_http

    from vlhub.utils import network

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub_http.time, "sleep", lambda seconds: None)  # huggingface_hub's waits between retries
    monkeypatch.setenv("VLHUB_HUB_TIMEOUT", "0.5")
    monkeypatch.setenv("VLHUB_HUB_TOTAL_TIMEOUT", "1")
    monkeypatch.setattr(network, "_configured", {})
    monkeypatch.delenv("VLHUB_DEBUG", raising=False)

    def point_at(url: str):
        monkeypatch.setenv("HF_ENDPOINT", url)
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", url)
        monkeypatch.setattr(
            huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}"
        )
        monkeypatch.setattr(datasets.config, "HF_ENDPOINT", url)
        monkeypatch.setattr(datasets.config, "HUB_DATASETS_URL", url + "/datasets/{repo_id}/resolve/{revision}/{path}")

    yield point_at
    from huggingface_hub.utils import close_session

    close_session()  # the next test gets a fresh client (the deadlines set its timeout)


def within(seconds: float, call):
    """call() in a daemon thread; fails the test (rather than hanging it) if it has not ended after `seconds`."""
    from vlhub.utils.network import in_daemon_thread

    future = in_daemon_thread(call, name="test")
    try:
        return future.exception(timeout=seconds)
    except TimeoutError:
        pytest.fail(f"still running after {seconds} s: the deadline did not hold")


# The trickling server runs in the full suite only (~1 s of waiting); the fast loop keeps the silent one, the same
# deadline on the same command.
@pytest.mark.parametrize("server_kind", ["silent", pytest.param("trickling", marks=pytest.mark.slow)])
def test_vlhub_extract_from_an_unresponsive_hub_ends_in_one_line(tmp_path, capsys, loopback_hub, server_kind):
    from tests.hub_server import SilentServer, TricklingServer
    from vlhub.cli import main

    write_test_image(tmp_path / "a.png", seed=0)
    with SilentServer() if server_kind == "silent" else TricklingServer() as server:
        loopback_hub(server.url)
        codes = []
        assert (
            within(
                60,
                lambda: codes.append(
                    main(
                        [
                            "extract",
                            str(tmp_path / "a.png"),
                            "--extractor",
                            "org/extractor",
                            "--output",
                            str(tmp_path / "s"),
                        ]
                    )
                ),
            )
            is None
        )
    err = capsys.readouterr().err
    assert codes == [USER_ERROR_EXIT_CODE] and "Traceback" not in err
    lines = _error_lines(err, "vlhub extract: error:")
    assert len(lines) == 1, err
    assert f"downloading the region extractor org/extractor at {server.url} did not finish within 1 s" in lines[0]
    assert not (tmp_path / "s").exists()


def test_finetune_from_a_trickling_hub_ends_naming_the_download(tmp_path, loopback_hub):
    from tests.hub_server import TricklingServer
    from vlhub.training.cli import finetune_main
    from vlhub.utils.network import HubTimeoutError

    with TricklingServer() as server:
        loopback_hub(server.url)
        error = within(
            60,
            lambda: finetune_main(
                [
                    "--model_name_or_path",
                    "org/model",
                    "--output_dir",
                    str(tmp_path / "run"),
                    "--hub_timeout",
                    "0.5",
                    "--hub_total_timeout",
                    "1",
                ]
            ),
        )
    assert isinstance(error, HubTimeoutError)
    assert str(error).startswith(f"downloading the model org/model at {server.url} did not finish within 1 s")


def test_a_hub_dataset_from_a_silent_hub_ends_naming_the_dataset(loopback_hub):
    from tests.hub_server import SilentServer
    from vlhub.training.data import load_table
    from vlhub.utils.network import HubTimeoutError

    with SilentServer() as server:
        loopback_hub(server.url)
        error = within(60, lambda: load_table("org/ds"))
    assert isinstance(error, HubTimeoutError)
    assert str(error).startswith(f"loading the dataset org/ds at {server.url} did not finish within 1 s")


# ~2 s of waiting on uploads: the full suite's; the fast loop keeps test_safety_training.py's stalled upload (a push
# that does not finish ends in an error after training, checkpoints intact).
@pytest.mark.slow
@pytest.mark.usefixtures("fresh_accelerate_state")
def test_a_trickling_upload_does_not_keep_a_finished_run_waiting(tmp_path, loopback_hub):
    from tests.hub_server import FakeHub
    from tests.test_safety_training import arguments
    from tests.test_training_loop import make_task
    from vlhub.training import HubError, train
    from vlhub.training.loop import verify_checkpoint

    with FakeHub() as hub:
        loopback_hub(hub.url)

        def trickle_after_creation(state):
            hub.trickle_uploads = True

        error = within(
            90,
            lambda: train(
                make_task(tmp_path),
                arguments(
                    tmp_path,
                    push_to_hub=True,
                    hub_model_id="tester/slow",
                    hub_token="hf_fake",
                    hub_timeout=0.5,
                    hub_total_timeout=1,
                ),
                callbacks=[trickle_after_creation],
            ),
        )
        assert hub.stalled >= 1 and hub.commits == []
    assert isinstance(error, HubError)
    assert f"uploading {tmp_path / 'run'} to tester/slow" in str(error) and "did not finish within 1 s" in str(error)
    for step in (2, 4):
        verify_checkpoint(tmp_path / "run" / f"checkpoint-{step}")


def test_import_features_names_the_source_of_a_reader_memory_error(tmp_path, capsys, monkeypatch):
    from vlhub.cli import main
    from vlhub.processing import stores

    def declares_too_much(*args, **kwargs):
        raise MemoryError()  # as numpy does for an array header declaring 16 GiB

    monkeypatch.delenv("VLHUB_DEBUG", raising=False)
    monkeypatch.setattr(stores, "open_feature_file", declares_too_much)
    (tmp_path / "features").mkdir()
    code = main(["import-features", str(tmp_path / "features"), "--format", "npz", "--output", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert code == USER_ERROR_EXIT_CODE and "Traceback" not in err
    assert err == (
        f"vlhub import-features: error: {tmp_path / 'features'} (a npz feature source) cannot be read: "
        "MemoryError: more data than fits in memory\n"
    )


@pytest.mark.slow
def test_every_process_of_an_accelerate_launch_stops_on_an_owned_output_dir(tmp_path):
    """Both processes of a 2-process run (forked from preloaded code as `accelerate launch --num_processes 2` starts
    them: tests/process_group.py) stop on their own, each with the one-line refusal; none waits for the other."""
    from tests.process_group import run_processes
    from tests.test_training_cli import common_args, write_store_dataset
    from vlhub.utils.locks import FolderLock

    store = write_store_dataset(tmp_path / "data")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("VLHUB_DEBUG", None)
    arguments = ["--dataset", str(store), *common_args(tmp_path)]
    with FolderLock(tmp_path / "run", "--output_dir"):  # another run owns the folder
        processes = run_processes(str(REPO / "pretrain.py"), arguments, env, cwd=tmp_path)
    refusal = re.compile(r"pretrain\.py: error: --output_dir .*? in use by another run \(process (\d+) on host")
    for process in processes:
        assert process.returncode == USER_ERROR_EXIT_CODE, process.stderr[-4000:]  # its own exit, not killed (-9)
        assert refusal.findall(process.stderr) == [str(os.getpid())], process.stderr[-4000:]
        assert "FolderInUseError" not in process.stderr and "Traceback" not in process.stderr
    assert not (tmp_path / "run" / "checkpoint-1").exists()
