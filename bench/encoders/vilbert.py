"""ViLBERT VQA at the released size: the 6-layer / 6-co-attention model (`bert_base_6layer_6conect.json`: BERT-base
text stream, 1024-wide 6-layer visual stream, 6 co-attention layers) with the 3129-answer head."""

import torch

import vlhub

DESCRIPTION = "ViLBERT 6-layer/6-co-attention VQA"
DEFAULT_REGIONS = 37  # 36 detected regions + the global image token, as the pre-training data


def build(attn_implementation: str) -> torch.nn.Module:
    config = vlhub.VilbertConfig(id2label={i: str(i) for i in range(3129)})
    config._attn_implementation = attn_implementation
    return vlhub.VilbertForQuestionAnswering(config).eval()


def make_inputs(model, batch: int, text: int, regions: int) -> dict:
    config = model.config
    generator = torch.Generator().manual_seed(0)
    locations = torch.rand(batch, regions, 5, generator=generator)
    locations[:, 0] = torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0])  # the global image token
    return {
        "input_ids": torch.randint(1000, config.vocab_size, (batch, text), generator=generator),
        "attention_mask": torch.ones(batch, text, dtype=torch.long),
        "region_features": torch.rand(batch, regions, config.region_feature_dim, generator=generator),
        "region_locations": locations,
        "region_attention_mask": torch.ones(batch, regions, dtype=torch.long),
    }
