"""Region proposal network: 3×3 conv + ReLU, objectness (one logit per anchor) and box deltas, then the test-time
proposal selection (top-k, decode, clip, drop empty, NMS, top-k)."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .boxes import clip_boxes, decode_boxes, nms_boxes
from .configuration import DetectorConfig

__all__ = ["caffe_cell_anchors", "detectron2_cell_anchors", "grid_anchors", "RPNHead", "RegionProposalNetwork"]


def caffe_cell_anchors(
    base_size: int = 16, ratios: Sequence[float] = (0.5, 1.0, 2.0), scales: Sequence[float] = (4, 8, 16, 32)
) -> torch.Tensor:
    """`(len(ratios)·len(scales), 4)` anchors of py-faster-rcnn's `generate_anchors`: ratio-major, integer-rounded
    widths, centred on the base box's centre ((base − 1) / 2), inclusive (+1) width convention."""
    ctr = (base_size - 1) / 2.0
    area = float(base_size * base_size)
    anchors = []
    for ratio in ratios:
        w = np.round(np.sqrt(area / ratio))
        h = np.round(w * ratio)
        for scale in scales:
            ws, hs = w * scale, h * scale
            anchors.append([ctr - 0.5 * (ws - 1), ctr - 0.5 * (hs - 1), ctr + 0.5 * (ws - 1), ctr + 0.5 * (hs - 1)])
    return torch.tensor(anchors, dtype=torch.float32)


def detectron2_cell_anchors(
    sizes: Sequence[float] = (64.0, 128.0, 256.0, 512.0), ratios: Sequence[float] = (0.5, 1.0, 2.0)
) -> torch.Tensor:
    """detectron2's `DefaultAnchorGenerator`: size-major, w = sqrt(size² / ratio), h = ratio·w, centred at 0."""
    anchors = []
    for size in sizes:
        for ratio in ratios:
            w = math.sqrt(size * size / ratio)
            h = ratio * w
            anchors.append([-w / 2.0, -h / 2.0, w / 2.0, h / 2.0])
    return torch.tensor(anchors, dtype=torch.float32)


def cell_anchors_for(config: DetectorConfig) -> torch.Tensor:
    if config.anchor_style == "caffe":
        scales = [size / config.feature_stride for size in config.anchor_sizes]
        return caffe_cell_anchors(config.feature_stride, config.anchor_ratios, scales)
    return detectron2_cell_anchors(config.anchor_sizes, config.anchor_ratios)


def grid_anchors(cell_anchors: torch.Tensor, height: int, width: int, stride: int) -> torch.Tensor:
    """`(height·width·A, 4)` anchors over a feature map, ordered (y, x, anchor)."""
    shifts_x = torch.arange(width, dtype=torch.float32, device=cell_anchors.device) * stride
    shifts_y = torch.arange(height, dtype=torch.float32, device=cell_anchors.device) * stride
    shift_y, shift_x = torch.meshgrid(shifts_y, shifts_x, indexing="ij")
    shifts = torch.stack((shift_x, shift_y, shift_x, shift_y), dim=-1).reshape(-1, 1, 4)
    return (shifts + cell_anchors.reshape(1, -1, 4)).reshape(-1, 4)


class RPNHead(nn.Module):
    """`conv` 3×3 + ReLU, then 1×1 `objectness_logits` (A channels) and `anchor_deltas` (4·A channels)."""

    def __init__(self, in_channels: int, hidden_channels: int, num_anchors: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, hidden_channels, 3, padding=1)
        self.objectness_logits = nn.Conv2d(hidden_channels, num_anchors, 1)
        self.anchor_deltas = nn.Conv2d(hidden_channels, 4 * num_anchors, 1)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = F.relu(self.conv(features))
        return self.objectness_logits(hidden), self.anchor_deltas(hidden)


class RegionProposalNetwork(nn.Module):
    """Proposals of one image from its res4 map.

    `cell_anchors` `(A, 4)` is a buffer: generated from the config, replaced by a checkpoint's own anchors.
    """

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__()
        self.config = config
        self.rpn_head = RPNHead(config.res4_channels, config.rpn_hidden_channels, config.num_anchors)
        self.register_buffer("cell_anchors", cell_anchors_for(config))

    def forward(
        self, features: torch.Tensor, image_size: tuple[int, int], scale: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`features` `(1, C, Hf, Wf)`; `image_size` `(h, w)` of the resized image; `scale` its resize factor
        (Caffe's minimum proposal size is 16·scale). Returns `(boxes (R, 4), logits (R,))` in resized-image pixels,
        by decreasing objectness."""
        logits, deltas = self.rpn_head(features)
        return self.select_proposals(logits, deltas, image_size, scale)

    def select_proposals(
        self, logits: torch.Tensor, deltas: torch.Tensor, image_size: tuple[int, int], scale: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        config = self.config
        convention = config.box_convention
        num_anchors, height, width = logits.shape[1:]
        logits = logits[0].permute(1, 2, 0).reshape(-1).float()
        deltas = deltas[0].reshape(num_anchors, 4, height, width).permute(2, 3, 0, 1).reshape(-1, 4).float()
        anchors = grid_anchors(self.cell_anchors.float(), height, width, config.feature_stride)
        if convention == "caffe":
            # proposal_layer.py: decode all, clip, drop small boxes, then sort and cut.
            boxes = clip_boxes(
                decode_boxes(deltas, anchors, config.rpn_box_weights, convention), image_size, convention
            )
            min_size = config.rpn_min_size * scale
            keep = ((boxes[:, 2] - boxes[:, 0] + 1) >= min_size) & ((boxes[:, 3] - boxes[:, 1] + 1) >= min_size)
            boxes, logits = boxes[keep], logits[keep]
            order = torch.sort(logits, descending=True, stable=True).indices[: config.rpn_pre_nms_top_n]
            boxes, logits = boxes[order], logits[order]
        else:
            # detectron2 find_top_rpn_proposals: sort and cut, decode, clip, drop empty boxes.
            order = torch.sort(logits, descending=True, stable=True).indices[: config.rpn_pre_nms_top_n]
            logits = logits[order]
            boxes = decode_boxes(deltas[order], anchors[order], config.rpn_box_weights, convention)
            boxes = clip_boxes(boxes, image_size, convention)
            keep = ((boxes[:, 2] - boxes[:, 0]) > config.rpn_min_size) & (
                (boxes[:, 3] - boxes[:, 1]) > config.rpn_min_size
            )
            boxes, logits = boxes[keep], logits[keep]
        keep = nms_boxes(boxes, logits, config.rpn_nms_threshold, convention)[: config.rpn_post_nms_top_n]
        return boxes[keep], logits[keep]
