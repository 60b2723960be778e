"""TDEN-base VQA (sentence encoder 12, object encoder 6, cross-modal encoder 6, decoder 6 layers, 768 wide, 3129
answers; 100 regions + [IMG] as the VQA release)."""

import torch

import vlhub

from . import random_inputs, vqa_model

DESCRIPTION = "TDEN-base VQA"
DEFAULT_REGIONS = 101


def build(attn_implementation: str, size: str = "base") -> torch.nn.Module:
    return vqa_model(
        vlhub.TdenConfig, vlhub.TdenForQuestionAnswering, attn_implementation, size, bidirectional_decoder=True
    )


def make_inputs(model, batch: int, text: int, regions: int) -> dict:
    return random_inputs(model.config, batch, text, regions, location_dim=5)
