"""Box arithmetic in the two conventions the references use.

"detectron2" (detectron2, MMF/HF port): width = x2 − x1, images span [0, W] × [0, H], dw/dh clamped at log(1000/16).
"caffe" (py-faster-rcnn / bottom-up-attention): width = x2 − x1 + 1, images span [0, W − 1] × [0, H − 1], areas in
NMS count the +1, no clamp.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torchvision.ops import batched_nms, box_iou, nms

__all__ = ["decode_boxes", "clip_boxes", "nms_boxes", "batched_nms_boxes", "pairwise_iou"]

_SCALE_CLAMP = math.log(1000.0 / 16)


def decode_boxes(
    deltas: torch.Tensor, boxes: torch.Tensor, weights: Sequence[float], convention: str = "detectron2"
) -> torch.Tensor:
    """Apply `deltas` `(R, 4·K)` (dx, dy, dw, dh per class) to `boxes` `(R, 4)`; returns `(R, 4·K)` boxes."""
    deltas = deltas.float()
    boxes = boxes.to(deltas.dtype)
    one = 1.0 if convention == "caffe" else 0.0
    widths = boxes[:, 2] - boxes[:, 0] + one
    heights = boxes[:, 3] - boxes[:, 1] + one
    ctr_x = boxes[:, 0] + 0.5 * widths
    ctr_y = boxes[:, 1] + 0.5 * heights
    wx, wy, ww, wh = weights
    dx = deltas[:, 0::4] / wx
    dy = deltas[:, 1::4] / wy
    dw = deltas[:, 2::4] / ww
    dh = deltas[:, 3::4] / wh
    if convention != "caffe":
        dw = dw.clamp(max=_SCALE_CLAMP)
        dh = dh.clamp(max=_SCALE_CLAMP)
    pred_ctr_x = dx * widths[:, None] + ctr_x[:, None]
    pred_ctr_y = dy * heights[:, None] + ctr_y[:, None]
    pred_w = torch.exp(dw) * widths[:, None]
    pred_h = torch.exp(dh) * heights[:, None]
    out = torch.empty_like(deltas)
    out[:, 0::4] = pred_ctr_x - 0.5 * pred_w
    out[:, 1::4] = pred_ctr_y - 0.5 * pred_h
    out[:, 2::4] = pred_ctr_x + 0.5 * pred_w
    out[:, 3::4] = pred_ctr_y + 0.5 * pred_h
    return out


def clip_boxes(boxes: torch.Tensor, image_size: tuple[int, int], convention: str = "detectron2") -> torch.Tensor:
    """Clip `(..., 4·K)` boxes to an image of `(h, w)`."""
    height, width = image_size
    one = 1 if convention == "caffe" else 0
    out = boxes.clone()
    out[..., 0::4] = out[..., 0::4].clamp(min=0, max=width - one)
    out[..., 1::4] = out[..., 1::4].clamp(min=0, max=height - one)
    out[..., 2::4] = out[..., 2::4].clamp(min=0, max=width - one)
    out[..., 3::4] = out[..., 3::4].clamp(min=0, max=height - one)
    return out


def _for_iou(boxes: torch.Tensor, convention: str) -> torch.Tensor:
    # With inclusive pixel coordinates (Caffe) a box covers x2 − x1 + 1 pixels: shift x2, y2 by one.
    if convention == "caffe":
        return boxes + boxes.new_tensor([0.0, 0.0, 1.0, 1.0])
    return boxes


def pairwise_iou(boxes: torch.Tensor, convention: str = "detectron2") -> torch.Tensor:
    boxes = _for_iou(boxes, convention)
    return box_iou(boxes, boxes)


def nms_boxes(
    boxes: torch.Tensor, scores: torch.Tensor, threshold: float, convention: str = "detectron2"
) -> torch.Tensor:
    return nms(_for_iou(boxes, convention), scores, threshold)


def batched_nms_boxes(
    boxes: torch.Tensor, scores: torch.Tensor, groups: torch.Tensor, threshold: float, convention: str = "detectron2"
) -> torch.Tensor:
    return batched_nms(_for_iou(boxes, convention), scores, groups, threshold)
