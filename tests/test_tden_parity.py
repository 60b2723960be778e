"""TDEN parity: X-modaler checkpoints → `vlhub convert tden` → processor on the raw inputs → model, against what the
original code computed (tests/fixtures/tden, or $VLHUB_FIXTURES_DIR/tden).

Every tensor of the fixture's `outputs.safetensors` is compared (`test_tden_parity_every_output_is_checked`); the
pre-training batch is the original's masked batch (`model_inputs.safetensors`), since masking is data preparation.
"""

import pytest
import torch
from transformers import AutoModel, AutoModelForImageTextToText, AutoModelForPreTraining, AutoProcessor

import vlhub
from vlhub.modeling.tden.convert_tden import convert_tden
from vlhub.modeling.tden import xmodaler_beam_search

from .conftest import ParityFixture, assert_close, parity_fixture_dir
from .release_files import paths_of, tden_files

ROOT, pytestmark = parity_fixture_dir("tden", "TDEN")
TASKS = {"pretrain": "pretraining", "caption": "captioning", "vqa": "vqa", "retrieval": "retrieval"}
SEP = 102


class Fixture(ParityFixture):
    label = "TDEN"

    def __init__(self, root, work):
        self.files = tden_files(root / "original")
        missing = sorted(set(TASKS) - set(self.files["runs"]))
        if missing:
            pytest.fail(f"the TDEN fixture at {root} has no checkpoint (*.pth) in original/{missing}")
        super().__init__(root, work, paths_of(self.files))
        self.checked: set[str] = set()
        self._converted = {}

    def convert(self, name):
        if name not in self._converted:
            run = self.files["runs"][name]
            answers = run["checkpoint"].parent / "trainval_label2ans.pkl"
            convert_tden(
                run["checkpoint"],
                self.work / name,
                config=run["config"],
                tokenizer=self.files["vocab"],
                answers=answers if answers.is_file() else None,
            )
            self._converted[name] = self.work / name
        return self._converted[name]

    def regions(self):
        out = []
        for image in self.raw["images"]:
            t = self.raw_tensors
            out.append(
                vlhub.RegionFeatures(
                    features=t[image["features_tensor"]],
                    boxes=t[image["boxes_tensor"]],
                    image_size=(image["image_h"], image["image_w"]),
                    class_probs=t[image["cls_prob_tensor"]],
                )
            )
        return out

    def texts(self, kind):
        return [entry["text"] for entry in self.raw[kind]]

    def batch(self, prefix):
        """The original's model inputs under vlhub's names."""
        mi = self.model_inputs
        batch = {
            "region_features": mi[f"{prefix}.ATT_FEATS"],
            "region_locations": mi[f"{prefix}.ATT_FEATS_LOC"],
            "region_attention_mask": mi[f"{prefix}.ATT_MASKS"].long(),
        }
        if f"{prefix}.TOKENS_MASKS" in mi:
            batch["attention_mask"] = mi[f"{prefix}.TOKENS_MASKS"].long()
        return batch

    def understanding_run(self, task):
        """`task`'s converted folder, the original's batch, and the base model's outputs (all hidden states) on it
        with the understanding stream's tokens."""
        folder = self.convert(task)
        batch = self.batch(task)
        text = dict(
            input_ids=self.model_inputs[f"{task}.U_TOKENS_IDS"],
            token_type_ids=self.model_inputs[f"{task}.U_TOKENS_TYPE"],
        )
        base = AutoModel.from_pretrained(folder).eval()
        with torch.no_grad():
            out = base(**batch, **text, output_hidden_states=True)
        return folder, batch, base, out

    def close(self, name, actual, expected=None):
        assert_close(actual, self.outputs[name] if expected is None else expected, name)
        self.checked.add(name)

    def equal(self, name, actual):
        expected = self.outputs[name]
        assert torch.equal(actual.to(expected.dtype), expected), f"{name}: {actual.tolist()} != {expected.tolist()}"
        self.checked.add(name)

    def layers(self, prefix, states):
        """`prefix.layer<i>` for every layer the fixture holds, against `states[i]`."""
        names = sorted(
            (k for k in self.outputs if k.startswith(prefix + ".layer")), key=lambda k: int(k.rsplit("layer", 1)[1])
        )
        assert len(names) == len(states), f"{prefix}: the model has {len(states)} layers, the fixture {len(names)}"
        for name, state in zip(names, states):
            self.close(name, state)


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    return Fixture(ROOT, tmp_path_factory.mktemp("tden_parity"))


def _check_encoders(fx, prefix, out, stream="u"):
    """Embeddings, object encoder and sentence encoder of a base-model output against `prefix.*`."""
    fx.close(f"{prefix}.visual_embed", out.vision_hidden_states[0])
    fx.layers(f"{prefix}.object_encoder", out.vision_hidden_states[1:])
    fx.close(f"{prefix}.token_embed.{stream}", out.hidden_states[0])
    fx.layers(f"{prefix}.sentence_encoder.{stream}", out.hidden_states[1:])


def _split_cross(fx, prefix, cross_hidden_states, num_regions):
    fx.layers(f"{prefix}.cross_encoder.visual", [h[:, :num_regions] for h in cross_hidden_states])
    fx.layers(f"{prefix}.cross_encoder.text", [h[:, num_regions:] for h in cross_hidden_states])


@pytest.mark.parametrize(
    "prefix, folder, stream",
    [
        ("caption_tf", "caption", "generation"),
        ("caption_gen", "caption", "generation"),
        ("vqa", "vqa", "understanding"),
        ("retrieval", "retrieval", "understanding"),
    ],
)
def test_tden_parity_processor_inputs(fx, prefix, folder, stream):
    """Raw regions and texts → the tensors the original forward received: [IMG] row, 5-d locations, masks, ids."""
    processor = AutoProcessor.from_pretrained(fx.convert(folder))
    assert isinstance(processor, vlhub.TdenProcessor) and processor.text_stream == stream
    texts = fx.texts("questions" if prefix == "vqa" else "captions")
    inputs = processor(text=texts, regions=fx.regions(), return_tensors="pt")
    mi = fx.model_inputs
    torch.testing.assert_close(inputs["region_features"], mi[f"{prefix}.ATT_FEATS"], atol=1e-6, rtol=1e-6)
    assert torch.equal(inputs["region_locations"], mi[f"{prefix}.ATT_FEATS_LOC"])
    assert torch.equal(inputs["region_attention_mask"].float(), mi[f"{prefix}.ATT_MASKS"])
    key = "G" if stream == "generation" else "U"
    if f"{prefix}.{key}_TOKENS_IDS" in mi:
        expected, length = mi[f"{prefix}.{key}_TOKENS_IDS"], inputs["input_ids"].shape[1]
        # The original pads captions to MAX_SEQ_LEN; vlhub to the longest text of the batch.
        assert torch.equal(inputs["input_ids"], expected[:, :length]) and not expected[:, length:].any()
        types = mi[f"{prefix}.{key}_TOKENS_TYPE"][:, :length]
        assert torch.equal(inputs["token_type_ids"] * inputs["attention_mask"], types * inputs["attention_mask"])
    if f"{prefix}.TOKENS_MASKS" in mi and stream == "understanding":
        assert torch.equal(inputs["attention_mask"].float(), mi[f"{prefix}.TOKENS_MASKS"])
    if stream == "generation":  # captioning inputs have no [SEP]
        assert not (inputs["input_ids"] == SEP).any()


def test_tden_parity_processor_from_the_original_feature_files(fx):
    """The original's per-image npz files, read with vlhub's NpzFolderReader, give the same region inputs."""
    from vlhub.processing.stores import NpzFolderReader

    reader = NpzFolderReader(fx.root / "original" / "features")
    processor = AutoProcessor.from_pretrained(fx.convert("caption"))
    inputs = processor(regions=[reader[image["image_id"]] for image in fx.raw["images"]], return_tensors="pt")
    torch.testing.assert_close(inputs["region_features"], fx.model_inputs["caption_tf.ATT_FEATS"], atol=1e-6, rtol=1e-6)
    assert torch.equal(inputs["region_locations"], fx.model_inputs["caption_tf.ATT_FEATS_LOC"])


def test_tden_parity_pretraining(fx):
    folder = fx.convert("pretrain")
    mi = fx.model_inputs
    batch = fx.batch("pretrain")
    streams = dict(
        input_ids=mi["pretrain.U_TOKENS_IDS"],
        token_type_ids=mi["pretrain.U_TOKENS_TYPE"],
        decoder_input_ids=mi["pretrain.G_TOKENS_IDS"],
        decoder_token_type_ids=mi["pretrain.G_TOKENS_TYPE"],
    )
    # The base model out of the pre-training folder: every intermediate state.
    base = AutoModel.from_pretrained(folder).eval()
    with torch.no_grad():
        out = base(**batch, **streams, decoder_attention_mask=batch["attention_mask"], output_hidden_states=True)
    _check_encoders(fx, "pretrain", out)
    fx.close("pretrain.token_embed.g", out.generation_hidden_states[0])
    fx.layers("pretrain.sentence_encoder.g", out.generation_hidden_states[1:])
    _split_cross(fx, "pretrain", out.cross_encoder_hidden_states, batch["region_features"].shape[1])
    fx.layers("pretrain.decoder", out.decoder_hidden_states[1:])

    model = AutoModelForPreTraining.from_pretrained(folder).eval()
    assert isinstance(model, vlhub.TdenForPreTraining)
    masked_regions = torch.nn.functional.pad(mi["pretrain.V_TARGET_LABELS"] > 0, (1, 0))  # [IMG] is never a target
    targets = mi["pretrain.V_TARGET"][mi["pretrain.V_TARGET_LABELS"] > 0]
    with torch.no_grad():
        heads = model(
            **batch,
            **streams,
            labels=mi["pretrain.U_TARGET_IDS"],
            decoder_labels=mi["pretrain.G_TARGET_IDS"],
            masked_regions=masked_regions,
            region_class_targets=targets,
        )
    fx.close("pretrain.mlm_logits", heads.mlm_logits)
    fx.close("pretrain.msg_logits", heads.msg_logits)
    fx.close("pretrain.moc_logits", heads.moc_logits)
    mlm_positions = (mi["pretrain.U_TARGET_IDS"] >= 0).nonzero()
    fx.equal("pretrain.mlm_masked_positions", mlm_positions)
    fx.close("pretrain.mlm_logits_masked", heads.mlm_logits[mlm_positions[:, 0], mlm_positions[:, 1]])
    fx.close("pretrain.msg_logits_masked", heads.msg_logits[mlm_positions[:, 0], mlm_positions[:, 1]])
    fx.equal("pretrain.moc_masked_positions", masked_regions.nonzero())
    moc_positions = fx.outputs["pretrain.moc_masked_positions"]
    fx.close("pretrain.moc_logits_masked", heads.moc_logits[moc_positions[:, 0], moc_positions[:, 1]])
    fx.close("pretrain.loss_mlm", heads.mlm_loss)
    fx.close("pretrain.loss_msg", heads.msg_loss)
    fx.close("pretrain.loss_moc", heads.moc_loss)
    fx.close("pretrain.ism_text_embeds", heads.text_embeds)
    fx.close("pretrain.ism_image_embeds", heads.image_embeds)
    fx.close("pretrain.ism_similarity", heads.similarity)


def test_tden_parity_captioning_teacher_forced(fx):
    folder = fx.convert("caption")
    mi = fx.model_inputs
    batch = fx.batch("caption_tf")
    ids, types = mi["caption_tf.G_TOKENS_IDS"], mi["caption_tf.G_TOKENS_TYPE"]
    base = AutoModel.from_pretrained(folder).eval()
    with torch.no_grad():
        out = base(
            **{k: v for k, v in batch.items() if k != "attention_mask"},
            decoder_input_ids=ids,
            decoder_token_type_ids=types,
            decoder_attention_mask=batch["attention_mask"],
            output_hidden_states=True,
        )
    _check_encoders(fx, "caption_tf", out, stream="g")
    fx.layers("caption_tf.decoder", out.decoder_hidden_states[1:])

    captioner = AutoModelForImageTextToText.from_pretrained(folder).eval()
    assert isinstance(captioner, vlhub.TdenForConditionalGeneration)
    with torch.no_grad():
        logits = captioner(input_ids=ids, token_type_ids=types, **batch).logits
    fx.close("caption_tf.logits", logits)


def test_tden_parity_greedy_generation_with_cache(fx):
    """generate() (transformers' GenerationMixin, greedy, key/value cache) reproduces the original's greedy ids,
    including the row that stops early, and its per-step logits."""
    folder = fx.convert("caption")
    captioner = AutoModelForImageTextToText.from_pretrained(folder).eval()
    batch = fx.batch("caption_gen")
    steps = fx.outputs["caption_gen.greedy_ids"].shape[1]
    with torch.no_grad():
        generated = captioner.generate(
            **batch,
            max_new_tokens=steps,
            num_beams=1,
            do_sample=False,
            return_dict_in_generate=True,
            output_logits=True,
        )
    ids = generated.sequences[:, 1:]  # after [CLS]
    expected = fx.outputs["caption_gen.greedy_ids"]
    logits = torch.stack(generated.logits, dim=1)
    logprobs = torch.log_softmax(logits.float(), dim=-1).max(dim=-1).values
    for row in range(expected.shape[0]):
        ends = (expected[row] == SEP).nonzero()
        stop = int(ends[0]) + 1 if len(ends) else steps
        assert ids[row, :stop].tolist() == expected[row, :stop].tolist(), f"row {row}"
        # After [SEP] transformers pads; the original keeps writing [SEP].
        assert (ids[row, stop:] == captioner.generation_config.pad_token_id).all()
        fx.close(
            f"caption_gen.greedy_step_logits[{row}]",
            logits[row, :stop],
            fx.outputs["caption_gen.greedy_step_logits"][row, :stop],
        )
        fx.close(
            f"caption_gen.greedy_logprobs[{row}]",
            logprobs[row, :stop],
            fx.outputs["caption_gen.greedy_logprobs"][row, :stop],
        )
    assert any((row == SEP).any() and row[-1] == SEP for row in expected), "the fixture has a row that stops early"
    fx.checked.update({"caption_gen.greedy_ids", "caption_gen.greedy_step_logits", "caption_gen.greedy_logprobs"})


def test_tden_parity_xmodaler_beam_search(fx):
    """The X-modaler beam search option reproduces the original's beam ids and log-probs (best beam and all beams),
    including the finished beam that wins without length normalisation."""
    folder = fx.convert("caption")
    captioner = AutoModelForImageTextToText.from_pretrained(folder).eval()
    batch = fx.batch("caption_gen")
    all_ids = fx.outputs["caption_gen.beam_all_ids"]
    beams, steps = all_ids.shape[1:]
    search = dict(
        max_new_tokens=steps, num_beams=beams, custom_generate=xmodaler_beam_search, return_dict_in_generate=True
    )
    best = captioner.generate(**batch, **search)
    fx.equal("caption_gen.beam_ids", best.sequences[:, 1:])
    fx.close("caption_gen.beam_logprobs", best.token_scores)
    every = captioner.generate(**batch, **search, num_return_sequences=beams)
    fx.equal("caption_gen.beam_all_ids", every.sequences[:, 1:].view(-1, beams, steps))
    fx.close("caption_gen.beam_all_logprobs", every.token_scores.view(-1, beams, steps))
    torch.testing.assert_close(every.sequences_scores, every.token_scores.sum(-1))
    # transformers' own beam search with the converted generation settings (beam 2, no length penalty) agrees on
    # this fixture up to the first [SEP] (its bookkeeping differs in general; see xmodaler_beam_search).
    with torch.no_grad():
        hf = captioner.generate(**batch, max_new_tokens=steps, num_beams=beams, length_penalty=0.0, do_sample=False)
    for row, expected in zip(hf[:, 1:].tolist(), fx.outputs["caption_gen.beam_ids"].tolist()):
        stop = expected.index(SEP) + 1 if SEP in expected else steps
        assert row[:stop] == expected[:stop]


def test_tden_parity_vqa(fx):
    folder, batch, _, out = fx.understanding_run("vqa")
    _check_encoders(fx, "vqa", out)
    _split_cross(fx, "vqa", out.cross_encoder_hidden_states, batch["region_features"].shape[1])
    fx.layers("vqa.decoder", out.decoder_hidden_states[1:])

    # The pipeline's route: processor on the raw question and regions, then the head.
    processor = AutoProcessor.from_pretrained(folder)
    inputs = processor(text=fx.texts("questions"), regions=fx.regions(), return_tensors="pt")
    model = vlhub.TdenForQuestionAnswering.from_pretrained(folder).eval()
    with torch.no_grad():
        answers = model(**inputs)
    fx.close("vqa.u_logits", answers.understanding_logits)
    fx.close("vqa.g_logits", answers.generation_logits)
    fx.equal("vqa.prediction", answers.logits.argmax(-1))
    assert model.config.num_labels == fx.outputs["vqa.u_logits"].shape[1]


def test_tden_parity_retrieval(fx):
    folder, _, base, out = fx.understanding_run("retrieval")
    assert base.cross_encoder is None and base.decoder is None
    _check_encoders(fx, "retrieval", out)

    processor = AutoProcessor.from_pretrained(folder)
    inputs = processor(text=fx.texts("captions"), regions=fx.regions(), return_tensors="pt")
    model = vlhub.TdenForImageTextRetrieval.from_pretrained(folder).eval()
    with torch.no_grad():
        scores = model(**inputs)
    fx.close("retrieval.text_embeds", scores.text_embeds)
    fx.close("retrieval.image_embeds", scores.image_embeds)
    fx.close("retrieval.similarity", scores.logits_per_text)
    torch.testing.assert_close(scores.logits[:, 0], scores.logits_per_text.diagonal())


def test_tden_parity_every_output_is_checked(fx):
    """Runs last in this module: every tensor of outputs.safetensors was compared by a test above."""
    checked = {name.split("[")[0] for name in fx.checked}
    assert set(fx.outputs) <= checked, f"outputs no test compared: {sorted(set(fx.outputs) - checked)}"
