"""ViLBERT's processor: the global image token, 5-d locations, the region limit, the 12-in-1 task token."""

import pytest
import torch
from transformers import AutoProcessor, BertTokenizer

import vlhub
from vlhub.modeling.vilbert import VilbertProcessor, VilbertRegionProcessor, vilbert_locations

from .helpers import random_regions


def processor(vocab, **settings):
    region_settings = {
        k: settings.pop(k)
        for k in list(settings)
        if k in ("max_regions", "confidence_threshold", "min_regions", "region_selection")
    }
    return VilbertProcessor(
        feature_extractor=VilbertRegionProcessor(region_feature_dim=16, **region_settings),
        tokenizer=BertTokenizer(vocab=str(vocab), do_lower_case=True),
        **settings,
    )


def test_global_image_token_first_then_regions_in_order(tiny_vocab):
    regions = [random_regions(3, 16, seed=1), random_regions(6, 16, seed=2)]
    out = processor(tiny_vocab)(text=["What colour is the cat ?", "a dog"], regions=regions)
    assert set(out) == {
        "input_ids",
        "attention_mask",
        "token_type_ids",
        "region_features",
        "region_locations",
        "region_attention_mask",
    }
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


def test_more_regions_than_allowed_is_an_error_naming_the_limit_when_refused(tiny_vocab):
    regions = random_regions(5, 16, seed=1, scores=False)
    with pytest.raises(ValueError, match=r"at most max_regions=3 regions \(and the global image token\)"):
        processor(tiny_vocab, max_regions=3, region_selection="refuse")(text="a dog", regions=regions)
    # The default keeps the original's first max_region_num rows: the global token (over all 5) and 3 regions.
    out = processor(tiny_vocab, max_regions=3)(text="a dog", regions=regions)
    assert out["region_attention_mask"].sum() == 4
    torch.testing.assert_close(out["region_features"][0, 0], regions.features.sum(0) / 5)
    assert torch.equal(out["region_features"][0, 1:], regions.features[:3])
    out = processor(tiny_vocab, max_regions=5)(text="a dog", regions=regions)
    assert out["region_attention_mask"].sum() == 6


def test_selection_by_confidence_when_asked(tiny_vocab):
    regions = random_regions(8, 16, seed=3)
    out = processor(tiny_vocab, max_regions=3, confidence_threshold=0.0)(text="a dog", regions=regions)
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
    assert region_processor.max_regions == 100 and region_processor.confidence_threshold is None
    assert region_processor.max_joined_regions is None and region_processor.ground_truth_rows == "after_max_regions"
    with pytest.raises(ValueError, match="must be >= min_regions"):
        VilbertRegionProcessor(max_regions=0)


# ------------------------------------------------------------------------------- 12-in-1 pointing (Visual7w, task 4)
def boxes_of(boxes, image_size=(100, 200), feature_dim=16, offset=0.0):
    boxes = torch.tensor(boxes, dtype=torch.float32)
    features = torch.arange(len(boxes) * feature_dim, dtype=torch.float32).reshape(len(boxes), feature_dim) + offset
    return vlhub.RegionFeatures(features, boxes, image_size)


def test_pointing_targets_are_the_originals_inclusive_iou_cut_at_one_half():
    from vlhub.modeling.vilbert import pointing_targets

    boxes = torch.tensor([[0.0, 0.0, 9.0, 9.0], [2.0, 0.0, 11.0, 9.0], [5.0, 0.0, 14.0, 9.0], [50.0, 20.0, 69.0, 39.0]])
    # Inclusive pixels: each 10x10 box covers 100 pixels; [2, 11] overlaps [0, 9] in 8 columns -> 80 / 120 = 2/3;
    # [5, 14] in 5 columns -> 50 / 150 = 1/3, below one half -> 0; the far box -> 0.
    torch.testing.assert_close(pointing_targets(boxes, [0, 0, 9, 9]), torch.tensor([1.0, 2 / 3, 0.0, 0.0]))
    with pytest.raises(ValueError, match="4 finite pixel coordinates"):
        pointing_targets(boxes, [0, 0, 9])
    with pytest.raises(ValueError, match="x2 >= x1"):
        pointing_targets(boxes, [9, 0, 0, 9])


def test_pointing_layout_detected_rows_then_candidates_after_max_regions(tiny_vocab):
    # Image 100 x 200 (height x width). max_regions=3: the global token and up to 3 detected regions, so the
    # candidates start at row 4 (the releases: 101).
    detected = [boxes_of([[0, 0, 100, 50], [10, 10, 30, 30]]), boxes_of([[0, 0, 20, 20], [0, 0, 40, 40], [5, 5, 9, 9]])]
    candidates = [
        boxes_of([[0, 0, 9, 9], [50, 20, 69, 39], [2, 0, 11, 9]], offset=1000),
        boxes_of([[0, 0, 9, 9], [50, 20, 69, 39], [2, 0, 11, 9], [100, 50, 199, 99]], offset=2000),
    ]
    out = processor(tiny_vocab, max_regions=3, num_task_tokens=20).pointing(
        text=["what is on the table ?", "the red cat"],
        regions=detected,
        candidates=candidates,
        choices=[[2, 0, 1], [3, 1, 0]],
        answer_boxes=[[0, 0, 9, 9], [100, 50, 199, 99]],
        task_id=4,
    )
    assert out["task_ids"].tolist() == [[4], [4]]
    assert out["region_features"].shape == (2, 4 + 4, 16)
    assert out["region_attention_mask"].tolist() == [[1, 1, 1, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1, 1]]
    assert out["choice_region_ids"].tolist() == [[6, 4, 5], [7, 5, 4]]
    # Rows 4.. are the candidates' own features, no global token of theirs; row 3 of example 0 is padding.
    assert torch.equal(out["region_features"][0, 4:7], candidates[0].features)
    assert torch.equal(out["region_features"][1, 4:8], candidates[1].features)
    assert out["region_features"][0, 3].abs().sum() == 0 and out["region_features"][0, 7].abs().sum() == 0
    # The global token is the mean of the detected regions only.
    torch.testing.assert_close(out["region_features"][0, 0], detected[0].features.mean(0))
    # Candidate locations: [x1/W, y1/H, x2/W, y2/H, (x2-x1)(y2-y1)/(W*H)] with W=200, H=100.
    torch.testing.assert_close(out["region_locations"][0, 5], torch.tensor([0.25, 0.2, 0.345, 0.39, 361 / 20000]))
    torch.testing.assert_close(out["region_locations"][1, 7], torch.tensor([0.5, 0.5, 0.995, 0.99, 4851 / 20000]))
    # Labels of the chosen boxes in the order of the choices: IoU 2/3, 1 and 0 (example 0); 1, 0, 0 (example 1).
    torch.testing.assert_close(out["labels"], torch.tensor([[2 / 3, 1.0, 0.0], [1.0, 0.0, 0.0]]))
    # The text is `[CLS] question [SEP]`, as for every task.
    assert out["input_ids"][0, 0] == 2 and out["input_ids"][0, 7] == 3  # 6 word pieces


def test_pointing_with_the_releases_101_rows_is_the_originals_101_plus_index(tiny_vocab):
    detected = random_regions(100, 16, seed=4, scores=False)
    candidates = boxes_of(
        [[0, 0, 20, 20], [1, 2, 30, 40], [3, 3, 9, 9], [0, 0, 63, 47], [5, 6, 7, 8]], image_size=(48, 64)
    )
    out = processor(tiny_vocab).pointing(
        text="which box is the cat ?", regions=detected, candidates=candidates, choices=[4, 0, 2, 3]
    )
    assert out["region_features"].shape == (1, 106, 16) and out["region_attention_mask"].sum() == 106
    assert out["choice_region_ids"].tolist() == [[105, 101, 103, 104]]
    assert torch.equal(out["region_features"][0, 1:101], detected.features)
    assert torch.equal(out["region_features"][0, 101:], candidates.features)
    assert "labels" not in out


def test_pointing_inputs_run_the_referring_expression_head(tiny_vocab):
    from vlhub.modeling.vilbert import VilbertForReferringExpression

    from .test_vilbert_transformers_checks import tiny_config

    torch.manual_seed(0)
    model = VilbertForReferringExpression(tiny_config(vocab_size=20, region_feature_dim=16)).eval()
    detected = [
        random_regions(2, 16, seed=1, image_size=(100, 200)),
        random_regions(3, 16, seed=2, image_size=(100, 200)),
    ]
    candidates = [boxes_of([[0, 0, 9, 9], [2, 0, 11, 9]]), boxes_of([[0, 0, 9, 9], [50, 20, 69, 39]])]
    out = processor(tiny_vocab, max_regions=3).pointing(
        text=["the cat", "a dog"], regions=detected, candidates=candidates, answer_boxes=[[0, 0, 9, 9]] * 2
    )
    labels = out.pop("labels")
    with torch.no_grad():
        every_row = model(**{k: v for k, v in out.items() if k != "choice_region_ids"}).logits
        pointed = model(**out, labels=labels)
    assert pointed.logits.shape == (2, 2)
    torch.testing.assert_close(pointed.logits, torch.stack([every_row[0, [4, 5]], every_row[1, [4, 5]]]))
    assert torch.isfinite(pointed.loss)


def test_pointing_bad_inputs_name_the_problem(tiny_vocab):
    pointing = processor(tiny_vocab, max_regions=3).pointing
    detected = [boxes_of([[0, 0, 10, 10]]), boxes_of([[0, 0, 10, 10]])]
    candidates = [boxes_of([[0, 0, 9, 9], [1, 1, 5, 5]]), boxes_of([[0, 0, 9, 9]])]
    text = ["a cat", "a dog"]
    with pytest.raises(ValueError, match="needs candidates="):
        pointing(text=text, regions=detected)
    with pytest.raises(ValueError, match=r"at least one choice, got \[2, 0\] choices"):
        pointing(text=text, regions=detected, candidates=candidates, choices=[[0, 1], []])
    with pytest.raises(ValueError, match=r"choices\[1\] must be rows of candidates\[1\] \(0..0\), got \[1\]"):
        pointing(text=text, regions=detected, candidates=candidates, choices=[[0], [1]])
    with pytest.raises(ValueError, match="one candidates RegionFeatures per image"):
        pointing(text=text, regions=detected, candidates=candidates[:1])
    with pytest.raises(ValueError, match=r"candidates\[0\] are boxes of an image of size \(48, 64\)"):
        pointing(text=text, regions=detected, candidates=[boxes_of([[0, 0, 9, 9]], image_size=(48, 64))] * 2)
    with pytest.raises(ValueError, match=r"candidates\[0\] has 8-d features"):
        pointing(text=text, regions=detected, candidates=[boxes_of([[0, 0, 9, 9]], feature_dim=8)] * 2)
    with pytest.raises(ValueError, match=r"answer_boxes\[1\]: an answer box must be"):
        pointing(
            text=text,
            regions=detected,
            candidates=candidates,
            choices=[[0], [0]],
            answer_boxes=[[0, 0, 9, 9], [0, 0, 9]],
        )
    unlimited = processor(tiny_vocab, max_regions=None)
    with pytest.raises(ValueError, match="max_regions=None"):
        unlimited.pointing(text=text, regions=detected, candidates=candidates, choices=[[0], [0]])


def test_guesswhat_pointing_pads_fewer_choices_to_a_masked_row_as_the_original(tiny_vocab):
    # GuessWhat games have different numbers of objects; the original pads the choices with the index of a padded
    # row (204 -> row 305 of 306). Here: 3 and 1 candidates, every candidate a choice, the padded row is row 4 + 3.
    proc = processor(tiny_vocab, max_regions=3)
    text = proc.guesswhat_text(["is it a cat ?", "is it red ?"], ["yes", "no"])
    assert text == "start is it a cat ? answer yes stop start is it red ? answer no stop"
    detected = [boxes_of([[0, 0, 10, 10]]), boxes_of([[0, 0, 20, 20]])]
    candidates = [boxes_of([[0, 0, 9, 9], [2, 0, 11, 9], [50, 20, 69, 39]], offset=100), boxes_of([[2, 0, 11, 9]])]
    out = proc.pointing(
        text=["a cat", "a dog"], regions=detected, candidates=candidates, answer_boxes=[[0, 0, 9, 9], [0, 0, 9, 9]]
    )
    assert out["region_features"].shape == (2, 4 + 4, 16)
    assert out["region_attention_mask"].tolist() == [[1, 1, 0, 0, 1, 1, 1, 0], [1, 1, 0, 0, 1, 0, 0, 0]]
    assert out["choice_region_ids"].tolist() == [[4, 5, 6], [4, 7, 7]]
    torch.testing.assert_close(out["labels"], torch.tensor([[1.0, 2 / 3, 0.0], [2 / 3, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="one answer per question"):
        proc.guesswhat_text(["is it a cat ?"], [])
