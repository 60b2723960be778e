"""transformers' model checks (tests/model_checks.py) for UniterModel and every UNITER head."""

import pytest
import torch

from vlhub import (
    UniterConfig,
    UniterForImageTextRetrieval,
    UniterForMultipleChoice,
    UniterForPreTraining,
    UniterForQuestionAnswering,
    UniterForReferringExpression,
    UniterForVisualEntailment,
    UniterForVisualReasoning,
    UniterModel,
)

from .model_checks import ModelCase, ModelChecks, model_case_fixture

BATCH, TEXT, REGIONS, FEATURES, REGION_LABELS = 2, 6, 5, 16, 11


def tiny_config(**overrides) -> UniterConfig:
    settings = dict(
        vocab_size=40,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=16,
        region_feature_dim=FEATURES,
        num_region_labels=REGION_LABELS,
    )
    return UniterConfig(**{**settings, **overrides})


def _generator(seed=0):
    return torch.Generator().manual_seed(seed)


def text_and_regions(config, batch=BATCH) -> dict:
    """Padded text and regions: example 0 is full, the others have 2 pad tokens and 2 pad regions."""
    g = _generator()
    input_ids = torch.randint(5, config.vocab_size, (batch, TEXT), generator=g)
    input_ids[:, 0], attention_mask = 2, torch.ones(batch, TEXT, dtype=torch.long)
    region_attention_mask = torch.ones(batch, REGIONS, dtype=torch.long)
    input_ids[1:, -2:], attention_mask[1:, -2:], region_attention_mask[1:, -2:] = 0, 0, 0
    region_features = torch.rand(batch, REGIONS, FEATURES, generator=g) * region_attention_mask[..., None]
    return dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        region_features=region_features,
        region_locations=torch.rand(batch, REGIONS, 7, generator=g),
        region_attention_mask=region_attention_mask,
    )


def two_images(config) -> dict:
    single = text_and_regions(config)
    g = _generator(1)
    return {
        **single,
        "region_features": torch.stack(
            [single["region_features"], torch.rand(BATCH, REGIONS, FEATURES, generator=g)], 1
        ),
        "region_locations": torch.stack([single["region_locations"]] * 2, 1),
        "region_attention_mask": torch.stack([single["region_attention_mask"]] * 2, 1),
    }


def three_choices(config) -> dict:
    single = text_and_regions(config)
    choices = text_and_regions(config, batch=BATCH * 3)
    return {
        **single,
        "input_ids": choices["input_ids"].view(BATCH, 3, TEXT),
        "attention_mask": choices["attention_mask"].view(BATCH, 3, TEXT),
    }


def region_masks(inputs) -> torch.Tensor:
    masks = torch.zeros(BATCH, REGIONS, dtype=torch.bool)
    masks[0, 1] = masks[1, 2] = True
    return masks


def pretraining_inputs(config) -> dict:
    return {**text_and_regions(config), "region_masks": region_masks(None)}


def mlm_labels(config, inputs):
    labels = torch.full((BATCH, TEXT), -100)
    labels[0, 2], labels[1, 1] = 7, 9
    return {"labels": labels}


def mrfr_targets(config, inputs):
    return {"region_feature_targets": torch.rand(2, FEATURES, generator=_generator(2))}


def mrc_targets(config, inputs):
    return {"region_class_targets": torch.softmax(torch.rand(2, REGION_LABELS, generator=_generator(3)), -1)}


def itm_labels(config, inputs):
    return {"itm_labels": torch.tensor([1, 0])}


def all_targets(config, inputs):
    return {
        **mlm_labels(config, inputs),
        **mrfr_targets(config, inputs),
        **mrc_targets(config, inputs),
        **itm_labels(config, inputs),
    }


def _without_region_masks(inputs_builder):
    def build(config):
        return {k: v for k, v in inputs_builder(config).items() if k != "region_masks"}

    return build


# Heads of the other objectives get no gradient in a one-objective batch (the original's conditional masking).
MLM_HEAD, MRFR_HEAD, MRC_HEAD = (r"^cls\.",), (r"^feat_regress\.",), (r"^region_classifier\.",)
ITM_HEAD = (r"^itm_output\.", r"^uniter\.pooler\.")
MASK_EMBEDDING = (r"^uniter\.img_embeddings\.mask_embedding\.",)

CASES = [
    ModelCase("model", UniterModel, tiny_config(), text_and_regions),
    ModelCase("pretraining-all-objectives", UniterForPreTraining, tiny_config(), pretraining_inputs, all_targets),
    ModelCase(
        "pretraining-mlm",
        UniterForPreTraining,
        tiny_config(),
        _without_region_masks(pretraining_inputs),
        mlm_labels,
        MRFR_HEAD + MRC_HEAD + ITM_HEAD + MASK_EMBEDDING,
        forward_kwargs={"objective": "mlm"},
    ),
    ModelCase(
        "pretraining-mrfr",
        UniterForPreTraining,
        tiny_config(),
        pretraining_inputs,
        mrfr_targets,
        MLM_HEAD + MRC_HEAD + ITM_HEAD,
        forward_kwargs={"objective": "mrfr"},
    ),
    ModelCase(
        "pretraining-mrc",
        UniterForPreTraining,
        tiny_config(),
        pretraining_inputs,
        mrc_targets,
        MLM_HEAD + MRFR_HEAD + ITM_HEAD,
        forward_kwargs={"objective": "mrc"},
    ),
    ModelCase(
        "pretraining-mrc-kl",
        UniterForPreTraining,
        tiny_config(),
        pretraining_inputs,
        mrc_targets,
        MLM_HEAD + MRFR_HEAD + ITM_HEAD,
        forward_kwargs={"objective": "mrc-kl"},
    ),
    ModelCase(
        "pretraining-itm",
        UniterForPreTraining,
        tiny_config(),
        _without_region_masks(pretraining_inputs),
        itm_labels,
        MLM_HEAD + MRFR_HEAD + MRC_HEAD + MASK_EMBEDDING,
        forward_kwargs={"objective": "itm"},
    ),
    ModelCase(
        "pretraining-itm-wra",
        UniterForPreTraining,
        tiny_config(),
        _without_region_masks(pretraining_inputs),
        itm_labels,
        MLM_HEAD + MRFR_HEAD + MRC_HEAD + MASK_EMBEDDING,
        forward_kwargs={"objective": "itm-wra"},
    ),
    # The contrastive extension runs the text-only and the image-only pass; the pooler is its projection.
    ModelCase(
        "pretraining-itc",
        UniterForPreTraining,
        tiny_config(),
        _without_region_masks(pretraining_inputs),
        lambda config, inputs: {"itc_image_ids": torch.tensor([0, 1])},
        MLM_HEAD + MRFR_HEAD + MRC_HEAD + (r"^itm_output\.",) + MASK_EMBEDDING,
        forward_kwargs={"objective": "itc"},
    ),
    ModelCase(
        "vqa",
        UniterForQuestionAnswering,
        tiny_config(id2label={i: f"answer{i}" for i in range(5)}),
        text_and_regions,
        lambda config, inputs: {"labels": torch.rand(BATCH, 5, generator=_generator(4))},
    ),
    ModelCase(
        "ve",
        UniterForVisualEntailment,
        tiny_config(),
        text_and_regions,
        lambda config, inputs: {"labels": torch.tensor([0, 2])},
    ),
    ModelCase(
        "retrieval",
        UniterForImageTextRetrieval,
        tiny_config(),
        text_and_regions,
        lambda config, inputs: {"num_negatives": 1},
    ),
    ModelCase(
        "nlvr2-paired",
        UniterForVisualReasoning,
        tiny_config(type_vocab_size=3, nlvr2_head="paired"),
        two_images,
        lambda config, inputs: {"labels": torch.tensor([0, 1])},
    ),
    ModelCase(
        "nlvr2-paired-attn",
        UniterForVisualReasoning,
        tiny_config(type_vocab_size=3),
        two_images,
        lambda config, inputs: {"labels": torch.tensor([0, 1])},
    ),
    ModelCase(
        "re",
        UniterForReferringExpression,
        tiny_config(),
        text_and_regions,
        lambda config, inputs: {"labels": torch.tensor([1, 2])},
    ),
    ModelCase(
        "re-2-layer",
        UniterForReferringExpression,
        tiny_config(re_head_layers=2),
        text_and_regions,
        lambda config, inputs: {"labels": torch.tensor([1, 2])},
    ),
    ModelCase(
        "vcr",
        UniterForMultipleChoice,
        tiny_config(),
        three_choices,
        lambda config, inputs: {"labels": torch.tensor([2, 0])},
    ),
]


case = model_case_fixture(CASES)


class TestUniterTransformersChecks(ModelChecks):
    pass


def test_heads_own_only_what_they_use():
    """The mask embedding lives only in the pre-training model (at the released checkpoints' key); the pooler only
    where the pooled output is read; the retrieval head keeps no ITM layer."""
    key = "uniter.img_embeddings.mask_embedding.weight"
    assert key in UniterForPreTraining(tiny_config()).state_dict()
    for head in (
        UniterForQuestionAnswering,
        UniterForImageTextRetrieval,
        UniterForReferringExpression,
        UniterForMultipleChoice,
        UniterForVisualReasoning,
    ):
        assert key not in head(tiny_config(type_vocab_size=3)).state_dict(), head
    assert UniterForReferringExpression(tiny_config()).uniter.pooler is None
    assert UniterForVisualReasoning(tiny_config(type_vocab_size=3)).uniter.pooler is None
    assert UniterForVisualReasoning(tiny_config(type_vocab_size=3, nlvr2_head="paired")).uniter.pooler is not None
    assert not hasattr(UniterForImageTextRetrieval(tiny_config()), "itm_output")
    with pytest.raises(ValueError, match="region mask embedding"):
        UniterModel(tiny_config())(**pretraining_inputs(tiny_config()))


def test_a_head_does_not_change_the_config_it_is_given():
    config = tiny_config()
    before = config.to_dict()
    model = UniterForVisualEntailment(config)
    assert config.to_dict() == before and model.config.num_labels == 3 and config.num_labels == 2


def test_retrieval_rank_output_seeded_from_an_itm_head(tmp_path):
    pretraining = UniterForPreTraining(tiny_config())
    state = pretraining.state_dict()
    retrieval = UniterForImageTextRetrieval(tiny_config())
    retrieval.init_rank_output_from_itm(state["itm_output.weight"], state["itm_output.bias"])
    assert torch.equal(retrieval.rank_output.weight[0], state["itm_output.weight"][1])
    assert torch.equal(retrieval.rank_output.bias, state["itm_output.bias"][1:])
    with pytest.raises(ValueError, match="ITM head"):
        retrieval.init_rank_output_from_itm(state["itm_output.weight"][:1], state["itm_output.bias"][:1])


def test_a_downstream_head_loads_a_pretraining_checkpoint_without_unexpected_backbone_keys(tmp_path):
    UniterForPreTraining(tiny_config()).save_pretrained(tmp_path)
    _, info = UniterForReferringExpression.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(k.startswith("uniter.") for k in info["unexpected_keys"]), info["unexpected_keys"]
    assert set(info["missing_keys"]) == {"re_output.weight", "re_output.bias"}
