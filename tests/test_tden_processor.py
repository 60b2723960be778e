"""TdenProcessor: uncased word pieces in the understanding and generation layouts, the [IMG] row, 5-d locations."""

import pytest
import torch
from transformers import AutoProcessor, BertTokenizer

import vlhub
from vlhub import TdenProcessor, TdenRegionProcessor


@pytest.fixture
def processor(tiny_vocab):
    tokenizer = BertTokenizer(vocab=str(tiny_vocab), do_lower_case=True)
    return TdenProcessor(feature_extractor=TdenRegionProcessor(region_feature_dim=4), tokenizer=tokenizer)


def _regions(n=3, width=200, height=100):
    boxes = torch.tensor(
        [[0.0, 0.0, 100.0, 50.0], [50.0, 25.0, 150.0, 75.0], [10.0, 10.0, 20.0, 30.0], [0.0, 0.0, 200.0, 100.0]]
    )[:n]
    return vlhub.RegionFeatures(
        features=torch.arange(n * 4, dtype=torch.float32).view(n, 4), boxes=boxes, image_size=(height, width)
    )


def test_understanding_layout_is_cls_text_sep_of_type_0(processor):
    out = processor(text=["What colour is the CAT"], regions=[_regions()])
    tok = processor.tokenizer
    pieces = tok("what colour is the cat", add_special_tokens=False)["input_ids"]
    assert out["input_ids"][0].tolist() == [tok.cls_token_id, *pieces, tok.sep_token_id]  # uncased
    assert out["token_type_ids"].unique().tolist() == [0]


def test_generation_layout_has_no_sep_type_1_and_drops_the_final_full_stop(processor):
    out = processor(text=["A red cat on the table.", "a dog"], regions=[_regions(), _regions(2)], stream="generation")
    tok = processor.tokenizer
    pieces = tok("a red cat on the table", add_special_tokens=False)["input_ids"]
    assert out["input_ids"][0].tolist() == [tok.cls_token_id, *pieces]
    assert tok.sep_token_id not in out["input_ids"].tolist()[0]
    assert (out["token_type_ids"][out["attention_mask"].bool()] == 1).all()
    assert out["attention_mask"][1].tolist() == [1, 1, 1, 0, 0, 0, 0]
    # The per-call stream does not change the processor's setting.
    assert processor.text_stream == "understanding"
    assert processor(text=["a dog"])["input_ids"][0, -1] == tok.sep_token_id


def test_img_row_is_the_mean_feature_at_the_whole_image(processor):
    regions = _regions()
    out = processor(regions=[regions, _regions(2)])
    features, locations = out["region_features"], out["region_locations"]
    assert features.shape == (2, 4, 4) and locations.shape == (2, 4, 5)
    torch.testing.assert_close(features[0, 0], regions.features.mean(0))
    assert locations[0, 0].tolist() == [0.0, 0.0, 1.0, 1.0, 1.0]
    torch.testing.assert_close(features[0, 1:], regions.features)
    assert out["region_attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    # [x1/W, y1/H, x2/W, y2/H, area/(W*H)] for the 200x100 image
    torch.testing.assert_close(locations[0, 1], torch.tensor([0.0, 0.0, 0.5, 0.5, 0.25]))
    torch.testing.assert_close(locations[0, 2], torch.tensor([0.25, 0.25, 0.75, 0.75, 0.25]))
    torch.testing.assert_close(locations[0, 3], torch.tensor([0.05, 0.1, 0.1, 0.3, 200 / 20000]))


def test_settings_round_trip_and_bad_values_are_refused(processor, tmp_path):
    processor.text_stream = "generation"
    processor.save_pretrained(tmp_path)
    loaded = AutoProcessor.from_pretrained(tmp_path)
    assert isinstance(loaded, TdenProcessor) and loaded.text_stream == "generation"
    assert isinstance(loaded.feature_extractor, TdenRegionProcessor) and loaded.feature_extractor.max_regions == 50
    with pytest.raises(ValueError, match="stream must be one of"):
        processor(text=["a cat"], stream="captioning")
    with pytest.raises(ValueError, match="text_stream must be one of"):
        TdenProcessor(feature_extractor=TdenRegionProcessor(), tokenizer=processor.tokenizer, text_stream="both")
    # X-modaler keeps the first MAX_FEAT_NUM - 1 regions (the default "first_n"); "refuse" makes more an error.
    assert (
        TdenRegionProcessor(region_feature_dim=4, max_regions=2, min_regions=1)(_regions(3))["region_features"].shape[1]
        == 3
    )
    small = TdenRegionProcessor(region_feature_dim=4, max_regions=2, min_regions=1, region_selection="refuse")
    with pytest.raises(ValueError, match="at most max_regions=2"):
        small(_regions(3))


def test_detector_output_is_selected_as_xmodaler_extracted_it():
    n = 8
    scores = torch.tensor([0.1, 0.5, 0.3, 0.05, 0.9, 0.25, 0.2, 0.15])
    regions = vlhub.RegionFeatures(
        features=torch.arange(n * 4, dtype=torch.float32).view(n, 4),
        boxes=torch.tensor([[0.0, 0.0, 10.0, 10.0]]).repeat(n, 1),
        image_size=(20, 20),
        scores=scores,
    )
    # >= 0.2 in detector order: boxes 1, 2, 4, 5, 6
    chosen = TdenRegionProcessor(region_feature_dim=4, min_regions=2, max_regions=50).select(regions)
    torch.testing.assert_close(chosen.scores, scores[[1, 2, 4, 5, 6]])
    # fewer than min_regions above the threshold: the most confident ones, by confidence
    chosen = TdenRegionProcessor(region_feature_dim=4, min_regions=6, max_regions=50).select(regions)
    torch.testing.assert_close(chosen.scores, scores[[4, 1, 2, 5, 6, 7]])
    # more than max_detections: the most confident; then the data mapper's first max_regions
    chosen = TdenRegionProcessor(region_feature_dim=4, min_regions=1, max_detections=3, max_regions=2).select(regions)
    torch.testing.assert_close(chosen.scores, scores[[4, 1]])
