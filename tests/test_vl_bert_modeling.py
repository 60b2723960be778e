"""VL-BERT's own semantics (layout, positions, visual terms) and its errors on bad input."""

import math

import pytest
import torch

from vlhub import (
    VlBertConfig,
    VlBertForMultipleChoice,
    VlBertForPreTraining,
    VlBertForQuestionAnswering,
    VlBertForReferringExpression,
    VlBertModel,
    geometry_embedding,
)

from .test_vl_bert_transformers_checks import MASK, REGIONS, TEXT, text_and_regions, tiny_config


def _model(cls=VlBertModel, **overrides):
    torch.manual_seed(0)
    return cls(
        tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, image_feature_dropout=0.0, **overrides)
    ).eval()


def test_geometry_embedding_is_the_spec_formula():
    locations = torch.tensor([[0.25, 0.5, 0.1, 0.3]])
    out = geometry_embedding(locations, dim=4, scale=100.0, wavelength=1000.0)
    assert out.shape == (1, 32)
    for c, value in enumerate(locations[0].tolist()):
        for i in range(4):
            angle = 100.0 * value / 1000.0 ** (i / 4)
            assert out[0, c * 8 + i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert out[0, c * 8 + 4 + i].item() == pytest.approx(math.cos(angle), abs=1e-5)


def test_padding_text_and_objects_changes_nothing_at_real_positions():
    """Objects take position n_text (real tokens), so extra padding of either modality leaves the outputs alone."""
    model = _model()
    inputs = {k: v[1:2] for k, v in text_and_regions(model.config).items()}
    n_text, n_obj = int(inputs["attention_mask"].sum()), int(inputs["region_attention_mask"].sum())
    trimmed = dict(inputs)
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        trimmed[key] = inputs[key][:, :n_text]
    for key in ("region_features", "region_locations", "region_attention_mask"):
        trimmed[key] = inputs[key][:, :n_obj]
    with torch.no_grad():
        padded = model(**inputs).last_hidden_state
        tight = model(**trimmed).last_hidden_state
    torch.testing.assert_close(padded[:, :n_text], tight[:, :n_text], atol=1e-5, rtol=0)
    torch.testing.assert_close(padded[:, TEXT : TEXT + n_obj], tight[:, n_text : n_text + n_obj], atol=1e-5, rtol=0)
    torch.testing.assert_close(padded[:, -1], tight[:, -1], atol=1e-5, rtol=0)


def test_every_token_carries_the_whole_image_and_object_order_does_not_matter():
    model = _model()
    inputs = {k: v[:1] for k, v in text_and_regions(model.config).items()}
    with torch.no_grad():
        reference = model(**inputs).last_hidden_state
        # Objects 1.. permuted: same text outputs (they share one position), permuted object outputs.
        order = torch.tensor([0, 3, 1, 4, 2])
        shuffled = dict(
            inputs,
            region_features=inputs["region_features"][:, order],
            region_locations=inputs["region_locations"][:, order],
        )
        out = model(**shuffled).last_hidden_state
        torch.testing.assert_close(out[:, :TEXT], reference[:, :TEXT], atol=1e-5, rtol=0)
        torch.testing.assert_close(out[:, TEXT : TEXT + REGIONS], reference[:, TEXT + order], atol=1e-5, rtol=0)
        # Changing the whole-image object (0) changes every text token; changing object 1 does not change the
        # text embeddings (layer 0) — only attention mixes it in.
        other_image = dict(inputs, region_features=inputs["region_features"].clone())
        other_image["region_features"][:, 0] += 1
        other_object = dict(inputs, region_features=inputs["region_features"].clone())
        other_object["region_features"][:, 1] += 1
        base = model(**inputs, output_hidden_states=True).hidden_states[0]
        image_changed = model(**other_image, output_hidden_states=True).hidden_states[0]
        object_changed = model(**other_object, output_hidden_states=True).hidden_states[0]
    assert (image_changed[:, :TEXT] - base[:, :TEXT]).abs().amax(-1).min() > 1e-4
    torch.testing.assert_close(object_changed[:, :TEXT], base[:, :TEXT])
    # [END] has no visual term.
    torch.testing.assert_close(image_changed[:, -1], base[:, -1])


def test_text_region_ids_ground_words_in_objects():
    model = _model()
    inputs = {k: v[:1] for k, v in text_and_regions(model.config).items()}
    grounded = torch.zeros(1, TEXT, dtype=torch.long)
    grounded[0, 2] = 3
    with torch.no_grad():
        default = model(**inputs, output_hidden_states=True).hidden_states[0]
        explicit = model(**inputs, text_region_ids=torch.zeros_like(grounded), output_hidden_states=True).hidden_states[
            0
        ]
        moved = model(**inputs, text_region_ids=grounded, output_hidden_states=True).hidden_states[0]
    torch.testing.assert_close(default, explicit)
    assert not torch.allclose(moved[0, 2], default[0, 2])
    torch.testing.assert_close(moved[0, 3], default[0, 3])


def test_visual_layer_norms_start_at_the_configured_scale():
    model = VlBertModel(
        VlBertConfig(
            vocab_size=30,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            region_feature_dim=8,
            geometry_embedding_dim=2,
            mask_token_id=4,
        )
    )
    assert torch.all(model.embeddings.visual_ln_text.weight == 0)
    assert torch.all(model.embeddings.visual_ln_object.weight == 0)
    pretraining = VlBertForPreTraining(model.config)
    assert torch.all(pretraining.vl_bert.visual_embeddings.object_mask_visual_embedding == 0)


def test_vqa_reads_the_mask_token():
    model = _model(VlBertForQuestionAnswering)
    inputs = text_and_regions(model.config)
    positions = model.answer_positions(inputs["input_ids"], inputs["attention_mask"], None)
    assert positions.tolist() == [TEXT - 2, TEXT - 4, TEXT - 4]
    with torch.no_grad():
        out = model(**inputs)
        by_hand = model.vqa_head(out.last_hidden_state[torch.arange(3), positions])
    torch.testing.assert_close(out.logits, by_hand)
    # With inputs_embeds the slot is the token before the last real one: the same positions.
    assert (
        model.answer_positions(None, inputs["attention_mask"], torch.zeros(3, TEXT, 32)).tolist() == positions.tolist()
    )


def test_referring_expression_masks_padded_objects():
    model = _model(VlBertForReferringExpression)
    inputs = text_and_regions(model.config)
    with torch.no_grad():
        logits = model(**inputs).logits
    assert torch.all(logits[1:, -2:] == -10000.0) and torch.all(logits[0] > -10000.0)


# ---------------------------------------------------------------------------------------------------- bad input
def test_pixels_given_to_a_prec_model_are_refused():
    model = _model()
    inputs = text_and_regions(model.config)
    with pytest.raises(ValueError, match="pixels.*prec"):
        model(
            input_ids=inputs["input_ids"],
            region_features=torch.rand(3, 3, 32, 32),
            region_locations=inputs["region_locations"],
        )


def test_bad_region_inputs_are_named():
    model = _model()
    inputs = text_and_regions(model.config)
    with pytest.raises(ValueError, match="region_features must have shape"):
        model(**dict(inputs, region_features=torch.rand(3, REGIONS, 7)))
    with pytest.raises(ValueError, match="without region_locations"):
        model(**dict(inputs, region_locations=None))
    with pytest.raises(ValueError, match="region_locations must have shape"):
        model(**dict(inputs, region_locations=torch.rand(3, REGIONS, 7)))
    with pytest.raises(ValueError, match="no region_attention_mask"):
        model(**dict(inputs, region_attention_mask=None))
    with pytest.raises(ValueError, match="differ in size"):
        model(**dict(inputs, input_ids=inputs["input_ids"][:2], attention_mask=None, token_type_ids=None))
    with pytest.raises(ValueError, match="either input_ids or inputs_embeds"):
        model(**inputs, inputs_embeds=torch.zeros(3, TEXT, 32))


def test_text_longer_than_the_positions_allow_is_refused():
    model = _model()
    inputs = text_and_regions(model.config)
    too_long = model.config.max_position_embeddings - 1
    with pytest.raises(ValueError, match="no position for the objects and \\[END\\]"):
        model(**dict(inputs, input_ids=torch.full((3, too_long), 7), attention_mask=None, token_type_ids=None))


def test_text_only_needs_the_pretraining_embeddings():
    inputs = text_and_regions(tiny_config())
    text_only = {k: inputs[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    with pytest.raises(ValueError, match="pre-training model"):
        _model()(**text_only)
    with pytest.raises(ValueError, match="pre-training model"):
        _model()(**inputs, region_masks=torch.zeros(3, REGIONS, dtype=torch.bool))
    out = _model(VlBertForPreTraining)(**text_only, labels=torch.full((3, TEXT), 7))
    assert out.mvrc_logits is None and torch.isfinite(out.loss) and out.mlm_loss == 0


def test_vqa_without_the_answer_slot_is_refused():
    model = _model(VlBertForQuestionAnswering)
    inputs = text_and_regions(model.config)
    inputs["input_ids"] = inputs["input_ids"].masked_fill(inputs["input_ids"] == MASK, 7)
    with pytest.raises(RuntimeError, match="answer slot"):
        model(**inputs)
    with pytest.raises(ValueError, match="labels must be soft scores"):
        model(**text_and_regions(model.config), labels=torch.zeros(3))


def test_heads_need_regions_and_well_shaped_targets():
    inputs = text_and_regions(tiny_config())
    text_only = {k: inputs[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    for cls in (VlBertForQuestionAnswering, VlBertForReferringExpression):
        with pytest.raises(ValueError, match="regions"):
            _model(cls)(**text_only)
    with pytest.raises(ValueError, match="num_choices"):
        _model(VlBertForMultipleChoice)(**inputs)
    pretraining = _model(VlBertForPreTraining)
    with pytest.raises(ValueError, match="labels must have shape"):
        pretraining(**inputs, labels=torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="region_class_targets must have shape"):
        pretraining(**inputs, region_class_targets=torch.zeros(3, REGIONS, 2))
