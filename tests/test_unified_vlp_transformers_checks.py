"""transformers' model checks (tests/model_checks.py) for UnifiedVlpModel and every Unified VLP head."""

import pytest
import torch
from huggingface_hub.errors import StrictDataclassClassValidationError

from vlhub import (
    UnifiedVlpConfig,
    UnifiedVlpForConditionalGeneration,
    UnifiedVlpForPreTraining,
    UnifiedVlpForQuestionAnswering,
    UnifiedVlpModel,
)

from .model_checks import ModelCase, ModelChecks, model_case_fixture

BATCH, REGIONS, TEXT, FEATURES, CLASSES, ANSWERS = 2, 4, 5, 16, 5, 6


def tiny_config(**overrides) -> UnifiedVlpConfig:
    settings = dict(
        vocab_size=40,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=20,
        num_regions=REGIONS,
        region_feature_dim=FEATURES,
        region_embed_dim=24,
        region_location_dim=6 + CLASSES,
        pad_token_id=0,
        region_token_id=1,
        bos_token_id=2,
        eos_token_id=3,
        mask_token_id=4,
    )
    return UnifiedVlpConfig(**{**settings, **overrides})


def inputs(config) -> dict:
    """`[CLS] r r r r [SEP] w w w [SEP]`: example 1 has two text pads and one padded region slot."""
    g = torch.Generator().manual_seed(0)
    start = config.num_regions + 2
    input_ids = torch.randint(5, config.vocab_size, (BATCH, start + TEXT), generator=g)
    input_ids[:, 0], input_ids[:, 1 : start - 1], input_ids[:, start - 1] = 2, 1, 3
    attention_mask = torch.ones_like(input_ids)
    input_ids[1, -2:], attention_mask[1, -2:] = 0, 0
    region_attention_mask = torch.ones(BATCH, REGIONS, dtype=torch.long)
    region_attention_mask[1, -1] = 0
    return dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        region_attention_mask=region_attention_mask,
        region_features=torch.rand(BATCH, REGIONS, FEATURES, generator=g),
        region_locations=torch.randn(BATCH, REGIONS, 6 + CLASSES, generator=g),
    )


def all_text_labels(config, inputs):
    labels = torch.full(inputs["input_ids"].shape, -100)
    labels[0, REGIONS + 3], labels[1, REGIONS + 2] = 7, 9
    return {"labels": labels}


def masked_position_labels(config, inputs):
    return {
        "masked_positions": torch.tensor([[REGIONS + 3, REGIONS + 4], [REGIONS + 2, 0]]),
        "labels": torch.tensor([[7, 8], [9, -100]]),
    }


def soft_scores(config, inputs):
    return {"labels": torch.rand(BATCH, ANSWERS, generator=torch.Generator().manual_seed(1))}


def mixed_patterns(builder):
    def build(config):
        return {**builder(config), "seq2seq": torch.tensor([True, False])}

    return build


def one_step(config):
    """A decoding step: the prompt and two words, predicting the next from a trailing [MASK]."""
    return {**inputs(config), "predict_next": True}


CASES = [
    ModelCase("model-bidirectional", UnifiedVlpModel, tiny_config(), inputs),
    ModelCase("model-seq2seq", UnifiedVlpModel, tiny_config(), inputs, forward_kwargs={"seq2seq": True}),
    ModelCase("model-mixed", UnifiedVlpModel, tiny_config(), mixed_patterns(inputs)),
    ModelCase("pretraining", UnifiedVlpForPreTraining, tiny_config(), inputs, all_text_labels),
    ModelCase(
        "pretraining-mixed-masked-positions",
        UnifiedVlpForPreTraining,
        tiny_config(),
        mixed_patterns(inputs),
        masked_position_labels,
    ),
    ModelCase("captioning", UnifiedVlpForConditionalGeneration, tiny_config(), inputs, masked_position_labels),
    ModelCase("captioning-next-word", UnifiedVlpForConditionalGeneration, tiny_config(), one_step),
    ModelCase(
        "vqa",
        UnifiedVlpForQuestionAnswering,
        tiny_config(id2label={i: f"answer{i}" for i in range(ANSWERS)}),
        inputs,
        soft_scores,
    ),
]


case = model_case_fixture(CASES)


class TestUnifiedVlpTransformersChecks(ModelChecks):
    pass


def test_heads_own_only_what_they_use():
    # The original computes the tanh pooler and no head or loss reads it: only the bare model has it.
    for head in (UnifiedVlpForPreTraining, UnifiedVlpForConditionalGeneration, UnifiedVlpForQuestionAnswering):
        assert head(tiny_config()).vlp.pooler is None
    assert UnifiedVlpModel(tiny_config()).pooler is not None
    assert not hasattr(UnifiedVlpForQuestionAnswering(tiny_config()), "cls")


def test_a_head_loads_a_pretraining_checkpoint_without_unexpected_keys(tmp_path):
    UnifiedVlpForPreTraining(tiny_config()).save_pretrained(tmp_path)
    captioner, info = UnifiedVlpForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    _, info = UnifiedVlpForQuestionAnswering.from_pretrained(tmp_path, output_loading_info=True)
    assert set(info["missing_keys"]) == {f"ans_classifier.{i}.{p}" for i in (0, 2) for p in ("weight", "bias")}


def test_config_rejects_inconsistent_sizes():
    # huggingface_hub's strict dataclasses wrap the ValueError of validate_architecture
    with pytest.raises(StrictDataclassClassValidationError, match="no room for text"):
        tiny_config(max_position_embeddings=REGIONS + 3)
    with pytest.raises(StrictDataclassClassValidationError, match="type_vocab_size"):
        tiny_config(type_vocab_size=2)
