"""A detector trained on the shapes world, for what random weights cannot tell: whether bf16 and int8 select the
same boxes as float32 when the class scores are a trained detector's (issue 30 item 4).

The project holds no trained bottom-up-attention checkpoint (the released one is a download away), and on random
weights the class scores of all proposals lie close together, so any rounding reorders the selection. This script
trains a small detector of the same architecture (ResNet-50 C4, RoIPool 14×14, dilated res5, attribute head) on
shapes-world scenes, 24 classes (colour + shape) and 2 attributes (size), with the Faster R-CNN losses computed by
torchvision's detection utilities (`Matcher`, `BalancedPositiveNegativeSampler`, `BoxCoder`) on the extractor's
own modules, and measures it:

    python bench/shapes_detector.py train --output runs/shapes_detector --steps 1500
    python bench/shapes_detector.py agreement runs/shapes_detector --images 200

`train` saves a `RegionExtractor` folder and prints the float32 detector's recall on held-out scenes; `agreement`
compares bf16 and int8 (res5) detections with float32's in each selection rule.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.detection._utils import BalancedPositiveNegativeSampler, BoxCoder, Matcher
from torchvision.ops import box_iou

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vlhub.data.shapes_scene import OBJECT_ATTRIBUTES, OBJECT_CLASSES, SIZES, Scene, sample_scene  # noqa: E402
from vlhub.processing.detector import DetectorConfig, RegionExtractor  # noqa: E402
from vlhub.processing.detector.backbone import Bottleneck, ConvNorm  # noqa: E402
from vlhub.processing.detector.rpn import grid_anchors  # noqa: E402

SCENE_SIZE = 256  # default scene side, pixels
# Seeds of the scene streams: training, the held-out recall set, and the agreement set (with its calibration scenes).
TRAIN_SEED, HELD_OUT_SEED, AGREEMENT_SEED = 1, 2, 3


def shapes_detector_config(scene_size: int = SCENE_SIZE, **overrides) -> DetectorConfig:
    """The released detector's architecture at 1/4 of its width, sized for square scenes of `scene_size` pixels:
    anchors of 1/8–1/2 of the side, 100 proposals, the "butd" selection of 10–36 boxes. Pixels are divided by
    ImageNet's standard deviation (the released model divides by 1), which training from scratch needs."""
    settings = dict(
        depth=50,
        width_per_group=16,
        stem_out_channels=16,
        res2_out_channels=64,
        rpn_hidden_channels=64,
        anchor_style="detectron2",
        anchor_sizes=[scene_size / 8, scene_size / 4, scene_size / 2],
        anchor_ratios=[0.5, 1.0, 2.0],
        num_classes=len(OBJECT_CLASSES) - 1,
        num_attributes=len(OBJECT_ATTRIBUTES) - 1,
        attribute_embedding_dim=32,
        attribute_hidden_dim=64,
        min_size=scene_size,
        max_size=scene_size,
        pixel_std=[57.375, 57.12, 58.395],
        rpn_pre_nms_top_n=1000,
        rpn_post_nms_top_n=100,
        min_boxes=10,
        max_boxes=36,
        object_names=list(OBJECT_CLASSES[1:]),
        attribute_names=list(OBJECT_ATTRIBUTES[1:]),
    )
    settings.update(overrides)
    return DetectorConfig(**settings)


def initialised_extractor(config: DetectorConfig, seed: int = 0) -> RegionExtractor:
    """A detector to train from scratch. Its BatchNorms are frozen (inference-style, as the released model's), so
    they start as identities, except each residual branch's last one, which scales the branch by 0.2 so that the
    sum of 19 blocks stays in range; convolutions get He initialisation, the predictors detectron2's small normals."""
    torch.manual_seed(seed)
    extractor = RegionExtractor(config)
    with torch.no_grad():
        for module in extractor.modules():
            if isinstance(module, ConvNorm):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                module.norm.weight.fill_(1.0)
                module.norm.bias.zero_()
                module.norm.running_mean.zero_()
                module.norm.running_var.fill_(1.0 - module.norm.eps)
            if isinstance(module, Bottleneck):
                module.conv3.norm.weight.fill_(0.2)
        head, predictor = extractor.proposal_generator.rpn_head, extractor.roi_heads.box_predictor
        for layer in (head.conv, head.objectness_logits, head.anchor_deltas, predictor.cls_score, predictor.fc_attr):
            nn.init.normal_(layer.weight, std=0.01)
            nn.init.zeros_(layer.bias)
        nn.init.normal_(predictor.bbox_pred.weight, std=0.001)
        nn.init.zeros_(predictor.bbox_pred.bias)
    return extractor


@dataclass
class Targets:
    """One scene's ground truth in the resized image: `boxes` `(G, 4)`, `classes` `(G,)` 0-based object ids,
    `attributes` `(G,)` 0-based attribute ids."""

    boxes: torch.Tensor
    classes: torch.Tensor
    attributes: torch.Tensor


def scene_targets(scene: Scene, scale_yx: tuple[float, float]) -> Targets:
    """A scene's objects as detection targets, boxes scaled from the scene's pixels to the resized image's."""
    scale_y, scale_x = scale_yx
    boxes = torch.tensor([obj.box for obj in scene.objects], dtype=torch.float32)
    boxes = boxes * torch.tensor([scale_x, scale_y, scale_x, scale_y])
    classes = torch.tensor([OBJECT_CLASSES.index(f"{o.colour} {o.shape}") - 1 for o in scene.objects])
    attributes = torch.tensor([SIZES.index(o.size) for o in scene.objects])
    return Targets(boxes, classes, attributes)


class DetectionLosses:
    """Faster R-CNN's four training losses on a `RegionExtractor`'s own modules (RPN objectness and boxes, RoI
    classification and class-specific boxes) plus the attribute head's, as torchvision's detection models compute
    them: anchors matched at IoU 0.7 / 0.3 (256 sampled per image, half positive), RoIs (the RPN's proposals and the
    ground truth) at 0.5 (`rois_per_image` sampled, a quarter positive)."""

    def __init__(self, extractor: RegionExtractor, rois_per_image: int = 64) -> None:
        config = extractor.config
        self.extractor = extractor
        self.anchor_matcher = Matcher(0.7, 0.3, allow_low_quality_matches=True)
        self.anchor_sampler = BalancedPositiveNegativeSampler(256, 0.5)
        self.rpn_coder = BoxCoder(tuple(config.rpn_box_weights))
        self.roi_matcher = Matcher(0.5, 0.5, allow_low_quality_matches=False)
        self.roi_sampler = BalancedPositiveNegativeSampler(rois_per_image, 0.25)
        self.roi_coder = BoxCoder(tuple(config.box_weights))

    def __call__(self, scenes: list[Scene]) -> dict[str, torch.Tensor]:
        extractor = self.extractor
        prepared = extractor.prepare([scene.image for scene in scenes])
        targets = [
            scene_targets(scene, (p.resized_size[0] / p.original_size[0], p.resized_size[1] / p.original_size[1]))
            for scene, p in zip(scenes, prepared)
        ]
        res4_maps = [extractor.backbone_features(p) for p in prepared]
        rpn_losses, proposals = [], []
        for res4, item, target in zip(res4_maps, prepared, targets):
            losses, boxes = self._rpn(res4, item.resized_size, item.scale, target)
            rpn_losses.append(losses)
            proposals.append(torch.cat([boxes, target.boxes]))
        losses = {name: torch.stack([part[name] for part in rpn_losses]).mean() for name in rpn_losses[0]}
        losses.update(self._roi_heads(res4_maps, proposals, targets))
        return losses

    def _rpn(self, res4, image_size, scale, target: Targets) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        rpn = self.extractor.proposal_generator
        logits, deltas = rpn.rpn_head(res4)
        num_anchors, height, width = logits.shape[1:]
        # The same (y, x, anchor) order as `RegionProposalNetwork.select_proposals`.
        flat_logits = logits[0].permute(1, 2, 0).reshape(-1)
        flat_deltas = deltas[0].reshape(num_anchors, 4, height, width).permute(2, 3, 0, 1).reshape(-1, 4)
        anchors = grid_anchors(rpn.cell_anchors.float(), height, width, rpn.config.feature_stride)
        matches = self.anchor_matcher(box_iou(target.boxes, anchors))
        labels = (matches >= 0).float()
        labels[matches == Matcher.BETWEEN_THRESHOLDS] = -1.0
        positive, negative = (mask[0] for mask in self.anchor_sampler([labels]))
        sampled = torch.where(positive | negative)[0]
        positive = torch.where(positive)[0]
        wanted = self.rpn_coder.encode_single(target.boxes[matches[positive]], anchors[positive])
        losses = {
            "rpn_objectness": F.binary_cross_entropy_with_logits(flat_logits[sampled], labels[sampled]),
            "rpn_boxes": F.smooth_l1_loss(flat_deltas[positive], wanted, beta=1 / 9, reduction="sum")
            / max(len(sampled), 1),
        }
        with torch.no_grad():
            boxes, _ = rpn.select_proposals(logits.detach(), deltas.detach(), image_size, scale)
        return losses, boxes

    def _roi_heads(self, res4_maps, proposals, targets: list[Targets]) -> dict[str, torch.Tensor]:
        num_classes = self.extractor.config.num_classes
        boxes, classes, attributes, regression = [], [], [], []
        for candidates, target in zip(proposals, targets):
            matches = self.roi_matcher(box_iou(target.boxes, candidates))
            labels = torch.where(matches >= 0, target.classes[matches.clamp(min=0)], num_classes)
            positive, negative = (mask[0] for mask in self.roi_sampler([(matches >= 0).long()]))
            keep = torch.where(positive | negative)[0]
            kept_matches = matches[keep].clamp(min=0)
            boxes.append(candidates[keep])
            classes.append(labels[keep])
            attributes.append(target.attributes[kept_matches])
            regression.append(self.roi_coder.encode_single(target.boxes[kept_matches], candidates[keep]))
        heads = self.extractor.roi_heads
        features = heads.region_features(res4_maps, boxes)
        class_logits, box_deltas, attribute_logits = heads.box_predictor(features)
        classes, attributes, regression = torch.cat(classes), torch.cat(attributes), torch.cat(regression)
        foreground = torch.where(classes < num_classes)[0]
        picked = box_deltas.reshape(len(box_deltas), num_classes, 4)[foreground, classes[foreground]]
        losses = {
            "roi_classes": F.cross_entropy(class_logits, classes),
            "roi_boxes": F.smooth_l1_loss(picked, regression[foreground], beta=1 / 9, reduction="sum")
            / max(len(classes), 1),
        }
        if attribute_logits is not None and len(foreground):
            losses["roi_attributes"] = F.cross_entropy(attribute_logits[foreground], attributes[foreground])
        return losses


def scene_stream(seed: int, scene_size: int):
    rng = np.random.default_rng(seed)
    while True:
        yield sample_scene(rng, scene_size, 1, 6)


def train(
    extractor: RegionExtractor,
    steps: int,
    batch_size: int = 2,
    learning_rate: float = 1e-3,
    log_every: int = 50,
    rois_per_image: int = 64,
):
    """AdamW with a 100-step warm-up and a cosine decay, on scenes of the detector's input size; returns the last
    logged losses."""
    losses_of = DetectionLosses(extractor, rois_per_image)
    parameters = [p for p in extractor.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=learning_rate, weight_decay=1e-4)
    warmup = min(100, max(steps // 10, 1))

    def rate(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(steps - warmup, 1)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    scenes = scene_stream(TRAIN_SEED, extractor.config.min_size)
    extractor.train()
    start, logged = time.perf_counter(), {}
    for step in range(steps):
        losses = losses_of([next(scenes) for _ in range(batch_size)])
        total = sum(losses.values())
        if not torch.isfinite(total):
            raise FloatingPointError(
                f"step {step}: a loss is not finite: { ({k: float(v.detach()) for k, v in losses.items()}) }"
            )
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 10.0)
        optimizer.step()
        schedule.step()
        if (step + 1) % log_every == 0 or step + 1 == steps:
            logged = {name: round(float(value.detach()), 4) for name, value in losses.items()}
            print(f"step {step + 1}/{steps} ({time.perf_counter() - start:.0f} s): {logged}", flush=True)
    extractor.eval()
    return logged


def held_out_recall(extractor: RegionExtractor, count: int, iou: float = 0.5) -> dict[str, float]:
    """On `count` held-out scenes: the share of objects found (a detection at IoU ≥ `iou` with the right class and
    a confidence ≥ the config's score threshold), the share of such confident detections that are right, and the
    share of found objects whose size attribute is right."""
    scenes = scene_stream(HELD_OUT_SEED, extractor.config.min_size)
    objects = found = confident = correct = sizes_right = 0
    threshold = extractor.config.score_threshold
    with torch.inference_mode():
        for _ in range(count):
            scene = next(scenes)
            detections = extractor.detect(scene.image)[0]
            targets = scene_targets(scene, (1.0, 1.0))
            sure = detections.scores >= threshold
            overlaps = box_iou(targets.boxes, detections.boxes) >= iou
            same_class = targets.classes[:, None] == detections.class_ids[None, :]
            hits = overlaps & same_class & sure[None, :]
            objects += len(targets.boxes)
            found += int(hits.any(dim=1).sum())
            confident += int(sure.sum())
            correct += int(hits.any(dim=0).sum())
            for g in torch.where(hits.any(dim=1))[0]:
                first = int(torch.where(hits[g])[0][0])
                sizes_right += int(detections.attribute_ids[first] == targets.attributes[g])
    return {
        "recall": found / max(objects, 1),
        "precision": correct / max(confident, 1),
        "size_accuracy": sizes_right / max(found, 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    trainer = commands.add_parser("train", help="train a shapes-world detector and save it")
    trainer.add_argument("--output", required=True, help="the RegionExtractor folder to write")
    trainer.add_argument("--steps", type=int, default=1500)
    trainer.add_argument("--batch-size", type=int, default=2)
    trainer.add_argument("--learning-rate", type=float, default=1e-3)
    trainer.add_argument("--scene-size", type=int, default=SCENE_SIZE, help="scene side in pixels (default 256)")
    trainer.add_argument("--rois-per-image", type=int, default=64, help="RoIs sampled per scene (default 64)")
    trainer.add_argument("--held-out", type=int, default=100, help="scenes for the recall printed at the end")
    trainer.add_argument("--threads", type=int, default=None)
    comparer = commands.add_parser("agreement", help="bf16 and int8 against float32 on a trained detector")
    comparer.add_argument("folder", help="a RegionExtractor folder (written by `train`, or any converted detector)")
    comparer.add_argument("--images", type=int, default=200)
    comparer.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.command == "train":
        for name in ("steps", "batch_size", "held_out", "rois_per_image"):
            if getattr(args, name) < 1:
                parser.error(f"--{name.replace('_', '-')} must be at least 1")
        if args.scene_size < 64:
            parser.error("--scene-size must be at least 64")
        extractor = initialised_extractor(shapes_detector_config(args.scene_size))
        train(extractor, args.steps, args.batch_size, args.learning_rate, rois_per_image=args.rois_per_image)
        extractor.save_pretrained(args.output)
        print(f"saved {args.output}; held-out {held_out_recall(extractor, args.held_out)}", flush=True)
    else:
        from bench.detector_speed import compare_dtypes, cpu_kind

        reference = RegionExtractor.from_pretrained(args.folder)
        print(f"CPU: {cpu_kind()}", flush=True)
        if reference.object_names == list(OBJECT_CLASSES[1:]):  # a shapes-world detector: how good it is
            print(f"held-out fp32 {held_out_recall(reference, 100)}", flush=True)
        scenes = scene_stream(AGREEMENT_SEED, reference.config.min_size)
        calibration = [next(scenes).image for _ in range(4)]
        pictures = [next(scenes).image for _ in range(args.images)]
        detectors = {
            f"shapes detector ({mode})": RegionExtractor.from_pretrained(args.folder, selection_mode=mode)
            for mode in ("butd", "max_class_nms", "per_class_nms")
        }
        compare_dtypes(detectors, pictures, calibration)


if __name__ == "__main__":
    main()
