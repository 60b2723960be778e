"""ViLBERT's processor: the global image token, 5-d locations, the region limit, the 12-in-1 task token."""

import pytest
import torch
from transformers import AutoProcessor, BertTokenizer

import vlhub
from vlhub.modeling.vilbert import VilbertProcessor, VilbertRegionProcessor, vilbert_locations

from .helpers import random_regions


def processor(vocab, **settings):
    region_settings = {k: settings.pop(k) for k in list(settings) if k in ("max_regions", "confidence_threshold",
                                                                           "min_regions")}
    return VilbertProcessor(
        feature_extractor=VilbertRegionProcessor(region_feature_dim=16, **region_settings),
        tokenizer=BertTokenizer(vocab=str(vocab), do_lower_case=True), **settings,
    )


def test_global_image_token_first_then_regions_in_order(tiny_vocab):
    regions = [random_regions(3, 16, seed=1), random_regions(6, 16, seed=2)]
    out = processor(tiny_vocab)(text=["What colour is the cat ?", "a dog"], regions=regions)
    assert set(out) == {"input_ids", "attention_mask", "token_type_ids", "region_features", "region_locations",
                        "region_attention_mask"}
    assert out["region_attention_mask"].sum(1).tolist() == [4, 7]
    assert out["region_features"].shape == (2, 7, 16)
    for i, r in enumerate(regions):
        n = len(r)
        torch.testing.assert_close(out["region_features"][i, 0], r.features.sum(0) / n)
        assert torch.equal(out["region_features"][i, 1 : n + 1], r.features)
        assert out["region_locations"][i, 0].tolist() == [0.0, 0.0, 1.0, 1.0, 1.0]
        assert torch.equal(out["region_locations"][i, 1 : n + 1], vilbert_locations(r))
    assert out["region_features"][0, 4:].abs().sum() == 0
    tok = out["input_ids"][0]
    assert tok[0] == 2 and tok[7] == 3  # [CLS] ... [SEP], lower-cased word pieces (no [UNK])
    assert 1 not in out["input_ids"][0, :8].tolist()


def test_vilbert_locations_formula():
    regions = vlhub.RegionFeatures(torch.ones(1, 4), torch.tensor([[10.0, 20.0, 40.0, 60.0]]), (100, 200))
    assert torch.allclose(vilbert_locations(regions)[0], torch.tensor([0.05, 0.2, 0.2, 0.6, 0.06]))


def test_more_regions_than_allowed_is_an_error_naming_the_limit(tiny_vocab):
    regions = random_regions(5, 16, seed=1, scores=False)
    with pytest.raises(ValueError, match="max_regions=4 rows, the global image token included"):
        processor(tiny_vocab, max_regions=4)(text="a dog", regions=regions)
    out = processor(tiny_vocab, max_regions=6)(text="a dog", regions=regions)
    assert out["region_attention_mask"].sum() == 6


def test_selection_by_confidence_when_asked(tiny_vocab):
    regions = random_regions(8, 16, seed=3)
    out = processor(tiny_vocab, max_regions=4, confidence_threshold=0.0)(text="a dog", regions=regions)
    assert out["region_attention_mask"].sum() == 4  # 3 regions + the global token
    best = torch.sort(regions.scores, descending=True, stable=True).indices[:3]
    assert torch.equal(out["region_features"][0, 1:4], regions.features[best])


def test_task_token(tiny_vocab):
    multi = processor(tiny_vocab, num_task_tokens=20)
    with pytest.raises(ValueError, match="pass task_id="):
        multi(text="a dog", regions=random_regions(3, 16))
    with pytest.raises(ValueError, match=r"task_id must be an integer in 0\.\.19"):
        multi(text="a dog", regions=random_regions(3, 16), task_id=25)
    out = multi(text=["a dog", "a cat"], regions=[random_regions(3, 16), random_regions(2, 16)], task_id=15)
    assert out["task_ids"].tolist() == [[15], [15]]
    multi.task_id = 1
    assert multi(text="a dog", regions=random_regions(3, 16))["task_ids"].tolist() == [[1]]
    with pytest.raises(ValueError, match="no task tokens"):
        processor(tiny_vocab)(text="a dog", regions=random_regions(3, 16), task_id=1)
    assert "task_ids" in multi.model_input_names and "task_ids" not in processor(tiny_vocab).model_input_names


def test_save_load_round_trip(tmp_path, tiny_vocab):
    original = processor(tiny_vocab, num_task_tokens=20, task_id=12, max_regions=37, max_text_length=20)
    original.save_pretrained(tmp_path)
    vlhub.VilbertConfig(vocab_size=30, num_task_tokens=20).save_pretrained(tmp_path)
    loaded = AutoProcessor.from_pretrained(tmp_path)
    assert isinstance(loaded, VilbertProcessor) and isinstance(loaded.feature_extractor, VilbertRegionProcessor)
    assert (loaded.num_task_tokens, loaded.task_id, loaded.max_text_length) == (20, 12, 20)
    assert loaded.feature_extractor.max_regions == 37
    regions = [random_regions(3, 16, seed=1)]
    a, b = original(text="a dog", regions=regions), loaded(text="a dog", regions=regions)
    assert all(torch.equal(a[k], b[k]) for k in a) and a.keys() == b.keys()


def test_default_limits():
    region_processor = VilbertRegionProcessor()
    assert region_processor.max_regions == 101 and region_processor.confidence_threshold is None
    with pytest.raises(ValueError, match="at least 2"):
        VilbertRegionProcessor(max_regions=1)
