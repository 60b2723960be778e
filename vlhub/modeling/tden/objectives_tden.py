"""TDEN's pre-training objectives and its captioning objective, as X-modaler builds their batches
(`datasets/images/conceptual_captions.py`, `functional/func_pretrain.py`, `losses/pretrain_losses.py`,
`engine/tden_pretrainer.py`).

One example (`ConceptualCaptionsDataset`):

- words: each word piece of the caption is selected with probability 0.15 (no minimum: X-modaler's
  `must_mask=False`, so an example may have no target); a selected piece becomes [MASK] (80%), a random id of the
  whole vocabulary (10%) or stays (10%). The MLM targets are the selected pieces.
- regions (row 0 is [IMG]): each region is selected with probability 0.15 and then zeroed with probability 0.9;
  every region whose IoU with a selected region exceeds 0.4 (pixel-inclusive boxes, X-modaler's `iou`) is zeroed
  too, the selected one included. The masked-object targets are the selected regions' detector class
  distributions. [IMG] becomes the sum of the masked features over `max(1, regions - zeroed)`.
- masked sentence generation (MSG): the generation stream gets the *same masked* sentence (type 1); its targets
  are the clean `[CLS] w .. [SEP]` shifted left by one.
- image-sentence matching (ISM): the hardest in-batch negative triplet loss over the (masked) sentence and object
  encoders' pooled vectors; captions of the same image are not negatives of each other.

Objectives: `joint` (all four losses on every batch, summed with weight 1: the original's, and the default),
`mlm`, `moc`, `msg` and `ism` alone (for other mixes), and `caption` (the captioner's teacher-forced
cross-entropy: `[CLS] w1 .. wn` → `w1 .. wn [SEP]`, the fine-tuning objective of `finetune.py --task captioning`).

`joint` has a second pass for scheduled sampling (`tden_second_pass`, X-modaler's Two-Pass-A).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from ...processing.detector.boxes import pairwise_iou
from ...training.masking import mask_tokens
from ...training.objectives import Objective, ObjectiveContext

if TYPE_CHECKING:
    from transformers.utils import ModelOutput

__all__ = ["TDEN_OBJECTIVES", "tden_mask_regions", "tden_second_pass", "OVERLAP_IOU", "ZEROED_SHARE"]

ZEROED_SHARE = 0.9  # of the selected regions, the share whose own feature is zeroed (`random_region`)
OVERLAP_IOU = 0.4  # regions overlapping a selected one by more than this are zeroed too


def tden_mask_regions(
    region_features: torch.Tensor, regions: Sequence, rngs: Sequence[np.random.Generator], probability: float = 0.15
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """X-modaler's `random_region` over a batch.

    region_features `(batch, 1 + R, dim)`: row 0 [IMG], rows `1..n` the example's `n` regions (`regions[i]`, the
    `RegionFeatures` in the processor's order, whose `boxes` are in pixels). Returns `(features with the masked
    regions zeroed and [IMG] recomputed, masked_regions (batch, 1 + R) bool: the selected regions,
    region_class_targets (num_selected, num_classes): their detector class distributions, row-major)`.
    """
    if len(rngs) != region_features.shape[0] or len(regions) != region_features.shape[0]:
        raise ValueError(
            f"need the regions and one random generator per example: {len(regions)} regions and "
            f"{len(rngs)} generators for a batch of {region_features.shape[0]}"
        )
    features = region_features.clone()
    selected_rows = torch.zeros(features.shape[:2], dtype=torch.bool)
    targets = []
    for row, (example, rng) in enumerate(zip(regions, rngs)):
        count = len(example)
        if example.class_probs is None:
            raise ValueError(f"example {row}: masked object classification needs the regions' class_probs")
        draws = rng.random(count)  # one draw per region, as `random_region`: < p selects, < 0.9 p zeroes it
        selected = torch.from_numpy(draws < probability)
        zeroed = torch.from_numpy(draws < probability * ZEROED_SHARE)
        if selected.any():
            overlaps = pairwise_iou(example.boxes.double(), convention="caffe")[selected] > OVERLAP_IOU
            overlapping = overlaps.any(0)
            zeroed |= overlapping
            removed = int(overlapping.sum())  # X-modaler counts the overlap set (a selected box overlaps itself)
        else:
            removed = 0
        body = features[row, 1 : count + 1]
        body[zeroed] = 0
        features[row, 0] = body.sum(0) / max(1, count - removed)
        selected_rows[row, 1 : count + 1] = selected
        targets.append(example.class_probs[selected].float())
    return features, selected_rows, torch.cat(targets)


def _group_ids(examples) -> torch.Tensor:
    """Per example, the batch index of the first example of the same image (pairs of one image are not negatives)."""
    first: dict[str, int] = {}
    return torch.tensor([first.setdefault(e["image_id"], i) for i, e in enumerate(examples)], dtype=torch.long)


def _shifted_targets(clean_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """`[CLS] w .. [SEP]` → `w .. [SEP] -100`: the next token at every real position, -100 at the last one and at
    padding (MSG's targets)."""
    targets = torch.full_like(clean_ids, -100)
    targets[:, :-1] = clean_ids[:, 1:].masked_fill(attention_mask[:, 1:] == 0, -100)
    return targets


def _build(words: bool, regions: bool, generation: bool, matching: bool):
    def build(context: ObjectiveContext, examples, rngs) -> dict:
        inputs, selected = context.encode(examples)
        tokenizer = context.tokenizer
        clean = inputs["input_ids"]
        if words or generation:
            # The vocabulary's every id may be the random replacement (`np.random.randint(len(tokenizer))`).
            special = [tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id]
            masked, labels = mask_tokens(
                clean,
                inputs["attention_mask"],
                special,
                tokenizer.mask_token_id,
                torch.arange(len(tokenizer)),
                rngs,
                context.mlm_probability,
                at_least_one=False,
            )
        if regions:
            inputs["region_features"], inputs["masked_regions"], inputs["region_class_targets"] = tden_mask_regions(
                inputs["region_features"], selected, rngs, context.region_mask_probability
            )
        if generation:
            inputs["decoder_input_ids"] = masked
            inputs["decoder_labels"] = _shifted_targets(clean, inputs["attention_mask"])
        if words:
            inputs["input_ids"], inputs["labels"] = masked, labels
        if matching:
            inputs["image_ids"] = _group_ids(examples)
        else:
            inputs["compute_similarity"] = False
        if not (words or regions or matching):  # msg alone: the generation stream only
            for key in ("input_ids", "token_type_ids"):
                inputs.pop(key)
        return inputs

    return build


def tden_second_pass(batch: dict, outputs: ModelOutput, replace: torch.Tensor | None) -> dict:
    """X-modaler's second pass of scheduled sampling (`TDENPretrainer.run_step`, the paper's Two-Pass-A).

    The original trains each batch twice, with an optimizer step after each pass: pass 1 on the masked batch (MLM +
    MOC + MSG + ISM); pass 2 on the same batch whose word pieces at every MLM target position (`labels >= 0`:
    [MASK], random and kept ones alike) are replaced by the first pass's greedy predictions (argmax, not sampled,
    detached): the understanding stream takes the cross-modal encoder's prediction for that position, the
    generation stream the decoder's prediction of the previous position (which predicts this one: shifted right by
    one). Regions, masks and targets stay as they were; matching is off in pass 2 (MLM + MOC + MSG).

    `replace` (`(batch, length)` bool, optional) limits the replaced positions further (`--scheduled_sampling_probability`
    below 1, an extension: the original replaces every target position). X-modaler's `SCHEDULED_SAMPLING.*` settings
    (start epoch, increment, maximum probability) feed only its recurrent captioners, never TDEN, so there is no
    schedule here.
    """
    positions = batch["labels"] >= 0
    if replace is not None:
        positions = positions & replace.to(positions.device)
    second = dict(batch)
    second["input_ids"] = torch.where(positions, outputs.mlm_logits.argmax(-1), batch["input_ids"])
    predicted = outputs.msg_logits.argmax(-1)
    shifted = torch.cat([predicted[:, :1], predicted[:, :-1]], dim=1)  # position 0 ([CLS]) is never a target
    second["decoder_input_ids"] = torch.where(positions, shifted, batch["decoder_input_ids"])
    second["compute_similarity"] = False
    second.pop("image_ids", None)
    return second


def _build_caption(context: ObjectiveContext, examples, rngs) -> dict:
    """The captioner's inputs `[CLS] w1 .. wn` (the processor's generation layout) and targets `w1 .. wn [SEP]`."""
    inputs, _ = context.encode(examples)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    sep = context.tokenizer.sep_token_id
    lengths = mask.sum(1)
    if (ids[torch.arange(len(ids)), lengths - 1] == sep).any():
        raise ValueError(
            "the caption objective needs the processor's generation layout ([CLS] w, no [SEP]): use "
            "processor.for_task('captioning')"
        )
    labels = _shifted_targets(ids, mask)
    labels[torch.arange(len(ids)), lengths - 1] = sep
    inputs["labels"] = labels
    return inputs


_REGIONS = ("class_probs",)

TDEN_OBJECTIVES = (
    Objective("joint", None, _build(True, True, True, True), region_fields=_REGIONS, second_pass=tden_second_pass),
    Objective("mlm", None, _build(True, False, False, False)),
    Objective("moc", None, _build(False, True, False, False), region_fields=_REGIONS),
    Objective("msg", None, _build(False, False, True, False)),
    Objective("ism", None, _build(False, False, False, True)),
    Objective("caption", None, _build_caption),
)
