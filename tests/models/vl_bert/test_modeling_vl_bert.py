"""transformers' common model and config tests (ModelTesterMixin, ConfigTester) for VL-BERT and every VL-BERT head
(the precomputed-feature models; the end-to-end ResNet variant is a config of the same classes)."""

import unittest

import pytest
import torch

from vlhub import (
    VlBertConfig,
    VlBertForMultipleChoice,
    VlBertForPreTraining,
    VlBertForQuestionAnswering,
    VlBertForReferringExpression,
    VlBertModel,
)

from ..region_testers import (
    RegionModelTestMixin,
    RegionModelTester,
    choices,
    class_labels,
    label_floats,
    label_ids,
    soft_labels,
    text_labels,
)
from ..transformers_mixins import ModelTesterMixin

# transformers' whole common suite over every head: the full suite runs it (VLHUB_SLOW_TESTS=1, CI), the fast
# loop keeps vlhub's own checks of the same capabilities (tests/test_vl_bert_transformers_checks.py).
pytestmark = pytest.mark.slow

MASK, NUM_REGION_LABELS, NUM_VCR_REGION_LABELS, NUM_ANSWERS = 4, 11, 6, 5


class VlBertModelTester(RegionModelTester):
    def __init__(self, parent):
        super().__init__(
            parent,
            VlBertConfig,
            region_location_dim=4,
            config_overrides={
                "geometry_embedding_dim": 4,
                "num_region_labels": NUM_REGION_LABELS,
                "num_vcr_region_labels": NUM_VCR_REGION_LABELS,
                "mask_token_id": MASK,
                "id2label": {i: f"answer{i}" for i in range(NUM_ANSWERS)},
            },
        )
        self.seq_length = self.text_length + self.num_regions + 1  # [text | objects | [END]]


def answer_slot(tester, inputs) -> dict:
    """The VQA head reads its answer at the last [MASK]: every text (the mixin's extra rows too) starts with one."""
    input_ids = inputs["input_ids"].clone()
    input_ids[..., 0] = MASK
    return {**inputs, "input_ids": input_ids}


def pretraining_targets(tester, inputs) -> dict:
    """MLM labels, the first region of each example masked with its MVRC class distribution."""
    region_masks = torch.zeros(tester.batch_size, tester.num_regions, dtype=torch.bool)
    region_masks[:, 0] = True
    return {
        **text_labels(tester, inputs),
        "region_masks": region_masks,
        "region_class_targets": torch.softmax(
            label_floats([tester.batch_size, tester.num_regions, NUM_REGION_LABELS]), -1
        ),
    }


def vcr_targets(tester, inputs) -> dict:
    return {
        **class_labels(3)(tester, inputs),
        "region_labels": label_ids([tester.batch_size, tester.num_regions], NUM_VCR_REGION_LABELS),
    }


class VlBertModelTest(RegionModelTestMixin, ModelTesterMixin, unittest.TestCase):
    model_tester_class = VlBertModelTester
    all_model_classes = (
        VlBertModel,
        VlBertForPreTraining,
        VlBertForQuestionAnswering,
        VlBertForReferringExpression,
        VlBertForMultipleChoice,
    )
    inputs_for = {"VlBertForQuestionAnswering": answer_slot, "VlBertForMultipleChoice": choices(3)}
    labels_for = {
        "VlBertForPreTraining": pretraining_targets,
        "VlBertForQuestionAnswering": soft_labels(NUM_ANSWERS),
        "VlBertForReferringExpression": lambda tester, inputs: {
            "labels": (label_floats([tester.batch_size, tester.num_regions]) > 0.5).float()
        },
        "VlBertForMultipleChoice": vcr_targets,
    }
