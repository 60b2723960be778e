"""ViLBERT's region rules at the 12-in-1 release's real counts (small feature dims): the detections of the task
datasets, the ground-truth boxes the grounding and pointing datasets join after them, and `max_regions` counting
detected regions (a processor saved when it counted rows loads with the same limit)."""

import json
import logging

import pytest
import torch
from transformers import AutoProcessor, BertTokenizer

import vlhub
from vlhub.modeling.vilbert.convert_vilbert import _region_settings
from vlhub.modeling.vilbert import VilbertProcessor, VilbertRegionProcessor

DIM = 8


def random_regions(num_regions, feature_dim, seed=0, scores=False):
    """Random regions of a 48 x 64 image, no detector confidences (a feature file's)."""
    generator = torch.Generator().manual_seed(seed)
    corners = torch.rand(num_regions, 2, 2, generator=generator).sort(dim=1).values * torch.tensor([64.0, 48.0])
    return vlhub.RegionFeatures(
        torch.rand(num_regions, feature_dim, generator=generator), corners.reshape(num_regions, 4), (48, 64)
    )


def original_rows(detections, ground_truth, max_region_num):
    """What `visual7w_pointing_dataset.py`, `guesswhat_pointing_dataset.py`, `refer_expression_dataset.py` and
    `flickr_grounding_dataset.py` (training split) keep: the reader's rows (g_feat = sum of all the detections' features
    / their number, then the detections), the ground-truth file's rows without its own global token after them, and
    `mix_num_boxes = min(num_boxes + gt_num_boxes - 1, max_region_num)` of those rows."""
    features = torch.cat([detections.features.sum(0, keepdim=True) / len(detections), detections.features])
    if ground_truth is not None:
        features = torch.cat([features, ground_truth.features])
    return features[:max_region_num]


def converted(vocab, task, task_id):
    settings = _region_settings(task, "multi_task", task_id, [])
    return VilbertProcessor(
        feature_extractor=VilbertRegionProcessor(region_feature_dim=DIM, **settings),
        tokenizer=BertTokenizer(vocab=str(vocab), do_lower_case=True),
        num_task_tokens=20,
    )


def real_rows(inputs, index=0):
    return inputs["region_features"][index][inputs["region_attention_mask"][index].bool()]


@pytest.mark.parametrize(
    "task, task_id, max_region_num",
    [("visual7w", 4, 200), ("guesswhat_pointing", 17, 306), ("re", 10, 101), ("flickr_grounding", 18, 200)],
)
def test_converted_settings_are_the_task_configs_max_region_num(tiny_vocab, task, task_id, max_region_num):
    region_processor = converted(tiny_vocab, task, task_id).feature_extractor
    assert region_processor.max_regions == 100  # the reader's 101 rows, the global token on top
    assert region_processor.max_joined_regions == max_region_num - 1
    assert region_processor.ground_truth_rows == (
        "after_max_regions" if task in ("visual7w", "guesswhat_pointing") else "after_detections"
    )
    plain = converted(tiny_vocab, "vqa", 1).feature_extractor
    assert (plain.max_regions, plain.max_joined_regions) == (100, None)


def original_reader(regions):
    """`ImageFeaturesH5Reader`'s rows of one feature file: the global feature (sum of the features / their number)
    then the features; locations `[0, 0, 1, 1, 1]` then `[x1/W, y1/H, x2/W, y2/H, area/(W*H)]`; `num_boxes` + 1."""
    height, width = regions.image_size
    boxes = regions.boxes
    locations = torch.zeros(len(regions), 5)
    locations[:, :4] = boxes
    locations[:, 4] = (boxes[:, 3] - boxes[:, 1]) * (boxes[:, 2] - boxes[:, 0]) / (width * height)
    locations[:, [0, 2]] /= width
    locations[:, [1, 3]] /= height
    features = torch.cat([regions.features.sum(0, keepdim=True) / len(regions), regions.features])
    return features, torch.cat([torch.tensor([[0.0, 0.0, 1.0, 1.0, 1.0]]), locations]), len(regions) + 1


def original_vcr_rows(detections, ground_truth, max_region_num):
    """`vcr_dataset.py`'s `__getitem__` (12-in-1 and beta alike): the detections' global feature merged with the
    ground-truth file's, weighted by the readers' `num_boxes`; the ground-truth rows without their global token, at
    most `max_region_num - 1` of them kept first; then `min(max_region_num - gt kept, num_boxes)` detection rows (the
    merged global token first); rows: detections, then ground truth; zero-padded to `max_region_num`, mask 1 on the
    kept rows."""
    features, boxes, num_boxes = original_reader(detections)
    gt_features, gt_boxes, gt_num_boxes = original_reader(ground_truth)
    features[0] = (features[0] * num_boxes + gt_features[0] * gt_num_boxes) / (num_boxes + gt_num_boxes)
    gt_features, gt_boxes, gt_num_boxes = gt_features[1:], gt_boxes[1:], gt_num_boxes - 1
    gt_box_preserve = min(max_region_num - 1, gt_num_boxes)
    num_box_preserve = min(max_region_num - gt_box_preserve, num_boxes)
    mix_features = torch.cat([features[:num_box_preserve], gt_features[:gt_box_preserve]])
    mix_boxes = torch.cat([boxes[:num_box_preserve], gt_boxes[:gt_box_preserve]])
    count = num_box_preserve + gt_box_preserve
    padded_features, padded_boxes = torch.zeros(max_region_num, DIM), torch.zeros(max_region_num, 5)
    padded_features[:count], padded_boxes[:count] = mix_features, mix_boxes
    mask = (torch.arange(max_region_num) < count).long()
    return padded_features, padded_boxes, mask


def converted_vcr(vocab, release):
    settings = _region_settings("vcr", release, 5 if release == "multi_task" else None, [])
    return VilbertProcessor(
        feature_extractor=VilbertRegionProcessor(region_feature_dim=DIM, **settings),
        tokenizer=BertTokenizer(vocab=str(vocab), do_lower_case=True),
        num_task_tokens=20 if release == "multi_task" else 0,
    )


@pytest.mark.parametrize("release, max_region_num", [("multi_task", 101), ("beta", 100)])
def test_converted_vcr_processors_join_ground_truth_as_the_vcr_datasets(tiny_vocab, release, max_region_num):
    region_processor = converted_vcr(tiny_vocab, release).feature_extractor
    assert region_processor.ground_truth_rows == "after_cut_detections"
    assert region_processor.max_regions == region_processor.max_joined_regions == max_region_num - 1


@pytest.mark.parametrize("release, max_region_num", [("multi_task", 101), ("beta", 100)])
@pytest.mark.parametrize("detections, ground_truth", [(100, 30), (100, 120), (100, 99), (10, 5), (1, 1)])
def test_vcr_join_is_the_original_datasets_rows(tiny_vocab, release, max_region_num, detections, ground_truth):
    processor = converted_vcr(tiny_vocab, release)
    task_id = 5 if release == "multi_task" else None
    regions, truth = random_regions(detections, DIM, seed=3), random_regions(ground_truth, DIM, seed=4)
    inputs = processor(text="is the cat on the table ?", regions=regions, ground_truth=truth, task_id=task_id)
    features, boxes, mask = original_vcr_rows(regions, truth, max_region_num)
    rows = inputs["region_attention_mask"].shape[1]
    assert rows <= max_region_num and not mask[rows:].any()  # vlhub pads to the batch's longest, masked alike
    torch.testing.assert_close(inputs["region_features"][0], features[:rows])
    torch.testing.assert_close(inputs["region_locations"][0], boxes[:rows])
    assert torch.equal(inputs["region_attention_mask"][0], mask[:rows])


def test_vcr_join_in_a_batch_and_its_cut_logged_once(tiny_vocab, caplog):
    processor = converted_vcr(tiny_vocab, "multi_task")
    regions = [random_regions(100, DIM, seed=5), random_regions(12, DIM, seed=6)]
    truth = [random_regions(120, DIM, seed=7), random_regions(4, DIM, seed=8)]
    with caplog.at_level(logging.WARNING):
        inputs = processor(text=["a", "b"], regions=regions, ground_truth=truth, task_id=5)
    assert "kept the ground-truth regions first" in caplog.text and processor.feature_extractor.regions_cut == 1
    for index in range(2):
        features, boxes, mask = original_vcr_rows(regions[index], truth[index], 101)
        torch.testing.assert_close(inputs["region_features"][index], features)
        torch.testing.assert_close(inputs["region_locations"][index], boxes)
        assert torch.equal(inputs["region_attention_mask"][index], mask)


def test_vcr_multiple_choice_inputs_with_ground_truth_run_the_choice_model(tiny_vocab):
    from vlhub.training.finetuning import encode_choices

    processor = converted_vcr(tiny_vocab, "multi_task")
    processor.task_id = 5
    regions = [random_regions(100, DIM, seed=9), random_regions(20, DIM, seed=10)]
    truth = [random_regions(30, DIM, seed=11), random_regions(3, DIM, seed=12)]
    choices = [["the cat", "a dog", "the table", "red"], ["yes", "no", "blue", "the red cat"]]
    inputs = encode_choices(processor, ["what is on the table ?", "is the cat red ?"], choices)
    inputs.update(processor(regions=regions, ground_truth=truth))  # regions alone, as the collator encodes them
    assert inputs["input_ids"].shape[:2] == (2, 4) and inputs["region_features"].shape == (2, 101, DIM)
    features, _, mask = original_vcr_rows(regions[1], truth[1], 101)
    torch.testing.assert_close(inputs["region_features"][1], features)
    assert torch.equal(inputs["region_attention_mask"][1], mask)
    config = vlhub.VilbertConfig(
        vocab_size=len(processor.tokenizer),
        region_feature_dim=DIM,
        num_task_tokens=20,
        **vlhub.get_architecture("vilbert").config_fields("tiny"),
    )
    outputs = vlhub.VilbertForMultipleChoice(config).eval()(**inputs, labels=torch.tensor([0, 3]))
    assert outputs.logits.shape == (2, 4) and torch.isfinite(outputs.loss)


def test_vcr_join_bad_inputs_name_the_problem(tiny_vocab):
    processor = converted_vcr(tiny_vocab, "multi_task")
    with pytest.raises(ValueError, match=r"ground_truth\[0\] has 4-d features"):
        processor(text="a", regions=random_regions(3, DIM), ground_truth=random_regions(2, 4), task_id=5)
    with pytest.raises(ValueError, match=r"regions\[0\] has 4-d features"):
        processor(text="a", regions=random_regions(3, 4), ground_truth=random_regions(2, DIM), task_id=5)
    processor.feature_extractor.region_selection = "refuse"
    with pytest.raises(ValueError, match="100 detected and 2 ground-truth regions exceed max_joined_regions=100"):
        processor(text="a", regions=random_regions(100, DIM), ground_truth=random_regions(2, DIM), task_id=5)
    scored = vlhub.RegionFeatures(
        torch.rand(3, DIM), torch.tensor([[0.0, 0.0, 4.0, 4.0]] * 3), (48, 64), scores=torch.ones(3)
    )
    by_confidence = VilbertRegionProcessor(
        region_feature_dim=DIM, confidence_threshold=0.2, ground_truth_rows="after_cut_detections"
    )
    with pytest.raises(ValueError, match="keeps each image's first detections"):
        by_confidence.join_ground_truth([scored], [random_regions(2, DIM)])


def test_refuse_stays_available_for_ground_truth(tiny_vocab):
    refusing = VilbertRegionProcessor(region_feature_dim=DIM, ground_truth_rows="refuse")
    with pytest.raises(ValueError, match="refuses ground-truth regions"):
        refusing.join_ground_truth([random_regions(3, DIM)], [random_regions(2, DIM)])


@pytest.mark.parametrize(
    "task, task_id, max_region_num, detections, candidates",
    [
        ("visual7w", 4, 200, 100, 30),
        ("visual7w", 4, 200, 100, 99),
        ("visual7w", 4, 200, 100, 120),
        ("visual7w", 4, 200, 60, 150),  # fewer detections: the original keeps more candidates, vlhub the same ones
        ("guesswhat_pointing", 17, 306, 100, 205),
        ("guesswhat_pointing", 17, 306, 100, 210),
    ],
)
def test_pointing_keeps_the_originals_rows(tiny_vocab, caplog, task, task_id, max_region_num, detections, candidates):
    regions = random_regions(detections, DIM, seed=1, scores=False)
    boxes = random_regions(candidates, DIM, seed=2, scores=False)
    processor = converted(tiny_vocab, task, task_id)
    with caplog.at_level(logging.WARNING):
        inputs = processor.pointing(
            text="which one ?", regions=regions, candidates=boxes, choices=[0, 3, 1, 2], task_id=task_id
        )
    expected = original_rows(regions, boxes, max_region_num)
    assert torch.equal(real_rows(inputs), expected)
    kept = len(expected) - 1 - detections
    assert processor.feature_extractor.regions_cut == (kept < candidates)
    assert ("max_joined_regions" in caplog.text) == (kept < candidates)
    # The candidates start at row 101 (the original's `vision_logit[:, 101:]`), the detections padded up to it.
    assert inputs["choice_region_ids"].tolist() == [[101, 104, 102, 103]]
    assert torch.equal(inputs["region_features"][0, 101 : 101 + kept], boxes.features[:kept])
    if kept < candidates:  # the original's gather fails on a cut candidate
        with pytest.raises(ValueError, match=rf"choices\[0\] names candidates \[{kept}\], which max_joined_regions"):
            processor.pointing(
                text="which one ?", regions=regions, candidates=boxes, choices=[0, kept], task_id=task_id
            )
        processor.feature_extractor.region_selection = "refuse"
        with pytest.raises(ValueError, match=rf"candidates\[0\]: {detections} detected and {candidates} ground-truth"):
            processor.pointing(text="which one ?", regions=regions, candidates=boxes, choices=[0], task_id=task_id)


def test_guesswhat_choices_padded_to_a_masked_row_at_the_release_counts(tiny_vocab):
    processor = converted(tiny_vocab, "guesswhat_pointing", 17)
    regions = [random_regions(100, DIM, seed=3, scores=False), random_regions(100, DIM, seed=4, scores=False)]
    boxes = [random_regions(20, DIM, seed=5, scores=False), random_regions(5, DIM, seed=6, scores=False)]
    inputs = processor.pointing(
        text=["a", "b"], regions=regions, candidates=boxes, choices=[[0, 7, 19], [4]], task_id=17
    )
    assert inputs["region_features"].shape[1] == 101 + 20 + 1
    assert inputs["choice_region_ids"].tolist() == [[101, 108, 120], [105, 121, 121]]
    assert inputs["region_attention_mask"][:, 121].tolist() == [0, 0]


@pytest.mark.parametrize(
    "task, task_id, max_region_num, detections, ground_truth",
    [
        ("re", 10, 101, 100, 30),  # the released features: the ground-truth boxes never fit
        ("re", 10, 101, 80, 30),  # fewer detections: 20 of them join
        ("flickr_grounding", 18, 200, 100, 150),
    ],
)
def test_grounding_training_joins_ground_truth_right_after_the_detections(
    tiny_vocab, task, task_id, max_region_num, detections, ground_truth
):
    regions = random_regions(detections, DIM, seed=7, scores=False)
    truth = random_regions(ground_truth, DIM, seed=8, scores=False)
    processor = converted(tiny_vocab, task, task_id)
    inputs = processor(text="the man on the left", regions=regions, ground_truth=truth, task_id=task_id)
    expected = original_rows(regions, truth, max_region_num)
    # "after_detections": the rows are the original's, in the original's places.
    assert torch.equal(inputs["region_features"][0], expected)
    assert inputs["region_attention_mask"].tolist() == [[1] * len(expected)]
    assert set(inputs) == {
        "input_ids",
        "attention_mask",
        "token_type_ids",
        "task_ids",
        "region_features",
        "region_locations",
        "region_attention_mask",
    }
    # Evaluation (no ground truth): the detections alone, as the original's other split.
    assert torch.equal(
        real_rows(processor(text="the man", regions=regions, task_id=task_id)),
        original_rows(regions, None, max_region_num),
    )


def test_joined_rows_run_the_referring_expression_head(tiny_vocab):
    from vlhub.modeling.vilbert import VilbertForReferringExpression

    from .test_vilbert_transformers_checks import tiny_config

    torch.manual_seed(0)
    model = VilbertForReferringExpression(tiny_config(vocab_size=20, region_feature_dim=DIM)).eval()
    processor = converted(tiny_vocab, "re", 10)
    processor.num_task_tokens = 0
    regions = [random_regions(3, DIM, seed=1, scores=False), random_regions(5, DIM, seed=2, scores=False)]
    truth = [random_regions(2, DIM, seed=3, scores=False), random_regions(1, DIM, seed=4, scores=False)]
    inputs = processor(text=["the cat", "a dog"], regions=regions, ground_truth=truth)
    assert inputs["region_attention_mask"].tolist() == [[1] * 6 + [0] * 1, [1] * 7]
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (2, 7) and torch.isfinite(logits[:, :6]).all()


def test_ground_truth_bad_inputs_name_the_problem(tiny_vocab):
    processor = converted(tiny_vocab, "re", 10)
    regions = [random_regions(3, DIM, seed=1)]
    with pytest.raises(ValueError, match="1 images but 2 ground_truth sets"):
        processor(text="a", regions=regions, ground_truth=[random_regions(2, DIM)] * 2, task_id=10)
    with pytest.raises(ValueError, match=r"ground_truth\[0\] has 4-d features"):
        processor(text="a", regions=regions, ground_truth=[random_regions(2, 4)], task_id=10)
    with pytest.raises(ValueError, match="pass regions= \\(or images=\\) too"):
        processor(text="a", ground_truth=[random_regions(2, DIM)], task_id=10)
    with pytest.raises(ValueError, match="ground_truth_rows must be one of"):
        VilbertRegionProcessor(ground_truth_rows="after")
    with pytest.raises(ValueError, match="max_joined_regions counts the detected regions too"):
        VilbertRegionProcessor(max_regions=100, max_joined_regions=50)


# ----------------------------------------------------------------- max_regions: detected regions, saved folders
def test_a_folder_saved_when_max_regions_counted_rows_loads_with_the_same_limit(tmp_path, tiny_vocab, caplog):
    new = VilbertProcessor(
        feature_extractor=VilbertRegionProcessor(region_feature_dim=DIM, max_regions=100),
        tokenizer=BertTokenizer(vocab=str(tiny_vocab), do_lower_case=True),
    )
    new.save_pretrained(tmp_path)
    vlhub.VilbertConfig(vocab_size=20).save_pretrained(tmp_path)
    saved_path = tmp_path / "processor_config.json"
    saved = json.loads(saved_path.read_text())
    assert saved["feature_extractor"]["max_regions_counts"] == "regions"
    # As saved before: 101 rows, the global token included, and no marker.
    del saved["feature_extractor"]["max_regions_counts"]
    for name in ("max_joined_regions", "ground_truth_rows"):
        del saved["feature_extractor"][name]
    saved["feature_extractor"]["max_regions"] = 101
    saved_path.write_text(json.dumps(saved))
    with caplog.at_level(logging.WARNING):
        old = AutoProcessor.from_pretrained(tmp_path)
        AutoProcessor.from_pretrained(tmp_path)
    assert old.feature_extractor.max_regions == 100
    assert caplog.text.count("saved when max_regions counted rows") <= 1  # once per process
    regions = [random_regions(130, DIM, seed=1, scores=False), random_regions(7, DIM, seed=2, scores=False)]
    a, b = new(text=["a", "b"], regions=regions), old(text=["a", "b"], regions=regions)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert b["region_attention_mask"].sum(1).tolist() == [101, 8]
    # Saved again, it carries the marker and today's count.
    old.save_pretrained(tmp_path / "again")
    again = json.loads((tmp_path / "again" / "processor_config.json").read_text())["feature_extractor"]
    assert (again["max_regions"], again["max_regions_counts"]) == (100, "regions")
    # A limit given at load time is in today's meaning.
    assert AutoProcessor.from_pretrained(tmp_path, max_regions=36).feature_extractor.max_regions == 36
