"""Issue 25, findings 1, 2, 4 and 7: resume restores all state or names what it cannot; one run per --output_dir;
every Hub call has a deadline; a user's mistake is one line, a bug a traceback."""

from __future__ import annotations

import fractions
import json
import sqlite3

import pytest
import torch

from vlhub.utils.errors import USER_ERROR_EXIT_CODE, VlhubUserError, named_input, run_command

from .helpers import random_regions, tiny_detector, write_test_image


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
    code = main(["extract", str(tmp_path / "images"), "--extractor", str(tmp_path / "detector"),
                 "--output", str(tmp_path / "store")])
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
        code = main(["extract", str(tmp_path / "a.png"), "--extractor", str(tmp_path / "detector"),
                     "--output", str(tmp_path / "store")])
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
    with pytest.raises(VlhubUserError, match=r"index\.sqlite \(the region store's id index\) cannot be read: "
                                             r"DatabaseError") as caught:
        store = RegionStore(tmp_path / "store")
        store["img0"]
    assert isinstance(caught.value.__cause__, sqlite3.DatabaseError)


@pytest.mark.parametrize("name, content", [("captions.parquet", b"PAR1 not parquet PAR1"),
                                           ("captions.jsonl", b'{"caption": "a red' + b"\x00\x01")])
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
    assert err.startswith(f"vlhub convert: error: {tmp_path / 'config.yaml'} (the detector config) cannot be read: "
                          "ConstructorError")
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
@pytest.mark.parametrize("write, problem", [
    (_truncated, r"random_states_0\.pkl cannot be read \("),
    (_torch_save({}), r"random_states_0\.pkl has no random_state \(Python's random generator\)"),
    (_torch_save([1, 2]), r"random_states_0\.pkl holds a list"),
    (_torch_save({"random_state": fractions.Fraction(1, 3)}), r"random_states_0\.pkl cannot be read \(Unpickling"),
    (_torch_save({"random_state": (3, tuple(range(625)), None), "numpy_random_seed": "not a state",
                  "torch_manual_seed": torch.get_rng_state()}),
     r"random_states_0\.pkl: numpy_random_seed \(numpy's global generator\) cannot be restored"),
])
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
