"""Unified VLP parity: original checkpoints → `vlhub convert unified_vlp` → processor on the raw inputs → model and
`generate()`, against what the original code computed (tests/fixtures/unified_vlp, or $VLHUB_FIXTURES_DIR/unified_vlp).

Every tensor of the fixture is checked: the raw inputs against their JSON description, every model input against
what the processor (and the model's own mask/type/position construction) produces, every output against the model."""

import re

import pytest
import torch
import torch.nn.functional as F
from transformers import (
    AutoModelForImageTextToText,
    AutoModelForPreTraining,
    AutoModelForVisualQuestionAnswering,
    AutoProcessor,
    GenerationConfig,
)

import vlhub
from vlhub.modeling.unified_vlp.convert_unified_vlp import convert_unified_vlp
from vlhub.modeling.unified_vlp import vlp_beam_search, vlp_region_geometry

from .conftest import ParityFixture, assert_close, parity_fixture_dir
from .release_files import paths_of, unified_vlp_files

ROOT, pytestmark = parity_fixture_dir("unified_vlp", "Unified VLP")


def assert_equal(actual, expected, what):
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert torch.equal(actual.long(), expected.long()), f"{what}: {actual.tolist()} != {expected.tolist()}"


class Fixture(ParityFixture):
    label = "Unified VLP"

    def __init__(self, root, work):
        self.files = unified_vlp_files(root / "original")
        super().__init__(root, work, paths_of(self.files))
        self.inputs = self.model_inputs
        self._folders = {}

    def convert(self, name, task=None):
        key = (name, task)
        if key not in self._folders:
            folder = self.work / f"{name}-{task}"
            convert_unified_vlp(
                self.files["checkpoints"][name],
                folder,
                config=self.files["config"],
                task=task,
                tokenizer=self.files["vocab"],
            )
            self._folders[key] = folder
        return self._folders[key]

    def pooled_output(self, folder, inputs, checkpoint="img2txt"):
        """The tanh pooler, which the original computes and no head or loss reads (the converter drops it): the
        bare model of `folder` with the original checkpoint's pooler weights."""
        model = vlhub.UnifiedVlpModel.from_pretrained(folder).eval()
        original = torch.load(self.files["checkpoints"][checkpoint], weights_only=True)
        model.pooler.dense.load_state_dict({k: original[f"bert.pooler.dense.{k}"] for k in ("weight", "bias")})
        with torch.no_grad():
            return model(**inputs).pooler_output

    def regions(self):
        t = self.raw_tensors
        return [
            vlhub.RegionFeatures(
                features=t[self.raw["region_features_tensor"]][e["region_features_index"]],
                boxes=torch.tensor(e["boxes_xyxy_pixels"], dtype=torch.float32),
                image_size=(e["image_height"], e["image_width"]),
                class_probs=t[self.raw["class_probs_tensor"]][e["class_probs_index"]],
                scores=torch.tensor(e["detector_confidences"], dtype=torch.float32),
            )
            for e in self.raw["examples"]
        ]

    def token_ids(self):
        return [e["caption_token_ids"] for e in self.raw["examples"]]

    def processed(self, folder):
        """The processor's output on the raw inputs, text padded to the fixture's length."""
        processor = AutoProcessor.from_pretrained(folder)
        out = processor(token_ids=self.token_ids(), regions=self.regions())
        length = self.inputs["s2s_input_ids"].shape[1]
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            assert out[key].shape[1] <= length
            out[key] = F.pad(out[key], (0, length - out[key].shape[1]))
        return processor, out

    def captions_table(self):
        """The README's table of generated ids and captions (image → greedy ids, greedy caption, beam ids, beam
        caption)."""
        rows = {}
        pattern = re.compile(r"^\| (\d+) \| \[([\d, ]+)\] \| `([^`]*)` \| \[([\d, ]+)\] \| `([^`]*)` \|$")
        for line in (self.root / "README.md").read_text(encoding="utf-8").splitlines():
            match = pattern.match(line.strip())
            if match:
                rows[int(match[1])] = (match[3], match[5])
        return rows


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    return Fixture(ROOT, tmp_path_factory.mktemp("unified_vlp_parity"))


def _capture(model, names):
    """Forward hooks on `model`'s submodules `names` → dict of their outputs."""
    captured, handles = {}, []
    for name in names:
        module = model.get_submodule(name)
        handles.append(module.register_forward_hook(lambda m, i, o, name=name: captured.__setitem__(name, o)))
    return captured, handles


# ---------------------------------------------------------------------------------------------------- inputs
def test_unified_vlp_parity_raw_inputs_match_their_description(fx):
    t = fx.raw_tensors
    for i, example in enumerate(fx.raw["examples"]):
        assert_close(t["boxes"][i], torch.tensor(example["boxes_xyxy_pixels"]), f"boxes[{i}]")
        assert_close(t["confidences"][i], torch.tensor(example["detector_confidences"]), f"confidences[{i}]")
        assert_equal(t["class_idx"][i], torch.tensor(example["detector_class_idx"]), f"class_idx[{i}]")
        assert_equal(t["image_sizes_wh"][i], torch.tensor([example["image_width"], example["image_height"]]), "size")
        rows = torch.cat([t["boxes"][i], t["class_idx"][i, :, None].float(), t["confidences"][i, :, None]], dim=1)
        assert_close(t["bbox_h5_rows"][i], rows, f"bbox_h5_rows[{i}]")
    assert t["region_features"].shape[:2] == t["class_probs"].shape[:2]


def test_unified_vlp_parity_region_inputs(fx):
    processor, inputs = fx.processed(fx.convert("img2txt"))
    assert_close(inputs["region_features"], fx.inputs["vis_feats"], "vis_feats")
    assert_close(inputs["region_locations"], fx.inputs["vis_pe"], "vis_pe")
    geometry = torch.stack([vlp_region_geometry(r) for r in fx.regions()])
    assert_close(geometry, fx.inputs["geometry_6d_before_layernorm"], "geometry_6d_before_layernorm")
    assert inputs["region_attention_mask"].all()


@pytest.mark.parametrize("mode", ["s2s", "bi"])
def test_unified_vlp_parity_text_inputs(fx, mode):
    folder = fx.convert("img2txt")
    processor, inputs = fx.processed(folder)
    if mode == "bi":
        processor.mode = "bidirectional"
        inputs = processor(token_ids=fx.token_ids(), regions=fx.regions())
        length = fx.inputs["bi_input_ids"].shape[1]
        inputs = {
            k: F.pad(v, (0, length - v.shape[1]))
            for k, v in inputs.items()
            if k in ("input_ids", "token_type_ids", "attention_mask")
        }
    ids = fx.inputs[f"{mode}_input_ids"]
    positions, labels, weights = (fx.inputs[f"{mode}_masked_{k}"] for k in ("pos", "lm_labels", "weights"))
    # The original masked some slots (randomly): the processor's ids are the labels there and equal elsewhere.
    unmasked = ids.clone()
    for b in range(ids.shape[0]):
        for p, label, w in zip(positions[b], labels[b], weights[b]):
            if w:
                unmasked[b, p] = label
    assert_equal(inputs["input_ids"], unmasked, f"{mode}_input_ids (unmasked)")
    assert_equal(inputs["token_type_ids"], fx.inputs[f"{mode}_token_type_ids"], f"{mode}_token_type_ids")
    # The 4-D mask the model builds from the processor's 2-D mask is the original's 0/1 matrix.
    model = AutoModelForPreTraining.from_pretrained(folder)
    embeddings = torch.zeros(*ids.shape, model.config.hidden_size)
    mask = model.vlp.build_attention_mask(embeddings, inputs["attention_mask"], mode == "s2s")
    visible = mask[:, 0] if mask.dtype == torch.bool else mask[:, 0] == 0
    assert_equal(visible, fx.inputs[f"{mode}_attention_mask"].bool(), f"{mode}_attention_mask")
    # Dummies the original loader passes and the model ignores (no NSP head; relax_projection=0 ignores task_idx).
    assert (fx.inputs[f"{mode}_is_next"] == -1).all()
    assert (fx.inputs[f"{mode}_task_idx"] == (3 if mode == "s2s" else 0)).all()


def test_unified_vlp_parity_vqa_inputs(fx):
    folder = fx.convert("vqa2")
    processor = AutoProcessor.from_pretrained(folder)
    assert processor.mode == "bidirectional"
    inputs = processor(token_ids=fx.token_ids(), regions=fx.regions())
    length = fx.inputs["vqa_input_ids"].shape[1]
    assert_equal(
        F.pad(inputs["input_ids"], (0, length - inputs["input_ids"].shape[1])), fx.inputs["vqa_input_ids"], "ids"
    )
    assert_equal(
        F.pad(inputs["token_type_ids"], (0, length - inputs["input_ids"].shape[1])),
        fx.inputs["vqa_token_type_ids"],
        "vqa_token_type_ids",
    )
    model = AutoModelForVisualQuestionAnswering.from_pretrained(folder)
    mask = model.vlp.build_attention_mask(
        torch.zeros(*fx.inputs["vqa_input_ids"].shape, model.config.hidden_size),
        F.pad(inputs["attention_mask"], (0, length - inputs["input_ids"].shape[1])),
        False,
    )
    visible = mask[:, 0] if mask.dtype == torch.bool else mask[:, 0] == 0
    assert_equal(visible, fx.inputs["vqa_attention_mask"].bool(), "vqa_attention_mask")
    assert (fx.inputs["vqa_is_next"] == -1).all() and (fx.inputs["vqa_task_idx"] == 0).all()


def test_unified_vlp_parity_decoder_inputs(fx):
    folder = fx.convert("img2txt")
    processor = AutoProcessor.from_pretrained(folder)
    prompt = processor(regions=fx.regions())
    assert_equal(prompt["input_ids"], fx.inputs["dec_input_ids"], "dec_input_ids")
    total = fx.inputs["dec_token_type_ids"].shape[1]
    model = AutoModelForImageTextToText.from_pretrained(folder)
    positions = torch.arange(total)[None]  # the model's default positions (plain count)
    assert_equal(positions.expand(prompt["input_ids"].shape[0], -1), fx.inputs["dec_position_ids"], "dec_position_ids")
    types = model.vlp.default_token_type_ids(positions, True, prompt["input_ids"].shape[0])
    assert_equal(types[:, : prompt["input_ids"].shape[1]], prompt["token_type_ids"], "prompt types")
    assert_equal(types, fx.inputs["dec_token_type_ids"], "dec_token_type_ids")
    mask = model.vlp.build_attention_mask(torch.zeros(*types.shape, model.config.hidden_size), None, True)
    visible = mask[:, 0] if mask.dtype == torch.bool else mask[:, 0] == 0
    assert_equal(visible, fx.inputs["dec_attention_mask"].bool(), "dec_attention_mask")
    assert (fx.inputs["dec_task_idx"] == 3).all()


# ---------------------------------------------------------------------------------------------------- forwards
@pytest.mark.parametrize("mode", ["s2s", "bi"])
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_unified_vlp_parity_pretraining(fx, mode, attn_implementation):
    folder = fx.convert("img2txt", task="pretraining")
    processor, inputs = fx.processed(folder)
    model = AutoModelForPreTraining.from_pretrained(folder, attn_implementation=attn_implementation).eval()
    assert type(model).__name__ == "UnifiedVlpForPreTraining"
    ids = fx.inputs[f"{mode}_input_ids"]
    captured, handles = _capture(model, ["vlp.embeddings.vis_embed", "vlp.embeddings.vis_pe_embed"])
    common = dict(
        input_ids=ids,
        attention_mask=(ids != 0).long(),
        token_type_ids=fx.inputs[f"{mode}_token_type_ids"],
        region_features=inputs["region_features"],
        region_locations=inputs["region_locations"],
        region_attention_mask=inputs["region_attention_mask"],
        seq2seq=mode == "s2s",
    )
    with torch.no_grad():
        full = model(**common, output_hidden_states=True)
        weights = fx.inputs[f"{mode}_masked_weights"]
        labels = torch.where(weights > 0, fx.inputs[f"{mode}_masked_lm_labels"], -100)
        masked = model(**common, masked_positions=fx.inputs[f"{mode}_masked_pos"], labels=labels)
    for handle in handles:
        handle.remove()
    out = fx.outputs
    assert_close(captured["vlp.embeddings.vis_embed"], out[f"{mode}_vis_embed_output"], "vis_embed_output")
    assert_close(captured["vlp.embeddings.vis_pe_embed"], out[f"{mode}_vis_pe_embed_output"], "vis_pe_embed_output")
    assert_close(full.hidden_states[0], out[f"{mode}_embedding_output"], "embedding_output")
    layers = sorted(int(k.rsplit("layer", 1)[1]) for k in out if k.startswith(f"{mode}_hidden_states_layer"))
    assert layers, "the fixture has no per-layer outputs"
    for layer in layers:
        assert_close(full.hidden_states[layer + 1], out[f"{mode}_hidden_states_layer{layer}"], f"layer {layer}")
    assert_close(full.last_hidden_state, out[f"{mode}_sequence_output"], "sequence_output")
    assert_close(fx.pooled_output(folder, common), out[f"{mode}_pooled_output"], "pooled_output")
    assert_close(full.logits, out[f"{mode}_mlm_logits_all"], "mlm_logits_all")
    assert_close(masked.logits, out[f"{mode}_mlm_logits_masked"], "mlm_logits_masked")
    assert_close(masked.loss, out[f"{mode}_masked_lm_loss"], "masked_lm_loss")


def test_unified_vlp_parity_captioner_forward(fx):
    """The captioning head loads the same weights and gives the seq2seq MLM logits."""
    folder = fx.convert("img2txt")
    _, inputs = fx.processed(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    ids = fx.inputs["s2s_input_ids"]
    with torch.no_grad():
        out = model(
            input_ids=ids,
            attention_mask=(ids != 0).long(),
            token_type_ids=fx.inputs["s2s_token_type_ids"],
            region_features=inputs["region_features"],
            region_locations=inputs["region_locations"],
        )
    assert_close(out.logits, fx.outputs["s2s_mlm_logits_all"], "captioner logits")


def test_unified_vlp_parity_original_3d_mask(fx):
    """The original's own 0/1 mask matrices give the same outputs (the model accepts them as given)."""
    folder = fx.convert("img2txt", task="pretraining")
    _, inputs = fx.processed(folder)
    model = AutoModelForPreTraining.from_pretrained(folder).eval()
    with torch.no_grad():
        out = model(
            input_ids=fx.inputs["s2s_input_ids"],
            attention_mask=fx.inputs["s2s_attention_mask"],
            token_type_ids=fx.inputs["s2s_token_type_ids"],
            region_features=inputs["region_features"],
            region_locations=inputs["region_locations"],
        )
    assert_close(out.last_hidden_state, fx.outputs["s2s_sequence_output"], "sequence_output (3-D mask)")


def test_unified_vlp_parity_vqa(fx):
    folder = fx.convert("vqa2")
    processor = AutoProcessor.from_pretrained(folder)
    model = AutoModelForVisualQuestionAnswering.from_pretrained(folder).eval()
    assert type(model).__name__ == "UnifiedVlpForQuestionAnswering"
    inputs = processor(token_ids=fx.token_ids(), regions=fx.regions())
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True)
    length = inputs["input_ids"].shape[1]
    # The original pads to 123; padding rows never influence real rows, so compare the real length.
    assert_close(out.hidden_states[0], fx.outputs["vqa_embedding_output"][:, :length], "vqa_embedding_output")
    assert_close(out.last_hidden_state, fx.outputs["vqa_sequence_output"][:, :length], "vqa_sequence_output")
    assert_close(out.logits, fx.outputs["vqa_logits"], "vqa_logits")
    assert_equal(out.predicted_answer_ids, fx.outputs["vqa_answer_idx"], "vqa_answer_idx")
    # padded to the original's length: every row (padding rows included) matches
    full = {
        k: F.pad(v, (0, fx.inputs["vqa_input_ids"].shape[1] - length))
        if k in ("input_ids", "token_type_ids", "attention_mask")
        else v
        for k, v in inputs.items()
    }
    with torch.no_grad():
        padded = model(**full, output_hidden_states=True)
    assert_close(padded.hidden_states[0], fx.outputs["vqa_embedding_output"], "vqa_embedding_output (padded)")
    assert_close(padded.last_hidden_state, fx.outputs["vqa_sequence_output"], "vqa_sequence_output (padded)")
    # The VQA head has no pooler (it reads [CLS] x [SEP]); the checkpoint's pooler in the bare model:
    pooled = fx.pooled_output(fx.convert("vqa2"), dict(inputs, seq2seq=False), checkpoint="vqa2")
    assert_close(pooled, fx.outputs["vqa_pooled_output"], "vqa_pooled_output")


# ---------------------------------------------------------------------------------------------------- decoding
@pytest.fixture(scope="module")
def captioner(fx):
    folder = fx.convert("img2txt")
    processor = AutoProcessor.from_pretrained(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    return processor, model, processor(regions=fx.regions())


def _generate_without_eos(model, prompt, **kwargs):
    """generate() with no end token, so every step runs (as the original's decoder)."""
    saved = model.generation_config
    model.generation_config = GenerationConfig(eos_token_id=None, pad_token_id=0, bos_token_id=None)
    try:
        return model.generate(**prompt, **kwargs)
    finally:
        model.generation_config = saved


def _first_eos_lengths(ids, eos):
    return [next((i + 1 for i, t in enumerate(row) if t == eos), len(row)) for row in ids.tolist()]


def test_unified_vlp_parity_greedy_generate(fx, captioner):
    processor, model, prompt = captioner
    expected_ids, expected_logits = fx.outputs["greedy_output_ids"], fx.outputs["greedy_step_logits"]
    steps = expected_ids.shape[1]
    out = model.generate(
        **prompt, max_new_tokens=steps, do_sample=False, num_beams=1, output_logits=True, return_dict_in_generate=True
    )
    prompt_length = prompt["input_ids"].shape[1]
    generated, logits = out.sequences[:, prompt_length:], torch.stack(out.logits, dim=1)
    # generate() stops at [SEP] (102): compare up to and including each row's first [SEP].
    for b, length in enumerate(_first_eos_lengths(expected_ids, model.config.eos_token_id)):
        assert_equal(generated[b, :length], expected_ids[b, :length], f"greedy ids of image {b}")
        assert_close(logits[b, :length], expected_logits[b, :length], f"greedy step logits of image {b}")
        assert (generated[b, length:] == model.generation_config.pad_token_id).all()
    # The original never stops: without an end token, all steps (also after a [SEP]) match.
    out = _generate_without_eos(
        model,
        prompt,
        max_new_tokens=steps,
        do_sample=False,
        num_beams=1,
        output_logits=True,
        return_dict_in_generate=True,
    )
    assert_equal(out.sequences[:, prompt_length:], expected_ids, "greedy ids without early stop")
    logits = torch.stack(out.logits, dim=1)
    assert_close(logits, expected_logits, "greedy step logits without early stop")
    assert_close(logits.max(dim=-1).values, fx.outputs["greedy_output_scores"], "greedy_output_scores")


def test_unified_vlp_parity_original_beam_search(fx, captioner):
    processor, model, prompt = captioner
    expected = fx.outputs["beam_output_ids"]
    steps, beams = expected.shape[1], fx.outputs["beam_wids"].shape[2]
    out = model.generate(
        **prompt, max_new_tokens=steps, num_beams=beams, custom_generate=vlp_beam_search, return_dict_in_generate=True
    )
    prompt_length = prompt["input_ids"].shape[1]
    assert_equal(out.sequences[:, prompt_length:], expected, "beam_output_ids")
    total = fx.outputs["beam_pred_seq"].shape[1]
    assert_equal(
        F.pad(out.sequences[:, prompt_length:], (0, total - steps)), fx.outputs["beam_pred_seq"], "beam_pred_seq"
    )
    assert_close(out.beam_scores, fx.outputs["beam_scores"][:, :steps], "beam_scores")
    assert_equal(out.beam_token_ids, fx.outputs["beam_wids"][:, :steps], "beam_wids")
    assert_equal(out.beam_parents, fx.outputs["beam_ptrs"][:, :steps], "beam_ptrs")
    for name in ("beam_scores", "beam_wids", "beam_ptrs"):  # the original pads its traces to the full length
        assert (fx.outputs[name][:, steps:] == 0).all()
    plain = model.generate(**prompt, max_new_tokens=steps, num_beams=beams, custom_generate=vlp_beam_search)
    assert_equal(plain, out.sequences, "sequences without return_dict_in_generate")


def test_unified_vlp_parity_captions(fx, captioner):
    """Decoded captions are the original's (cut at [SEP]/[PAD], word pieces merged), as its README lists them."""
    processor, model, prompt = captioner
    table = fx.captions_table()
    if not table:
        pytest.skip("the fixture README lists no captions")
    steps = fx.outputs["greedy_output_ids"].shape[1]
    greedy = processor.batch_decode(_generate_without_eos(model, prompt, max_new_tokens=steps, do_sample=False))
    beams = fx.outputs["beam_wids"].shape[2]
    beam = processor.batch_decode(
        model.generate(**prompt, max_new_tokens=steps, num_beams=beams, custom_generate=vlp_beam_search)
    )
    for image, (greedy_caption, beam_caption) in table.items():
        assert greedy[image] == greedy_caption
        assert beam[image] == beam_caption


def test_unified_vlp_parity_every_output_is_compared(fx):
    """Runs last in this module: the tests above looked up every tensor of outputs.safetensors to compare it."""
    assert not fx.unread_outputs(), f"outputs no test compared: {fx.unread_outputs()}"
