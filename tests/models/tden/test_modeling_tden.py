"""transformers' common model and config tests (ModelTesterMixin, ConfigTester) for TDEN and every TDEN head.
transformers' generation tests are not in its source distribution (see tests/models/transformers_mixins.py)."""

import unittest

import pytest
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

from ...model_checks import assert_outputs_close
from ..region_testers import (
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

# transformers' whole common suite over every head: the full suite runs it (VLHUB_SLOW_TESTS=1, CI), the fast
# loop keeps vlhub's own checks of the same capabilities (tests/test_tden_transformers_checks.py).
pytestmark = pytest.mark.slow

NUM_REGION_LABELS = 11

# The hidden-state records each class returns with `output_hidden_states` on the tester's inputs: one per block and
# stream it runs (the sentence encoder over the understanding stream and over the generation stream, the object
# encoder, the cross-modal encoder, the decoder), as transformers' multi-stream models return them (LXMERT's heads).
HIDDEN_STATE_RECORDS = {
    "TdenModel": (
        "hidden_states",
        "generation_hidden_states",
        "vision_hidden_states",
        "cross_encoder_hidden_states",
        "decoder_hidden_states",
    ),
    "TdenForPreTraining": (
        "hidden_states",
        "generation_hidden_states",
        "vision_hidden_states",
        "cross_encoder_hidden_states",
        "decoder_hidden_states",
    ),
    # Captioning: the generation stream only (its sentence encoder is `hidden_states`), no cross-modal encoder.
    "TdenForConditionalGeneration": ("hidden_states", "vision_hidden_states", "decoder_hidden_states"),
    # VQA and VCR: the decoder reads the understanding stream bidirectionally (`bidirectional_decoder`).
    "TdenForQuestionAnswering": (
        "hidden_states",
        "vision_hidden_states",
        "cross_encoder_hidden_states",
        "decoder_hidden_states",
    ),
    "TdenForMultipleChoice": (
        "hidden_states",
        "vision_hidden_states",
        "cross_encoder_hidden_states",
        "decoder_hidden_states",
    ),
    # Retrieval: no cross-modal encoder, no decoder.
    "TdenForImageTextRetrieval": ("hidden_states", "vision_hidden_states"),
}


class TdenModelTester(RegionModelTester):
    """The sentence encoder 2 layers of 32 (the mixin's `num_hidden_layers`), the object encoder, the cross-modal
    encoder and the decoder one layer each: every parameter of the six classes is compared per dtype by
    `test_bc_torch_dtype`, and 2 layers per block made it 1016 tensors (7112 subtests, about 50 s). One config serves
    every head:
    the decoder reads the question bidirectionally without generation tokens (VQA, VCR) and one label (the VCR
    head's one logit per choice; the VQA head then scores one answer). The hidden states the mixin reads are the
    sentence encoder's (`seq_length` = the text)."""

    def __init__(self, parent):
        super().__init__(
            parent,
            TdenConfig,
            region_location_dim=5,
            config_overrides={
                "num_visual_layers": 1,
                "num_cross_encoder_layers": 1,
                "num_decoder_layers": 1,
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

    def test_attention_outputs(self):
        """transformers' check, one class at a time: `output_hidden_states` adds one record per stream the class runs
        (`HIDDEN_STATE_RECORDS`), which the mixin reads from the tester's `num_hidden_states_types`."""
        for model_class in self.all_model_classes:
            with self.subTest(model_class.__name__):
                self.model_tester.num_hidden_states_types = len(HIDDEN_STATE_RECORDS[model_class.__name__])
                self.all_model_classes = (model_class,)
                try:
                    super().test_attention_outputs()
                finally:
                    del self.all_model_classes  # the class's tuple again

    def test_hidden_state_records(self):
        """The records each class returns are the ones `HIDDEN_STATE_RECORDS` names (the mixin counts them only),
        with one attention record beside each hidden-state record, and `decoder_cross_attentions` with the decoder."""
        config, inputs_dict = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            with self.subTest(model_class.__name__):
                model = model_class(config).eval()
                with torch.no_grad():
                    outputs = model(
                        **self._prepare_for_class(inputs_dict, model_class),
                        output_hidden_states=True,
                        output_attentions=True,
                    )
                expected = HIDDEN_STATE_RECORDS[model_class.__name__]
                self.assertEqual({key for key in outputs if key.endswith("hidden_states")}, set(expected))
                attentions = {name.replace("hidden_states", "attentions") for name in expected}
                if "decoder_hidden_states" in expected:
                    attentions.add("decoder_cross_attentions")
                self.assertEqual({key for key in outputs if key.endswith("attentions")}, attentions)

    def test_eager_matches_sdpa_every_stream(self):
        """With every stream's records on the heads, the mixin's eager-vs-sdpa check reads `vision_hidden_states` (the
        object encoder only): here every output (logits and each stream's hidden states) is compared, with the
        tester's padded masks and with no attention mask at all."""
        config, inputs_dict = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            for attention_mask in (inputs_dict["attention_mask"], None):
                with self.subTest(model_class.__name__, attention_mask=attention_mask is not None):
                    eager = model_class._from_config(config, attn_implementation="eager").eval()
                    sdpa = model_class._from_config(config, attn_implementation="sdpa").eval()
                    sdpa.load_state_dict(eager.state_dict())
                    inputs = self._prepare_for_class({**inputs_dict, "attention_mask": attention_mask}, model_class)
                    with torch.no_grad():
                        assert_outputs_close(
                            sdpa(**inputs, output_hidden_states=True),
                            eager(**inputs, output_hidden_states=True),
                            atol=1e-5,
                            what=f"{model_class.__name__} sdpa vs eager",
                        )
