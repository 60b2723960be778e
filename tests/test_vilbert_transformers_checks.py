"""transformers' model checks (tests/model_checks.py) for VilbertModel and every ViLBERT head."""

import torch

from vlhub import (
    VilbertConfig,
    VilbertForImageTextRetrieval,
    VilbertForMultipleChoice,
    VilbertForPreTraining,
    VilbertForQuestionAnswering,
    VilbertForReferringExpression,
    VilbertForVisualEntailment,
    VilbertForVisualReasoning,
    VilbertModel,
)

from .model_checks import ModelCase, ModelChecks, model_case_fixture

from .test_uniter_transformers_checks import BATCH, FEATURES, REGION_LABELS, REGIONS, TEXT, _generator
from .test_uniter_transformers_checks import text_and_regions as _uniter_inputs
from .test_uniter_transformers_checks import three_choices as _uniter_three_choices
from .test_uniter_transformers_checks import two_images as _uniter_two_images

TASKS = 4


def tiny_config(**overrides) -> VilbertConfig:
    settings = dict(
        vocab_size=40,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=16,
        region_feature_dim=FEATURES,
        num_region_labels=REGION_LABELS,
        visual_hidden_size=24,
        visual_num_hidden_layers=2,
        visual_num_attention_heads=2,
        visual_intermediate_size=24,
        bi_hidden_size=16,
        bi_num_attention_heads=2,
        visual_co_attention_layers=[0, 1],
        text_co_attention_layers=[1, 2],
    )
    return VilbertConfig(**{**settings, **overrides})


def text_and_regions(config, batch=BATCH) -> dict:
    """UNITER's padded text and regions (example 0 full, the others with 2 pad tokens and 2 pad regions) with
    ViLBERT's 5-d locations, and task ids for a multi-task model."""
    inputs = _uniter_inputs(config, batch)
    inputs["region_locations"] = torch.rand(batch, REGIONS, 5, generator=_generator(1))
    if config.num_task_tokens:
        inputs["task_ids"] = torch.tensor([[1], [3]] * (batch // 2) + [[1]] * (batch % 2))
    return inputs


def two_images(config) -> dict:
    inputs = _uniter_two_images(config)
    inputs["region_locations"] = torch.rand(BATCH, 2, REGIONS, 5, generator=_generator(2))
    return inputs


def three_choices(config) -> dict:
    inputs = _uniter_three_choices(config)
    inputs["region_locations"] = text_and_regions(config)["region_locations"]
    return inputs


def pretraining_targets(config, inputs):
    labels = torch.full((BATCH, TEXT), -100)
    labels[0, 2], labels[1, 1] = 7, 9
    region_labels = torch.zeros(BATCH, REGIONS, dtype=torch.long)
    region_labels[0, 1] = region_labels[1, 2] = 1
    targets = torch.softmax(torch.rand(BATCH, REGIONS, REGION_LABELS, generator=_generator(3)), -1)
    return {
        "labels": labels,
        "region_labels": region_labels,
        "region_class_targets": targets,
        "alignment_labels": torch.tensor([0, 1]),
    }


def mlm_only(config, inputs):
    return {"labels": pretraining_targets(config, inputs)["labels"]}


def class_labels(*values):
    return lambda config, inputs: {"labels": torch.tensor(values)}


POOLERS = (r"^vilbert\.[tv]_pooler\.",)
# After the last co-attention layer a stream no longer reaches the other: a loss on one stream's output alone gives
# no gradient to the other stream's tail (its layers after the exchange and its side of the last exchange).
_LAST = "vilbert\\.encoder\\.c_layer\\.1\\."
VISION_TAIL = (
    r"^vilbert\.encoder\.v_layer\.1\.",
    "^" + _LAST + r"(biattention\.(query1|key2|value2)|biOutput\.(dense1|LayerNorm1)|v_)",
)
MT = dict(num_task_tokens=TASKS)
# The referring-expression head runs the text layers before the last co-attention layer only.
RE_TEXT_LAYERS = tiny_config().text_co_attention_layers[-1]
CASES = [
    ModelCase("model", VilbertModel, tiny_config(), text_and_regions),
    ModelCase("model-task-tokens", VilbertModel, tiny_config(**MT), text_and_regions),
    ModelCase("model-sum-fusion", VilbertModel, tiny_config(fusion_method="sum"), text_and_regions),
    ModelCase("pretraining", VilbertForPreTraining, tiny_config(), text_and_regions, pretraining_targets),
    ModelCase(
        "pretraining-task-tokens", VilbertForPreTraining, tiny_config(**MT), text_and_regions, pretraining_targets
    ),
    ModelCase(
        "pretraining-mlm",
        VilbertForPreTraining,
        tiny_config(),
        text_and_regions,
        mlm_only,
        (r"^cls\.imagePredictions\.", r"^cls\.bi_seq_relationship\.", *POOLERS, *VISION_TAIL),
    ),
    ModelCase(
        "vqa",
        VilbertForQuestionAnswering,
        tiny_config(id2label={i: f"answer{i}" for i in range(5)}),
        text_and_regions,
        lambda config, inputs: {"labels": torch.rand(BATCH, 5, generator=_generator(4))},
    ),
    ModelCase(
        "vqa-beta-head",
        VilbertForQuestionAnswering,
        tiny_config(classifier_type="beta", id2label={i: f"answer{i}" for i in range(5)}),
        text_and_regions,
        lambda config, inputs: {"labels": torch.rand(BATCH, 5, generator=_generator(4))},
    ),
    ModelCase(
        "vqa-task-tokens",
        VilbertForQuestionAnswering,
        tiny_config(**MT),
        text_and_regions,
        lambda config, inputs: {"labels": torch.rand(BATCH, 2, generator=_generator(4))},
    ),
    ModelCase("ve", VilbertForVisualEntailment, tiny_config(), text_and_regions, class_labels(0, 2)),
    ModelCase(
        "retrieval",
        VilbertForImageTextRetrieval,
        tiny_config(),
        text_and_regions,
        lambda config, inputs: {"num_negatives": 1},
    ),
    ModelCase("nlvr2", VilbertForVisualReasoning, tiny_config(), two_images, class_labels(0, 1)),
    ModelCase(
        "re",
        VilbertForReferringExpression,
        tiny_config(),
        text_and_regions,
        class_labels(1, 2),
        num_returned_layers=RE_TEXT_LAYERS,
    ),
    ModelCase(
        "re-soft-targets",
        VilbertForReferringExpression,
        tiny_config(),
        text_and_regions,
        lambda config, inputs: {"labels": torch.rand(BATCH, REGIONS, generator=_generator(5))},
        num_returned_layers=RE_TEXT_LAYERS,
    ),
    ModelCase("vcr", VilbertForMultipleChoice, tiny_config(), three_choices, class_labels(2, 0)),
]


case = model_case_fixture(CASES)


class TestVilbertTransformersChecks(ModelChecks):
    pass
