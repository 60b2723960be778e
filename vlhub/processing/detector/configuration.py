"""`DetectorConfig`: every setting of the bottom-up-attention Faster R-CNN, JSON-serialisable.

Defaults are the released Visual Genome model (ResNet-101 C4, 1600 objects, 400 attributes, 300 proposals,
600/1000 resize, Caffe pixel means, BGR) with the original `generate_tsv.py` box selection ("butd").
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...utils.choices import check_choice

__all__ = ["DetectorConfig", "SELECTION_MODES", "RESNET_BLOCKS"]

# Bottleneck blocks in res2, res3, res4 (res5 lives in the RoI head and always has 3).
RESNET_BLOCKS = {50: (3, 4, 6), 101: (3, 4, 23), 152: (3, 8, 36)}

# "butd": the Caffe original's generate_tsv.py (per-class NMS, confidence threshold, min..max boxes, proposal boxes).
# "max_class_nms": the MMF / Hugging Face FRCNN port's `do_nms` (class-agnostic NMS over each proposal's best class,
#     first threshold of the list giving min..max boxes, regressed boxes).
# "per_class_nms": the detectron2 port's attribute notebook (`fast_rcnn_inference_single_image` per class over
#     every (proposal, class) pair above the score threshold, NMS threshold loop until min..max detections).
SELECTION_MODES = ("butd", "max_class_nms", "per_class_nms")

BOX_CONVENTIONS = ("detectron2", "caffe")
RESIZE_BACKENDS = ("torch", "pil")


@dataclass
class DetectorConfig:
    """Settings of a `RegionExtractor`.

    Architecture: `depth` (50/101/152 → res2..res4 block counts), `stem_out_channels`, `res2_out_channels`
    (doubling per stage; res5 = 8×), `width_per_group`·`num_groups` (res2 bottleneck width, doubling per stage),
    `stride_in_1x1` (MSRA/Caffe style), `caffe_maxpool` (stem pool 3×3/2 pad 0 ceil-mode), `res5_dilation`
    (dilation of the RoI head's 3×3 convs; stride is 1 throughout res5), `rpn_hidden_channels`,
    `num_classes`/`num_attributes` (without background / "no attribute"), `attribute_embedding_dim`,
    `attribute_hidden_dim`, `pooler_resolution` (RoIPool output, at 1/16).

    Proposals: `anchor_style` ("caffe": ratio-major integer anchors of `generate_anchors.py`; "detectron2":
    size-major float anchors centred at 0), `anchor_sizes`, `anchor_ratios` (h/w); a checkpoint's anchors, when it
    has them, are used verbatim. `rpn_pre_nms_top_n`, `rpn_post_nms_top_n`, `rpn_nms_threshold`, `rpn_min_size`
    (boxes with a side ≤ it are dropped; Caffe: side < 16·scale), `rpn_box_weights`, `box_weights` (RoI head),
    `box_convention` ("detectron2": w = x2 − x1, clip to [0, W]; "caffe": w = x2 − x1 + 1, clip to [0, W − 1],
    NMS areas +1).

    Input: `min_size`/`max_size` (shortest-edge resize with the long side capped), `pixel_mean`/`pixel_std` in
    `input_format` channel order, `resize_backend` ("torch": float bilinear `F.interpolate`, as the MMF/HF port;
    "pil": Pillow bilinear on uint8, as detectron2), `max_image_pixels`.

    Selection (see `SELECTION_MODES`): `selection_mode`, `score_threshold`, `nms_thresholds` (one for "butd", a list
    tried in order otherwise), `min_boxes`, `max_boxes`.

    Vocabularies: `object_names` (num_classes), `attribute_names` (num_attributes); saved as vocab files.
    Speed: `roi_batch_size` (RoIs per res5 forward, bounds memory).
    """

    depth: int = 101
    num_groups: int = 1
    width_per_group: int = 64
    stem_out_channels: int = 64
    res2_out_channels: int = 256
    stride_in_1x1: bool = True
    caffe_maxpool: bool = True
    res5_dilation: int = 2
    norm_eps: float = 1e-5
    rpn_hidden_channels: int = 512
    anchor_style: str = "caffe"
    anchor_sizes: list[float] = field(default_factory=lambda: [64.0, 128.0, 256.0, 512.0])
    anchor_ratios: list[float] = field(default_factory=lambda: [0.5, 1.0, 2.0])
    feature_stride: int = 16
    rpn_pre_nms_top_n: int = 6000
    rpn_post_nms_top_n: int = 300
    rpn_nms_threshold: float = 0.7
    rpn_min_size: float = 0.0
    rpn_box_weights: list[float] = field(default_factory=lambda: [1.0, 1.0, 1.0, 1.0])
    box_weights: list[float] = field(default_factory=lambda: [10.0, 10.0, 5.0, 5.0])
    box_convention: str = "detectron2"
    pooler_resolution: int = 14
    num_classes: int = 1600
    num_attributes: int = 400
    attribute_embedding_dim: int = 256
    attribute_hidden_dim: int = 512
    min_size: int = 600
    max_size: int = 1000
    pixel_mean: list[float] = field(default_factory=lambda: [102.9801, 115.9465, 122.7717])
    pixel_std: list[float] = field(default_factory=lambda: [1.0, 1.0, 1.0])
    input_format: str = "BGR"
    resize_backend: str = "torch"
    max_image_pixels: int = 1 << 27
    selection_mode: str = "butd"
    score_threshold: float = 0.2
    nms_thresholds: list[float] = field(default_factory=lambda: [0.3])
    min_boxes: int = 10
    max_boxes: int = 100
    object_names: list[str] | None = None
    attribute_names: list[str] | None = None
    roi_batch_size: int = 50

    def __post_init__(self):
        self.validate()

    # ------------------------------------------------------------------ derived sizes
    @property
    def blocks_per_stage(self) -> tuple[int, int, int]:
        return RESNET_BLOCKS[self.depth]

    @property
    def res4_channels(self) -> int:
        return self.res2_out_channels * 4

    @property
    def feature_dim(self) -> int:
        """Size of a region feature (res5 output channels, 2048 for the released model)."""
        return self.res2_out_channels * 8

    @property
    def num_anchors(self) -> int:
        return len(self.anchor_sizes) * len(self.anchor_ratios)

    @property
    def has_attributes(self) -> bool:
        return self.num_attributes > 0

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        def fail(message):
            raise ValueError(f"DetectorConfig: {message}")

        if self.depth not in RESNET_BLOCKS:
            fail(f"depth must be one of {sorted(RESNET_BLOCKS)}, got {self.depth}")
        for name in (
            "num_groups",
            "width_per_group",
            "stem_out_channels",
            "res2_out_channels",
            "rpn_hidden_channels",
            "num_classes",
            "pooler_resolution",
            "min_size",
            "max_size",
            "rpn_pre_nms_top_n",
            "rpn_post_nms_top_n",
            "min_boxes",
            "max_boxes",
            "roi_batch_size",
            "res5_dilation",
            "feature_stride",
        ):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                fail(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.num_attributes < 0:
            fail(f"num_attributes must be >= 0 (0 = no attribute head), got {self.num_attributes}")
        if self.max_size < self.min_size:
            fail(f"max_size ({self.max_size}) must be >= min_size ({self.min_size})")
        if self.max_boxes < self.min_boxes:
            fail(f"max_boxes ({self.max_boxes}) must be >= min_boxes ({self.min_boxes})")
        for name, choices in (
            ("selection_mode", SELECTION_MODES),
            ("box_convention", BOX_CONVENTIONS),
            ("resize_backend", RESIZE_BACKENDS),
            ("anchor_style", ("caffe", "detectron2")),
            ("input_format", ("BGR", "RGB")),
        ):
            check_choice(getattr(self, name), choices, f"DetectorConfig: {name}")
        for name in ("pixel_mean", "pixel_std"):
            values = getattr(self, name)
            if len(values) != 3:
                fail(f"{name} needs 3 values (one per channel), got {values!r}")
        if any(s <= 0 for s in self.pixel_std):
            fail(f"pixel_std must be positive, got {self.pixel_std}")
        for name in ("rpn_box_weights", "box_weights"):
            if len(getattr(self, name)) != 4:
                fail(f"{name} needs 4 values (dx, dy, dw, dh), got {getattr(self, name)!r}")
        if not self.nms_thresholds:
            fail("nms_thresholds must list at least one IoU threshold")
        if self.selection_mode == "butd" and len(self.nms_thresholds) != 1:
            fail(f"selection_mode 'butd' uses one NMS threshold, got {self.nms_thresholds}")
        for t in [*self.nms_thresholds, self.rpn_nms_threshold, self.score_threshold]:
            if not (0.0 <= t <= 1.0) or math.isnan(t):
                fail(f"thresholds must lie in [0, 1], got {t}")
        for name, count in (("object_names", self.num_classes), ("attribute_names", self.num_attributes)):
            names = getattr(self, name)
            if names is not None and len(names) != count:
                fail(f"{name} has {len(names)} entries but the model has {count}")

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict, **overrides: Any) -> "DetectorConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        merged = {**data, **overrides}
        unknown = sorted(set(merged) - known)
        if unknown:
            raise ValueError(f"unknown DetectorConfig field(s) {unknown}; known fields: {sorted(known)}")
        return cls(**merged)

    def replace(self, **changes: Any) -> "DetectorConfig":
        return self.from_dict(self.to_dict(), **changes)

    def to_json_file(self, path: str | os.PathLike, exclude: tuple[str, ...] = (), extra: dict | None = None) -> None:
        """Write the fields (less `exclude`) as JSON, after the entries of `extra` (e.g. the extractor type)."""
        data = {**(extra or {}), **{k: v for k, v in self.to_dict().items() if k not in exclude}}
        Path(path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
