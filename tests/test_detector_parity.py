"""Parity of vlhub's RegionExtractor with the two reference ports, on their tiny random-weight fixtures.

Fixtures: $VLHUB_FIXTURES_DIR/detector_frcnn (MMF / HF `FRCNN` port, `pytorch_model.bin` + `config.yaml`) and
$VLHUB_FIXTURES_DIR/detector_d2 (detectron2 fork `py-bottom-up-attention`, `.pkl` + yacs config, the attribute
notebook's selection). Weights go through vlhub's converter; images are read from raw/*.png; every size and
setting comes from the fixture's own files.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vlhub.conversion.detector import convert_detector
from vlhub.processing.detector import RegionExtractor

from .conftest import fixtures_root

FEATURE_TOL = BOX_TOL = 1e-3
PROB_TOL = 1e-4


class Fixture:
    def __init__(self, name: str, weights_name: str):
        self.root = fixtures_root() / name
        if not self.root.is_dir():
            if os.environ.get("VLHUB_FIXTURES_DIR"):  # the fixtures were asked for: fail loudly
                pytest.fail(f"$VLHUB_FIXTURES_DIR is set but has no {name} fixture under {self.root.parent}")
            pytest.skip(f"no {name} fixture under {self.root.parent}")
        self.weights = self.root / "original" / weights_name
        listing = json.loads((self.root / "raw_inputs.json").read_text())
        self.images = [(self.root / item["file"], item["tensor"]) for item in listing["images"]]
        self.inputs = load_file(self.root / "model_inputs.safetensors")
        self.outputs = load_file(self.root / "outputs.safetensors")
        self.intermediates = load_file(self.root / "intermediates.safetensors")
        self.raw = load_file(self.root / "raw_inputs.safetensors")
        self._single = None

    @property
    def single(self):
        """Detections of each image, one image per call (computed once per module)."""
        if self._single is None:
            self._single = [self.extractor.detect(str(path))[0] for path, _ in self.images]
        return self._single


def _num_objects(readme: Path) -> int:
    # The notebook's NUM_OBJECTS is set by the fixture's harness; its README states it.
    match = re.search(r"NUM_OBJECTS\s*=\s*(\d+)", readme.read_text(encoding="utf-8"))
    assert match, f"{readme} does not state NUM_OBJECTS"
    return int(match.group(1))


@pytest.fixture(scope="module")
def frcnn(tmp_path_factory):
    fixture = Fixture("detector_frcnn", "pytorch_model.bin")
    out = tmp_path_factory.mktemp("frcnn")
    convert_detector(fixture.weights, out)
    fixture.extractor = RegionExtractor.from_pretrained(out)
    return fixture


@pytest.fixture(scope="module")
def d2(tmp_path_factory):
    fixture = Fixture("detector_d2", "faster_rcnn_from_caffe_attr.pkl")
    out = tmp_path_factory.mktemp("d2")
    convert_detector(fixture.weights, out)
    count = _num_objects(fixture.root / "README.md")
    fixture.extractor = RegionExtractor.from_pretrained(out, min_boxes=count, max_boxes=count)
    return fixture


def _close(actual, expected, tol, what):
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    diff = (actual.float() - expected.float()).abs().max().item() if actual.numel() else 0.0
    assert diff <= tol, f"{what}: max abs diff {diff:.3g} > {tol}"


# ---------------------------------------------------------------------------------------------------- frcnn port
def test_detector_frcnn_parity_preprocessing(frcnn):
    for path, name in frcnn.images:
        prepared = frcnn.extractor.prepare(str(path))[0]
        assert list(prepared.resized_size) == frcnn.inputs[f"{name}.sizes"][0].tolist()
        _close(prepared.tensor[None], frcnn.inputs[f"{name}.images"], 1e-3, f"{name} images")
        expected_scales = frcnn.inputs[f"{name}.scales_yx"][0]
        _close(torch.tensor(prepared.scales_yx), expected_scales, 1e-6, f"{name} scales_yx")


def _check_stages(fixture, class_logits_key: str):
    """Stage by stage, each from the reference's own input, so a mismatch points at one stage."""
    extractor, inter = fixture.extractor, fixture.intermediates
    with torch.inference_mode():
        for path, name in fixture.images:
            prepared = extractor.prepare(str(path))[0]
            res4 = inter[f"{name}.res4"]
            _close(extractor.backbone_features(prepared), res4, FEATURE_TOL, f"{name} res4")
            logits, deltas = inter[f"{name}.rpn_objectness_logits"], inter[f"{name}.rpn_anchor_deltas"]
            head_logits, head_deltas = extractor.proposal_generator.rpn_head(res4)
            _close(head_logits, logits, FEATURE_TOL, f"{name} rpn logits")
            _close(head_deltas, deltas, FEATURE_TOL, f"{name} rpn deltas")
            boxes, scores = extractor.proposal_generator.select_proposals(logits, deltas, prepared.resized_size)
            _close(boxes, inter[f"{name}.proposal_boxes"], BOX_TOL, f"{name} proposals")
            _close(scores, inter[f"{name}.proposal_logits"], FEATURE_TOL, f"{name} proposal logits")
            head = extractor.roi_heads([res4], [inter[f"{name}.proposal_boxes"]])[0]
            _close(head.features, inter[f"{name}.feature_pooled"], FEATURE_TOL, f"{name} pooled features")
            _close(head.class_logits, inter[f"{name}.{class_logits_key}"], FEATURE_TOL, f"{name} class logits")
            _close(head.box_deltas, inter[f"{name}.box_deltas"], FEATURE_TOL, f"{name} box deltas")
            _close(head.attribute_logits, inter[f"{name}.attr_logits"], FEATURE_TOL, f"{name} attribute logits")


def test_detector_frcnn_parity_intermediates(frcnn):
    _check_stages(frcnn, "obj_logits")


def test_detector_frcnn_parity_outputs(frcnn):
    out, inter = frcnn.outputs, frcnn.intermediates
    for (path, name), detections in zip(frcnn.images, frcnn.single):
        count = int(out[f"{name}.preds_per_image"][0])
        assert len(detections) == count
        assert detections.proposal_indices.tolist() == inter[f"{name}.keep"].tolist()
        assert detections.nms_thresholds_tried == pytest.approx(inter[f"{name}.nms_thresh_tried"].tolist())
        assert detections.class_ids.tolist() == out[f"{name}.obj_ids"][0].tolist()
        assert detections.attribute_ids.tolist() == out[f"{name}.attr_ids"][0].tolist()
        _close(detections.boxes, out[f"{name}.boxes"][0], BOX_TOL, f"{name} boxes")
        _close(detections.features, out[f"{name}.roi_features"][0], FEATURE_TOL, f"{name} features")
        _close(detections.scores, out[f"{name}.obj_probs"][0], PROB_TOL, f"{name} object probs")
        _close(detections.attribute_scores, out[f"{name}.attr_probs"][0], PROB_TOL, f"{name} attribute probs")
        # class_probs come background FIRST; the reference stores them background last
        reference = inter[f"{name}.cls_probs_selected"]
        _close(detections.class_probs, torch.cat([reference[:, -1:], reference[:, :-1]], 1), PROB_TOL, "class probs")
        height, width = detections.image_size
        normalized = detections.boxes / torch.tensor([width, height, width, height])
        _close(normalized, out[f"{name}.normalized_boxes"][0], BOX_TOL, f"{name} normalized boxes")


def test_detector_frcnn_parity_batched_region_features(frcnn):
    """All images in one call (one RoI-head pass) give each image's own results."""
    out = frcnn.outputs
    regions = frcnn.extractor([str(p) for p, _ in frcnn.images])
    for (path, name), region, single in zip(frcnn.images, regions, frcnn.single):
        assert tuple(region.image_size) == tuple(frcnn.raw[name].shape[:2])
        _close(region.features, out[f"{name}.roi_features"][0], FEATURE_TOL, f"{name} features")
        _close(region.boxes, out[f"{name}.boxes"][0], BOX_TOL, f"{name} boxes")
        _close(region.features, single.features, 1e-5, f"{name} batched vs single features")
        _close(region.scores, single.scores, 1e-6, f"{name} batched vs single scores")
        assert region.class_probs.shape[1] == frcnn.extractor.config.num_classes + 1


# ---------------------------------------------------------------------------------------------------- detectron2 port
def test_detector_d2_parity_preprocessing(d2):
    config = d2.extractor.config
    mean = torch.tensor(config.pixel_mean).view(3, 1, 1)
    std = torch.tensor(config.pixel_std).view(3, 1, 1)
    for path, name in d2.images:
        prepared = d2.extractor.prepare(str(path))[0]
        assert list(prepared.resized_size) == d2.inputs[f"{name}.image_sizes"][0].tolist()
        _close(prepared.tensor[None], d2.inputs[f"{name}.images"], 1e-4, f"{name} images")
        bgr = (prepared.tensor * std + mean).round()
        assert torch.equal(bgr, d2.inputs[f"{name}.resized_bgr"]), f"{name}: resized pixels differ from Pillow's"


def test_detector_d2_parity_intermediates(d2):
    _check_stages(d2, "cls_logits")


def test_detector_d2_parity_outputs(d2):
    out, inter = d2.outputs, d2.intermediates
    for (path, name), detections in zip(d2.images, d2.single):
        assert len(detections) == int(out[f"{name}.num_boxes"][0])
        assert detections.proposal_indices.tolist() == inter[f"{name}.ids"].tolist()
        assert detections.nms_thresholds_tried == inter[f"{name}.nms_thresh_tried"].tolist()
        assert detections.class_ids.tolist() == out[f"{name}.pred_classes"].tolist()
        assert detections.attribute_ids.tolist() == out[f"{name}.attr_classes"].tolist()
        assert list(detections.image_size) == out[f"{name}.image_size"].tolist()
        _close(detections.boxes, out[f"{name}.boxes"], BOX_TOL, f"{name} boxes")
        _close(detections.features, out[f"{name}.roi_features"], FEATURE_TOL, f"{name} features")
        _close(detections.scores, out[f"{name}.scores"], PROB_TOL, f"{name} scores")
        _close(detections.attribute_scores, out[f"{name}.attr_scores"], PROB_TOL, f"{name} attribute scores")
