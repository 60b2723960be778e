"""UNITER parity: original checkpoints → `vlhub convert` → processor on the raw inputs → model, against what the
original code computed (tests/fixtures/uniter, or $VLHUB_FIXTURES_DIR/uniter)."""

import json

import pytest
import torch
from transformers import AutoModel, AutoModelForPreTraining, AutoModelForVisualQuestionAnswering, AutoProcessor

import vlhub
from vlhub.conversion import convert_uniter

from .conftest import ParityFixture, assert_close, parity_fixture_dir, write_vocab
from .release_files import paths_of, uniter_files

ROOT, pytestmark = parity_fixture_dir("uniter", "UNITER")


class Fixture(ParityFixture):
    label = "UNITER"

    def __init__(self, root, work):
        self.files = uniter_files(root / "original")
        super().__init__(root, work, needed=paths_of(self.files))
        self.config = self.files["config"]
        vocab_size = json.loads(self.config.read_text())["vocab_size"]
        self.vocab = write_vocab(work / "vocab.txt", vocab_size, self.raw["special_tokens"])
        self._converted = {}

    def regions(self):
        out = []
        for example in self.raw["examples"]:
            image, t = example["image"], self.raw_tensors
            out.append(
                vlhub.RegionFeatures(
                    features=t[image["features_tensor"]],
                    boxes=t[image["boxes_tensor"]],
                    image_size=(image["height"], image["width"]),
                    class_probs=t[image["soft_labels_tensor"]],
                    scores=t[image["conf_tensor"]],
                )
            )
        return out

    def word_ids(self):
        return [example["word_ids"] for example in self.raw["examples"]]

    def convert(self, name, task=None):
        key = (name, task)
        if key not in self._converted:
            folder = self.work / f"{name}-{task}"
            convert_uniter(
                self.files["checkpoints"][name],
                folder,
                config=self.config,
                task=task,
                tokenizer=self.vocab,
                answers=self.files["answers"] if name == "vqa" else None,
            )
            self._converted[key] = folder
        return self._converted[key]

    def inputs(self, folder, **region_settings):
        processor = AutoProcessor.from_pretrained(folder)
        for name, value in region_settings.items():
            setattr(processor.feature_extractor, name, value)
        return processor(token_ids=self.word_ids(), regions=self.regions(), return_tensors="pt")

    # The original lays each example out as [text_i | regions_i | junk]; vlhub as [text | regions] padded per
    # modality. Compare the real positions of both.
    def assert_sequence_close(self, mine, reference, text_length):
        text_lens = self.model_inputs["txt_lens"].tolist()
        num_boxes = self.model_inputs["num_bbs"].tolist()
        for i, (tl, nb) in enumerate(zip(text_lens, num_boxes)):
            ours = torch.cat([mine[i, :tl], mine[i, text_length : text_length + nb]])
            assert_close(ours, reference[i, : tl + nb], f"example {i}")


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    return Fixture(ROOT, tmp_path_factory.mktemp("uniter_parity"))


def test_uniter_parity_processor_inputs(fx):
    inputs = fx.inputs(fx.convert("pretrain"))
    mi = fx.model_inputs
    assert torch.equal(inputs["input_ids"], mi["input_ids"])
    text_mask = inputs["attention_mask"]
    assert text_mask.sum(1).tolist() == mi["txt_lens"].tolist()
    assert inputs["region_attention_mask"].sum(1).tolist() == mi["num_bbs"].tolist()
    assert torch.equal(inputs["region_features"], mi["img_feat"])
    assert torch.equal(inputs["region_locations"], mi["img_pos_feat"])
    # The 6-d box the original stores (float16) is exactly ours.
    for i, example in enumerate(fx.raw["examples"]):
        stored = fx.raw_tensors[example["image"]["norm_bb_stored_tensor"]]
        n = mi["num_bbs"][i]
        assert torch.equal(inputs["region_locations"][i, :n, :6], stored[:n])


def test_uniter_parity_pretrain_backbone(fx):
    folder = fx.convert("pretrain")
    inputs = fx.inputs(folder)
    model = AutoModel.from_pretrained(folder).eval()  # the bare backbone out of a pre-training checkpoint
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True)
    T = inputs["input_ids"].shape[1]
    ref = fx.outputs
    fx.assert_sequence_close(out.hidden_states[0], ref["pretrain.embedding_output"], T)
    for layer in range(ref["pretrain.encoder_layers"].shape[0]):
        fx.assert_sequence_close(out.hidden_states[layer + 1], ref["pretrain.encoder_layers"][layer], T)
    fx.assert_sequence_close(out.last_hidden_state, ref["pretrain.sequence_output"], T)
    assert_close(out.pooler_output, ref["pretrain.pooled_output"], "pooled")


def test_uniter_parity_pretrain_itm_and_wra(fx):
    folder = fx.convert("pretrain")
    inputs = fx.inputs(folder)
    model = AutoModelForPreTraining.from_pretrained(folder).eval()
    labels = fx.model_inputs["itm_targets"]
    with torch.no_grad():
        out = model(**inputs, itm_labels=labels, objective="itm-wra")
    ref = fx.outputs
    assert_close(out.itm_logits, ref["pretrain.itm_scores"], "itm scores")
    assert_close(out.itm_loss, ref["pretrain.itm_loss"].mean(), "itm loss")
    assert_close(out.wra_distance, ref["pretrain.itm_ot_dist"], "OT distance")


def test_uniter_parity_pretrain_mlm(fx):
    folder = fx.convert("pretrain")
    inputs = fx.inputs(folder)
    mi, ref = fx.model_inputs, fx.outputs
    inputs["input_ids"] = mi["mlm_input_ids"]  # the original collate's corruption, replayed
    model = AutoModelForPreTraining.from_pretrained(folder).eval()
    with torch.no_grad():
        out = model(**inputs, labels=mi["mlm_txt_labels"], objective="mlm")
    fx.assert_sequence_close(out.last_hidden_state, ref["pretrain.mlm_sequence_output"], inputs["input_ids"].shape[1])
    assert_close(out.mlm_logits, ref["pretrain.mlm_prediction_scores"], "MLM scores")
    assert_close(out.mlm_loss, ref["pretrain.mlm_loss"].mean(), "MLM loss")


@pytest.mark.parametrize("objective", ["mrfr", "mrc-kl", "mrc"])
def test_uniter_parity_pretrain_region_modelling(fx, objective):
    folder = fx.convert("pretrain")
    inputs = fx.inputs(folder)
    mi, ref = fx.model_inputs, fx.outputs
    model = AutoModelForPreTraining.from_pretrained(folder).eval()
    with torch.no_grad():
        out = model(
            **inputs,
            region_masks=mi["mrm_img_masks"],
            region_feature_targets=mi["mrfr_feat_targets"],
            region_class_targets=mi["mrc_label_targets"],
            objective=objective,
        )
    fx.assert_sequence_close(out.last_hidden_state, ref["pretrain.mrm_sequence_output"], inputs["input_ids"].shape[1])
    if objective == "mrfr":
        assert_close(out.mrfr_predictions, ref["pretrain.mrfr_prediction_feat"], "MRFR features")
        assert_close(out.mrfr_loss, ref["pretrain.mrfr_loss_mean"], "MRFR loss")
    elif objective == "mrc-kl":
        assert_close(out.mrc_logits, ref["pretrain.mrc_prediction_soft_label"], "MRC logits")
        assert_close(out.mrc_kl_loss, ref["pretrain.mrckl_loss_mean"], "MRC-kl loss")
    else:
        assert_close(out.mrc_loss, ref["pretrain.mrc_loss"].mean(), "MRC loss")


def test_uniter_parity_vqa(fx):
    folder = fx.convert("vqa")
    inputs = fx.inputs(folder)
    model = AutoModelForVisualQuestionAnswering.from_pretrained(folder).eval()
    assert isinstance(model, vlhub.UniterForQuestionAnswering)
    ans2label = json.loads(fx.files["answers"].read_text())
    assert model.config.id2label[ans2label["yes"]] == "yes"
    # Soft-score targets built from the raw annotations, as the original `_get_vqa_target`.
    targets = torch.zeros(len(fx.raw["examples"]), model.config.num_labels)
    for i, example in enumerate(fx.raw["examples"]):
        for label, score in zip(example["vqa_target"]["labels"], example["vqa_target"]["scores"]):
            targets[i, label] = score
    assert torch.equal(targets, fx.model_inputs["vqa_targets"])
    with torch.no_grad():
        out = model(**inputs, labels=targets, output_hidden_states=True)
    ref = fx.outputs
    fx.assert_sequence_close(out.last_hidden_state, ref["vqa.sequence_output"], inputs["input_ids"].shape[1])
    assert_close(out.pooler_output, ref["vqa.pooled_output"], "pooled")
    assert_close(out.logits, ref["vqa.answer_scores"], "answer scores")
    relative = ((out.loss - ref["vqa.loss"]).abs() / ref["vqa.loss"].abs()).item()
    assert relative <= 1e-5, f"VQA loss relative diff {relative:.3g}"


def test_uniter_parity_retrieval(fx):
    folder = fx.convert("itm")
    inputs = fx.inputs(folder)
    model = vlhub.UniterForImageTextRetrieval.from_pretrained(folder).eval()
    with torch.no_grad():
        out = model(**inputs)
    ref = fx.outputs
    fx.assert_sequence_close(out.last_hidden_state, ref["itm.sequence_output"], inputs["input_ids"].shape[1])
    assert_close(out.pooler_output, ref["itm.pooled_output"], "pooled")
    assert_close(out.logits, ref["itm.rank_scores"], "rank scores")


def test_uniter_parity_zero_shot_retrieval(fx):
    folder = fx.convert("pretrain", task="retrieval")
    model = vlhub.UniterForImageTextRetrieval.from_pretrained(folder).eval()
    with torch.no_grad():
        out = model(**fx.inputs(folder))
    assert_close(out.logits, fx.outputs["itm_zeroshot.rank_scores"], "zero-shot rank scores")


def test_uniter_parity_referring_expression(fx):
    folder = fx.convert("re")
    # The original RE feature DB keeps every box in stored order (conf_th=-1): no confidence selection.
    inputs = fx.inputs(folder, confidence_threshold=None)
    model = vlhub.UniterForReferringExpression.from_pretrained(folder).eval()
    labels = torch.tensor([example["re_target_index"] for example in fx.raw["examples"]])
    assert torch.equal(labels, fx.model_inputs["re_targets"].view(-1))
    with torch.no_grad():
        out = model(**inputs, labels=labels)
    ref = fx.outputs
    fx.assert_sequence_close(out.last_hidden_state, ref["re.sequence_output"], inputs["input_ids"].shape[1])
    real = inputs["region_attention_mask"].bool()
    assert_close(out.logits[real], ref["re.scores"][real], "region scores")
    assert (out.logits[~real] == -10000).all() and (ref["re.scores"][~real] == -10000).all()
    assert_close(out.loss, ref["re.loss"].mean(), "RE loss")


def test_uniter_parity_every_output_is_compared(fx):
    """Runs last in this module: the tests above looked up every tensor of outputs.safetensors to compare it."""
    assert not fx.unread_outputs(), f"outputs no test compared: {fx.unread_outputs()}"
