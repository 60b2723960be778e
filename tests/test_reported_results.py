"""The original authors' published figures: each architecture's table (one place, with sources), and the converted
model card that carries the rows of its release and task as unverified `model-index` results."""

import importlib
import os
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from vlhub.conversion.common import ConversionReport, write_model_card
from vlhub.conversion.reported import CardResults

from .conftest import fixtures_root, write_vocab

ARCHITECTURES = ("uniter", "vl_bert", "vilbert", "unified_vlp", "tden")
# The converters' task names (plus a pre-trained model ranking without fine-tuning).
TASKS = {
    "uniter": "UNITER_TASKS",
    "vl_bert": "VL_BERT_TASKS",
    "vilbert": "VILBERT_TASKS",
    "unified_vlp": "VLP_TASKS",
    "tden": "TDEN_TASKS",
}
# The papers the tables cite (/work/shared/papers beside the repository, or $VLHUB_PAPERS_DIR).
PAPERS = Path(os.environ.get("VLHUB_PAPERS_DIR", Path(__file__).resolve().parents[1] / ".." / "shared" / "papers"))


def table(architecture):
    return importlib.import_module(f"vlhub.modeling.{architecture}.reported_results").REPORTED_RESULTS


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_every_row_names_its_source_and_a_task_the_converter_builds(architecture):
    converter = importlib.import_module(f"vlhub.modeling.{architecture}.convert_{architecture}")
    tasks = set(getattr(converter, TASKS[architecture]))
    rows = table(architecture)
    assert rows
    for row in rows:
        assert row.task in tasks | {"zero_shot_retrieval"}, row
        assert row.source and row.source_url.startswith("https://"), row
        assert 0 < row.value < 200, row  # percentages and CIDEr
    keys = [(r.release, r.task, r.dataset, r.split, r.metric, r.setting) for r in rows]
    assert len(keys) == len(set(keys)), "a figure listed twice"


@pytest.mark.parametrize("architecture", ["uniter", "vl_bert", "vilbert"])
def test_paper_figures_appear_in_the_paper(architecture):
    """Rows copied from a paper hold numbers written in that paper's text (to its precision)."""
    paper = PAPERS / f"{architecture}.txt"
    if not paper.is_file():
        pytest.skip(f"the paper text is not at {paper}")
    text = paper.read_text(encoding="utf-8")
    missing = [row for row in table(architecture) if not any(f"{row.value:.{digits}f}" in text for digits in (1, 2))]
    assert not missing, missing


def _card(tmp_path, architecture, release, task):
    write_model_card(
        tmp_path,
        title=f"{architecture} {task}",
        architecture=architecture,
        source_file="model.bin",
        source_sha256="0" * 64,
        original_repository="https://github.com/o/r",
        original_commit="abc",
        report=ConversionReport("model.bin"),
        pipeline_tag=None,
        usage="pass",
        reported=CardResults(table(architecture), release, task),
    )
    return ModelCard.load(tmp_path / "README.md")


@pytest.mark.parametrize(
    "architecture, release, task, expected",
    [
        ("uniter", "base", "vqa", {("test-dev", "accuracy"): 72.27, ("test-std", "accuracy"): 72.46}),
        ("uniter", "large", "nlvr2", {("dev", "accuracy"): 78.40, ("test-P", "accuracy"): 79.50}),
        ("vl_bert", "base", "vqa", {("test-dev", "accuracy"): 71.16}),
        (
            "vilbert",
            "pretrained",
            "zero_shot_retrieval",
            {
                ("test", "image retrieval R@1"): 31.86,
                ("test", "image retrieval R@5"): 61.12,
                ("test", "image retrieval R@10"): 72.80,
            },
        ),
        (
            "unified_vlp",
            "base",
            "vqa",
            {("val (Dev)", "accuracy"): 67.4, ("test-dev", "accuracy"): 70.5, ("test-std", "accuracy"): 70.7},
        ),
        (
            "tden",
            "base",
            "retrieval",
            {
                ("not stated", "image retrieval R@1"): 62.0,
                ("not stated", "image retrieval R@5"): 86.6,
                ("not stated", "image retrieval R@10"): 92.4,
            },
        ),
    ],
)
def test_card_carries_the_release_and_task_rows_as_unverified_model_index(
    tmp_path, architecture, release, task, expected
):
    card = _card(tmp_path, architecture, release, task)
    results = card.data.eval_results
    assert {(r.dataset_split, r.metric_name): r.metric_value for r in results} == expected
    assert all(r.verified is False and "not measured by vlhub" in r.source_name and r.source_url for r in results)
    assert "## Results reported by the original authors" in card.text and "vlhub did not measure them" in card.text


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_every_release_and_task_survives_the_model_index_round_trip(tmp_path, architecture):
    """Each card's rows come back from the saved `model-index` exactly (none merged into another)."""
    groups = {(row.release, row.task) for row in table(architecture)}
    for index, (release, task) in enumerate(sorted(groups)):
        rows = CardResults(table(architecture), release, task).rows
        loaded = _card(tmp_path / str(index), architecture, release, task).data.eval_results
        assert sorted(
            (r.dataset_name, r.dataset_split, r.metric_name, r.metric_config or "", r.metric_value) for r in loaded
        ) == sorted((r.dataset, r.split, r.metric, r.setting, r.value) for r in rows)


def test_card_of_an_unpublished_size_or_task_lists_none(tmp_path):
    card = _card(tmp_path / "tiny", "uniter", None, "vqa")
    assert card.data.eval_results is None and "matches none of the published releases (base, large)" in card.text
    card = _card(tmp_path / "mt", "vilbert", "multi_task", "vqa")
    assert card.data.eval_results is None and "publish no figure for this task of the multi_task release" in card.text


@pytest.mark.skipif(not (fixtures_root() / "uniter" / "original").is_dir(), reason="no UNITER fixture")
def test_converter_picks_the_release_from_the_size_and_zero_shot_for_a_pretrained_ranker(tmp_path, monkeypatch):
    import json

    from vlhub.conversion import reported
    from vlhub.modeling.uniter import convert_uniter as uniter

    from .release_files import uniter_files

    files = uniter_files(fixtures_root() / "uniter" / "original")
    size = json.loads(files["config"].read_text())["vocab_size"]
    vocab = write_vocab(
        tmp_path / "vocab.txt", size, {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}
    )
    pretrained = files["checkpoints"]["pretrain"]
    uniter.convert_uniter(pretrained, tmp_path / "tiny", config=files["config"], task="retrieval", tokenizer=vocab)
    tiny = ModelCard.load(tmp_path / "tiny" / "README.md")  # a 64-wide test model is no published release
    assert tiny.data.eval_results is None and "matches none of the published releases" in tiny.text
    # as if it were UNITER-base (the converters save through OriginalRelease.save, which reads the size there)
    monkeypatch.setattr(reported, "size_release", lambda hidden_size: "base")
    uniter.convert_uniter(pretrained, tmp_path / "zs", config=files["config"], task="retrieval", tokenizer=vocab)
    zero_shot = ModelCard.load(tmp_path / "zs" / "README.md").data.eval_results
    assert {(r.dataset_name, r.metric_name, r.metric_value) for r in zero_shot} == {
        ("Flickr30k", "image retrieval R@1", 62.34),
        ("Flickr30k", "text retrieval R@1", 75.10),
    }
    assert all(r.metric_config.startswith("zero-shot") for r in zero_shot)
