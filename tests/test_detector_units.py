"""Pieces of the detector against ground truth written down independently of the code under test."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torchvision.ops import nms

from vlhub.processing.detector import DetectorConfig, RegionExtractor
from vlhub.processing.detector.backbone import ConvNorm, Stem
from vlhub.processing.detector.boxes import clip_boxes, decode_boxes
from vlhub.processing.detector.image_io import load_rgb_image
from vlhub.processing.detector.rpn import caffe_cell_anchors, cell_anchors_for, detectron2_cell_anchors, grid_anchors
from vlhub.processing.detector.selection import (
    per_class_nms_keep,
    select_butd,
    select_max_class_nms,
    select_per_class_nms,
)
from vlhub.processing.detector.transform import resized_size

from .helpers import tiny_detector, tiny_detector_config, write_test_image

# regions.md §1.3: the 12 cell anchors of bottom-up-attention's generate_anchors (x1, y1, x2, y2), channel order.
CAFFE_ANCHORS = [
    [-38, -16, 53, 31],
    [-84, -40, 99, 55],
    [-176, -88, 191, 103],
    [-360, -184, 375, 199],
    [-24, -24, 39, 39],
    [-56, -56, 71, 71],
    [-120, -120, 135, 135],
    [-248, -248, 263, 263],
    [-14, -36, 29, 51],
    [-36, -80, 51, 95],
    [-80, -168, 95, 183],
    [-168, -344, 183, 359],
]


def test_caffe_anchors_are_the_original_twelve():
    assert caffe_cell_anchors().tolist() == CAFFE_ANCHORS
    assert cell_anchors_for(DetectorConfig(anchor_style="caffe")).tolist() == CAFFE_ANCHORS


def test_detectron2_anchors_and_grid_order():
    anchors = detectron2_cell_anchors()
    # size-major: first three are the 64-px anchors of ratios 0.5, 1, 2 (w = sqrt(64²/r), h = r·w)
    w = math.sqrt(64 * 64 / 0.5)
    assert anchors[0].tolist() == pytest.approx([-w / 2, -w / 4, w / 2, w / 4])
    assert anchors[1].tolist() == pytest.approx([-32, -32, 32, 32])
    grid = grid_anchors(anchors, height=2, width=3, stride=16)
    assert grid.shape == (2 * 3 * 12, 4)
    # order (y, x, a): index (y=1, x=2, a=1) is the 64×64 anchor shifted by (32, 16)
    assert grid[(1 * 3 + 2) * 12 + 1].tolist() == pytest.approx([32 - 32, 16 - 32, 32 + 32, 16 + 32])


def test_caffe_maxpool_is_ceil_mode_without_padding():
    config = tiny_detector_config(caffe_maxpool=True)
    stem = Stem(config)
    with torch.no_grad():
        stem.conv1.weight.zero_()
        stem.conv1.weight[:, 0, 3, 3] = 1.0  # conv output = the input's first channel at stride 2
    for size in (600, 601, 37, 64):
        x = torch.rand(1, 3, size, size + 3)
        with torch.no_grad():
            out = stem(x)
        conv = [math.floor((n + 6 - 7) / 2) + 1 for n in (size, size + 3)]
        expected = [math.ceil((n - 3) / 2) + 1 for n in conv]  # Caffe pooling output size
        assert list(out.shape[2:]) == expected
        # the last window (pad 0, ceil mode) starts at 2·(out − 1) and is cut by the map's edge
        conv_map = F.relu(stem.conv1(x))[0, 0]
        last_y, last_x = 2 * (expected[0] - 1), 2 * (expected[1] - 1)
        assert out[0, 0, -1, -1].item() == pytest.approx(
            conv_map[last_y : last_y + 3, last_x : last_x + 3].max().item()
        )
        assert out[0, 0, 0, 0].item() == pytest.approx(conv_map[0:3, 0:3].max().item())


def test_conv_norm_folds_frozen_batchnorm():
    torch.manual_seed(0)
    conv = ConvNorm(3, 5, 3, padding=1)
    with torch.no_grad():
        conv.norm.weight.uniform_(0.5, 2)
        conv.norm.bias.normal_()
        conv.norm.running_mean.normal_()
        conv.norm.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 9, 9)
    plain = F.conv2d(x, conv.weight, padding=1)
    expected = (plain - conv.norm.running_mean.view(1, -1, 1, 1)) / torch.sqrt(
        conv.norm.running_var.view(1, -1, 1, 1) + 1e-5
    ) * conv.norm.weight.view(1, -1, 1, 1) + conv.norm.bias.view(1, -1, 1, 1)
    torch.testing.assert_close(conv(x), expected, atol=1e-5, rtol=1e-5)


def test_resize_rule_matches_the_references_sizes():
    # sizes from the fixture READMEs (min 256, max 384) and regions.md (600/1000)
    assert resized_size(300, 400, 256, 384)[0] == (256, 341)
    assert resized_size(256, 256, 256, 384)[0] == (256, 256)
    assert resized_size(150, 360, 256, 384)[0] == (160, 384)
    assert resized_size(480, 640, 800, 1333)[0] == (800, 1067)
    assert resized_size(600, 800, 600, 1000)[0] == (600, 800)


def test_box_conventions():
    boxes = torch.tensor([[10.0, 20.0, 29.0, 59.0]])
    zero = torch.zeros(1, 4)
    assert decode_boxes(zero, boxes, (1, 1, 1, 1)).tolist() == [[10.0, 20.0, 29.0, 59.0]]
    # Caffe: width 20 (+1), centre x 20, dx = 0.5 moves it by 10; detectron2: width 19, centre 19.5, moves 9.5
    shifted = decode_boxes(torch.tensor([[0.5, 0.0, 0.0, 0.0]]), boxes, (1, 1, 1, 1), "caffe")
    assert shifted.tolist() == [[20.0, 20.0, 40.0, 60.0]]
    shifted = decode_boxes(torch.tensor([[0.5, 0.0, 0.0, 0.0]]), boxes, (1, 1, 1, 1))
    assert shifted[0].tolist() == pytest.approx([19.5, 20.0, 38.5, 59.0])
    # dw is clamped at log(1000/16) in the detectron2 convention only
    huge = torch.tensor([[0.0, 0.0, 10.0, 0.0]])
    width = decode_boxes(huge, boxes, (1, 1, 1, 1))[0, 2] - decode_boxes(huge, boxes, (1, 1, 1, 1))[0, 0]
    assert width.item() == pytest.approx(19 * 1000 / 16, rel=1e-5)
    out = torch.tensor([[-5.0, -5.0, 105.0, 55.0]])
    assert clip_boxes(out, (50, 100)).tolist() == [[0.0, 0.0, 100.0, 50.0]]
    assert clip_boxes(out, (50, 100), "caffe").tolist() == [[0.0, 0.0, 99.0, 49.0]]


# ------------------------------------------------------------------------------------------------- selection
def _random_detections(seed: int, num_boxes: int = 40, num_classes: int = 6):
    generator = torch.Generator().manual_seed(seed)
    xy = torch.rand(num_boxes, 2, generator=generator) * 80
    wh = torch.rand(num_boxes, 2, generator=generator) * 40 + 4
    boxes = torch.cat([xy, xy + wh], dim=1)
    logits = torch.randn(num_boxes, num_classes + 1, generator=generator) * 2
    return boxes, logits.softmax(-1)


def _butd_reference(boxes, probs, threshold, nms_threshold, min_boxes, max_boxes, caffe):
    """generate_tsv.py, written as the loop it is (numpy, one NMS per class)."""
    iou_boxes = boxes + torch.tensor([0, 0, 1.0, 1.0]) if caffe else boxes
    num_boxes, num_columns = probs.shape
    max_conf = np.zeros(num_boxes, dtype=np.float32)
    for c in range(num_columns - 1):  # background is the last column here
        keep = nms(iou_boxes, probs[:, c], nms_threshold).numpy()
        max_conf[keep] = np.where(max_conf[keep] < probs[keep, c].numpy(), probs[keep, c].numpy(), max_conf[keep])
    keep_boxes = np.where(max_conf >= threshold)[0]
    if len(keep_boxes) < min_boxes:
        keep_boxes = np.argsort(-max_conf, kind="stable")[:min_boxes]
    elif len(keep_boxes) > max_boxes:
        keep_boxes = np.argsort(-max_conf, kind="stable")[:max_boxes]
    return keep_boxes.tolist(), max_conf[keep_boxes]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("caffe", [False, True])
def test_butd_selection_matches_the_per_class_loop(seed, caffe):
    boxes, probs = _random_detections(seed)
    convention = "caffe" if caffe else "detectron2"
    for threshold, lo, hi in ((0.2, 10, 100), (0.2, 3, 5), (0.6, 10, 100), (0.0, 1, 100)):
        selection = select_butd(boxes, probs, threshold, 0.3, lo, hi, convention)
        expected_ids, expected_conf = _butd_reference(boxes, probs, threshold, 0.3, lo, hi, caffe)
        assert selection.proposal_indices.tolist() == expected_ids
        np.testing.assert_allclose(selection.scores.numpy(), expected_conf, rtol=0, atol=0)
        assert torch.equal(selection.boxes, boxes[selection.proposal_indices])


@pytest.mark.parametrize("seed", range(4))
def test_per_class_nms_keep_matches_torchvision_per_class(seed):
    boxes, probs = _random_detections(seed, num_boxes=60, num_classes=9)
    keep = per_class_nms_keep(boxes, probs, 0.4)
    for c in range(probs.shape[1]):
        expected = torch.zeros(len(boxes), dtype=torch.bool)
        expected[nms(boxes, probs[:, c], 0.4)] = True
        assert torch.equal(keep[:, c], expected), f"class {c}"


def test_max_class_nms_tries_thresholds_until_enough_boxes():
    boxes, probs = _random_detections(3, num_boxes=50, num_classes=4)
    predicted = boxes.repeat(1, 4)  # every class regresses to the proposal
    scores, classes = probs[:, :-1].max(1)
    counts = {t: len(nms(boxes, scores, t)) for t in (0.1, 0.3, 0.5, 0.9)}
    target = counts[0.5]
    selection = select_max_class_nms(predicted, probs, [0.1, 0.3, 0.5, 0.9], target, 100)
    assert selection.nms_thresholds_tried == [0.1, 0.3, 0.5]
    assert selection.proposal_indices.tolist() == nms(boxes, scores, 0.5).tolist()
    assert selection.class_ids.tolist() == classes[selection.proposal_indices].tolist()
    capped = select_max_class_nms(predicted, probs, [0.9], 1, 7)
    assert len(capped.proposal_indices) == 7
    # none reaches min_boxes: the last threshold's result is kept
    fallback = select_max_class_nms(predicted, probs, [0.1, 0.3], 1000, 1000)
    assert fallback.nms_thresholds_tried == [0.1, 0.3]
    assert len(fallback.proposal_indices) == counts[0.3]


def test_per_class_nms_selection_against_a_loop():
    boxes, probs = _random_detections(5, num_boxes=30, num_classes=3)
    predicted = torch.cat([boxes + k for k in range(3)], dim=1)  # class k shifts the box by k px
    selection = select_per_class_nms(predicted, probs, 0.2, [0.5], 1, 1000)
    expected = []
    for c in range(3):
        candidates = torch.nonzero(probs[:, c] > 0.2).flatten()
        kept = nms(boxes[candidates] + c, probs[candidates, c], 0.5)
        expected += [(probs[candidates[k], c].item(), candidates[k].item(), c) for k in kept]
    expected.sort(key=lambda e: -e[0])
    got = list(zip(selection.scores.tolist(), selection.proposal_indices.tolist(), selection.class_ids.tolist()))
    assert [(i, c) for _, i, c in got] == [(i, c) for _, i, c in expected]
    for (_, i, c), box in zip(got, selection.boxes):
        assert torch.equal(box, boxes[i] + c)


# ------------------------------------------------------------------------------------------------- images
def test_image_conversions(tmp_path):
    rgb = np.random.default_rng(0).integers(0, 256, size=(20, 24, 3), dtype=np.uint8)
    gray = rgb[:, :, 0]
    assert (load_rgb_image(gray) == gray[:, :, None]).all()
    rgba = np.concatenate([rgb, np.full((20, 24, 1), 7, np.uint8)], axis=2)
    assert (load_rgb_image(rgba) == rgb).all()
    sixteen = gray.astype(np.uint16) * 257
    assert (load_rgb_image(sixteen) == gray[:, :, None]).all()
    Image.fromarray(sixteen).save(tmp_path / "deep.png")  # 16-bit grayscale PNG
    assert (load_rgb_image(tmp_path / "deep.png") == gray[:, :, None]).all()
    Image.fromarray(rgba, "RGBA").save(tmp_path / "alpha.png")
    assert (load_rgb_image(str(tmp_path / "alpha.png")) == rgb).all()
    Image.fromarray(gray, "L").save(tmp_path / "gray.png")
    assert (load_rgb_image(Image.open(tmp_path / "gray.png")) == gray[:, :, None]).all()


def test_bad_images_are_refused(tmp_path):
    write_test_image(tmp_path / "ok.png", 40, 40)
    data = (tmp_path / "ok.png").read_bytes()
    (tmp_path / "truncated.png").write_bytes(data[: len(data) // 2])
    (tmp_path / "text.png").write_text("not an image")
    with pytest.raises(ValueError, match="truncated"):
        load_rgb_image(tmp_path / "truncated.png")
    with pytest.raises(ValueError, match="cannot read the image"):
        load_rgb_image(tmp_path / "text.png")
    with pytest.raises(FileNotFoundError, match="no such image"):
        load_rgb_image(tmp_path / "missing.png")
    with pytest.raises(ValueError, match="too small"):
        load_rgb_image(np.zeros((8, 100, 3), np.uint8))
    with pytest.raises(ValueError, match="above the limit"):
        load_rgb_image(np.zeros((100, 100, 3), np.uint8), max_pixels=5000)
    with pytest.raises(ValueError, match="uint8"):
        load_rgb_image(np.zeros((32, 32, 3), np.float32))
    with pytest.raises(ValueError, match="shape"):
        load_rgb_image(np.zeros((32, 32, 2), np.uint8))
    with pytest.raises(TypeError, match="path, a PIL.Image or a numpy array"):
        load_rgb_image(torch.zeros(3, 32, 32))


def test_extractor_rejects_bad_inputs(tmp_path):
    extractor = tiny_detector()
    with pytest.raises(ValueError, match=r"images\[1\].*too small"):
        extractor([np.zeros((40, 40, 3), np.uint8), np.zeros((10, 40, 3), np.uint8)])
    with pytest.raises(ValueError, match="aspect ratio"):
        extractor(np.zeros((16, 4000, 3), np.uint8))  # shorter side resizes below the stride
    with pytest.raises(ValueError, match="no images"):
        extractor([])
    with pytest.raises(TypeError, match="images must be"):
        extractor(42)


# ------------------------------------------------------------------------------------------------- extractor
def test_extractor_outputs_and_round_trip(tmp_path):
    extractor = tiny_detector(seed=1, object_names=[f"thing{i}" for i in range(5)])
    image = write_test_image(tmp_path / "a.png", 48, 70, seed=1)
    other = write_test_image(tmp_path / "b.png", 64, 40, seed=2)
    regions = extractor([image, Image.open(other), np.asarray(Image.open(image))])
    assert len(regions) == 3
    first = regions[0]
    assert first.feature_dim == extractor.config.feature_dim == 16
    assert first.image_size == (48, 70)
    assert first.class_probs.shape == (len(first), 6) and first.attribute_probs.shape == (len(first), 3)
    torch.testing.assert_close(first.class_probs.sum(1), torch.ones(len(first)))
    assert 2 <= len(first) <= 10
    assert (first.boxes[:, 2] <= 70).all() and (first.boxes[:, 3] <= 48).all()
    torch.testing.assert_close(regions[2].features, first.features)  # path and array give the same pixels
    single = extractor(str(other))[0]
    torch.testing.assert_close(single.features, regions[1].features, atol=1e-5, rtol=1e-5)
    extractor.save_pretrained(tmp_path / "saved")
    assert {p.name for p in (tmp_path / "saved").iterdir()} >= {
        "config.json",
        "model.safetensors",
        "objects_vocab.txt",
        "attributes_vocab.txt",
    }
    loaded = RegionExtractor.from_pretrained(tmp_path / "saved")
    assert loaded.object_names == [f"thing{i}" for i in range(5)]
    assert loaded.attribute_names == ["attribute_0", "attribute_1", "attribute_2"]
    again = loaded(str(image))[0]
    torch.testing.assert_close(again.features, first.features)
    torch.testing.assert_close(again.boxes, first.boxes)
    regrouped = RegionExtractor.from_pretrained(
        tmp_path / "saved", selection_mode="max_class_nms", nms_thresholds=[0.3, 0.5]
    )
    assert regrouped.config.selection_mode == "max_class_nms"


def test_config_validation_and_json(tmp_path):
    config = tiny_detector_config()
    assert DetectorConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="selection_mode"):
        tiny_detector_config(selection_mode="fastest")
    with pytest.raises(ValueError, match="depth"):
        tiny_detector_config(depth=34)
    with pytest.raises(ValueError, match="object_names has 2 entries"):
        tiny_detector_config(object_names=["a", "b"])
    with pytest.raises(ValueError, match="unknown DetectorConfig field"):
        DetectorConfig.from_dict({"colour": "red"})
    with pytest.raises(ValueError, match="one NMS threshold"):
        tiny_detector_config(nms_thresholds=[0.3, 0.4])


def test_bfloat16_extractor_runs_and_stays_close(tmp_path):
    extractor = tiny_detector(seed=3, selection_mode="max_class_nms", nms_thresholds=[0.5])
    image = write_test_image(tmp_path / "a.png", 50, 60, seed=4)
    prepared = extractor.prepare(str(image))
    with torch.inference_mode():
        proposals, reference = extractor.run_heads(prepared)
        extractor.to(torch.bfloat16)
        res4 = extractor.backbone_features(prepared[0])
        low = extractor.roi_heads([res4], proposals)[0]
    assert res4.dtype == torch.bfloat16 and low.features.dtype == torch.float32
    error = (low.features - reference[0].features).norm() / reference[0].features.norm()
    assert error < 0.05
    assert len(extractor.detect(str(image))[0]) > 0


@pytest.mark.parametrize("floor", [0.05, 0.2, 0.5])
def test_per_class_nms_keep_with_a_score_floor_is_exact_above_it(floor):
    boxes, probs = _random_detections(7, num_boxes=50, num_classes=8)
    full = per_class_nms_keep(boxes, probs, 0.3)
    partial = per_class_nms_keep(boxes, probs, 0.3, min_score=floor)
    above = probs >= floor
    assert torch.equal(partial[above], full[above])
    assert not partial[~above].any()


def test_per_class_selection_that_keeps_nothing_is_an_error(tmp_path):
    extractor = tiny_detector(selection_mode="per_class_nms", nms_thresholds=[0.5], score_threshold=1.0)
    image = write_test_image(tmp_path / "a.png", 40, 40)
    assert len(extractor.detect(str(image))[0]) == 0
    with pytest.raises(ValueError, match="no detection has a class probability above score_threshold=1.0"):
        extractor(str(image))


def test_caffe_conventions_run_end_to_end(tmp_path):
    extractor = tiny_detector(
        seed=6, box_convention="caffe", anchor_style="caffe", rpn_min_size=16.0, box_weights=[1.0, 1.0, 1.0, 1.0]
    )
    assert extractor.proposal_generator.cell_anchors.tolist() == CAFFE_ANCHORS
    image = write_test_image(tmp_path / "a.png", 48, 80, seed=6)
    prepared = extractor.prepare(str(image))[0]
    detections = extractor.detect(str(image))[0]
    with torch.inference_mode():
        proposals, _ = extractor.run_heads([prepared])
    # generate_tsv.py: the reported boxes are the proposals divided by the resize factor
    expected = proposals[0][detections.proposal_indices] / prepared.scale
    limits = torch.tensor([79.0, 47.0, 79.0, 47.0])  # inclusive pixel coordinates: at most W - 1, H - 1
    torch.testing.assert_close(detections.boxes, torch.minimum(expected.clamp(min=0), limits))
    assert (detections.boxes[:, 2] <= 79).all() and (detections.boxes[:, 3] <= 47).all()
    widths = proposals[0][:, 2] - proposals[0][:, 0] + 1
    assert (widths >= 16 * prepared.scale).all()


def test_butd_skips_the_box_regression_and_detects_exactly_the_same(tmp_path):
    # "butd" reports the proposals, so run_heads skips bbox_pred; the detections must equal, bit for bit, those
    # computed from the full head (with box deltas), on several images.
    extractor = tiny_detector(seed=8)
    images = [write_test_image(tmp_path / f"{i}.png", 40 + 8 * i, 72 - 8 * i, seed=10 + i) for i in range(4)]
    prepared = extractor.prepare([str(image) for image in images])
    with torch.inference_mode():
        proposals, outputs = extractor.run_heads(prepared)
        res4 = [extractor.backbone_features(item) for item in prepared]
        full = extractor.roi_heads(res4, proposals, box_deltas=True)
        fast = extractor.detect([str(image) for image in images])
    for item, boxes, lean, complete, detections in zip(prepared, proposals, outputs, full, fast):
        assert lean.box_deltas is None and complete.box_deltas.shape == (len(boxes), 4 * 5)
        for name in ("features", "class_logits", "attribute_logits"):
            assert torch.equal(getattr(lean, name), getattr(complete, name)), name
        reference = extractor._detections(boxes, complete, item)
        for name in ("features", "boxes", "proposal_indices", "class_ids", "scores", "class_probs", "attribute_probs"):
            assert torch.equal(getattr(detections, name), getattr(reference, name)), name
