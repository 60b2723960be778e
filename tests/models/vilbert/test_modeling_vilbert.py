"""transformers' common model and config tests (ModelTesterMixin, ConfigTester) for ViLBERT and every ViLBERT head."""

import copy
import unittest
from unittest import mock

import pytest
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
# loop keeps vlhub's own checks of the same capabilities (tests/test_vilbert_transformers_checks.py).
pytestmark = pytest.mark.slow

NUM_REGION_LABELS = 11


class VilbertModelTester(RegionModelTester):
    """The text stream 2 layers of 32 (4 heads: the mixin's `num_hidden_layers`), the visual stream one, and one
    co-attention exchange between the text layers: the text layer before it, the exchange and each stream's layer
    after it all run. Every parameter of the eight heads is compared per dtype by `test_bc_torch_dtype` (and loaded
    again by each of the 24 eager-vs-SDPA variants), so the streams the mixin does not count keep one layer, as in
    TDEN's tester. The hidden states the mixin reads are the text stream's (`seq_length` = the text)."""

    def __init__(self, parent):
        super().__init__(
            parent,
            VilbertConfig,
            region_location_dim=5,
            config_overrides={
                "num_region_labels": NUM_REGION_LABELS,
                "visual_hidden_size": 32,
                "visual_num_hidden_layers": 1,
                "visual_num_attention_heads": 4,
                "visual_intermediate_size": 37,
                "bi_hidden_size": 32,
                "bi_num_attention_heads": 4,
                "visual_co_attention_layers": [0],
                "text_co_attention_layers": [1],
            },
        )
        self.seq_length = self.text_length
        self.num_hidden_states_types = 2  # the text stream's hidden_states and vision_hidden_states


def pretraining_targets(tester, inputs) -> dict:
    """MLM labels, the last region of each example masked (its class distribution) and alignment labels."""
    region_labels_ = torch.zeros(tester.batch_size, tester.num_regions, dtype=torch.long)
    region_labels_[:, -1] = 1
    return {
        **text_labels(tester, inputs),
        "region_labels": region_labels_,
        "region_class_targets": torch.softmax(
            label_floats([tester.batch_size, tester.num_regions, NUM_REGION_LABELS]), -1
        ),
        "alignment_labels": label_ids([tester.batch_size], 2),
    }


class VilbertModelTest(RegionModelTestMixin, ModelTesterMixin, unittest.TestCase):
    model_tester_class = VilbertModelTester
    all_model_classes = (
        VilbertModel,
        VilbertForPreTraining,
        VilbertForQuestionAnswering,
        VilbertForVisualEntailment,
        VilbertForImageTextRetrieval,
        VilbertForVisualReasoning,
        VilbertForReferringExpression,
        VilbertForMultipleChoice,
    )
    inputs_for, labels_for = eight_head_layout("Vilbert", pretraining_targets)

    def _run_with_the_referring_expression_text_layers(self, mixin_test):
        """A mixin test on every class but the referring-expression head, then on that head counting the text layers
        it runs: it builds the text stream only up to the last co-attention layer (`text_co_attention_layers[-1]`
        layers, see `VilbertForReferringExpression`), so it returns that many text attentions and one more hidden
        state, not `num_hidden_layers`."""
        others = tuple(cls for cls in self.all_model_classes if cls is not VilbertForReferringExpression)
        with mock.patch.object(self, "all_model_classes", others):
            mixin_test()
        tester = self.model_tester
        config, inputs = tester.prepare_config_and_inputs_for_common()
        text_layers = config.text_co_attention_layers[-1]
        with (
            mock.patch.object(self, "all_model_classes", (VilbertForReferringExpression,)),
            mock.patch.object(
                tester, "prepare_config_and_inputs_for_common", lambda: (copy.deepcopy(config), copy.deepcopy(inputs))
            ),
            mock.patch.object(tester, "num_hidden_layers", text_layers),
        ):
            mixin_test()

    def test_hidden_states_output(self):
        self._run_with_the_referring_expression_text_layers(super().test_hidden_states_output)

    def test_attention_outputs(self):
        self._run_with_the_referring_expression_text_layers(super().test_attention_outputs)
