"""VL-BERT parity: original "prec" checkpoints → `vlhub convert vl_bert` → processor on the raw inputs → model, against
what the original code computed (tests/fixtures/vl_bert, or $VLHUB_FIXTURES_DIR/vl_bert).

The original packs each example as `[text | objects | [END] | junk]` ("seamless"); vlhub as `[text (T) | objects (K) |
[END]]`. The tests compare the real positions of both: text tokens where the text mask is set, objects where the
box mask is set, and [END].
"""

import pytest
import torch
from transformers import AutoModel, AutoModelForPreTraining, AutoModelForVisualQuestionAnswering, AutoProcessor

import vlhub
from vlhub.modeling.vl_bert.convert_vl_bert import convert_vl_bert

from .conftest import ParityFixture, assert_close, parity_fixture_dir
from .release_files import paths_of, vl_bert_files

ROOT, pytestmark = parity_fixture_dir("vl_bert", "VL-BERT")
# checkpoint → the cfgs/ folder of the config it is converted with (files found by `release_files.vl_bert_files`)
CHECKPOINTS = {"pretrain": "pretrain", "vqa": "vqa", "refcoco": "refcoco"}


def reference_locations(boxes: torch.Tensor, im_info: torch.Tensor) -> torch.Tensor:
    """The spec's box normalisation (`coordinate_embeddings` before the sinusoids), written independently here:
    `(xc, yc, w, h)` of the resized boxes divided by the resized image width/height."""
    width, height = im_info[:, 0, None], im_info[:, 1, None]
    x1, y1, x2, y2 = boxes.unbind(-1)
    return torch.stack([(x1 + x2) / 2 / width, (y1 + y2) / 2 / height, (x2 - x1) / width, (y2 - y1) / height], -1)


class Fixture(ParityFixture):
    label = "VL-BERT"

    def __init__(self, root, work):
        self.files = vl_bert_files(root / "original")
        super().__init__(root, work, [*paths_of(self.files), self.files["bert"] / "vocab.txt"])
        self._converted = {}

    def yaml(self, task):
        return self.files["configs"][task]

    def convert(self, name):
        if name not in self._converted:
            folder = self.work / name
            convert_vl_bert(
                self.files["checkpoints"][name],
                folder,
                config=self.yaml(CHECKPOINTS[name]),
                tokenizer=self.files["bert"],
                answers=self.files["answers"],
            )
            self._converted[name] = folder
        return self._converted[name]

    def regions(self):
        t = self.raw_tensors
        return [
            vlhub.RegionFeatures(
                features=t[e["region_features_tensor"]],
                boxes=t[e["boxes_tensor"]],
                image_size=(e["image_height"], e["image_width"]),
                class_probs=t[e["class_probs_tensor"]],
                scores=t[e["detector_confidences_tensor"]],
            )
            for e in self.raw["examples"]
        ]

    def token_ids(self):
        return [e["text_token_ids"] for e in self.raw["examples"]]

    def task_inputs(self, task):
        """Model inputs rebuilt from the original's collated batch (`model_inputs.safetensors`)."""
        mi = self.model_inputs
        boxes = mi[f"{task}.boxes"]
        real = boxes[:, :, 0] > -1.5  # the original's box_mask
        ids = mi[f"{task}.vlbert.text_input_ids"]
        return dict(
            input_ids=ids,
            attention_mask=mi[f"{task}.vlbert.text_mask"].long(),
            token_type_ids=mi[f"{task}.vlbert.text_token_type_ids"],
            region_features=boxes[:, :, 4:] * real[..., None],
            region_locations=reference_locations(boxes[:, :, :4], mi[f"{task}.im_info"]) * real[..., None],
            region_attention_mask=real.long(),
        )

    def pretrain_inputs(self):
        """The original's 3 image-caption rows and 2 text-only rows as one batch (text padded to the longer)."""
        mi = self.model_inputs
        captions, corpus = mi["pretrain.text"], mi["pretrain.aux_text"]
        length = max(captions.shape[1], corpus.shape[1])

        def pad(t, value):
            return torch.nn.functional.pad(t, (0, length - t.shape[1]), value=value)

        ids = torch.cat([pad(captions, 0), pad(corpus, 0)])
        labels = torch.cat([pad(mi["pretrain.mlm_labels"], -1), pad(mi["pretrain.aux_mlm_labels"], -1)])
        image_rows = self.task_inputs_from_boxes("pretrain")
        extra = corpus.shape[0]

        def rows(t):
            return torch.cat([t, t.new_zeros(extra, *t.shape[1:])])

        return dict(
            input_ids=ids,
            attention_mask=(ids > 0).long(),
            token_type_ids=torch.zeros_like(ids),
            region_features=rows(image_rows["region_features"]),
            region_locations=rows(image_rows["region_locations"]),
            region_attention_mask=rows(image_rows["region_attention_mask"]),
        ), dict(
            labels=labels,
            region_masks=rows(mi["pretrain.mvrc_ops"] == 1),
            region_class_targets=rows(mi["pretrain.mvrc_labels"]),
        )

    def task_inputs_from_boxes(self, task):
        mi = self.model_inputs
        boxes = mi[f"{task}.boxes"]
        real = boxes[:, :, 0] > -1.5
        return dict(
            region_features=boxes[:, :, 4:] * real[..., None],
            region_locations=reference_locations(boxes[:, :, :4], mi[f"{task}.im_info"]) * real[..., None],
            region_attention_mask=real.long(),
        )

    def assert_hidden_states(self, task, hidden_states, text_mask, region_mask):
        """Every layer (0 = embeddings) at every real text token, object and [END] against the seamless layout."""
        out = self.outputs
        seamless_text = out[f"{task}.seamless.text_positions_mask"]
        seamless_objects = out[f"{task}.seamless.object_positions_mask"]
        end = out[f"{task}.end_positions"]
        text_length, num_regions = text_mask.shape[1], region_mask.shape[1]
        layers = sorted(int(k.rsplit(".", 1)[1]) for k in out if k.startswith(f"{task}.seamless.hidden_states."))
        assert len(hidden_states) == len(layers), f"{len(hidden_states)} hidden states, the original {len(layers)}"
        rows = torch.arange(end.shape[0])
        for layer in layers:
            reference = out[f"{task}.seamless.hidden_states.{layer}"]
            mine = hidden_states[layer]
            assert_close(
                mine[:, :text_length][text_mask.bool()], reference[seamless_text], f"{task} layer {layer} text"
            )
            assert_close(
                mine[:, text_length : text_length + num_regions][region_mask.bool()],
                reference[seamless_objects],
                f"{task} layer {layer} objects",
            )
            assert_close(mine[:, -1], reference[rows, end], f"{task} layer {layer} [END]")
            # The original's own scatter-back of text and object outputs says the same.
            assert_close(
                mine[:, :text_length][text_mask.bool()],
                out[f"{task}.text_hidden_states.{layer}"][text_mask.bool()],
                f"{task} layer {layer} text (T)",
            )
            assert_close(
                mine[:, text_length : text_length + num_regions][region_mask.bool()],
                out[f"{task}.object_hidden_states.{layer}"][region_mask.bool()],
                f"{task} layer {layer} objects (K)",
            )
            assert_close(mine[:, -1], out[f"{task}.end_hidden_states.{layer}"], f"{task} layer {layer} [END] (B)")


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    return Fixture(ROOT, tmp_path_factory.mktemp("vl_bert_parity"))


def _visual_checks(fx, task, region_embeddings, inputs, region_masks=None):
    """`obj_reps` (the visual feature embedding) and the 4096-d input of `obj_downsample` at every real object."""
    real = inputs["region_attention_mask"].bool()
    out = fx.outputs
    assert_close(
        region_embeddings[real], out[f"{task}.obj_reps"][real[: out[f"{task}.obj_reps"].shape[0]]], f"{task} obj_reps"
    )
    geometry = vlhub.geometry_embedding(inputs["region_locations"][real])
    reference = out[f"{task}.obj_downsample_input"]
    assert_close(geometry, reference[:, : geometry.shape[1]], f"{task} geometry embedding")
    appearance = inputs["region_features"][real]
    kept = torch.ones(appearance.shape[0], dtype=torch.bool) if region_masks is None else ~region_masks[real]
    assert_close(appearance[kept], reference[kept, geometry.shape[1] :], f"{task} appearance features")


def test_vl_bert_parity_pretraining_processor_orders_objects_as_the_conceptual_captions_loader(fx):
    """The pre-training folder's processor (the converter read the pre-training YAML) → the original's collated
    pre-training batch: objects sorted by their largest class probability, boxes and text as the original's (its
    SEQ_LEN cut is not triggered here; the cut itself is tested in test_region_rules.py)."""
    processor = AutoProcessor.from_pretrained(fx.convert("pretrain"))
    inputs = processor(token_ids=fx.token_ids(), regions=fx.regions(), return_tensors="pt")
    mi = fx.model_inputs
    boxes = mi["pretrain.boxes"]
    real = boxes[:, :, 0] > -1.5
    assert torch.equal(inputs["region_attention_mask"].bool(), real)
    objects = real.clone()
    objects[:, 0] = False  # the original's object 0 is the mean of the regions MVRC left unmasked
    assert_close(inputs["region_features"][objects], boxes[:, :, 4:][objects], "pretrain objects, sorted")
    expected_locations = reference_locations(boxes[:, :, :4], mi["pretrain.im_info"])
    assert_close(inputs["region_locations"][real], expected_locations[real], "pretrain object locations")
    masked = mi["pretrain.mlm_labels"] != -1
    assert torch.equal(inputs["input_ids"], torch.where(masked, mi["pretrain.mlm_labels"], mi["pretrain.text"]))
    processor.feature_extractor.sort_by_class_score = False  # the files' own order is another: the test can fail
    unsorted = processor(token_ids=fx.token_ids(), regions=fx.regions(), return_tensors="pt")
    assert not torch.equal(unsorted["region_features"][objects], inputs["region_features"][objects])


@pytest.mark.parametrize("task", ["vqa", "refcoco"])
def test_vl_bert_parity_processor_inputs(fx, task):
    """Raw regions + token ids → the processor → exactly what the original's loaders and model assembled."""
    processor = AutoProcessor.from_pretrained(fx.convert(task))
    assert isinstance(processor, vlhub.VlBertProcessor)
    inputs = processor(token_ids=fx.token_ids(), regions=fx.regions(), return_tensors="pt")
    mi = fx.model_inputs
    assert torch.equal(inputs["input_ids"], mi[f"{task}.vlbert.text_input_ids"])
    assert torch.equal(inputs["token_type_ids"], mi[f"{task}.vlbert.text_token_type_ids"])
    assert torch.equal(inputs["attention_mask"].bool(), mi[f"{task}.vlbert.text_mask"].bool())
    boxes = mi[f"{task}.boxes"]
    real = boxes[:, :, 0] > -1.5
    assert torch.equal(inputs["region_attention_mask"].bool(), real)
    assert_close(inputs["region_features"][real], boxes[:, :, 4:][real], f"{task} region features (object 0 = mean)")
    expected_locations = reference_locations(boxes[:, :, :4], mi[f"{task}.im_info"])
    assert_close(inputs["region_locations"][real], expected_locations[real], f"{task} region locations")
    # The geometry half of the original's 4096-d visual input, from the processor's locations.
    geometry = vlhub.geometry_embedding(inputs["region_locations"][real])
    assert_close(geometry, fx.outputs[f"{task}.obj_downsample_input"][:, : geometry.shape[1]], f"{task} geometry")


def test_vl_bert_parity_vqa(fx):
    folder = fx.convert("vqa")
    model = AutoModelForVisualQuestionAnswering.from_pretrained(folder).eval()
    assert isinstance(model, vlhub.VlBertForQuestionAnswering)
    inputs = fx.task_inputs("vqa")
    labels = fx.model_inputs["vqa.label"]
    with torch.no_grad():
        out = model(**inputs, labels=labels, output_hidden_states=True)
        backbone = model.vl_bert(**inputs)
    fx.assert_hidden_states("vqa", out.hidden_states, inputs["attention_mask"], inputs["region_attention_mask"])
    _visual_checks(fx, "vqa", backbone.region_embeddings, inputs)
    assert_close(out.logits, fx.outputs["vqa.label_logits"], "vqa logits")
    assert_close(out.loss.reshape(1), fx.outputs["vqa.ans_loss"], "vqa loss")
    positions = model.answer_positions(inputs["input_ids"], inputs["attention_mask"], None)
    assert torch.equal(positions, fx.outputs["vqa.answer_positions"][:, 1])
    answers = [model.config.id2label[i] for i in out.logits.argmax(-1).tolist()]
    reference = fx.outputs["vqa.label_logits"].argmax(-1).tolist()
    answer_list = fx.files["answers"].read_text().split()
    assert answers == [answer_list[i] for i in reference]


def test_vl_bert_parity_vqa_from_raw(fx):
    """Raw inputs → processor → model gives the original's answer logits."""
    folder = fx.convert("vqa")
    processor = AutoProcessor.from_pretrained(folder)
    model = AutoModelForVisualQuestionAnswering.from_pretrained(folder).eval()
    with torch.no_grad():
        out = model(**processor(token_ids=fx.token_ids(), regions=fx.regions(), return_tensors="pt"))
    assert_close(out.logits, fx.outputs["vqa.label_logits"], "vqa logits from raw inputs")


def test_vl_bert_parity_refcoco(fx):
    folder = fx.convert("refcoco")
    model = vlhub.VlBertForReferringExpression.from_pretrained(folder).eval()
    inputs = fx.task_inputs("refcoco")
    real = inputs["region_attention_mask"].bool()
    labels = fx.model_inputs["refcoco.label"].clamp(min=0)
    with torch.no_grad():
        out = model(**inputs, labels=labels, output_hidden_states=True)
        backbone = model.vl_bert(**inputs)
    fx.assert_hidden_states("refcoco", out.hidden_states, inputs["attention_mask"], inputs["region_attention_mask"])
    _visual_checks(fx, "refcoco", backbone.region_embeddings, inputs)
    assert_close(out.logits[real], fx.outputs["refcoco.label_logits"][real], "refcoco scores")
    assert_close(out.loss.reshape(1), fx.outputs["refcoco.cls_loss"], "refcoco loss")
    # The predicted box, mapped back to the original image as the original does (x / scale).
    mi = fx.model_inputs
    best = out.logits.argmax(-1)
    boxes = mi["refcoco.boxes"][torch.arange(best.shape[0]), best, :4]
    scale = mi["refcoco.im_info"][:, 2:4].repeat(1, 2)
    assert_close(boxes / scale, fx.outputs["refcoco.pred_boxes"], "refcoco predicted boxes")

    # From the raw inputs through the processor.
    processor = AutoProcessor.from_pretrained(folder)
    with torch.no_grad():
        raw_out = model(**processor(token_ids=fx.token_ids(), regions=fx.regions(), return_tensors="pt"))
    assert_close(raw_out.logits[real], fx.outputs["refcoco.label_logits"][real], "refcoco scores from raw inputs")


def test_vl_bert_parity_pretrain(fx):
    folder = fx.convert("pretrain")
    model = AutoModelForPreTraining.from_pretrained(folder).eval()
    assert isinstance(model, vlhub.VlBertForPreTraining)
    inputs, targets = fx.pretrain_inputs()
    with torch.no_grad():
        out = model(**inputs, **targets, output_hidden_states=True)
        # Without labels the MLM logits cover every text position.
        unlabelled = model(**inputs, region_masks=targets["region_masks"])
        backbone = model.vl_bert(**inputs, region_masks=targets["region_masks"])
    o = fx.outputs
    fx.assert_hidden_states("pretrain", out.hidden_states, inputs["attention_mask"], inputs["region_attention_mask"])
    images = o["pretrain.obj_reps"].shape[0]
    image_inputs = {k: v[:images] for k, v in inputs.items()}
    _visual_checks(fx, "pretrain", backbone.region_embeddings[:images], image_inputs, targets["region_masks"][:images])

    text_mask = inputs["attention_mask"].bool()
    length = o["pretrain.mlm_logits_wvc"].shape[1]
    mine = unlabelled.mlm_logits[:, :length]
    labelled = targets["labels"] >= 0
    assert_close(out.mlm_logits, unlabelled.mlm_logits[labelled], "MLM logits at the labels (row-major)")
    assert_close(
        mine[:images][text_mask[:images, :length]],
        o["pretrain.mlm_logits_wvc"][text_mask[:images, :length]],
        "MLM logits (image-text rows)",
    )
    assert_close(
        mine[images:][text_mask[images:, :length]],
        o["pretrain.mlm_logits_aux"][text_mask[images:, :length]],
        "MLM logits (text-only rows)",
    )
    rows, cols = o["pretrain.mlm_masked_positions"].unbind(1)
    assert_close(
        unlabelled.mlm_logits[rows, cols], o["pretrain.mlm_logits_at_masked"], "MLM logits at the masked words"
    )
    assert torch.equal(targets["labels"][rows, cols], o["pretrain.mlm_masked_labels"])
    rows, cols = o["pretrain.aux_mlm_masked_positions"].unbind(1)
    assert_close(
        unlabelled.mlm_logits[images + rows, cols], o["pretrain.aux_mlm_logits_at_masked"], "text-only MLM logits"
    )

    real = inputs["region_attention_mask"][:images].bool()
    assert_close(out.mvrc_logits[:images][real], o["pretrain.mvrc_logits"][real], "MVRC logits")
    rows, cols = o["pretrain.mvrc_labelled_positions"].unbind(1)
    assert_close(out.mvrc_logits[rows, cols], o["pretrain.mvrc_logits_at_labelled"], "MVRC logits at labelled objects")
    assert torch.equal(targets["region_masks"][rows, cols].long(), o["pretrain.mvrc_labelled_ops"])

    assert_close(out.mlm_loss.reshape(1), o["pretrain.mlm_loss_wvc"], "MLM loss (image-text rows)")
    assert_close(out.text_only_mlm_loss.reshape(1), o["pretrain.mlm_loss_aux"], "MLM loss (text-only rows)")
    assert_close(out.mvrc_loss.reshape(1), o["pretrain.mvrc_loss"], "MVRC loss")
    assert_close(out.loss.reshape(1), o["pretrain.total_loss"], "total loss")
    # The MLM head's input is the last layer's text slice, the MVRC head's the objects.
    last = out.hidden_states[-1]
    assert_close(
        last[:, : inputs["input_ids"].shape[1]][text_mask],
        o["pretrain.mlm_head_input"][:, : inputs["input_ids"].shape[1]][text_mask],
        "MLM head input",
    )


def test_vl_bert_parity_backbone_from_pretraining_folder(fx):
    """AutoModel on a converted pre-training folder is the bare backbone (pre-training embeddings ignored), and a
    text+image forward matches the pre-training model's hidden states."""
    folder = fx.convert("pretrain")
    backbone = AutoModel.from_pretrained(folder).eval()
    assert isinstance(backbone, vlhub.VlBertModel)
    inputs, _ = fx.pretrain_inputs()
    images = fx.outputs["pretrain.obj_reps"].shape[0]
    image_inputs = {k: v[:images] for k, v in inputs.items()}
    with torch.no_grad():
        out = backbone(**image_inputs, output_hidden_states=True)
        full = AutoModelForPreTraining.from_pretrained(folder).eval()(**image_inputs, output_hidden_states=True)
    for mine, reference in zip(out.hidden_states, full.hidden_states):
        assert torch.equal(mine, reference)


def test_vl_bert_parity_vqa_pipeline_on_converted_folder(fx):
    """`pipeline("visual-question-answering")` on the converted folder: the question strings and regions of the raw
    inputs give the original's best answer and its sigmoid score."""
    from transformers import pipeline

    vqa = pipeline("visual-question-answering", model=str(fx.convert("vqa")))
    logits = fx.outputs["vqa.label_logits"]
    answer_list = fx.files["answers"].read_text().split()
    for i, (example, regions) in enumerate(zip(fx.raw["examples"], fx.regions())):
        best = vqa(image=regions, question=example["vqa_question_string"], top_k=1)[0]
        assert best["answer"] == answer_list[logits[i].argmax().item()]
        assert best["score"] == pytest.approx(torch.sigmoid(logits[i].max()).item(), abs=1e-4)


def _layout(model, backbone, inputs, **extra):
    """`model`'s output on `inputs` (all hidden states) and the ids its `backbone`'s embeddings fed `token_type_embeddings` and `position_embeddings` for `[text | objects | [END]]`
    (captured at those tables, as the fixture captured the original's) and the attention mask they returned."""
    embeddings, captured = backbone.embeddings, {}
    hooks = [
        embeddings.token_type_embeddings.register_forward_pre_hook(
            lambda module, args: captured.__setitem__("token_type_ids", args[0])
        ),
        embeddings.position_embeddings.register_forward_pre_hook(
            lambda module, args: captured.__setitem__("position_ids", args[0])
        ),
        embeddings.register_forward_hook(
            lambda module, args, output: captured.__setitem__("attention_mask", output[1])
        ),
    ]
    try:
        with torch.no_grad():
            out = model(**inputs, **extra, output_hidden_states=True)
    finally:
        for hook in hooks:
            hook.remove()
    return captured, out


@pytest.mark.parametrize("task", ["vqa", "refcoco", "pretrain"])
def test_vl_bert_parity_seamless_layout_and_head_inputs(fx, task):
    """The original's seamless layout ids (token types, positions, attention mask) at every real text token, object
    and [END]; the object features out of `obj_downsample`; pre-training's MVRC head input (the last layer's objects)."""
    if task == "pretrain":
        model = AutoModelForPreTraining.from_pretrained(fx.convert(task)).eval()
        inputs, targets = fx.pretrain_inputs()
        extra = {"region_masks": targets["region_masks"]}
    else:
        model = AutoModel.from_pretrained(fx.convert(task)).eval()
        inputs, extra = fx.task_inputs(task), {}
    backbone_model = model.vl_bert if task == "pretrain" else model
    captured, out = _layout(model, backbone_model, inputs, **extra)
    o = fx.outputs
    text_mask, region_mask = inputs["attention_mask"].bool(), inputs["region_attention_mask"].bool()
    text_length, num_regions = text_mask.shape[1], region_mask.shape[1]
    seamless_text, seamless_objects = (
        o[f"{task}.seamless.text_positions_mask"],
        o[f"{task}.seamless.object_positions_mask"],
    )
    end = o[f"{task}.end_positions"]
    rows = torch.arange(end.shape[0])
    for name in ("token_type_ids", "position_ids", "attention_mask"):
        mine, reference = captured[name], o[f"{task}.seamless.{name}"]
        assert torch.equal(mine[:, :text_length][text_mask], reference[seamless_text]), f"{task} {name} text"
        assert torch.equal(
            mine[:, text_length : text_length + num_regions][region_mask], reference[seamless_objects]
        ), f"{task} {name} objects"
        assert torch.equal(mine[:, -1], reference[rows, end]), f"{task} {name} [END]"
    assert torch.equal(captured["attention_mask"].sum(1), o[f"{task}.seamless.attention_mask"].sum(1)), (
        f"{task}: attended positions per row"
    )
    with torch.no_grad():
        backbone = backbone_model(**inputs, **extra)
    images = o[f"{task}.obj_reps"].shape[0]
    real = region_mask[:images]
    assert_close(
        backbone.region_embeddings[:images][real], o[f"{task}.obj_downsample_output"], f"{task} obj_downsample output"
    )
    if task == "pretrain":
        objects = out.hidden_states[-1][:, text_length : text_length + num_regions]
        assert_close(objects[region_mask], o["pretrain.mvrc_head_input"][region_mask], "MVRC head input")


def test_vl_bert_parity_every_output_is_compared(fx):
    """Runs last in this module: the tests above looked up every tensor of outputs.safetensors to compare it."""
    assert not fx.unread_outputs(), f"outputs no test compared: {fx.unread_outputs()}"
