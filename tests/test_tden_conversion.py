"""`vlhub convert tden`: X-modaler's checkpointer files → vlhub folders; the key accounting, conversion across tasks,
and the errors on files and requests that cannot work. Uses the tiny checkpoints of tests/fixtures/tden."""

import json
import os

import pytest
import torch
from transformers import AutoProcessor, pipeline

import vlhub
from vlhub.cli import main as cli_main
from vlhub.conversion.common import CheckpointError
from vlhub.modeling.tden.convert_tden import convert_tden, detect_tden_task, load_tden_checkpoint

from .conftest import fixtures_root
from .release_files import tden_files

ROOT = fixtures_root() / "tden"
ORIGINAL = ROOT / "original"
pytestmark = pytest.mark.skipif(
    not ORIGINAL.is_dir() and not os.environ.get("VLHUB_FIXTURES_DIR"), reason=f"no TDEN fixture at {ROOT}"
)
if ORIGINAL.is_dir():  # each run folder's checkpoint, whatever the fixture set names it
    FILES = tden_files(ORIGINAL)
    RUNS, VOCAB = FILES["runs"], FILES["vocab"]


def checkpoint(name):
    return RUNS[name]["checkpoint"]


def convert(name, out, **kwargs):
    kwargs.setdefault("config", RUNS[name]["config"])
    kwargs.setdefault("tokenizer", VOCAB)
    return convert_tden(checkpoint(name), out, **kwargs)


def test_only_the_model_entry_of_the_container_is_read():
    container = torch.load(checkpoint("caption"), map_location="cpu", weights_only=True)
    assert {"model", "trainer"} <= set(container)
    state = load_tden_checkpoint(checkpoint("caption"))
    assert set(state) == set(container["model"])
    assert detect_tden_task(state) == "captioning"
    assert [detect_tden_task(load_tden_checkpoint(checkpoint(n))) for n in ("pretrain", "vqa", "retrieval")] == [
        "pretraining",
        "vqa",
        "retrieval",
    ]


def test_cli_converts_with_a_report_and_a_model_card(tmp_path):
    out = tmp_path / "caption"
    code = cli_main(
        [
            "convert",
            "tden",
            str(checkpoint("caption")),
            "--output-dir",
            str(out),
            "--config",
            str(RUNS["caption"]["config"]),
            "--tokenizer",
            str(VOCAB),
        ]
    )
    assert code == 0
    report = json.loads((out / "conversion_report.json").read_text())
    state = load_tden_checkpoint(checkpoint("caption"))
    assert set(report["used"].values()) | set(report["dropped"]) == set(state)
    assert "twice" in report["dropped"]["predictor.decoder.bias"] and not report["initialized"]
    assert report["used"]["lm_head.decoder.bias"] == "predictor.bias"
    assert (
        report["used"]["tden.decoder.layer.0.crossattention.self.key.weight"]
        == "decoder.g_layers.0.x_att.self.key.weight"
    )
    card = (out / "README.md").read_text()
    assert "xmodaler" in card and "image-to-text" in card
    config = json.loads((out / "config.json").read_text())
    assert (
        config["model_type"] == "tden"
        and config["num_cross_encoder_layers"] == 0
        and config["num_attention_heads"] == 4
    )
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["num_beams"] == 2 and generation["length_penalty"] == 0.0 and generation["max_new_tokens"] == 10
    processor = AutoProcessor.from_pretrained(out)
    assert processor.text_stream == "generation" and processor.max_text_length == 10
    assert processor.feature_extractor.max_regions == 50


def test_batchnorm_running_statistics_are_converted(tmp_path):
    convert("retrieval", tmp_path / "retrieval")
    state = load_tden_checkpoint(checkpoint("retrieval"))
    model = vlhub.TdenForImageTextRetrieval.from_pretrained(tmp_path / "retrieval")
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert torch.equal(
            getattr(model.similarity.v_pooler[0].bn, name), state[f"similarity_predictor.v_pooler.0.bn.{name}"]
        )


def test_a_pretraining_checkpoint_converts_to_every_task(tmp_path):
    for task, kept, dropped in (
        ("captioning", "lm_head.", ("decoder.u_layers.", "v_predictor.", "similarity_predictor.")),
        ("retrieval", "similarity.", ("decoder.", "predictor.", "v_predictor.")),
        ("vqa", "tden.cross_encoder.", ("predictor.", "v_predictor.", "similarity_predictor.")),
    ):
        report = convert(
            "pretrain",
            tmp_path / task,
            task=task,
            answers=ORIGINAL / "vqa" / "trainval_label2ans.pkl" if task == "vqa" else None,
        )
        assert any(k.startswith(kept) for k in report.used), task
        assert all(
            any(source.startswith(d) for d in dropped)
            for source in report.dropped
            if source != "predictor.decoder.bias"
        ), (task, report.dropped)
        assert all(any(source.startswith(d) for source in report.dropped) for d in dropped), task
        if task == "vqa":
            assert report.initialized and all(k.startswith("answer_head.") for k in report.initialized)
        else:
            assert not report.initialized
    # The converted retrieval head is the pre-training matching head: the same sentence and image vectors.
    from safetensors.torch import load_file

    mi = load_file(ROOT / "model_inputs.safetensors")
    batch = dict(
        input_ids=mi["pretrain.U_TOKENS_IDS"],
        attention_mask=mi["pretrain.TOKENS_MASKS"].long(),
        region_features=mi["pretrain.ATT_FEATS"],
        region_locations=mi["pretrain.ATT_FEATS_LOC"],
        region_attention_mask=mi["pretrain.ATT_MASKS"].long(),
    )
    convert("pretrain", tmp_path / "pretraining")
    with torch.no_grad():
        ism = vlhub.TdenForPreTraining.from_pretrained(tmp_path / "pretraining").eval()(**batch)
        retrieval = vlhub.TdenForImageTextRetrieval.from_pretrained(tmp_path / "retrieval").eval()(**batch)
    torch.testing.assert_close(retrieval.logits_per_text, ism.similarity)


def test_pipelines_work_on_converted_folders(tmp_path):
    from safetensors.torch import load_file

    raw = json.loads((ROOT / "raw_inputs.json").read_text())
    tensors = load_file(ROOT / "raw_inputs.safetensors")
    image = raw["images"][0]
    regions = vlhub.RegionFeatures(
        features=tensors[image["features_tensor"]],
        boxes=tensors[image["boxes_tensor"]],
        image_size=(image["image_h"], image["image_w"]),
    )
    convert("vqa", tmp_path / "vqa")
    answers = pipeline("visual-question-answering", model=str(tmp_path / "vqa"))(
        image=regions, question="is it sunny", top_k=2
    )
    assert len(answers) == 2 and all(isinstance(a["answer"], str) for a in answers)
    convert("retrieval", tmp_path / "retrieval")
    ranked = pipeline("image-text-retrieval", model=str(tmp_path / "retrieval"))(
        image=regions, texts=["man riding horse", "two dogs"]
    )
    assert [r["text"] for r in ranked] != [] and len(ranked) == 2
    convert("caption", tmp_path / "caption")
    for task in ("image-captioning", "image-to-text"):
        captioner = pipeline(task, model=str(tmp_path / "caption"))
        captions = captioner([regions, regions], generate_kwargs={"max_new_tokens": 5})
        assert len(captions) == 2 and captions[0] == captions[1]
        text = captions[0][0]["generated_text"]
        assert text.strip() and "[CLS]" not in text and "[SEP]" not in text  # special tokens are not words


@pytest.mark.parametrize(
    "name, task, message",
    [
        ("retrieval", "captioning", "no decoder layers"),
        ("caption", "retrieval", "cannot score image-text pairs"),
        ("caption", "vqa", "needs num_cross_encoder_layers"),
        ("caption", "nlvr2", "task must be one of"),
    ],
)
def test_impossible_tasks_are_refused(tmp_path, name, task, message):
    with pytest.raises((CheckpointError, ValueError), match=message):
        convert(name, tmp_path / "out", task=task)
    assert not (tmp_path / "out").exists()


def test_a_head_starts_from_another_heads_folder_its_config_allows(tmp_path):
    """As in transformers: the captioner's folder starts a retrieval head (its matching poolers new and reported
    missing); a retrieval folder's config has no decoder, which a captioner cannot do without."""
    convert("caption", tmp_path / "caption")
    convert("retrieval", tmp_path / "retrieval")
    _, info = vlhub.TdenForImageTextRetrieval.from_pretrained(tmp_path / "caption", output_loading_info=True)
    assert info["missing_keys"] and all(key.startswith("similarity.") for key in info["missing_keys"])
    with pytest.raises(ValueError, match="no decoder"):
        vlhub.TdenForConditionalGeneration.from_pretrained(tmp_path / "retrieval")


def test_bad_files_are_refused_with_their_reason(tmp_path):
    container = torch.load(checkpoint("caption"), map_location="cpu", weights_only=True)
    trainer_only = tmp_path / "trainer_only.pth"
    torch.save({k: v for k, v in container.items() if k != "model"}, trainer_only)
    with pytest.raises(CheckpointError, match="only trainer state"):
        convert_tden(trainer_only, tmp_path / "out", tokenizer=VOCAB)
    other = tmp_path / "bert.pth"
    torch.save({"bert.embeddings.word_embeddings.weight": torch.zeros(4, 2)}, other)
    with pytest.raises(CheckpointError, match="not an X-modaler TDEN checkpoint"):
        convert_tden(other, tmp_path / "out", tokenizer=VOCAB)
    state = dict(container["model"])
    state["predictor.decoder.bias"] = state["predictor.bias"] + 1
    differing = tmp_path / "differing.pth"
    torch.save({"model": state}, differing)
    with pytest.raises(CheckpointError, match="same tensor as predictor.bias"):
        convert_tden(differing, tmp_path / "out", config=RUNS["caption"]["config"], tokenizer=VOCAB)
    bare = tmp_path / "bare.pth"
    torch.save(dict(container["model"]), bare)  # a bare state dict is accepted too
    with pytest.raises(CheckpointError, match="attention heads"):  # hidden 64: the heads need the config
        convert_tden(bare, tmp_path / "out", tokenizer=VOCAB)
    assert convert_tden(bare, tmp_path / "bare", config=RUNS["caption"]["config"], tokenizer=VOCAB).used
    with pytest.raises(CheckpointError, match="META_ARCHITECTURE"):
        convert_tden(checkpoint("caption"), tmp_path / "out", config=RUNS["vqa"]["config"], tokenizer=VOCAB)
    assert not (tmp_path / "out").exists()
    code = cli_main(
        ["convert", "tden", str(trainer_only), "--output-dir", str(tmp_path / "out"), "--tokenizer", str(VOCAB)]
    )
    assert code == 2
