"""Which detections an image keeps: the three selection rules of the reference extractors.

All functions take one image's RoI-head outputs, with class probabilities `(R, C + 1)` from a softmax over all
logits, background LAST (the converted checkpoints' order), and return a `Selection`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from .boxes import batched_nms_boxes, nms_boxes, pairwise_iou

__all__ = ["Selection", "per_class_nms_keep", "select_butd", "select_max_class_nms", "select_per_class_nms"]


@dataclass
class Selection:
    """`proposal_indices` `(N,)` the proposal behind each detection (a proposal can occur twice in
    "per_class_nms"); `class_ids` `(N,)` 0-based, background excluded; `scores` `(N,)`; `boxes` `(N, 4)` the
    reported boxes in resized-image pixels; `nms_thresholds_tried` the NMS thresholds that ran."""

    proposal_indices: torch.Tensor
    class_ids: torch.Tensor
    scores: torch.Tensor
    boxes: torch.Tensor
    nms_thresholds_tried: list[float] = field(default_factory=list)


def per_class_nms_keep(
    boxes: torch.Tensor, scores: torch.Tensor, threshold: float, convention: str = "detectron2", min_score: float = 0.0
) -> torch.Tensor:
    """`(R, C)` mask: whether box r survives greedy NMS among all R boxes scored by class c's column.

    Equivalent to one `nms(boxes, scores[:, c], threshold)` per class, but all classes advance together: the
    boxes are shared, so the IoU matrix is computed once and step k visits every class's k-th best box.
    With `min_score`, only entries scoring at least that much are decided (the rest come back False): greedy
    NMS never lets a lower score suppress a higher one, so those entries are exact, and far fewer steps run.
    """
    num_boxes, num_classes = scores.shape
    keep = torch.zeros(num_boxes, num_classes, dtype=torch.bool)
    eligible = scores >= min_score
    classes = torch.nonzero(eligible.any(dim=0)).flatten()
    if len(classes) == 0:
        return keep
    scores, eligible = scores[:, classes], eligible[:, classes]
    depth = int(eligible.sum(dim=0).max())
    overlaps = pairwise_iou(boxes.float(), convention) > threshold  # (R, R)
    order = torch.sort(scores, dim=0, descending=True, stable=True).indices[:depth]  # (depth, C'): rank -> box
    columns = torch.arange(len(classes))
    suppressed = torch.zeros(len(classes), num_boxes, dtype=torch.bool)
    kept_columns = torch.zeros(num_boxes, len(classes), dtype=torch.bool)
    for rank in range(depth):
        box = order[rank]
        kept = ~suppressed[columns, box] & eligible[box, columns]
        kept_columns[box, columns] = kept
        suppressed |= overlaps[box] & kept[:, None]
    keep[:, classes] = kept_columns
    return keep


def select_butd(
    proposals: torch.Tensor,
    class_probs: torch.Tensor,
    score_threshold: float,
    nms_threshold: float,
    min_boxes: int,
    max_boxes: int,
    convention: str = "detectron2",
) -> Selection:
    """bottom-up-attention `generate_tsv.py`: per class, NMS over all proposals; a proposal's confidence is its
    best probability among the classes where it survives; keep proposals with confidence ≥ `score_threshold`
    in proposal order, or — when fewer than `min_boxes` / more than `max_boxes` pass — the `min_boxes` /
    `max_boxes` most confident, by decreasing confidence. Boxes are the PROPOSALS (features belong to them).

    Only (proposal, class) pairs scoring at least a floor are run through NMS: confidences at or above the floor
    are then exact (see `per_class_nms_keep`). The floor starts at the threshold and is lowered only when the
    fallback needs more exact confidences than that gives (down to 0, the full computation).
    """
    foreground = class_probs[:, :-1].float()
    floor = score_threshold
    while True:
        keep = per_class_nms_keep(proposals, foreground, nms_threshold, convention, min_score=floor)
        confidence = torch.where(keep, foreground, torch.zeros_like(foreground)).amax(dim=1)
        passing = torch.nonzero(confidence >= score_threshold).flatten()
        if min_boxes <= len(passing) <= max_boxes:
            break
        count = min(max(len(passing), min_boxes), max_boxes, len(proposals))
        if floor == 0.0 or int((confidence >= floor).sum()) >= count:
            passing = torch.sort(confidence, descending=True, stable=True).indices[:count]
            break
        floor = floor / 8 if floor > 1e-6 else 0.0
    return Selection(
        passing, foreground[passing].argmax(dim=1), confidence[passing], proposals[passing], [nms_threshold]
    )


def _first_accepted(run, thresholds, min_boxes: int):
    """Run `run(t)` for each threshold until one keeps at least `min_boxes`; the last try otherwise."""
    tried = []
    for threshold in thresholds:
        tried.append(threshold)
        kept = run(threshold)
        if len(kept) >= min_boxes:
            break
    return kept, tried


def select_max_class_nms(
    predicted_boxes: torch.Tensor,
    class_probs: torch.Tensor,
    nms_thresholds: Sequence[float],
    min_boxes: int,
    max_boxes: int,
    convention: str = "detectron2",
) -> Selection:
    """MMF / HF FRCNN port (`do_nms`): each proposal's best foreground class and its regressed box; class-agnostic
    NMS with each threshold in turn, capped at `max_boxes`, until at least `min_boxes` remain (the port fails when
    none does; here the last threshold's result is returned). Order: decreasing score.

    `predicted_boxes` `(R, 4·C)` clipped to the resized image."""
    foreground = class_probs[:, :-1].float()
    scores, classes = foreground.max(dim=1)
    boxes = predicted_boxes.reshape(len(predicted_boxes), -1, 4)[torch.arange(len(predicted_boxes)), classes]
    keep, tried = _first_accepted(
        lambda t: nms_boxes(boxes, scores, t, convention)[:max_boxes], nms_thresholds, min_boxes
    )
    return Selection(keep, classes[keep], scores[keep], boxes[keep], tried)


def select_per_class_nms(
    predicted_boxes: torch.Tensor,
    class_probs: torch.Tensor,
    score_threshold: float,
    nms_thresholds: Sequence[float],
    min_boxes: int,
    max_boxes: int,
    convention: str = "detectron2",
) -> Selection:
    """detectron2 attribute notebook (`fast_rcnn_inference_single_image` in a threshold loop): every (proposal,
    class) pair with probability > `score_threshold`, per-class NMS, the `max_boxes` best; thresholds tried in
    turn until at least `min_boxes` remain (the notebook: exactly NUM_OBJECTS = min = max), else the last try.
    A proposal may be returned for several classes. Order: decreasing score."""
    foreground = class_probs[:, :-1].float()
    boxes = predicted_boxes.reshape(len(predicted_boxes), -1, 4)
    mask = foreground > score_threshold
    pairs = mask.nonzero()  # (K, 2): proposal, class — row-major like the reference
    candidate_boxes, candidate_scores = boxes[mask], foreground[mask]
    keep, tried = _first_accepted(
        lambda t: batched_nms_boxes(candidate_boxes, candidate_scores, pairs[:, 1], t, convention)[:max_boxes],
        nms_thresholds,
        min_boxes,
    )
    return Selection(pairs[keep, 0], pairs[keep, 1], candidate_scores[keep], candidate_boxes[keep], tried)
