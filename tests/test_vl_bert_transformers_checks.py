"""transformers' model checks (tests/model_checks.py) for VlBertModel and every VL-BERT head."""

import torch

from vlhub import (
    VlBertConfig,
    VlBertForMultipleChoice,
    VlBertForPreTraining,
    VlBertForQuestionAnswering,
    VlBertForReferringExpression,
    VlBertModel,
)

from .model_checks import ModelCase, ModelChecks, model_case_fixture

BATCH, TEXT, REGIONS, FEATURES, REGION_LABELS, CHOICES = 3, 7, 5, 16, 11, 3
CLS, SEP, MASK = 2, 3, 4


def tiny_config(**overrides) -> VlBertConfig:
    settings = dict(
        vocab_size=40,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=16,
        region_feature_dim=FEATURES,
        geometry_embedding_dim=4,
        num_region_labels=REGION_LABELS,
        num_vcr_region_labels=6,
        mask_token_id=MASK,
        num_labels=5,
        visual_scale_text_init=1.0,
        visual_scale_object_init=1.0,
    )
    return VlBertConfig(**{**settings, **overrides})


def _generator(seed=0):
    return torch.Generator().manual_seed(seed)


def text_and_regions(config, batch=BATCH, seed=0) -> dict:
    """`[CLS] words [SEP] [MASK] [SEP]` (the VQA layout; the other heads read it as plain text), right-padded: row 0
    full, the others 2 tokens and 2 objects shorter. Object 0 is the whole image."""
    g = _generator(seed)
    input_ids = torch.randint(5, config.vocab_size, (batch, TEXT), generator=g)
    attention_mask = torch.ones(batch, TEXT, dtype=torch.long)
    region_attention_mask = torch.ones(batch, REGIONS, dtype=torch.long)
    input_ids[:, 0] = CLS
    input_ids[0, -3:] = torch.tensor([SEP, MASK, SEP])
    input_ids[1:, -5:-2] = torch.tensor([SEP, MASK, SEP])
    input_ids[1:, -2:], attention_mask[1:, -2:], region_attention_mask[1:, -2:] = 0, 0, 0
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[0, -2:] = token_type_ids[1:, -4:-2] = 1
    region_features = torch.rand(batch, REGIONS, FEATURES, generator=g) * region_attention_mask[..., None]
    locations = torch.rand(batch, REGIONS, 4, generator=g) * region_attention_mask[..., None]
    return dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        token_type_ids=token_type_ids,
        region_features=region_features,
        region_locations=locations,
        region_attention_mask=region_attention_mask,
    )


def pretraining_inputs(config) -> dict:
    """Two image-text rows and one text-only row (no object), with two objects masked for MVRC."""
    inputs = text_and_regions(config)
    inputs["region_attention_mask"][2] = 0
    inputs["region_features"][2] = inputs["region_locations"][2] = 0
    masks = torch.zeros(BATCH, REGIONS, dtype=torch.bool)
    masks[0, 1] = masks[1, 2] = True
    return {**inputs, "region_masks": masks}


def pretraining_labels(config, inputs):
    labels = torch.full((BATCH, TEXT), -100)
    labels[0, 2], labels[1, 1], labels[2, 3] = 7, 9, 11
    targets = torch.zeros(BATCH, REGIONS, REGION_LABELS)
    targets[0, 1] = torch.softmax(torch.randn(REGION_LABELS, generator=_generator(3)), 0)
    targets[1, 2] = torch.softmax(torch.randn(REGION_LABELS, generator=_generator(4)), 0)
    return {"labels": labels, "region_class_targets": targets}


def vqa_labels(config, inputs):
    return {"labels": torch.rand(BATCH, config.num_labels, generator=_generator(5))}


def re_labels(config, inputs):
    return {"labels": (torch.rand(BATCH, REGIONS, generator=_generator(6)) > 0.5).float()}


def choices(config) -> dict:
    shared = text_and_regions(config)
    per_choice = text_and_regions(config, batch=BATCH * CHOICES, seed=1)
    text = {k: per_choice[k].view(BATCH, CHOICES, TEXT) for k in ("input_ids", "attention_mask", "token_type_ids")}
    return {**shared, **text}


def vcr_labels(config, inputs):
    return {
        "labels": torch.tensor([0, 2, 1]),
        "region_labels": torch.randint(0, config.num_vcr_region_labels, (BATCH, REGIONS), generator=_generator(7)),
    }


def e2e_config() -> VlBertConfig:
    """An "e2e" model with a narrow ResNet-50 (res5 gives 8 x 8 = 64-d appearance features)."""
    return tiny_config(
        image_feature_precomputed=False,
        backbone_depth=50,
        backbone_width_per_group=2,
        backbone_stem_channels=4,
        backbone_res2_channels=8,
        region_feature_dim=64,
    )


def pixels_and_boxes(config) -> dict:
    inputs = text_and_regions(config)
    g = _generator(8)
    boxes = torch.tensor(
        [
            [0.0, 0.0, 47.0, 31.0],
            [4.0, 2.0, 30.0, 20.0],
            [10.5, 8.0, 40.0, 31.0],
            [0.0, 12.0, 22.0, 30.0],
            [25.0, 0.0, 47.0, 15.5],
        ]
    ).expand(BATCH, REGIONS, 4)
    del inputs["region_features"]
    return {**inputs, "pixel_values": 50 * torch.randn(BATCH, 3, 32, 48, generator=g), "region_boxes": boxes.clone()}


CASES = [
    ModelCase("model", VlBertModel, tiny_config(), text_and_regions),
    ModelCase("model_with_pooler", VlBertModel, tiny_config(with_pooler=True), text_and_regions),
    ModelCase("pretraining", VlBertForPreTraining, tiny_config(), pretraining_inputs, pretraining_labels),
    ModelCase("vqa", VlBertForQuestionAnswering, tiny_config(), text_and_regions, vqa_labels),
    ModelCase("referring_expression", VlBertForReferringExpression, tiny_config(), text_and_regions, re_labels),
    ModelCase("multiple_choice", VlBertForMultipleChoice, tiny_config(), choices, vcr_labels),
    ModelCase("vqa_e2e", VlBertForQuestionAnswering, e2e_config(), pixels_and_boxes, vqa_labels),
]


case = model_case_fixture(CASES)


class TestVlBertTransformersChecks(ModelChecks):
    pass
