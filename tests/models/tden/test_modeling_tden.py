"""transformers' common model and config tests (ModelTesterMixin, ConfigTester) for TDEN and every TDEN head.
transformers' generation tests are not in its source distribution (see tests/models/transformers_mixins.py)."""

import unittest

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

from ..region_testers import (
    NOT_YET_SORTED,
    CaptionerTestMixin,
    RegionModelTestMixin,
    RegionModelTester,
    choices,
    class_labels,
    label_floats,
    label_ids,
    soft_labels,
)
from ..transformers_mixins import ModelTesterMixin

pytestmark = NOT_YET_SORTED

NUM_REGION_LABELS = 11


class TdenModelTester(RegionModelTester):
    """Every block (sentence, object, cross-modal encoders, decoder) 2 layers of 32. One config serves every head:
    the decoder reads the question bidirectionally without generation tokens (VQA, VCR) and one label (the VCR
    head's one logit per choice; the VQA head then scores one answer). The hidden states the mixin reads are the
    sentence encoder's (`seq_length` = the text)."""

    def __init__(self, parent):
        super().__init__(
            parent,
            TdenConfig,
            region_location_dim=5,
            config_overrides={
                "num_visual_layers": 2,
                "num_cross_encoder_layers": 2,
                "num_decoder_layers": 2,
                "num_region_labels": NUM_REGION_LABELS,
                "similarity_pooler_size": 24,
                "classifier_pooler_size": 20,
                "bidirectional_decoder": True,
                "num_labels": 1,
                "pad_token_id": 0,
                "bos_token_id": 2,
                "eos_token_id": 3,
            },
        )
        self.seq_length = self.text_length


def both_streams(tester, inputs) -> dict:
    """The understanding stream and a generation stream (the text reversed)."""
    return {**inputs, "decoder_input_ids": inputs["input_ids"].flip(1)}


def caption(tester, inputs) -> dict:
    """Captions are causal and unpadded prefixes (a batch without an attention mask stays without one)."""
    mask = inputs.get("attention_mask")
    return {**inputs, "attention_mask": None if mask is None else torch.ones_like(mask)}


def pretraining_targets(tester, inputs) -> dict:
    """MLM labels (-1 ignored) at the first word, the generation stream's next words, the last region of each
    example masked (its class distribution) and one image per example (image-sentence matching)."""
    labels = torch.full(inputs["input_ids"].shape, -1)
    labels[:, 1] = label_ids([tester.batch_size], tester.vocab_size)
    masked_regions = torch.zeros(tester.batch_size, tester.num_regions, dtype=torch.bool)
    masked_regions[:, -1] = True
    return {
        "labels": labels,
        "decoder_labels": inputs["decoder_input_ids"].roll(-1, 1),
        "masked_regions": masked_regions,
        "region_class_targets": torch.softmax(label_floats([tester.batch_size, NUM_REGION_LABELS]), -1),
        "image_ids": torch.arange(tester.batch_size),
    }


class TdenModelTest(CaptionerTestMixin, RegionModelTestMixin, ModelTesterMixin, unittest.TestCase):
    model_tester_class = TdenModelTester
    all_model_classes = (
        TdenModel,
        TdenForPreTraining,
        TdenForConditionalGeneration,
        TdenForQuestionAnswering,
        TdenForImageTextRetrieval,
        TdenForMultipleChoice,
    )
    inputs_for = {
        "TdenModel": both_streams,
        "TdenForPreTraining": both_streams,
        "TdenForConditionalGeneration": caption,
        "TdenForMultipleChoice": choices(3),
    }
    labels_for = {
        "TdenForPreTraining": pretraining_targets,
        "TdenForConditionalGeneration": lambda tester, inputs: {"labels": inputs["input_ids"].roll(-1, 1)},
        "TdenForQuestionAnswering": soft_labels(1),
        "TdenForImageTextRetrieval": lambda tester, inputs: {
            "return_loss": True,
            "image_ids": torch.arange(tester.batch_size),
        },
        "TdenForMultipleChoice": class_labels(3),
    }
