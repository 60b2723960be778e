"""transformers' common model and config tests (ModelTesterMixin, ConfigTester) for Unified VLP and every Unified VLP
head. transformers' generation tests are not in its source distribution (see tests/models/transformers_mixins.py)."""

import unittest

import pytest
import torch

from vlhub import (
    UnifiedVlpConfig,
    UnifiedVlpForConditionalGeneration,
    UnifiedVlpForPreTraining,
    UnifiedVlpForQuestionAnswering,
    UnifiedVlpModel,
)

from ..region_testers import (
    CaptionerTestMixin,
    RegionModelTestMixin,
    RegionModelTester,
    label_ids,
    right_padded_mask,
    soft_labels,
)
from ..transformers_mixins import ModelTesterMixin, ids_tensor

# transformers' whole common suite over every head: the full suite runs it (VLHUB_SLOW_TESTS=1, CI), the fast
# loop keeps vlhub's own checks of the same capabilities (tests/test_unified_vlp_transformers_checks.py).
pytestmark = pytest.mark.slow

PAD, REGION, CLS, SEP, MASK = 0, 1, 2, 3, 4
NUM_REGIONS, NUM_CLASSES, NUM_ANSWERS = 3, 5, 5


class UnifiedVlpModelTester(RegionModelTester):
    """`[CLS] r r r [SEP] w ... w [SEP]`: the regions fill slots 1..num_regions of the text sequence."""

    def __init__(self, parent):
        super().__init__(
            parent,
            UnifiedVlpConfig,
            region_location_dim=6 + NUM_CLASSES,
            num_regions=NUM_REGIONS,
            config_overrides={
                "num_regions": NUM_REGIONS,
                "region_location_dim": 6 + NUM_CLASSES,
                "region_embed_dim": 24,
                "pad_token_id": PAD,
                "region_token_id": REGION,
                "bos_token_id": CLS,
                "eos_token_id": SEP,
                "mask_token_id": MASK,
                "id2label": {i: f"answer{i}" for i in range(NUM_ANSWERS)},
            },
        )
        self.text_start = self.num_regions + 2
        self.seq_length = self.text_start + self.text_length

    def inputs(self) -> dict:
        inputs = super().inputs()
        words = ids_tensor([self.batch_size, self.text_length], self.vocab_size - MASK - 1) + MASK + 1
        text_mask = right_padded_mask(self.batch_size, self.text_length)
        prefix = torch.tensor([CLS] + [REGION] * self.num_regions + [SEP]).expand(self.batch_size, -1)
        inputs["input_ids"] = torch.cat([prefix, words * text_mask], dim=1)
        inputs["attention_mask"] = torch.cat([torch.ones_like(prefix), text_mask], dim=1)
        return inputs


def text_position_labels(tester, inputs) -> dict:
    """A masked-LM target at the first word of each example (every other position ignored)."""
    labels = torch.full(inputs["input_ids"].shape, -100)
    labels[:, tester.text_start] = label_ids([tester.batch_size], tester.vocab_size)
    return {"labels": labels}


def masked_position_labels(tester, inputs) -> dict:
    """The captioner's targets: a word at the first text position of each example."""
    return {
        "masked_positions": torch.full((tester.batch_size, 1), tester.text_start),
        "labels": label_ids([tester.batch_size, 1], tester.vocab_size),
    }


class UnifiedVlpModelTest(CaptionerTestMixin, RegionModelTestMixin, ModelTesterMixin, unittest.TestCase):
    model_tester_class = UnifiedVlpModelTester
    all_model_classes = (
        UnifiedVlpModel,
        UnifiedVlpForPreTraining,
        UnifiedVlpForConditionalGeneration,
        UnifiedVlpForQuestionAnswering,
    )
    labels_for = {
        "UnifiedVlpForPreTraining": text_position_labels,
        "UnifiedVlpForConditionalGeneration": masked_position_labels,
        "UnifiedVlpForQuestionAnswering": soft_labels(NUM_ANSWERS),
    }

    def _logits_scored_by_loss(self, model, logits):
        """The captioner's loss is on the masked positions only (`masked_position_labels`: the first word), which is
        what `shift_labels` lines up with; its logits without `masked_positions` cover the whole sequence."""
        if isinstance(model, UnifiedVlpForConditionalGeneration):
            start = self.model_tester.text_start
            return logits[:, start : start + 1]
        return logits
