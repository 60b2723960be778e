"""UNITER-base VQA (12 layers, 768 wide, 3129 answers), the released uniter-base size."""

import torch

import vlhub

from . import random_inputs, vqa_model

DESCRIPTION = "UNITER-base VQA"
DEFAULT_REGIONS = 36


def build(attn_implementation: str, size: str = "base") -> torch.nn.Module:
    return vqa_model(vlhub.UniterConfig, vlhub.UniterForQuestionAnswering, attn_implementation, size)


def make_inputs(model, batch: int, text: int, regions: int) -> dict:
    return random_inputs(model.config, batch, text, regions, location_dim=7)
