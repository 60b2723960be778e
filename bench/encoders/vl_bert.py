"""VL-BERT-base prec VQA (12 layers, 768 wide, 3129 answers), the released vl-bert-base-prec size fine-tuned for VQA."""

import torch

import vlhub

from . import random_inputs, vqa_model

DESCRIPTION = "VL-BERT-base prec VQA"
# 36 bottom-up-attention regions plus the whole-image object 0 that VL-BERT always adds.
DEFAULT_REGIONS = 37


def build(attn_implementation: str) -> torch.nn.Module:
    return vqa_model(vlhub.VlBertConfig, vlhub.VlBertForQuestionAnswering, attn_implementation)


def make_inputs(model, batch: int, text: int, regions: int) -> dict:
    """`text` tokens laid out `[CLS] question [SEP] [MASK] [SEP]` and `regions` objects (object 0 = whole image)."""
    if text < 5:
        raise ValueError(f"the VQA layout needs at least 5 tokens, got text={text}")
    inputs = random_inputs(model.config, batch, text, regions, location_dim=4)
    input_ids = inputs["input_ids"]
    input_ids[:, 0], input_ids[:, -3], input_ids[:, -1] = 101, 102, 102
    input_ids[:, -2] = model.config.mask_token_id
    inputs["token_type_ids"] = torch.zeros(batch, text, dtype=torch.long)
    inputs["token_type_ids"][:, -2:] = 1
    return inputs
