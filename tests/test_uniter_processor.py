import pytest
import torch
from transformers import AutoProcessor

import vlhub
from vlhub.modeling.uniter import uniter_locations

from .helpers import random_regions, tiny_processor


def test_processor_outputs_and_padding(tiny_uniter_config, tiny_vocab):
    processor = tiny_processor(tiny_vocab, tiny_uniter_config)
    regions = [random_regions(3, 16, seed=1), random_regions(6, 16, seed=2)]
    out = processor(text=["what colour is the cat ?", "a dog"], regions=regions, return_tensors="pt")
    assert set(out) == {
        "input_ids",
        "attention_mask",
        "token_type_ids",
        "region_features",
        "region_locations",
        "region_attention_mask",
    }
    tok = processor.tokenizer
    assert out["input_ids"][0, 0] == tok.cls_token_id and out["input_ids"][1, 3] == tok.sep_token_id
    assert out["attention_mask"].sum(1).tolist() == [8, 4]
    assert out["token_type_ids"].abs().sum() == 0
    # min_regions=2, confidence 0.2: clamp(#(conf > 0.2), 2, 10) regions each
    counts = [max(2, int((r.scores > 0.2).sum())) for r in regions]
    assert out["region_attention_mask"].sum(1).tolist() == counts
    assert out["region_features"].shape == (2, max(counts), 16)
    assert out["region_locations"].shape == (2, max(counts), 7)
    assert out["region_features"][0, counts[0] :].abs().sum() == 0  # padding
    assert torch.equal(out["region_features"][1, : counts[1]], regions[1].features[: counts[1]].half().float())


def test_uniter_locations_formula():
    regions = vlhub.RegionFeatures(torch.ones(1, 4), torch.tensor([[10.0, 20.0, 40.0, 60.0]]), (100, 200))
    loc = uniter_locations(regions, float16_storage=False)[0]
    expected = torch.tensor([0.05, 0.2, 0.2, 0.6, 0.15, 0.4, 0.06])
    assert torch.allclose(loc, expected)
    rounded = uniter_locations(regions, float16_storage=True)[0]
    assert torch.equal(rounded[:6], expected[:6].half().float())


def test_uniter_locations_equal_the_formula_in_tensors_bit_for_bit():
    """The locations are computed in numpy (cheaper per op); they equal the same float32 arithmetic in PyTorch
    exactly, float16 rounding included, over boxes of every scale (subnormal and overflowing float16 included)."""
    generator = torch.Generator().manual_seed(0)
    for trial in range(200):
        count = int(torch.randint(1, 40, (1,), generator=generator))
        height, width = [(480, 640), (1, 1), (0.75, 1.5), (7, 3), (1 << 20, 1 << 22)][trial % 5]
        x1 = torch.rand(count, generator=generator) * width * 0.9
        y1 = torch.rand(count, generator=generator) * height * 0.9
        scale = 10.0 ** float(torch.randint(-9, 1, (1,), generator=generator))
        x2 = torch.minimum(x1 + torch.rand(count, generator=generator) * width * scale, torch.tensor(float(width)))
        y2 = torch.minimum(y1 + torch.rand(count, generator=generator) * height * scale, torch.tensor(float(height)))
        regions = vlhub.RegionFeatures(torch.ones(count, 4), torch.stack([x1, y1, x2, y2], 1), (height, width))
        size = torch.tensor([width, height], dtype=torch.float32)
        corner = regions.boxes[:, :2] / size
        extent = (regions.boxes[:, 2:] - regions.boxes[:, :2]) / size
        for rounded in (True, False):
            stored = torch.cat([corner, corner + extent, extent], dim=1)
            stored = stored.half().float() if rounded else stored
            expected = torch.cat([stored, stored[:, 4:5] * stored[:, 5:6]], dim=1)
            got = uniter_locations(regions, float16_storage=rounded)
            assert got.dtype == torch.float32 and got.shape == (count, 7)
            assert torch.equal(got.view(torch.int32), expected.view(torch.int32)), (trial, rounded)


def test_processor_save_load_round_trip(tmp_path, tiny_uniter_config, tiny_vocab):
    processor = tiny_processor(tiny_vocab, tiny_uniter_config, confidence_threshold=0.5, max_regions=7)
    processor.save_pretrained(tmp_path)
    tiny_uniter_config.save_pretrained(tmp_path)
    loaded = AutoProcessor.from_pretrained(tmp_path)
    assert isinstance(loaded, vlhub.UniterProcessor)
    assert loaded.feature_extractor.confidence_threshold == 0.5 and loaded.feature_extractor.max_regions == 7
    regions = [random_regions(5, 16, seed=3)]
    a = processor(text="a red cat", regions=regions)
    b = loaded(text="a red cat", regions=regions)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_processor_bad_inputs(tiny_uniter_config, tiny_vocab):
    processor = tiny_processor(tiny_vocab, tiny_uniter_config)
    regions = random_regions(3, 16)
    with pytest.raises(ValueError, match="empty"):
        processor(text="   ", regions=[regions])
    with pytest.raises(ValueError, match="16-d features"):
        processor(text="a cat", regions=[random_regions(3, 8)])
    with pytest.raises(ValueError, match="2 texts but 1 images"):
        processor(text=["a cat", "a dog"], regions=[regions])
    with pytest.raises(TypeError, match="RegionFeatures"):
        processor(text="a cat", regions=[torch.rand(3, 16)])
    with pytest.raises(ValueError, match="no region extractor"):
        processor(text="a cat", images=["cat.jpg"])
    with pytest.raises(ValueError, match="either regions or images, not both"):
        processor(text="a cat", regions=[regions], images=["cat.jpg"])
    with pytest.raises(ValueError, match="at most max_regions=10"):
        processor(text="a cat", regions=[random_regions(12, 16, scores=False)])
    with pytest.raises(ValueError, match="nothing to process"):
        processor()


def test_long_text_is_truncated_with_a_warning(tiny_uniter_config, tiny_vocab):
    processor = tiny_processor(tiny_vocab, tiny_uniter_config)
    processor.max_text_length = 6
    with pytest.warns(UserWarning, match="truncated to max_text_length=6"):
        out = processor(text="what colour is the cat on the table ?", regions=[random_regions(3, 16)])
    assert out["input_ids"].shape[1] == 6 and out["input_ids"][0, -1] == processor.tokenizer.sep_token_id
