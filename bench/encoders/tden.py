"""TDEN-base VQA (sentence encoder 12, object encoder 6, cross-modal encoder 6, decoder 6 layers, 768 wide, 3129
answers; 100 regions + [IMG] as the VQA release)."""

import torch

import vlhub

DESCRIPTION = "TDEN-base VQA"
DEFAULT_REGIONS = 101


def build(attn_implementation: str) -> torch.nn.Module:
    config = vlhub.TdenConfig(bidirectional_decoder=True, id2label={i: str(i) for i in range(3129)})
    config._attn_implementation = attn_implementation
    return vlhub.TdenForQuestionAnswering(config).eval()


def make_inputs(model, batch: int, text: int, regions: int) -> dict:
    config = model.config
    generator = torch.Generator().manual_seed(0)
    return {
        "input_ids": torch.randint(1000, config.vocab_size, (batch, text), generator=generator),
        "attention_mask": torch.ones(batch, text, dtype=torch.long),
        "region_features": torch.rand(batch, regions, config.region_feature_dim, generator=generator),
        "region_locations": torch.rand(batch, regions, 5, generator=generator),
        "region_attention_mask": torch.ones(batch, regions, dtype=torch.long),
    }
