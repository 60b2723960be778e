"""pretrain.py's command line on user data (a region store + captions, a `datasets` folder with inline regions),
and `accelerate launch --num_processes 2 pretrain.py` really starting two processes (slow)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.training_helpers import TINY_CONFIG, synthetic_corpus, write_vocab
from vlhub.training.cli import pretrain_main
from vlhub.training.data import load_caption_corpus, write_jsonl

REPO = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def write_store_dataset(folder: Path) -> Path:
    """A region store folder with captions.jsonl, as a user would bring their own data."""
    from vlhub.processing.stores import RegionStoreWriter

    corpus = synthetic_corpus()
    with RegionStoreWriter(folder, shard_size=16) as writer:
        for image_id, regions in corpus.regions.items():
            writer.add(image_id, regions)
    write_jsonl(folder / "captions.jsonl", [{"image_id": i, "caption": c} for i, c in corpus.train])
    return folder


def common_args(tmp_path: Path) -> list[str]:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_CONFIG))
    return [
        "--tokenizer",
        str(write_vocab(tmp_path)),
        "--config",
        str(config),
        "--max_steps",
        "3",
        "--per_device_batch_size",
        "4",
        "--logging_steps",
        "1",
        "--objectives",
        "mlm:1",
        "mrc-kl:1",
        "--output_dir",
        str(tmp_path / "run"),
    ]


def test_pretrain_cli_on_a_region_store_with_captions(tmp_path):
    store = write_store_dataset(tmp_path / "data")
    result = pretrain_main(["--dataset", str(store), *common_args(tmp_path)])
    assert result.global_step == 3
    state = json.loads((tmp_path / "run" / "vlhub_state.json").read_text())
    assert state["args"]["max_steps"] == 3 and state["command"].startswith("python pretrain.py --dataset")
    assert "mlm:1, mrc-kl:1" in (tmp_path / "run" / "README.md").read_text()


def test_pretrain_cli_on_a_datasets_folder_with_inline_regions(tmp_path):
    import datasets

    corpus = synthetic_corpus()
    rows = {"image_id": [], "caption": [], "features": [], "boxes": [], "image_size": [], "class_probs": []}
    for image_id, caption in corpus.train:
        regions = corpus.regions[image_id]
        for key, value in (
            ("image_id", image_id),
            ("caption", caption),
            ("features", regions.features.tolist()),
            ("boxes", regions.boxes.tolist()),
            ("image_size", list(regions.image_size)),
            ("class_probs", regions.class_probs.tolist()),
        ):
            rows[key].append(value)
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)}).save_to_disk(str(tmp_path / "ds"))
    result = pretrain_main(["--dataset", str(tmp_path / "ds"), *common_args(tmp_path)])
    assert result.global_step == 3


def test_bad_data_is_refused_with_the_expected_form(tmp_path):
    store = write_store_dataset(tmp_path / "data")
    (store / "captions.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="captions.jsonl"):
        load_caption_corpus(str(store))
    write_jsonl(tmp_path / "bad.jsonl", [{"image": "x", "text": "a red circle"}])
    with pytest.raises(ValueError, match="image_id"):
        load_caption_corpus(str(tmp_path / "bad.jsonl"), region_store=str(store))
    write_jsonl(store / "captions.jsonl", [{"image_id": "img000", "caption": "a red circle"}] * 8)
    with pytest.raises(ValueError, match="unknown objective"):
        pretrain_main(["--dataset", str(tmp_path / "data"), *common_args(tmp_path), "--objectives", "mlm", "nsp"])


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    """`accelerate launch --num_processes 2 pretrain.py` for 6 steps with a checkpoint at step 3, run once for the
    module's two-process tests: `(folder, pretrain.py's arguments, environment)`; the run is in `folder / "run"`. The
    launcher is accelerate's command line (the `accelerate` script's module) in a process forked from preloaded code
    (tests/process_group.py); it starts its two pretrain.py processes as new interpreters, as for a user."""
    from tests.process_group import run_processes

    tmp_path = tmp_path_factory.mktemp("two-process")
    store = write_store_dataset(tmp_path / "data")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    arguments = ["--dataset", str(store), *common_args(tmp_path), "--max_steps", "6", "--save_steps", "3"]
    launch = ["launch", "--num_processes", "2", str(REPO / "pretrain.py"), *arguments]
    (launcher,) = run_processes("-m accelerate.commands.accelerate_cli", launch, env, cwd=tmp_path, num_processes=1)
    assert launcher.returncode == 0, launcher.stderr[-4000:]
    return tmp_path, arguments, env


@pytest.mark.slow
def test_accelerate_launch_num_processes_2_starts_two_processes(two_process_run):
    tmp_path, _, _ = two_process_run
    state = json.loads((tmp_path / "run" / "vlhub_state.json").read_text())
    assert state["num_processes"] == 2
    # Each process saved its own random state with the checkpoint.
    names = {p.name for p in (tmp_path / "run" / "checkpoint-3" / "training_state").iterdir()}
    assert {"random_states_0.pkl", "random_states_1.pkl"} <= names
    assert state["command"].startswith("accelerate launch --num_processes 2 pretrain.py")


@pytest.mark.slow
def test_demo_runs_end_to_end_on_the_shapes_world(tmp_path):
    """The README's main job with few steps: every stage runs and the card records accuracy and baseline. Each
    `python -m vlhub.demo` is a process forked from preloaded code (tests/process_group.py), not a new interpreter."""
    from tests.process_group import run_processes

    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}

    def demo(*arguments):
        (process,) = run_processes("-m vlhub.demo", list(arguments), env, cwd=tmp_path, num_processes=1)
        return process

    command = [
        "--output_dir",
        str(tmp_path / "demo"),
        "--pretrain_steps",
        "10",
        "--finetune_steps",
        "10",
        "--retrieval_steps",
        "3",
        "--num_examples",
        "2",
        "--caption_steps",
        "10",
        # The checks read CIDEr only; METEOR's Java helper took most of this test's time.
        "--caption_metrics",
        "CIDEr",
        # Scoring every held-out example (a 50-image retrieval gallery: 12k cross-encoded pairs) took most of the
        # rest; a few examples per split still fill every score, card and baseline checked below.
        "--max_eval_samples",
        "16",
        "--gallery_images",
        "10",
    ]
    completed = demo(*command)
    assert completed.returncode == 0, completed.stderr[-4000:]
    # Every pipeline also ran on a PNG file of a held-out image (regions and, for Unified VLP, class probabilities
    # from the shapes extractor).
    assert completed.stdout.count("from the image file") == 3
    assert "majority-answer baseline" in completed.stdout and completed.stdout.count(" Q: ") == 3
    # UNITER pre-trains with its from-scratch mix, the contrastive extension included (the card says so).
    assert "objectives itc:1,itm:1" in completed.stdout
    assert "itc (1)" in (tmp_path / "demo" / "uniter" / "uniter-shapes" / "README.md").read_text()
    assert "most-frequent-caption baseline" in completed.stdout and completed.stdout.count(" caption: ") == 2
    assert "test_baseline_CIDEr" in (tmp_path / "demo" / "uniter" / "vlp-shapes-captioning" / "README.md").read_text()
    card = (tmp_path / "demo" / "uniter" / "uniter-shapes-vqa" / "README.md").read_text()
    assert "test_vqa_accuracy" in card and "test_majority_baseline" in card
    assert (tmp_path / "demo" / "uniter" / "uniter-shapes-vqa" / "region_extractor" / "config.json").is_file()
    assert "text -> image" in completed.stdout and "image -> text" in completed.stdout and "chance" in completed.stdout
    assert "pipeline('image-text-retrieval')" in completed.stdout
    pictures = sorted((tmp_path / "demo" / "uniter" / "pictures").glob("*.png"))
    assert len(pictures) == 2 and all(str(p) in completed.stdout for p in pictures)
    table = completed.stdout.split("== summary")[1]
    assert all(row in table for row in ("VQA", "retrieval", "captioning (Unified VLP)", "baseline"))
    # Run again: every finished step is reused, and the same table comes out.
    again = demo(*command)
    assert again.returncode == 0, again.stderr[-4000:]
    assert again.stdout.count("finished earlier with these settings, reused") == 5
    assert again.stdout.split("== summary")[1].split("done in")[0] == table.split("done in")[0]
    # Other settings in the same folders are refused in one line, naming the flag that starts over.
    other = demo(*command, "--pretrain_steps", "11")
    assert other.returncode != 0
    assert other.stderr.strip().splitlines()[-1].startswith("vlhub demo: ")
    assert "--overwrite_output_dir" in other.stderr and "Traceback" not in other.stderr


@pytest.mark.slow
def test_two_process_run_resumes_exactly(two_process_run):
    """Resuming a 2-process run from its checkpoint-3 (into another folder) logs what the original logged after 3.
    The resumed run's two processes are forked from preloaded code (tests/process_group.py): the launcher was the
    subject of the run resumed from."""
    from tests.process_group import run_processes

    tmp_path, arguments, env = two_process_run
    resumed = [
        *arguments,
        "--output_dir",
        str(tmp_path / "resumed"),
        "--resume_from_checkpoint",
        str(tmp_path / "run" / "checkpoint-3"),
    ]
    for process in run_processes(str(REPO / "pretrain.py"), resumed, env, cwd=tmp_path):
        assert process.returncode == 0, process.stderr[-4000:]
    assert json.loads((tmp_path / "resumed" / "vlhub_state.json").read_text())["num_processes"] == 2

    def losses(folder):
        return [
            (r["step"], r["loss"])
            for r in map(json.loads, (folder / "log_history.jsonl").read_text().splitlines())
            if "loss" in r
        ]

    expected, got = losses(tmp_path / "run"), losses(tmp_path / "resumed")
    assert [s for s, _ in got] == [1, 2, 3, 4, 5, 6]
    assert [s for s, _ in expected] == [s for s, _ in got]
    assert [loss for _, loss in got] == pytest.approx([loss for _, loss in expected], rel=1e-6)


def test_a_store_without_class_probabilities_trains_the_default_mix_it_can(tmp_path, caplog):
    from vlhub import RegionFeatures
    from vlhub.processing.stores import RegionStoreWriter

    corpus = synthetic_corpus()
    store = tmp_path / "data"
    with RegionStoreWriter(store, shard_size=16) as writer:  # a user's own features: no detector class scores
        for image_id, regions in corpus.regions.items():
            writer.add(
                image_id, RegionFeatures(features=regions.features, boxes=regions.boxes, image_size=regions.image_size)
            )
    write_jsonl(store / "captions.jsonl", [{"image_id": i, "caption": c} for i, c in corpus.train])
    arguments = common_args(tmp_path)
    arguments = arguments[: arguments.index("--objectives")] + arguments[arguments.index("--output_dir") :]
    with caplog.at_level("WARNING"):
        result = pretrain_main(["--dataset", str(store), *arguments])
    assert result.global_step == 3
    assert "no class_probs" in caplog.text and "drops mrc-kl" in caplog.text and "--objectives" in caplog.text
    card = (tmp_path / "run" / "README.md").read_text()
    assert "mrc-kl" not in card and "wra:2" in card and "mrfr:1" in card
    with pytest.raises(SystemExit, match="none of uniter's default objectives.*--objectives"):
        from vlhub.training.cli import _default_mix_for_data
        from vlhub.training.objectives import objectives_for

        class NoRegionFields:
            def __getattr__(self, name):
                return None

        _default_mix_for_data(
            "uniter",
            {name: type("O", (), {"region_fields": ("class_probs",)})() for name in objectives_for("uniter")},
            NoRegionFields(),
        )


def test_a_dataset_without_a_tokenizer_names_the_flag_when_offline(tmp_path):
    store = write_store_dataset(tmp_path / "data")
    arguments = common_args(tmp_path)
    del arguments[:2]  # no --tokenizer
    with pytest.raises(SystemExit, match="(?s)google-bert/bert-base-cased.*--tokenizer_name"):
        pretrain_main(["--dataset", str(store), *arguments])


def test_the_contrastive_extension_trains_and_reports_its_in_batch_accuracy(tmp_path):
    """UNITER's `itc` beside `itm` through pretrain.py on the shapes world (which has a validation split): the
    evaluation reports the contrastive loss and the share of captions whose best-scored image in the batch is their
    own (a fraction)."""
    result = pretrain_main(
        [
            "--objectives",
            "itc:1,itm:1",
            "--max_steps",
            "2",
            "--per_device_train_batch_size",
            "8",
            "--max_eval_samples",
            "32",
            "--logging_steps",
            "1",
            "--output_dir",
            str(tmp_path / "run"),
        ]
    )
    assert result.global_step == 2
    scores = result.eval_results
    assert {"itc_loss", "itc_accuracy", "itm_loss", "itm_accuracy"} <= set(scores)
    assert 0.0 <= scores["itc_accuracy"] <= 1.0 and scores["itc_loss"] > 0
    assert "itc (1), itm (1)" in (tmp_path / "run" / "README.md").read_text()


def test_a_missing_local_folder_is_refused_in_one_line_without_asking_the_hub(tmp_path, monkeypatch):
    from vlhub.training.cli import finetune_main
    from vlhub.utils.local_paths import missing_local_folder

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    for local in ("runs/does-not-exist", "./x", "../x", str(tmp_path / "x"), "~/no-such-vlhub-folder", "a/b/c"):
        assert missing_local_folder(local), local
    for hub_id_or_folder in ("bert-base-uncased", "google/vit-base-patch16-224", "runs", "elsewhere/model"):
        assert not missing_local_folder(hub_id_or_folder), hub_id_or_folder

    def no_network(*args, **kwargs):
        raise AssertionError("asked the Hub")

    monkeypatch.setattr("transformers.AutoConfig.from_pretrained", no_network)
    for main in (finetune_main, pretrain_main):
        with pytest.raises(SystemExit, match=r"^--model_name_or_path runs/does-not-exist: no such folder \(") as err:
            main(["--model_name_or_path", "runs/does-not-exist", "--output_dir", str(tmp_path / "out")])
        assert "\n" not in str(err.value)
