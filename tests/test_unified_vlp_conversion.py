"""Unified VLP converter beyond the numbers: strict key accounting with reasons, provenance, tasks, the CLI and
clear errors for wrong files."""

import json
import sys

import pytest
import torch

import vlhub
from vlhub.cli import main as cli_main
from vlhub.conversion.common import CheckpointError, sha256_of
from vlhub.modeling.unified_vlp.convert_unified_vlp import convert_unified_vlp

from .fresh_interpreter import run_module
from .conftest import fixtures_root
from .release_files import unified_vlp_files

ORIGINAL = fixtures_root() / "unified_vlp" / "original"
pytestmark = pytest.mark.skipif(not ORIGINAL.is_dir(), reason="no Unified VLP fixture")
if ORIGINAL.is_dir():  # found as the original finds them, whatever the fixture set names them
    FILES = unified_vlp_files(ORIGINAL)
    IMG2TXT, VQA2 = FILES["checkpoints"]["img2txt"], FILES["checkpoints"]["vqa2"]
    CONFIG, VOCAB = FILES["config"], FILES["vocab"]


def convert(source, folder, **kwargs):
    return convert_unified_vlp(source, folder, config=CONFIG, tokenizer=VOCAB, **kwargs)


def test_every_key_is_accounted_for_and_provenance_recorded(tmp_path):
    report = convert(IMG2TXT, tmp_path / "cap")
    keys = set(torch.load(IMG2TXT, weights_only=True))
    assert set(report.used.values()) | set(report.dropped) == keys
    assert "tied to vlp.embeddings.word_embeddings.weight" in report.dropped["cls.predictions.decoder.weight"]
    assert all("pooler" in report.dropped[k] for k in ("bert.pooler.dense.weight", "bert.pooler.dense.bias"))
    assert report.used["vlp.embeddings.vis_embed.0.weight"] == "vis_embed.0.weight"
    assert report.used["vlp.embeddings.vis_pe_embed.0.weight"] == "vis_pe_embed.0.weight"
    assert not report.initialized
    card = (tmp_path / "cap" / "README.md").read_text()
    assert sha256_of(IMG2TXT) in card and "LuoweiZhou/VLP" in card and "image-to-text" in card
    config = vlhub.UnifiedVlpConfig.from_pretrained(tmp_path / "cap")
    assert config.layer_norm_eps == 1e-5 and config.type_vocab_size == 6 and config.num_regions == 100
    assert config.architectures == ["UnifiedVlpForConditionalGeneration"]


def test_tasks_and_their_drops(tmp_path):
    report = convert(IMG2TXT, tmp_path / "pt", task="pretraining")
    pooler = {"bert.pooler.dense.weight", "bert.pooler.dense.bias"}
    assert set(report.dropped) == {"cls.predictions.decoder.weight", *pooler} and not report.initialized
    assert all("no released task or loss reads it" in report.dropped[k] for k in pooler)
    vqa = convert(VQA2, tmp_path / "vqa")  # detected from ans_classifier
    assert all(k.startswith(("cls.", "bert.pooler.")) for k in vqa.dropped)
    assert all("masked-LM head" in r for k, r in vqa.dropped.items() if k.startswith("cls."))
    assert any("answer_<i>" in note for note in vqa.notes)
    model_config = vlhub.UnifiedVlpConfig.from_pretrained(tmp_path / "vqa")
    assert model_config.num_labels == 3129 and model_config.id2label[5] == "answer_5"
    processor = vlhub.UnifiedVlpProcessor.from_pretrained(tmp_path / "vqa")
    assert processor.mode == "bidirectional"
    captioning = convert(VQA2, tmp_path / "vqa-cap", task="captioning")
    assert all(
        "VQA answer head" in captioning.dropped[f"ans_classifier.{i}.{p}"] for i in (0, 2) for p in ("weight", "bias")
    )


def test_answer_vocabulary(tmp_path):
    answers = tmp_path / "answers_vqa.txt"
    answers.write_text("\n".join(f"ans{i}" for i in range(3129)) + "\n")
    convert(VQA2, tmp_path / "vqa", answers=answers)
    assert vlhub.UnifiedVlpConfig.from_pretrained(tmp_path / "vqa").id2label[7] == "ans7"
    answers.write_text("yes\nno\n")
    with pytest.raises(CheckpointError, match="has 2 entries but the head predicts 3129"):
        convert(VQA2, tmp_path / "bad", answers=answers)


def test_wrong_files_get_clear_errors(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        convert(tmp_path / "missing.bin", tmp_path / "x")
    with pytest.raises(CheckpointError, match="needs a fine-tuned answer head"):
        convert(IMG2TXT, tmp_path / "x", task="vqa")
    state = torch.load(IMG2TXT, weights_only=True)
    text_only = tmp_path / "unilm.bin"
    torch.save({k: v for k, v in state.items() if not k.startswith("vis_")}, text_only)
    with pytest.raises(CheckpointError, match="not a Unified VLP checkpoint"):
        convert(text_only, tmp_path / "x")
    extra = tmp_path / "extra.bin"
    torch.save({**state, "cls.seq_relationship.weight": torch.zeros(2, 64)}, extra)
    with pytest.raises(CheckpointError, match="cls.seq_relationship.weight"):
        convert(extra, tmp_path / "x")
    two_types = tmp_path / "two_types.bin"
    torch.save({**state, "bert.embeddings.token_type_embeddings.weight": torch.zeros(2, 64)}, two_types)
    with pytest.raises(CheckpointError, match="2 token types"):
        convert(two_types, tmp_path / "x")
    bad_config = tmp_path / "bad.json"
    hidden = json.loads(CONFIG.read_text())["hidden_size"]
    bad_config.write_text(json.dumps({**json.loads(CONFIG.read_text()), "hidden_size": hidden * 2}))
    with pytest.raises(CheckpointError, match=f"hidden_size={hidden * 2} but the checkpoint has {hidden}"):
        convert_unified_vlp(IMG2TXT, tmp_path / "x", config=bad_config, tokenizer=VOCAB)


def test_ddp_prefix_and_fp16_convert_to_the_same_weights(tmp_path):
    state = torch.load(IMG2TXT, weights_only=True)
    torch.save({f"module.{k}": v.half() for k, v in state.items()}, tmp_path / "half.bin")
    convert(tmp_path / "half.bin", tmp_path / "half")
    model = vlhub.UnifiedVlpForConditionalGeneration.from_pretrained(tmp_path / "half")
    assert torch.equal(model.vlp.embeddings.vis_pe_embed[0].weight, state["vis_pe_embed.0.weight"].half().float())


# A fresh interpreter (~2 s): the full suite runs each architecture's; the fast loop keeps UNITER's
# (tests/test_uniter_conversion.py) and this file's in-process conversions.
@pytest.mark.slow
def test_cli_converts_and_reports_errors(tmp_path, capsys):
    out = tmp_path / "cli"
    command = [sys.executable, "-m", "vlhub.cli", "convert", "unified_vlp"]
    run_module(
        "vlhub.cli",
        [*command[3:], str(IMG2TXT), "--output-dir", str(out), "--config", str(CONFIG), "--tokenizer", str(VOCAB)]
        + ["--task", "captioning"],
        {"HF_HUB_OFFLINE": "1", "PATH": ""},
    )
    assert (out / "model.safetensors").is_file() and (out / "processor_config.json").is_file()
    # The error's exit status and message come from the same `main` the command above ran (no second interpreter).
    assert cli_main([*command[3:], str(tmp_path / "none.bin"), "--output-dir", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err


# The original's load_vocab (LuoweiZhou/VLP pytorch_pretrained_bert/tokenization.py) renames these vocab.txt entries
# as it reads them; written out here from the original code, not from vlhub's table.
ORIGINAL_RENAMES = {
    "[unused1]": "[X_SEP]",
    "[unused2]": "[SEP_0]",
    "[unused3]": "[SEP_1]",
    "[unused4]": "[SEP_2]",
    "[unused5]": "[SEP_3]",
    "[unused6]": "[SEP_4]",
    "[unused7]": "[SEP_5]",
    "[unused8]": "[SEP_6]",
    "[unused9]": "[SEP_7]",
    "[unused10]": "[SEP_8]",
    "[unused11]": "[SEP_9]",
}


def test_converted_tokenizer_has_the_original_token_strings(tmp_path):
    from transformers import AutoProcessor, AutoTokenizer

    report = convert(IMG2TXT, tmp_path / "cap")
    assert any("[X_SEP]" in note for note in report.notes)
    lines = VOCAB.read_text(encoding="utf-8").splitlines()
    expected = [ORIGINAL_RENAMES.get(token, token) for token in lines]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "cap")
    assert tokenizer.convert_ids_to_tokens(list(range(len(lines)))) == expected
    assert len(tokenizer) == len(lines)  # no id added: [X_SEP] keeps id 1
    # as the original's BasicTokenizer (never_split holds "[X_SEP]"), "[X_SEP]" in text is one token; "[SEP_0]" is not
    assert tokenizer("[X_SEP]", add_special_tokens=False)["input_ids"] == [1]
    assert tokenizer("[SEP_0]", add_special_tokens=False)["input_ids"] != [2]
    processor = AutoProcessor.from_pretrained(tmp_path / "cap")
    ids = [2, 11, 1, 3, 102, 2]  # cut at [SEP], as decode_img2txt.py
    assert processor.batch_decode(torch.tensor([ids])) == ["[SEP_0] [SEP_9] [X_SEP] [SEP_1]"]


def test_captioning_pipeline_prints_the_original_token_strings(tmp_path):
    from transformers import pipeline

    convert(IMG2TXT, tmp_path / "cap")
    model = vlhub.UnifiedVlpForConditionalGeneration.from_pretrained(tmp_path / "cap")
    with torch.no_grad():  # make id 2 ([unused2] in vocab.txt) the only likely word
        model.cls.predictions.bias[2] = 1e4
    model.save_pretrained(tmp_path / "cap")
    captioner = pipeline("image-captioning", model=str(tmp_path / "cap"))
    regions = vlhub.RegionFeatures(
        features=torch.rand(100, 2048),
        boxes=torch.tensor([[0.0, 0.0, 10.0, 10.0]]).repeat(100, 1),
        image_size=(20, 20),
        class_probs=torch.softmax(torch.randn(100, 1601), -1),
        scores=torch.rand(100),
    )
    assert captioner(regions, max_new_tokens=3) == [{"generated_text": "[SEP_0] [SEP_0] [SEP_0]"}]


def test_release_tokenizer_refuses_a_vocabulary_with_both_spellings():
    from transformers import BertTokenizer

    vocab = {"[PAD]": 0, "[unused1]": 1, "[X_SEP]": 2, "[UNK]": 3, "[CLS]": 4, "[SEP]": 5, "[MASK]": 6}
    with pytest.raises(ValueError, match=r"both '\[unused1\]' \(id 1\) and '\[X_SEP\]' \(id 2\)"):
        vlhub.modeling.unified_vlp.vlp_release_tokenizer(BertTokenizer(vocab=vocab, do_lower_case=False))
