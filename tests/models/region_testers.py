"""What the five architectures' testers share: tiny text-and-regions inputs in the layout transformers' mixin asks
for (`prepare_config_and_inputs_for_common`), and per-head input reshaping and labels in `_prepare_for_class`."""

import copy
import random
import unittest
from collections.abc import Callable

import torch

from .transformers_mixins import ConfigTester, floats_tensor, ids_tensor

# A head's inputs from the common text-and-regions batch, and the labels that give it a loss.
InputsFor = Callable[[object, dict], dict]


def right_padded_mask(batch: int, length: int) -> torch.Tensor:
    """`(batch, length)` attention mask: row 0 full, the others 1 to `length` leading ones."""
    lengths = ids_tensor([batch], length) + 1
    lengths[0] = length
    return (torch.arange(length) < lengths[:, None]).long()


class RegionModelTester:
    """Tiny config and inputs: `batch_size` examples of up to `text_length` tokens and `num_regions` regions,
    right-padded as the processors pad (example 0 full, the others of random lengths). `seq_length` is what the models' hidden states
    cover (text + regions for the single-stream models); a tester overrides it where the layout differs."""

    def __init__(
        self,
        parent,
        config_class,
        batch_size=2,
        text_length=7,
        num_regions=3,
        region_feature_dim=16,
        region_location_dim=5,
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        is_training=True,
        config_overrides=None,
    ):
        self.parent = parent
        self.config_class = config_class
        self.batch_size = batch_size
        self.text_length = text_length
        self.num_regions = num_regions
        self.region_feature_dim = region_feature_dim
        self.region_location_dim = region_location_dim
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.is_training = is_training
        self.config_overrides = config_overrides or {}
        self.seq_length = text_length + num_regions

    def get_config(self):
        return self.config_class(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=self.intermediate_size,
            max_position_embeddings=32,
            region_feature_dim=self.region_feature_dim,
            **self.config_overrides,
        )

    def inputs(self) -> dict:
        batch = self.batch_size
        input_ids = ids_tensor([batch, self.text_length], self.vocab_size)
        return {
            "input_ids": input_ids,
            "attention_mask": right_padded_mask(batch, self.text_length),
            "region_features": floats_tensor([batch, self.num_regions, self.region_feature_dim]),
            "region_locations": floats_tensor([batch, self.num_regions, self.region_location_dim]),
            "region_attention_mask": right_padded_mask(batch, self.num_regions),
        }

    def prepare_config_and_inputs_for_common(self):
        return self.get_config(), self.inputs()


class RegionModelTestMixin:
    """The test class's setup (`model_tester_class`, ConfigTester on its config class) and `_prepare_for_class` from
    two tables: `inputs_for[class name](tester, inputs)` reshapes the common batch for a head (two images, several
    choices), `labels_for[class name](tester, inputs)` gives its loss."""

    model_tester_class: type[RegionModelTester]
    inputs_for: dict[str, InputsFor] = {}
    labels_for: dict[str, InputsFor] = {}
    # The inputs besides `input_ids` that the mixin's eager-vs-sdpa check passes on (extended to its batch of 7).
    additional_model_inputs = ["attention_mask", "region_features", "region_locations", "region_attention_mask"]

    def setUp(self):
        self.model_tester = self.model_tester_class(self)
        self.config_tester = ConfigTester(self, config_class=self.model_tester.config_class, hidden_size=48)

    def test_config(self):
        self.config_tester.run_common_tests()

    def _prepare_for_class(self, inputs_dict, model_class, return_labels=False):
        inputs = copy.deepcopy(inputs_dict)
        name = model_class.__name__
        if name in self.inputs_for:
            inputs = self.inputs_for[name](self.model_tester, inputs)
        if return_labels and name in self.labels_for:
            inputs.update(self.labels_for[name](self.model_tester, inputs))
        return inputs


def label_ids(shape: list[int], num_values: int) -> torch.Tensor:
    """Labels are the same on every call (the mixin compares runs that each prepare their own labels)."""
    return ids_tensor(shape, num_values, rng=random.Random(0))


def label_floats(shape: list[int]) -> torch.Tensor:
    return floats_tensor(shape, rng=random.Random(0))


def class_labels(num_classes: int) -> InputsFor:
    """One class id per example."""
    return lambda tester, inputs: {"labels": label_ids([tester.batch_size], num_classes)}


def soft_labels(num_labels: int) -> InputsFor:
    """Soft scores in [0, 1] per answer (VQA's targets)."""
    return lambda tester, inputs: {"labels": label_floats([tester.batch_size, num_labels])}


def text_labels(tester, inputs) -> dict:
    """A masked-LM target at every text position."""
    return {"labels": label_ids(list(inputs["input_ids"].shape), tester.vocab_size)}


def region_labels(tester, inputs) -> dict:
    """One region index per example (referring expressions)."""
    return {"labels": label_ids([tester.batch_size], tester.num_regions)}


def two_images(tester, inputs) -> dict:
    """NLVR2: each example's text with two images (the second the first image of the next example)."""
    out = dict(inputs)
    for key in ("region_features", "region_locations", "region_attention_mask"):
        out[key] = torch.stack([inputs[key], inputs[key].roll(1, dims=0)], dim=1)
    return out


def choices(num_choices: int) -> InputsFor:
    """Multiple choice: `num_choices` texts per example (the example's words rolled by the choice's index), one
    image."""

    def build(tester, inputs):
        out = dict(inputs)
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        out["input_ids"] = torch.stack([ids.roll(shift, dims=-1) for shift in range(num_choices)], dim=1)
        # The mixin's eager-vs-sdpa check also runs without an attention mask.
        out["attention_mask"] = None if mask is None else torch.stack([mask] * num_choices, dim=1)
        return out

    return build


class CaptionerTestMixin:
    """A captioning architecture's test class: transformers' `GenerationTesterMixin` cannot be inherited."""

    @unittest.skip(
        "transformers' GenerationTesterMixin (tests/generation/test_utils.py) is not in its source distribution, "
        "so the captioner's tester cannot inherit it (issue 29: vlhub's own generation checks)"
    )
    def test_generation_tester_mixin_inheritance(self):
        pass


def eight_head_layout(prefix: str, pretraining_targets: InputsFor) -> tuple[dict, dict]:
    """`inputs_for` and `labels_for` of the eight-head layout UNITER and ViLBERT share (pre-training, VQA, visual
    entailment, retrieval, NLVR2, referring expressions, multiple choice): class names `<prefix>For<Head>`."""
    inputs_for = {f"{prefix}ForVisualReasoning": two_images, f"{prefix}ForMultipleChoice": choices(3)}
    labels_for = {
        f"{prefix}ForPreTraining": pretraining_targets,
        f"{prefix}ForQuestionAnswering": soft_labels(2),
        f"{prefix}ForVisualEntailment": class_labels(3),
        f"{prefix}ForImageTextRetrieval": lambda tester, inputs: {"num_negatives": 1},
        f"{prefix}ForVisualReasoning": class_labels(2),
        f"{prefix}ForReferringExpression": region_labels,
        f"{prefix}ForMultipleChoice": class_labels(3),
    }
    return inputs_for, labels_for
