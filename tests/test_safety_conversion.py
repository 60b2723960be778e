"""A conversion that fails part-way leaves the output folder as it was; one that succeeds keeps unrelated files and
never replaces a hand-written README.md silently."""

from __future__ import annotations

import json

import pytest

from vlhub.conversion import convert_uniter
from vlhub.modeling.uniter import UniterProcessor

from .conftest import fixtures_root, write_vocab

ORIGINAL = fixtures_root() / "uniter" / "original"
pytestmark = pytest.mark.skipif(not ORIGINAL.is_dir(), reason="no UNITER fixture")


@pytest.fixture
def vocab(tmp_path):
    size = json.loads((ORIGINAL / "config.json").read_text())["vocab_size"]
    specials = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}
    return write_vocab(tmp_path / "vocab.txt", size, specials)


def convert(output, vocab):
    return convert_uniter(ORIGINAL / "uniter-pretrain.pt", output, config=ORIGINAL / "config.json", tokenizer=vocab)


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
    assert "converted from uniter-pretrain.pt" in (output / "README.md").read_text()
    assert "README.md.orig" in caplog.text
    convert(output, vocab)  # converting again writes the same card: nothing more to keep
    assert not (output / "README.md.orig.1").exists()
