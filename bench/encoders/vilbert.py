"""ViLBERT VQA at the released size: the 6-layer / 6-co-attention model (`bert_base_6layer_6conect.json`: BERT-base
text stream, 1024-wide 6-layer visual stream, 6 co-attention layers) with the 3129-answer head."""

import torch

import vlhub

from . import random_inputs, vqa_model

DESCRIPTION = "ViLBERT 6-layer/6-co-attention VQA"
DEFAULT_REGIONS = 37  # 36 detected regions + the global image token, as the pre-training data


def build(attn_implementation: str) -> torch.nn.Module:
    return vqa_model(vlhub.VilbertConfig, vlhub.VilbertForQuestionAnswering, attn_implementation)


def make_inputs(model, batch: int, text: int, regions: int) -> dict:
    inputs = random_inputs(model.config, batch, text, regions, location_dim=5)
    inputs["region_locations"][:, 0] = torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0])  # the global image token
    return inputs
