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


def tiny_detector_config(**overrides):
    """A bottom-up-attention detector small enough for unit tests: 16-d region features, 5 classes, 3 attributes."""
    from vlhub.processing.detector import DetectorConfig

    settings = dict(
        depth=50,
        width_per_group=2,
        stem_out_channels=4,
        res2_out_channels=2,
        rpn_hidden_channels=4,
        num_classes=5,
        num_attributes=3,
        attribute_embedding_dim=4,
        attribute_hidden_dim=8,
        min_size=64,
        max_size=96,
        rpn_pre_nms_top_n=200,
        rpn_post_nms_top_n=20,
        min_boxes=2,
        max_boxes=10,
    )
    settings.update(overrides)
    return DetectorConfig(**settings)


def tiny_detector(seed: int = 0, **overrides):
    """A random-weight `RegionExtractor` of `tiny_detector_config` (BatchNorm statistics randomised too)."""
    from vlhub.processing.detector import RegionExtractor

    torch.manual_seed(seed)
    extractor = RegionExtractor(tiny_detector_config(**overrides))
    with torch.no_grad():
        for name, buffer in extractor.named_buffers():
            if name.endswith("running_var"):
                buffer.uniform_(0.5, 1.5)
            elif name.endswith(("norm.weight", "norm.bias", "running_mean")):
                buffer.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.1)
    return extractor


def write_test_image(path: Path, height: int = 40, width: int = 56, seed: int = 0, mode: str = "RGB") -> Path:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).convert(mode).save(path)
    return path


def vqa_single_and_batched(vqa, images, questions, top_k: int = 3) -> list:
    """A VQA pipeline's answers one example at a time and in batches of 2: the same answers and top scores either
    way (asserted). Returns the one-at-a-time answers."""
    import pytest

    single = [vqa(image=r, question=q, top_k=top_k) for r, q in zip(images, questions)]
    batched = vqa(image=images, question=questions, top_k=top_k, batch_size=2)
    for one, many in zip(single, batched):
        assert [a["answer"] for a in one] == [a["answer"] for a in many]
        assert one[0]["score"] == pytest.approx(many[0]["score"], abs=1e-5)
    return single


def end_captions_at(model, eos: int, region_attention_mask: torch.Tensor, steps: tuple[int, int]) -> list:
    """Steer a captioner's next-word scores so that every beam of image 0 emits `eos` from step `steps[0]` on and of
    image 1 from `steps[1]` on, never before (a forward hook; the two images' rows are told apart by the sums of their
    `region_attention_mask` rows, which must differ). Returns the list to which each forward appends its `(image 0
    rows, image 1 rows)`; its length is the next step's number (the prompt's forward gives step 0's scores)."""
    first = region_attention_mask[0].sum()
    assert first != region_attention_mask[1].sum(), "the two images need region masks of different sizes"
    rows_fed = []

    def steer(module, args, kwargs, output):
        step = len(rows_fed)
        image_0 = kwargs["region_attention_mask"].sum(-1) == first
        rows_fed.append((int(image_0.sum()), int((~image_0).sum())))
        logits = output.logits.clone()
        logits[:, -1, eos] -= 100.0
        logits[image_0, -1, eos] += 200.0 if step >= steps[0] else 0.0
        logits[~image_0, -1, eos] += 200.0 if step >= steps[1] else 0.0
        output.logits = logits
        return output

    model.register_forward_hook(steer, with_kwargs=True)
    return rows_fed
