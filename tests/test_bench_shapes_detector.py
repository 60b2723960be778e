"""bench/shapes_detector.py: the Faster R-CNN losses on the extractor's modules, and the dtype agreement wiring."""

import numpy as np
import pytest
import torch

from bench.detector_speed import compare_dtypes
from bench.shapes_detector import DetectionLosses, initialised_extractor, scene_targets, shapes_detector_config, train
from vlhub.data.shapes_scene import OBJECT_CLASSES, SIZES, sample_scene
from vlhub.processing.detector import RegionExtractor

# The bench's architecture at a width the tests can afford (16-d region features), on 128-pixel scenes.
TINY = dict(
    width_per_group=2,
    stem_out_channels=4,
    res2_out_channels=2,
    rpn_hidden_channels=4,
    attribute_embedding_dim=4,
    attribute_hidden_dim=8,
    anchor_sizes=[16.0, 32.0, 64.0],
    min_size=128,
    max_size=128,
    rpn_pre_nms_top_n=200,
    rpn_post_nms_top_n=20,
    min_boxes=2,
    max_boxes=6,
)


def scenes(count, seed=0, size=128):
    rng = np.random.default_rng(seed)
    return [sample_scene(rng, size, 1, 4) for _ in range(count)]


def test_scene_targets_scale_boxes_and_name_classes_and_sizes():
    scene = scenes(1)[0]
    targets = scene_targets(scene, (2.0, 0.5))
    for obj, box, cls, attribute in zip(scene.objects, targets.boxes, targets.classes, targets.attributes):
        x1, y1, x2, y2 = obj.box
        assert box.tolist() == [x1 * 0.5, y1 * 2.0, x2 * 0.5, y2 * 2.0]
        assert OBJECT_CLASSES[int(cls) + 1] == f"{obj.colour} {obj.shape}"
        assert SIZES[int(attribute)] == obj.size


def test_the_losses_reach_every_trainable_parameter():
    extractor = initialised_extractor(shapes_detector_config(**TINY))
    losses = DetectionLosses(extractor, rois_per_image=16)(scenes(2))
    assert set(losses) == {"rpn_objectness", "rpn_boxes", "roi_classes", "roi_boxes", "roi_attributes"}
    assert all(torch.isfinite(value) for value in losses.values())
    sum(losses.values()).backward()
    without = [name for name, p in extractor.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert without == []


def test_trained_folder_reloads_and_compares_dtypes(tmp_path, capsys):
    extractor = initialised_extractor(shapes_detector_config(**TINY))
    logged = train(extractor, steps=2, log_every=1)
    assert logged and all(np.isfinite(list(logged.values())))
    assert not extractor.training
    extractor.save_pretrained(tmp_path / "detector")
    reloaded = RegionExtractor.from_pretrained(tmp_path / "detector")
    assert reloaded.object_names == list(OBJECT_CLASSES[1:])
    pictures = [scene.image for scene in scenes(3, seed=5)]
    with torch.inference_mode():
        before, after = extractor.detect(pictures[:1])[0], reloaded.detect(pictures[:1])[0]
    torch.testing.assert_close(after.features, before.features)
    compare_dtypes({"tiny": reloaded}, pictures[:2], pictures[2:])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0].split()[-1] for line in lines[-2:]] == ["bf16", "int8"]
    assert all("boxes equal on" in line and "scoring >=" in line and "the same objects" in line for line in lines[-2:])


def test_train_refuses_a_loss_that_is_not_finite():
    extractor = initialised_extractor(shapes_detector_config(**TINY))
    with torch.no_grad():
        extractor.roi_heads.box_predictor.cls_score.bias.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="not finite"):
        train(extractor, steps=1)
