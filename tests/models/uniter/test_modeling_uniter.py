"""transformers' common model and config tests (ModelTesterMixin, ConfigTester) for UNITER and every UNITER head."""

import unittest

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

from ..region_testers import (
    RegionModelTestMixin,
    RegionModelTester,
    eight_head_layout,
    label_floats,
    label_ids,
    text_labels,
)
from ..transformers_mixins import ModelTesterMixin

# transformers' whole common suite over every head: the full suite runs it (VLHUB_SLOW_TESTS=1, CI), the fast
# loop keeps vlhub's own checks of the same capabilities (tests/test_uniter_transformers_checks.py).
pytestmark = pytest.mark.slow

NUM_REGION_LABELS, NUM_ANSWERS = 11, 5


class UniterModelTester(RegionModelTester):
    def __init__(self, parent):
        super().__init__(
            parent,
            UniterConfig,
            region_location_dim=7,
            config_overrides={"num_region_labels": NUM_REGION_LABELS, "type_vocab_size": 3},
        )


def pretraining_targets(tester, inputs) -> dict:
    """Every pre-training objective at once: MLM labels, the last region of each example masked (MRFR and MRC-kl
    targets for it) and ITM labels."""
    region_masks = torch.zeros(tester.batch_size, tester.num_regions, dtype=torch.bool)
    region_masks[:, -1] = True
    return {
        **text_labels(tester, inputs),
        "region_masks": region_masks,
        "region_feature_targets": label_floats([tester.batch_size, tester.region_feature_dim]),
        "region_class_targets": torch.softmax(label_floats([tester.batch_size, NUM_REGION_LABELS]), -1),
        "itm_labels": label_ids([tester.batch_size], 2),
    }


class UniterModelTest(RegionModelTestMixin, ModelTesterMixin, unittest.TestCase):
    model_tester_class = UniterModelTester
    all_model_classes = (
        UniterModel,
        UniterForPreTraining,
        UniterForQuestionAnswering,
        UniterForVisualEntailment,
        UniterForImageTextRetrieval,
        UniterForVisualReasoning,
        UniterForReferringExpression,
        UniterForMultipleChoice,
    )
    inputs_for, labels_for = eight_head_layout("Uniter", pretraining_targets)
