"""transformers' model checks (tests/model_checks.py) for TdenModel and every TDEN head."""

import torch

from vlhub import (
    TdenConfig,
    TdenForConditionalGeneration,
    TdenForImageTextRetrieval,
    TdenForMultipleChoice,
    TdenForPreTraining,
    TdenForQuestionAnswering,
    TdenModel,
)

from . import test_uniter_transformers_checks as uniter_inputs
from .model_checks import ModelCase, ModelChecks, model_case_fixture

BATCH, TEXT, REGIONS, FEATURES, REGION_LABELS, ANSWERS = 2, 6, 5, 16, 11, 5
assert (uniter_inputs.BATCH, uniter_inputs.TEXT, uniter_inputs.REGIONS, uniter_inputs.FEATURES) == (
    BATCH,
    TEXT,
    REGIONS,
    FEATURES,
)


def tiny_config(**overrides) -> TdenConfig:
    settings = dict(
        vocab_size=40,
        hidden_size=32,
        num_hidden_layers=2,
        num_visual_layers=2,
        num_cross_encoder_layers=2,
        num_decoder_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=16,
        region_feature_dim=FEATURES,
        num_region_labels=REGION_LABELS,
        similarity_pooler_size=24,
        classifier_pooler_size=20,
        bos_token_id=2,
        eos_token_id=3,
        pad_token_id=0,
    )
    return TdenConfig(**{**settings, **overrides})


def _generator(seed=0):
    return torch.Generator().manual_seed(seed)


def text_and_regions(config, batch=BATCH) -> dict:
    """UNITER's check inputs (padded text and regions: example 0 full, the others with 2 pad tokens and 2 pad
    regions), with TDEN's 5-d locations."""
    inputs = uniter_inputs.text_and_regions(config, batch)
    return {**inputs, "region_locations": inputs["region_locations"][..., :5]}


def both_streams(config) -> dict:
    inputs = text_and_regions(config)
    return {**inputs, "decoder_input_ids": inputs["input_ids"].flip(1)}


def caption(config) -> dict:
    inputs = text_and_regions(config)
    inputs["attention_mask"] = torch.ones_like(inputs["attention_mask"])  # captions: causal, unpadded prefixes
    return inputs


def three_choices(config) -> dict:
    inputs = uniter_inputs.three_choices(config)
    return {**inputs, "region_locations": inputs["region_locations"][..., :5]}


def pretraining_targets(config, inputs):
    labels = torch.full((BATCH, TEXT), -1)
    labels[0, 2], labels[1, 1] = 7, 9
    masked = torch.zeros(BATCH, REGIONS, dtype=torch.bool)
    masked[0, 1] = masked[1, 2] = True
    targets = torch.softmax(torch.rand(2, REGION_LABELS, generator=_generator(3)), -1)
    return {
        "labels": labels,
        "decoder_labels": inputs["input_ids"].roll(-1, 1),
        "masked_regions": masked,
        "region_class_targets": targets,
        "image_ids": torch.tensor([0, 1]),
    }


CASES = [
    ModelCase("model", TdenModel, tiny_config(), both_streams),
    ModelCase("pretraining", TdenForPreTraining, tiny_config(), both_streams, pretraining_targets),
    ModelCase(
        "captioning",
        TdenForConditionalGeneration,
        tiny_config(),
        caption,
        lambda config, inputs: {"labels": inputs["input_ids"].roll(-1, 1)},
    ),
    ModelCase(
        "vqa",
        TdenForQuestionAnswering,
        tiny_config(bidirectional_decoder=True, id2label={i: f"answer{i}" for i in range(ANSWERS)}),
        text_and_regions,
        lambda config, inputs: {"labels": torch.rand(BATCH, ANSWERS, generator=_generator(4))},
    ),
    ModelCase(
        "retrieval",
        TdenForImageTextRetrieval,
        tiny_config(),
        text_and_regions,
        lambda config, inputs: {"return_loss": True, "image_ids": torch.tensor([0, 1])},
    ),
    ModelCase(
        "vcr",
        TdenForMultipleChoice,
        tiny_config(num_labels=1),
        three_choices,
        lambda config, inputs: {"labels": torch.tensor([2, 0])},
    ),
]


case = model_case_fixture(CASES)


class TestTdenTransformersChecks(ModelChecks):
    pass


def test_heads_own_only_what_they_use():
    """Built from a config with every block (the defaults, the tiny preset), the captioner has no cross-modal encoder
    or matching poolers, retrieval no cross-modal encoder, decoder or LM head, VCR without a bidirectional decoder
    no decoder and no generation branch; the LM head is untied from the word embeddings (as the original)."""
    captioner = TdenForConditionalGeneration(tiny_config())
    assert captioner.tden.cross_encoder is None and not hasattr(captioner, "similarity")
    assert captioner.get_output_embeddings().weight is not captioner.get_input_embeddings().weight
    retrieval = TdenForImageTextRetrieval(tiny_config())
    assert retrieval.tden.cross_encoder is None and retrieval.tden.decoder is None and not hasattr(retrieval, "lm_head")
    vcr = TdenForMultipleChoice(tiny_config(num_labels=1))
    assert vcr.tden.decoder is None and not hasattr(vcr.answer_head, "g_pooler")
    vcr = TdenForMultipleChoice(tiny_config(num_labels=1, bidirectional_decoder=True))
    assert vcr.tden.decoder is not None and hasattr(vcr.answer_head, "g_pooler")
    keys = TdenForPreTraining(tiny_config()).state_dict()
    assert "similarity.v_pooler.1.bn.running_var" in keys and "lm_head.decoder.bias" in keys


def test_a_head_loads_a_pretraining_checkpoint(tmp_path):
    TdenForPreTraining(tiny_config(bidirectional_decoder=True, num_labels=ANSWERS)).save_pretrained(tmp_path)
    _, info = TdenForQuestionAnswering.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(k.startswith("tden.") for k in [*info["missing_keys"], *info["unexpected_keys"]]), info
    assert all(k.startswith("answer_head.") for k in info["missing_keys"])
