"""VL-BERT-base prec VQA (12 layers, 768 wide, 3129 answers), the released vl-bert-base-prec size fine-tuned for VQA."""

import torch

import vlhub

DESCRIPTION = "VL-BERT-base prec VQA"
# 36 bottom-up-attention regions plus the whole-image object 0 that VL-BERT always adds.
DEFAULT_REGIONS = 37


def build(attn_implementation: str) -> torch.nn.Module:
    config = vlhub.VlBertConfig(id2label={i: str(i) for i in range(3129)})
    config._attn_implementation = attn_implementation
    return vlhub.VlBertForQuestionAnswering(config).eval()


def make_inputs(model, batch: int, text: int, regions: int) -> dict:
    """`text` tokens laid out `[CLS] question [SEP] [MASK] [SEP]` and `regions` objects (object 0 = whole image)."""
    if text < 5:
        raise ValueError(f"the VQA layout needs at least 5 tokens, got text={text}")
    config = model.config
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1000, config.vocab_size, (batch, text), generator=generator)
    input_ids[:, 0], input_ids[:, -3], input_ids[:, -1] = 101, 102, 102
    input_ids[:, -2] = config.mask_token_id
    token_type_ids = torch.zeros(batch, text, dtype=torch.long)
    token_type_ids[:, -2:] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones(batch, text, dtype=torch.long),
        "token_type_ids": token_type_ids,
        "region_features": torch.rand(batch, regions, config.region_feature_dim, generator=generator),
        "region_locations": torch.rand(batch, regions, 4, generator=generator),
        "region_attention_mask": torch.ones(batch, regions, dtype=torch.long),
    }
