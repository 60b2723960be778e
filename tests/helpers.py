"""Small builders shared by the unit tests (tiny random models, synthetic regions)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import BertTokenizer

import vlhub


def random_regions(num_regions: int, feature_dim: int, image_size=(48, 64), seed: int = 0, scores=True):
    generator = torch.Generator().manual_seed(seed)
    height, width = image_size
    xy = torch.rand(num_regions, 2, generator=generator) * torch.tensor([width / 2, height / 2])
    wh = torch.rand(num_regions, 2, generator=generator) * torch.tensor([width / 2, height / 2]) + 1
    boxes = torch.cat([xy, xy + wh], dim=1)
    return vlhub.RegionFeatures(
        features=torch.rand(num_regions, feature_dim, generator=generator),
        boxes=boxes,
        image_size=image_size,
        scores=torch.rand(num_regions, generator=generator).sort(descending=True).values if scores else None,
    )


def tiny_processor(vocab: Path, config, **region_settings) -> vlhub.UniterProcessor:
    settings = {"min_regions": 2, "max_regions": 10, **region_settings}
    return vlhub.UniterProcessor(
        feature_extractor=vlhub.UniterRegionProcessor(region_feature_dim=config.region_feature_dim, **settings),
        tokenizer=BertTokenizer(vocab=str(vocab), do_lower_case=True),
    )


def save_tiny(folder: Path, model_class, config, vocab: Path, seed: int = 0, **config_overrides):
    torch.manual_seed(seed)
    for key, value in config_overrides.items():
        setattr(config, key, value)
    model = model_class(config).eval()
    model.save_pretrained(folder)
    tiny_processor(vocab, config).save_pretrained(folder)
    return model
