"""ViLBERT parity: the three original checkpoints (pre-trained, beta VQA, 12-in-1 multi-task) → `vlhub convert` →
models (and the processor on the raw inputs), against every tensor the original code computed
(tests/fixtures/vilbert, or $VLHUB_FIXTURES_DIR/vilbert). Sizes are read from the fixture, never assumed."""

import json

import pytest
import torch
from transformers import AutoModel, AutoProcessor

import vlhub
from vlhub.modeling.vilbert.convert_vilbert import convert_vilbert

from .conftest import ParityFixture, assert_close, parity_fixture_dir, write_vocab
from .release_files import paths_of, vilbert_files

ROOT, pytestmark = parity_fixture_dir("vilbert", "ViLBERT")
PADDED_SCORE_TOLERANCE = 2e-3  # rows at ≈ -10000 (float32 spacing there is ~1e-3)
# The three checkpoints' roles (found by their keys, `release_files.vilbert_files`).
CHECKPOINTS = ("pretrain", "beta_vqa", "mt")
INPUTS = {"pretrain": "beta", "beta_vqa": "beta", "mt": "mt"}
SPECIALS = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}  # the fixture's stub tokenizer


class Fixture(ParityFixture):
    label = "ViLBERT"

    def __init__(self, root, work):
        self.files = vilbert_files(root / "original")
        super().__init__(root, work, paths_of(self.files))
        self.config = self.files["config"]
        vocab_size = json.loads(self.config.read_text())["vocab_size"]
        self.vocab = write_vocab(work / "vocab.txt", vocab_size, SPECIALS)
        self._folders = {}

    def folder(self, release, task):
        if (release, task) not in self._folders:
            folder = self.work / f"{release}-{task}"
            convert_vilbert(
                self.files["checkpoints"][release], folder, config=self.config, task=task, tokenizer=self.vocab
            )
            self._folders[release, task] = folder
        return self._folders[release, task]

    def inputs(self, release, rows=None):
        prefix = INPUTS[release]
        t = self.model_inputs
        inputs = dict(
            input_ids=t[f"{prefix}.input_ids"],
            attention_mask=t[f"{prefix}.attention_mask"],
            token_type_ids=t[f"{prefix}.token_type_ids"],
            region_features=t[f"{prefix}.image_feat"],
            region_locations=t[f"{prefix}.image_loc"],
            region_attention_mask=t[f"{prefix}.image_attention_mask"],
        )
        if f"{prefix}.task_ids" in t:
            inputs["task_ids"] = t[f"{prefix}.task_ids"]
        return {k: v[rows] for k, v in inputs.items()} if rows is not None else inputs

    def regions(self):
        out = []
        for pair in self.raw["pairs"]:
            image = self.raw["images"][pair[0]]
            out.append(
                vlhub.RegionFeatures(
                    features=self.raw_tensors[image["features_tensor"]],
                    boxes=self.raw_tensors[image["boxes_tensor"]],
                    image_size=(image["image_h"], image["image_w"]),
                    class_probs=self.raw_tensors[image["cls_prob_tensor"]],
                )
            )
        return out

    def word_pieces(self):
        return [self.raw["texts"][pair[1]]["input_ids"][1:-1] for pair in self.raw["pairs"]]

    def run(self, release, task, model_class, attn="eager", rows=None, **extra):
        model = model_class.from_pretrained(self.folder(release, task), attn_implementation=attn).eval()
        with torch.no_grad():
            return model(**self.inputs(release, rows), **extra)


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    return Fixture(ROOT, tmp_path_factory.mktemp("vilbert-parity"))


def _expected(fx, release):
    return {k.split(".", 1)[1]: v for k, v in fx.outputs.items() if k.startswith(release + ".")}


TRUNK = {
    "sequence_output_t": "last_hidden_state",
    "sequence_output_v": "vision_last_hidden_state",
    "pooled_output_t": "text_pooler_output",
    "pooled_output_v": "vision_pooler_output",
}


@pytest.mark.parametrize("release", list(CHECKPOINTS))
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_vilbert_parity_trunk(fx, release, attn):
    """Both streams and both poolers, through AutoModel on each converted folder."""
    model = AutoModel.from_pretrained(fx.folder(release, "pretraining"), attn_implementation=attn).eval()
    assert isinstance(model, vlhub.VilbertModel)
    with torch.no_grad():
        outputs = model(**fx.inputs(release))
    expected = _expected(fx, release)
    for name, field in TRUNK.items():
        assert_close(outputs[field], expected[name], f"{release}.{name}")


@pytest.mark.parametrize("release", list(CHECKPOINTS))
def test_vilbert_parity_pretraining_heads(fx, release):
    """`cls.*` heads: MLM, masked-region classes and alignment logits (in the fine-tuned releases they are the
    `linguisic_prediction` / `vision_prediction` / `vil_binary_prediction` outputs)."""
    outputs = fx.run(release, "pretraining", vlhub.VilbertForPreTraining)
    expected = _expected(fx, release)
    batch = fx.inputs(release)["input_ids"].shape[0]
    names = {
        "prediction_scores_t": "prediction_logits",
        "prediction_scores_v": "region_logits",
        "seq_relationship_score": "alignment_logits",
        "linguisic_prediction": "prediction_logits",
        "vision_prediction": "region_logits",
    }
    if release != "pretrain" and expected["vil_binary_prediction"].shape[0] == batch:
        names["vil_binary_prediction"] = "alignment_logits"  # odd batch: the original returns the alignment logits
    checked = 0
    for name, field in names.items():
        if name in expected:
            assert_close(outputs[field], expected[name], f"{release}.{name}")
            checked += 1
    assert checked >= 3
    if "mlm_positions" in expected:
        mask_id = SPECIALS["[MASK]"]
        positions = (fx.inputs(release)["input_ids"] == mask_id).nonzero()
        assert torch.equal(positions, expected["mlm_positions"])
        gathered = outputs.prediction_logits[positions[:, 0], positions[:, 1]]
        assert_close(gathered, expected["masked_lm_logits"], f"{release}.masked_lm_logits")


def test_vilbert_parity_attention_maps(fx):
    """Per-layer attention probabilities of both streams and both directions of every co-attention layer."""
    outputs = fx.run("pretrain", "pretraining", vlhub.VilbertForPreTraining, output_attentions=True)
    expected = _expected(fx, "pretrain")
    found = 0
    for name, value in expected.items():
        if name.startswith("attention_probs_t."):
            actual = outputs.attentions[int(name.rsplit(".", 1)[1])]
        elif name.startswith("attention_probs_v."):
            actual = outputs.vision_attentions[int(name.rsplit(".", 1)[1])]
        elif name.startswith("co_attention_probs."):
            _, index, direction = name.split(".")
            field = "text_to_vision_attentions" if direction == "text_to_image" else "vision_to_text_attentions"
            actual = outputs[field][int(index)]
        else:
            continue
        assert_close(actual, value, f"pretrain.{name}")
        found += 1
    config = vlhub.VilbertConfig.from_pretrained(fx.folder("pretrain", "pretraining"))
    assert found == config.num_hidden_layers + config.visual_num_hidden_layers + 2 * config.num_co_attention_layers


def _region_scores(actual, expected, mask, what):
    """`vision_logit` `(B, R, 1)`: real rows at the usual tolerance, padded rows (≈ -10000) at theirs."""
    actual = actual.unsqueeze(-1)
    real = mask.bool()
    assert_close(actual[real], expected[real], what)
    assert_close(actual[~real], expected[~real], what + " (padded rows)", PADDED_SCORE_TOLERANCE)


@pytest.mark.parametrize("release", ["beta_vqa", "mt"])
def test_vilbert_parity_task_heads(fx, release):
    """Every task head the fine-tuned release has: VQA (weight-normed beta head / 12-in-1 logit_fc), GQA, retrieval
    (`vil_logit`), SNLI-VE, referring expressions (`vision_logit`; `linguisic_logit`, which no task reads and the
    head does not have, is checked through the full model below)."""
    expected = _expected(fx, release)
    inputs = fx.inputs(release)
    heads = {
        "vil_prediction": ("vqa", vlhub.VilbertForQuestionAnswering, "logits"),
        "vil_prediction_gqa": ("gqa", vlhub.VilbertForQuestionAnswering, "logits"),
        "vil_logit": ("retrieval", vlhub.VilbertForImageTextRetrieval, "logits"),
        "vil_tri_prediction": ("ve", vlhub.VilbertForVisualEntailment, "logits"),
    }
    for name, (task, model_class, field) in heads.items():
        if name in expected:
            actual = fx.run(release, task, model_class)[field]
            assert_close(actual, expected[name], f"{release}.{name} ({task})")
    regions = fx.run(release, "re", vlhub.VilbertForReferringExpression).logits
    _region_scores(regions, expected["vision_logit"], inputs["region_attention_mask"], f"{release}.vision_logit")


@pytest.mark.parametrize("release", ["beta_vqa", "mt"])
def test_vilbert_parity_linguisic_logit(fx, release):
    """The original's per-token score `linguisic_logit(sequence_output_t)`: the checkpoint's layer on the full
    model's text output (the referring-expression head, which reads the visual stream alone, has neither)."""
    model = vlhub.VilbertModel.from_pretrained(fx.folder(release, "pretraining")).eval()
    with torch.no_grad():
        text = model(**fx.inputs(release)).last_hidden_state
    original = torch.load(fx.files["checkpoints"][release], weights_only=True)
    actual = torch.nn.functional.linear(text, original["linguisic_logit.weight"], original["linguisic_logit.bias"])
    assert_close(actual, _expected(fx, release)["linguisic_logit"], f"{release}.linguisic_logit")


def test_vilbert_parity_multiple_choice(fx):
    """VCR reads `vil_logit` per (question, choice): the beta checkpoint's, one choice per example."""
    expected = _expected(fx, "beta_vqa")
    inputs = fx.inputs("beta_vqa")
    model = vlhub.VilbertForMultipleChoice.from_pretrained(fx.folder("beta_vqa", "vcr")).eval()
    text = {k: inputs[k].unsqueeze(1) for k in ("input_ids", "attention_mask", "token_type_ids")}
    regions = {k: inputs[k] for k in ("region_features", "region_locations", "region_attention_mask")}
    with torch.no_grad():
        logits = model(**text, **regions).logits
    assert_close(logits, expected["vil_logit"], "beta_vqa.vil_logit (vcr)")


def test_vilbert_parity_nlvr2_pair(fx):
    """The 12-in-1 NLVR2 head on two consecutive (text, image) examples, as the original pairs a batch."""
    expected = _expected(fx, "mt_pair")["vil_binary_prediction"]
    pairs = expected.shape[0]
    inputs = fx.inputs("mt", rows=slice(0, 2 * pairs))
    paired = {k: v.reshape(pairs, 2, *v.shape[1:]) for k, v in inputs.items() if k != "task_ids"}
    model = vlhub.VilbertForVisualReasoning.from_pretrained(fx.folder("mt", "nlvr2")).eval()
    with torch.no_grad():
        logits = model(**paired, task_ids=inputs["task_ids"][::2]).logits
    assert_close(logits, expected, "mt_pair.vil_binary_prediction")


@pytest.mark.parametrize("release", list(CHECKPOINTS))
def test_vilbert_parity_processor_inputs(fx, release):
    """The processor on the raw regions and word pieces gives the original's model inputs (padding aside: the
    original pads to a fixed length, vlhub to the longest in the batch)."""
    prefix = INPUTS[release]
    folder = fx.folder(release, "pretraining")
    processor = AutoProcessor.from_pretrained(folder)
    assert isinstance(processor, vlhub.VilbertProcessor)
    extra = {}
    if f"{prefix}.task_ids" in fx.model_inputs:
        task_ids = fx.model_inputs[f"{prefix}.task_ids"]
        assert torch.all(task_ids == task_ids[0, 0])
        extra["task_id"] = int(task_ids[0, 0])
    encoded = processor(token_ids=fx.word_pieces(), regions=fx.regions(), **extra)
    reference = fx.inputs(release)
    names = {
        "input_ids": "input_ids",
        "attention_mask": "attention_mask",
        "token_type_ids": "token_type_ids",
        "region_features": "region_features",
        "region_locations": "region_locations",
        "region_attention_mask": "region_attention_mask",
        "task_ids": "task_ids",
    }
    for name, ref_name in names.items():
        if ref_name not in reference:
            assert name not in encoded
            continue
        mine, ref = encoded[name], reference[ref_name]
        length = mine.shape[1]
        assert ref.shape[1] >= length
        if mine.is_floating_point():
            assert_close(mine, ref[:, :length], f"processor {name}", 1e-6)
        else:
            assert torch.equal(mine, ref[:, :length].to(mine.dtype)), name
        # The original's extra padding is padding.
        assert not ref[:, length:].any(), f"{name}: the fixture has non-zero values past the processor's padding"


@pytest.mark.parametrize("release", list(CHECKPOINTS))
def test_vilbert_parity_end_to_end(fx, release):
    """Processor → model, from the raw inputs, against the original outputs at every real position."""
    prefix = INPUTS[release]
    folder = fx.folder(release, "pretraining")
    processor = AutoProcessor.from_pretrained(folder)
    extra = {}
    if f"{prefix}.task_ids" in fx.model_inputs:
        extra["task_id"] = int(fx.model_inputs[f"{prefix}.task_ids"][0, 0])
    encoded = processor(token_ids=fx.word_pieces(), regions=fx.regions(), **extra)
    model = vlhub.VilbertForPreTraining.from_pretrained(folder).eval()
    with torch.no_grad():
        outputs = model(**encoded)
    expected = _expected(fx, release)
    text_real = encoded["attention_mask"].bool()
    if "task_ids" in encoded:
        text_real = torch.cat([text_real[:, :1], torch.ones_like(text_real[:, :1]), text_real[:, 1:]], dim=1)
    region_real = encoded["region_attention_mask"].bool()
    scores_t = expected.get("prediction_scores_t", expected.get("linguisic_prediction"))
    scores_v = expected.get("prediction_scores_v", expected.get("vision_prediction"))
    assert_close(outputs.prediction_logits[text_real], scores_t[:, : text_real.shape[1]][text_real], "mlm logits")
    assert_close(outputs.region_logits[region_real], scores_v[:, : region_real.shape[1]][region_real], "region logits")
    alignment = expected.get("seq_relationship_score", expected.get("vil_binary_prediction"))
    if alignment.shape[0] == outputs.alignment_logits.shape[0]:
        assert_close(outputs.alignment_logits, alignment, "alignment logits")


HANDLED = {
    "pretrain": {
        *TRUNK,
        "prediction_scores_t",
        "prediction_scores_v",
        "seq_relationship_score",
        "mlm_positions",
        "masked_lm_logits",
    },
    "beta_vqa": {
        *TRUNK,
        "vil_prediction",
        "vil_logit",
        "vil_binary_prediction",
        "vision_prediction",
        "vision_logit",
        "linguisic_prediction",
        "linguisic_logit",
    },
    "mt": {
        *TRUNK,
        "vil_prediction",
        "vil_prediction_gqa",
        "vil_logit",
        "vil_binary_prediction",
        "vil_tri_prediction",
        "vision_prediction",
        "vision_logit",
        "linguisic_prediction",
        "linguisic_logit",
    },
    "mt_pair": {"vil_binary_prediction"},
}
ATTENTION_MAPS = ("pretrain.attention_probs_t.", "pretrain.attention_probs_v.", "pretrain.co_attention_probs.")


def test_vilbert_parity_covers_every_fixture_tensor(fx):
    """The tests above compare every tensor of outputs.safetensors: a fixture tensor no test reads fails here."""
    unread = [
        name
        for name in fx.outputs
        if not name.startswith(ATTENTION_MAPS) and name.split(".", 1)[1] not in HANDLED.get(name.split(".")[0], ())
    ]
    assert not unread, f"fixture tensors no parity test compares: {unread}"
