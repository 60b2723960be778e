"""VL-BERT converter behaviour beyond the numbers: key accounting with reasons, provenance, task switches, the
original's checkpoint container, and clear errors for wrong files."""

import json
import sys

import pytest
import torch
import yaml

import vlhub
from vlhub.cli import main as cli_main
from vlhub.conversion import CheckpointError
from vlhub.conversion.common import sha256_of
from vlhub.modeling.vl_bert.convert_vl_bert import convert_vl_bert

from .fresh_interpreter import run_module
from .conftest import fixtures_root
from .release_files import vl_bert_files

ORIGINAL = fixtures_root() / "vl_bert" / "original"
pytestmark = pytest.mark.skipif(not ORIGINAL.is_dir(), reason="no VL-BERT fixture")
if ORIGINAL.is_dir():  # found as the original finds them (its configs name them), whatever the fixture set calls them
    FILES = vl_bert_files(ORIGINAL)
    PRETRAIN, VQA, REFCOCO = (FILES["checkpoints"][task] for task in ("pretrain", "vqa", "refcoco"))
    BERT, ANSWERS = FILES["bert"], FILES["answers"]


def _yaml(task):
    return FILES["configs"][task]


def _convert(name, out, task=None, cfg="pretrain", **kwargs):
    kwargs.setdefault("answers", ANSWERS)
    return convert_vl_bert(
        ORIGINAL / name if isinstance(name, str) else name, out, config=_yaml(cfg), task=task, tokenizer=BERT, **kwargs
    )


def _state(name):
    return torch.load(ORIGINAL / name, map_location="cpu", weights_only=True)["state_dict"]


def test_every_key_is_accounted_for_and_provenance_recorded(tmp_path):
    report = _convert(PRETRAIN, tmp_path / "out")
    keys = {k[len("module.") :] for k in _state(PRETRAIN)}
    assert set(report.used.values()) | set(report.dropped) == keys
    assert set(report.dropped) == {"vlbert.mlm_head.predictions.decoder.weight"}
    assert (
        "tied to vl_bert.embeddings.word_embeddings.weight"
        in report.dropped["vlbert.mlm_head.predictions.decoder.weight"]
    )
    assert not report.initialized
    saved = json.loads((tmp_path / "out" / "conversion_report.json").read_text())
    assert saved["dropped"] == report.dropped
    card = (tmp_path / "out" / "README.md").read_text()
    assert sha256_of(ORIGINAL / PRETRAIN) in card and "jackroos/VL-BERT" in card and PRETRAIN.name in card
    model = vlhub.VlBertForPreTraining.from_pretrained(tmp_path / "out")
    assert model.cls.predictions.decoder.weight is model.vl_bert.embeddings.word_embeddings.weight


def test_save_load_of_a_converted_folder_is_exact(tmp_path):
    _convert(VQA, tmp_path / "vqa", cfg="vqa")
    model = vlhub.VlBertForQuestionAnswering.from_pretrained(tmp_path / "vqa")
    model.save_pretrained(tmp_path / "again")
    again = vlhub.VlBertForQuestionAnswering.from_pretrained(tmp_path / "again")
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name
    assert again.config.id2label == model.config.id2label and len(model.config.id2label) == 50


def test_pretraining_checkpoint_starts_the_task_heads_like_the_original(tmp_path):
    state = {k[len("module.") :]: v for k, v in _state(PRETRAIN).items()}
    report = _convert(PRETRAIN, tmp_path / "vqa", task="vqa", cfg="vqa")
    assert set(report.initialized) == {"vqa_head.2.weight", "vqa_head.2.bias"}
    assert "used only by pre-training" in report.dropped["aux_text_visual_embedding.weight"]
    assert "MLM head of pre-training" in report.dropped["vlbert.mlm_head.predictions.bias"]
    vqa = vlhub.VlBertForQuestionAnswering.from_pretrained(tmp_path / "vqa")
    assert torch.equal(vqa.vqa_head[0].dense.weight, state["vlbert.mlm_head.predictions.transform.dense.weight"])
    assert torch.equal(vqa.vqa_head[0].LayerNorm.bias, state["vlbert.mlm_head.predictions.transform.LayerNorm.bias"])

    report = _convert(PRETRAIN, tmp_path / "re", task="refcoco", cfg="refcoco")
    assert set(report.initialized) == {"re_head.2.weight", "re_head.2.bias"}
    re = vlhub.VlBertForReferringExpression.from_pretrained(tmp_path / "re")
    assert torch.equal(re.re_head[0].dense.weight, state["vlbert.mvrc_head.transform.dense.weight"])
    assert re.config.classifier_dropout == 0.0  # RefCOCO+'s CLASSIFIER_DROPOUT

    # initialize_from_pretraining does the same from a converted pre-training model's state dict.
    _convert(PRETRAIN, tmp_path / "pre")
    pre = vlhub.VlBertForPreTraining.from_pretrained(tmp_path / "pre").state_dict()
    fresh = vlhub.VlBertForReferringExpression(re.config)
    fresh.initialize_from_pretraining(pre)
    assert torch.equal(fresh.re_head[0].dense.bias, re.re_head[0].dense.bias)


def test_vcr_layout_converts(tmp_path):
    """A VCR checkpoint keeps the backbone under `vlbert._module.` (TimeDistributed) and adds the pooler, `final_mlp`
    (dropout, Linear(H, 1)) and `cnn_loss_reg` (81-way object head)."""
    source = {
        k[len("module.") :]: v
        for k, v in _state(PRETRAIN).items()
        if not k.startswith(
            ("module.vlbert.mlm_head", "module.vlbert.mvrc_head", "module.aux_text", "module.object_mask")
        )
    }
    source = {k.replace("vlbert.", "vlbert._module.", 1): v for k, v in source.items()}
    hidden = source["vlbert._module.word_embeddings.weight"].shape[1]
    g = torch.Generator().manual_seed(0)
    extra = {
        "vlbert._module.pooler.dense.weight": torch.randn(hidden, hidden, generator=g),
        "vlbert._module.pooler.dense.bias": torch.randn(hidden, generator=g),
        "final_mlp.1.weight": torch.randn(1, hidden, generator=g),
        "final_mlp.1.bias": torch.randn(1, generator=g),
        "cnn_loss_reg.0.dense.weight": torch.randn(hidden, hidden, generator=g),
        "cnn_loss_reg.0.dense.bias": torch.randn(hidden, generator=g),
        "cnn_loss_reg.2.weight": torch.randn(81, hidden, generator=g),
        "cnn_loss_reg.2.bias": torch.randn(81, generator=g),
    }
    torch.save(
        {"state_dict": {f"module.{k}": v.half() for k, v in {**source, **extra}.items()}}, tmp_path / "vcr.model"
    )
    report = convert_vl_bert(tmp_path / "vcr.model", tmp_path / "vcr", config=_yaml("pretrain"), tokenizer=BERT)
    assert not report.initialized and not report.dropped
    model = vlhub.VlBertForMultipleChoice.from_pretrained(tmp_path / "vcr")
    assert model.vl_bert.pooler is not None and model.vl_bert.pooler.dense.weight.dtype == torch.float32
    torch.testing.assert_close(model.vcr_head[1].weight, extra["final_mlp.1.weight"].half().float())
    torch.testing.assert_close(model.vcr_region_head[2].bias, extra["cnn_loss_reg.2.bias"].half().float())
    # Images are resized as the YAML's SCALES say: this one 600/1000; VCR's own configs 600/1200.
    assert vlhub.VlBertProcessor.from_pretrained(tmp_path / "vcr").feature_extractor.max_size == 1000
    vcr_yaml = {**yaml.safe_load(_yaml("pretrain").read_text()), "SCALES": [600, 1200]}
    convert_vl_bert(tmp_path / "vcr.model", tmp_path / "vcr-1200", config=vcr_yaml, tokenizer=BERT)
    region_processor = vlhub.VlBertProcessor.from_pretrained(tmp_path / "vcr-1200").feature_extractor
    assert (region_processor.min_size, region_processor.max_size) == (600, 1200)
    with pytest.raises(CheckpointError, match=r"SCALES must be \[short side, longest side\], got \[1200\]"):
        convert_vl_bert(tmp_path / "vcr.model", tmp_path / "bad", config={**vcr_yaml, "SCALES": [1200]}, tokenizer=BERT)


def test_wrong_files_get_clear_errors(tmp_path):
    state = _state(PRETRAIN)
    # A prec config with an end-to-end checkpoint (its own ResNet), and a CNN missing its res5.
    e2e = dict(state)
    e2e["module.image_feature_extractor.backbone.conv1.weight"] = torch.zeros(64, 3, 7, 7)
    torch.save({"state_dict": e2e}, tmp_path / "e2e.model")
    with pytest.raises(CheckpointError, match="IMAGE_FEAT_PRECOMPUTED=True but the checkpoint is an end-to-end"):
        _convert(tmp_path / "e2e.model", tmp_path / "x")
    sizes = yaml.safe_load(_yaml("pretrain").read_text())["NETWORK"]["VLBERT"]  # the fixture's own sizes
    e2e_yaml = {"NETWORK": {"IMAGE_FEAT_PRECOMPUTED": False, "VLBERT": sizes}}
    with pytest.raises(CheckpointError, match="needs image_feature_extractor.backbone"):
        convert_vl_bert(tmp_path / "e2e.model", tmp_path / "x", config=e2e_yaml, tokenizer=BERT)
    # Another architecture's checkpoint.
    uniter = {
        "uniter.embeddings.word_embeddings.weight": torch.zeros(10, 4),
        "uniter.img_embeddings.img_linear.weight": torch.zeros(4, 8),
    }
    torch.save(uniter, tmp_path / "uniter.pt")
    with pytest.raises(CheckpointError, match="not a VL-BERT checkpoint.*UNITER"):
        _convert(tmp_path / "uniter.pt", tmp_path / "x")
    # A key nothing in vlhub's model takes.
    torch.save(
        {
            "state_dict": {
                **state,
                "module.vlbert.relationsip_head.caption_image_relationship.weight": torch.zeros(2, 64),
            }
        },
        tmp_path / "extra.model",
    )
    with pytest.raises(CheckpointError, match="relationsip_head.*no counterpart"):
        _convert(tmp_path / "extra.model", tmp_path / "x")
    # A fine-tuned checkpoint cannot become another task's model.
    with pytest.raises(CheckpointError, match="fine-tuned 'vqa' model"):
        _convert(VQA, tmp_path / "x", task="refcoco", cfg="refcoco")
    # The answers must match the VQA head.
    (tmp_path / "answers.txt").write_text("yes\nno\n")
    answers = len([line for line in ANSWERS.read_text().splitlines() if line.strip()])
    with pytest.raises(CheckpointError, match=f"2 entries but the head predicts {answers}"):
        _convert(VQA, tmp_path / "x", cfg="vqa", answers=tmp_path / "answers.txt")
    # The YAML must describe the checkpoint.
    with pytest.raises(CheckpointError, match="the config says"):
        convert_vl_bert(
            ORIGINAL / VQA,
            tmp_path / "x",
            config={"NETWORK": {"VLBERT": {**sizes, "num_hidden_layers": sizes["num_hidden_layers"] + 1}}},
            tokenizer=BERT,
            answers=ANSWERS,
        )
    visual = sizes["hidden_size"] // 2
    with pytest.raises(ValueError, match=f"visual_size={visual} is not supported"):
        convert_vl_bert(
            ORIGINAL / VQA,
            tmp_path / "x",
            config={"NETWORK": {"VLBERT": {**sizes, "visual_size": visual}}},
            tokenizer=BERT,
        )
    # Without a YAML the head count of a non-BERT size cannot be guessed.
    with pytest.raises(CheckpointError, match="--config"):
        convert_vl_bert(ORIGINAL / REFCOCO, tmp_path / "x", tokenizer=BERT)


# A fresh interpreter (~2 s): the full suite runs each architecture's; the fast loop keeps UNITER's
# (tests/test_uniter_conversion.py) and this file's in-process conversions.
@pytest.mark.slow
def test_cli_converts_and_reports_errors(tmp_path, capsys):
    command = [
        sys.executable,
        "-m",
        "vlhub.cli",
        "convert",
        "vl_bert",
        str(ORIGINAL / REFCOCO),
        "--output-dir",
        str(tmp_path / "re"),
        "--config",
        str(_yaml("refcoco")),
        "--tokenizer",
        str(BERT),
    ]
    # The checkout under test (the test session's sys.path), whatever vlhub the interpreter has installed.
    run_module("vlhub.cli", command[3:], {"HF_HUB_OFFLINE": "1", "PATH": ""})
    assert isinstance(
        vlhub.model_class_for(vlhub.VlBertConfig.from_pretrained(tmp_path / "re"))(
            vlhub.VlBertConfig.from_pretrained(tmp_path / "re")
        ),
        vlhub.VlBertForReferringExpression,
    )
    (tmp_path / "empty.model").write_bytes(b"")
    # The error's exit status and message come from the same `main` the command above ran (no second interpreter).
    assert cli_main([*command[3:5], str(tmp_path / "empty.model"), *command[6:]]) == 2
    assert "empty" in capsys.readouterr().err
