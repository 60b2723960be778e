"""Converter behaviour beyond the numbers: strict key accounting, provenance, clear errors for wrong files."""

import json

import pytest
import torch

import vlhub
from vlhub.cli import main as cli_main
from vlhub.conversion import CheckpointError, convert_uniter
from vlhub.modeling.uniter import UniterProcessor
from vlhub.conversion.common import sha256_of

from .fresh_interpreter import run_module
from .conftest import fixtures_root, write_vocab
from .release_files import uniter_files

ORIGINAL = fixtures_root() / "uniter" / "original"
pytestmark = pytest.mark.skipif(not ORIGINAL.is_dir(), reason="no UNITER fixture")
if ORIGINAL.is_dir():  # found as the original finds them, whatever the fixture set names them
    FILES = uniter_files(ORIGINAL)
    CONFIG, CHECKPOINTS = FILES["config"], FILES["checkpoints"]


@pytest.fixture
def vocab(tmp_path):
    size = json.loads((CONFIG).read_text())["vocab_size"]
    specials = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}
    return write_vocab(tmp_path / "vocab.txt", size, specials)


def test_every_key_is_accounted_for_and_provenance_recorded(tmp_path, vocab):
    source = CHECKPOINTS["pretrain"]
    report = convert_uniter(source, tmp_path / "out", config=CONFIG, tokenizer=vocab)
    keys = torch.load(source, weights_only=True).keys()
    assert set(report.used.values()) | set(report.dropped) == set(keys)
    assert "cls.predictions.decoder.weight" in report.dropped and "feat_regress.weight" in report.dropped
    assert not report.initialized
    saved = json.loads((tmp_path / "out" / "conversion_report.json").read_text())
    assert saved["dropped"] == report.dropped
    card = (tmp_path / "out" / "README.md").read_text()
    assert sha256_of(source) in card and "ChenRocks/UNITER" in card and CHECKPOINTS["pretrain"].name in card


def test_task_switch_drops_other_heads_with_reasons_and_initialises_new_ones(tmp_path, vocab):
    report = convert_uniter(CHECKPOINTS["itm"], tmp_path / "re", config=CONFIG, task="re", tokenizer=vocab)
    other_heads = {"itm_output.weight", "itm_output.bias", "rank_output.weight", "rank_output.bias"}
    not_owned = {
        "uniter.img_embeddings.mask_embedding.weight",
        "uniter.pooler.dense.weight",
        "uniter.pooler.dense.bias",
    }
    assert set(report.dropped) == other_heads | not_owned
    assert all("another task" in report.dropped[key] for key in other_heads)
    assert "used only by pre-training" in report.dropped["uniter.img_embeddings.mask_embedding.weight"]
    assert all(
        "does not use the pooled output" in report.dropped[key]
        for key in not_owned - {"uniter.img_embeddings.mask_embedding.weight"}
    )
    assert set(report.initialized) == {"re_output.weight", "re_output.bias"}
    assert isinstance(vlhub.model_class_for(vlhub.UniterConfig.from_pretrained(tmp_path / "re")), type)


def test_fp16_checkpoint_with_ddp_prefix_converts_to_the_same_numbers(tmp_path, vocab):
    state = torch.load(CHECKPOINTS["itm"], weights_only=True)
    torch.save({f"module.{k}": v.half() for k, v in state.items()}, tmp_path / "half.pt")
    convert_uniter(tmp_path / "half.pt", tmp_path / "half", config=CONFIG, tokenizer=vocab)
    model = vlhub.UniterForImageTextRetrieval.from_pretrained(tmp_path / "half")
    assert model.rank_output.weight.dtype == torch.float32
    assert torch.equal(model.rank_output.weight, state["rank_output.weight"].half().float())


def test_wrong_files_get_clear_errors(tmp_path, vocab):
    with pytest.raises(CheckpointError, match="does not exist"):
        convert_uniter(tmp_path / "missing.pt", tmp_path / "x", tokenizer=vocab)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes((CHECKPOINTS["re"]).read_bytes()[:5000])
    with pytest.raises(CheckpointError, match="truncated, corrupt"):
        convert_uniter(truncated, tmp_path / "x", tokenizer=vocab)
    vilbert_like = tmp_path / "vilbert.bin"
    torch.save(
        {"bert.v_embeddings.image_embeddings.weight": torch.zeros(2, 2), "vil_prediction.weight": torch.zeros(2)},
        vilbert_like,
    )
    with pytest.raises(CheckpointError, match="not a UNITER checkpoint.*ViLBERT"):
        convert_uniter(vilbert_like, tmp_path / "x", tokenizer=vocab)
    with pytest.raises(CheckpointError, match="needs a fine-tuned answer head"):
        convert_uniter(CHECKPOINTS["itm"], tmp_path / "x", config=CONFIG, task="vqa", tokenizer=vocab)
    with pytest.raises(FileNotFoundError, match="answer vocabulary"):
        convert_uniter(
            CHECKPOINTS["vqa"], tmp_path / "x", config=CONFIG, tokenizer=vocab, answers=tmp_path / "nope.json"
        )
    bad_config = tmp_path / "bad.json"
    hidden = json.loads(CONFIG.read_text())["hidden_size"]
    bad_config.write_text(json.dumps({**json.loads(CONFIG.read_text()), "hidden_size": hidden * 2}))
    with pytest.raises(CheckpointError, match=f"hidden_size={hidden * 2} but the checkpoint has {hidden}"):
        convert_uniter(CHECKPOINTS["re"], tmp_path / "x", config=bad_config, tokenizer=vocab)


def test_cli_converts_and_reports_errors(tmp_path, vocab, capsys):
    out = tmp_path / "cli"
    arguments = ["convert", "uniter", str(CHECKPOINTS["re"]), "--output-dir", str(out), "--config", str(CONFIG)]
    run_module("vlhub.cli", [*arguments, "--tokenizer", str(vocab)], {"HF_HUB_OFFLINE": "1", "PATH": ""})
    assert (out / "model.safetensors").is_file() and (out / "processor_config.json").is_file()
    # The error's exit status and message come from the same `main` the command above ran (no second interpreter).
    assert cli_main(["convert", "uniter", str(tmp_path / "none.pt"), "--output-dir", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err


# A conversion that fails part-way leaves the output folder as it was; one that succeeds keeps unrelated files and
# never replaces a hand-written README.md silently.


def convert(output, vocab):
    return convert_uniter(CHECKPOINTS["pretrain"], output, config=CONFIG, tokenizer=vocab)


def test_a_failure_after_the_weights_leaves_no_half_folder(tmp_path, vocab, monkeypatch):
    output = tmp_path / "converted"

    def offline(self, *args, **kwargs):  # the weights are written first, then the processor fails
        raise OSError("tokenizer files unreachable offline")

    monkeypatch.setattr(UniterProcessor, "save_pretrained", offline)
    with pytest.raises(OSError, match="unreachable offline"):
        convert(output, vocab)
    assert not output.exists()
    assert not list(tmp_path.glob(".converted.staging-*"))  # nothing left beside it either

    output.mkdir()
    (output / "notes.txt").write_text("mine")
    with pytest.raises(OSError):
        convert(output, vocab)
    assert sorted(p.name for p in output.iterdir()) == ["notes.txt"]


def test_unrelated_files_are_kept_and_a_different_readme_is_not_overwritten(tmp_path, vocab, caplog):
    output = tmp_path / "converted"
    output.mkdir()
    (output / "notes.txt").write_text("mine")
    (output / "README.md").write_text("# My own notes on this model\n")
    with caplog.at_level("WARNING"):
        convert(output, vocab)
    names = {p.name for p in output.iterdir()}
    assert {"notes.txt", "README.md", "README.md.orig", "model.safetensors", "config.json"} <= names
    assert (output / "README.md.orig").read_text() == "# My own notes on this model\n"
    assert f"converted from {CHECKPOINTS['pretrain'].name}" in (output / "README.md").read_text()
    assert "README.md.orig" in caplog.text
    convert(output, vocab)  # converting again writes the same card: nothing more to keep
    assert not (output / "README.md.orig.1").exists()
