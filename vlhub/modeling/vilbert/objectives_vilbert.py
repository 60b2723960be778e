"""ViLBERT's pre-training objectives, as the original Conceptual Captions pipelines build them (beta and 12-in-1
`concept_cap_dataset.py`: `random_cap`, `random_word`, `random_region`; `ConceptCapLoaderTrain`):

- every batch trains all three losses at once ("joint", the beta release's): with probability 0.5 the caption is
  replaced by a random caption of another image (alignment label 1; class 0 = aligned), word pieces are masked 15%
  (BERT 80/10/10), detected regions are masked 15% and 90% of the masked ones get their features zeroed; the global
  image token (row 0) is the mean of the region features *after* masking, as the beta loader computes it (the sum
  over the detected regions divided by their number). Like the beta release, masked words and regions also count
  for mismatched pairs.
- "joint-12in1": the same, as the multi-task repository's `--objective 1` (its README's pre-training command):
  masked words and regions of mismatched pairs do not count, and the global token's divisor is that loader's: the
  number of regions that overlap no masked region (IoU > 0.4, boxes in pixels with its +1 convention; a masked
  region overlaps itself), at least 1. The sum is unchanged (regions that only overlap a masked one keep their
  features). The original counts its 36 padded slots; it can only load images with all 36 regions (its overlap
  array has one row per detected region), so counting the detected regions is the same on the data it runs on.
- "mlm", "region-kl" and "alignment" are each of them alone, for other mixes.

The random caption is drawn, as the original, from the whole caption table (the training captions; the
validation captions when evaluating), redrawn while it belongs to the same image (the original does not redraw:
on millions of captions the chance is negligible, on a small corpus it would mislabel pairs). A collator built
without a caption table draws it from the batch's other images instead, and in a batch of one image replaces the
image.
"""

from __future__ import annotations

import torch
from torchvision.ops import box_iou

from ...training.objectives import Objective, ObjectiveContext

__all__ = ["VILBERT_OBJECTIVES", "unoverlapped_region_count"]

# Of the masked regions, this share gets zeroed features; the rest keep theirs (`random_region`).
_ZEROED_SHARE = 0.9
# 12-in-1: regions overlapping a masked region by more than this IoU leave the global token's divisor.
_OVERLAP_IOU = 0.4


def _pairs(context: ObjectiveContext, examples, rngs, negatives: bool):
    """The examples with captions swapped for mismatched pairs (probability `itm_negative_probability`), and the
    alignment labels (0 = aligned, 1 = random caption)."""
    pairs, labels = [], []
    for index, (example, rng) in enumerate(zip(examples, rngs)):
        if not negatives or rng.random() >= context.itm_negative_probability:
            pairs.append(example)
            labels.append(0)
            continue
        others = [e for e in examples if e["image_id"] != example["image_id"]]
        if context.other_caption is not None:
            pairs.append({**example, "caption": context.other_caption(example["image_id"], rng)})
        elif others:
            pairs.append({**example, "caption": others[int(rng.integers(len(others)))]["caption"]})
        else:  # no other image in the batch: mismatch the image instead
            pairs.append({**example, "image_id": context.other_image(example["image_id"], rng)})
        labels.append(1)
    return pairs, torch.tensor(labels, dtype=torch.long)


def unoverlapped_region_count(boxes: torch.Tensor, masked: torch.Tensor) -> int:
    """The 12-in-1 loader's divisor of the global image token: how many of the regions (`boxes` `(n, 4)` in pixels)
    overlap no masked region (`masked` `(n,)` bool) with IoU > 0.4, in the original's pixel convention (a box
    spans `x2 - x1 + 1` pixels); at least 1."""
    if not masked.any():
        return boxes.shape[0]
    inclusive = boxes + boxes.new_tensor([0.0, 0.0, 1.0, 1.0])
    covered = (box_iou(inclusive[masked], inclusive) > _OVERLAP_IOU).any(0)
    return max(int((~covered).sum()), 1)


def _mask_regions(context: ObjectiveContext, inputs: dict, regions, rngs, multi_task_divisor: bool = False) -> None:
    """Masks detected regions (rows 1..n; row 0 is the global token), zeroes 90% of them, recomputes the global
    token (the 12-in-1 divisor with `multi_task_divisor`), and adds `region_labels` and the detector class
    distributions `region_class_targets` per row."""
    features = inputs["region_features"].clone()
    batch, rows, _ = features.shape
    labels = torch.zeros(batch, rows, dtype=torch.long)
    targets = torch.zeros(batch, rows, regions[0].class_probs.shape[1])
    for i, (selected, rng) in enumerate(zip(regions, rngs)):
        n = len(selected)
        draws = rng.random(n)
        masked = draws < context.region_mask_probability
        for j in masked.nonzero()[0]:
            labels[i, 1 + j] = 1
            # random_region: of the masked (prob < p), the first 90% of the range zeroes the feature.
            if draws[j] < context.region_mask_probability * _ZEROED_SHARE:
                features[i, 1 + j] = 0
        divisor = unoverlapped_region_count(selected.boxes, torch.from_numpy(masked)) if multi_task_divisor else n
        features[i, 0] = features[i, 1 : n + 1].sum(0) / divisor
        targets[i, 1 : n + 1] = selected.class_probs
    inputs["region_features"], inputs["region_labels"], inputs["region_class_targets"] = features, labels, targets


def _builder(words: bool, regions: bool, negatives: bool, matched_only: bool = False):
    def build(context: ObjectiveContext, examples, rngs) -> dict:
        pairs, alignment = _pairs(context, examples, rngs, negatives)
        inputs, selected = context.encode(pairs)
        if words:
            context.mask_words(inputs, rngs)
        if regions:
            _mask_regions(context, inputs, selected, rngs, multi_task_divisor=matched_only)
        if negatives:
            inputs["alignment_labels"] = alignment
        if matched_only:  # 12-in-1 `--objective 1`: no masked-word or masked-region loss on mismatched pairs (and,
            # above, the 12-in-1 loader's global-token divisor)
            mismatched = alignment.bool()
            inputs["labels"][mismatched] = -100
            inputs["region_labels"][mismatched] = 0
        return inputs

    return build


VILBERT_OBJECTIVES = (
    Objective("joint", None, _builder(True, True, True), region_fields=("class_probs",), needs_other_images=True),
    Objective(
        "joint-12in1",
        None,
        _builder(True, True, True, matched_only=True),
        region_fields=("class_probs",),
        needs_other_images=True,
    ),
    Objective("mlm", None, _builder(True, False, False)),
    Objective("region-kl", None, _builder(False, True, False), region_fields=("class_probs",)),
    Objective("alignment", None, _builder(False, False, True), needs_other_images=True),
)
