"""UNITER's pre-training objectives, as the original data code builds them (`data/mlm.py`, `data/mrm.py`,
`data/itm.py`): conditional masking (one objective per batch, one modality corrupted), BERT 80/10/10 word masking, 15%
region masking with at least one region, and ITM negatives that swap the *image* for a random other image with
probability 0.5 (optionally some of them keep the image and take a contradicting caption, see `mismatched_pair`).
`wra` is ITM with the word-region alignment (optimal transport) loss added, as the released models were trained.
`itc` (image-text contrastive over the batch's matched pairs) is a vlhub extension, not part of the original recipe.
"""

from __future__ import annotations

import torch

from ...training.masking import mask_regions
from ...training.objectives import Objective, ObjectiveContext, mismatched_pair

__all__ = ["UNITER_OBJECTIVES"]


def _build_mlm(context: ObjectiveContext, examples, rngs) -> dict:
    inputs, _ = context.encode(examples)
    context.mask_words(inputs, rngs)
    return inputs


def _masked_region_inputs(context: ObjectiveContext, examples, rngs):
    inputs, regions = context.encode(examples)
    masks = mask_regions(inputs["region_attention_mask"], rngs, context.region_mask_probability)
    inputs["region_masks"] = masks
    return inputs, regions, masks


def _build_mrfr(context: ObjectiveContext, examples, rngs) -> dict:
    inputs, _, masks = _masked_region_inputs(context, examples, rngs)
    # Targets are the features the model saw before masking (row-major over (example, region)).
    inputs["region_feature_targets"] = inputs["region_features"][masks]
    return inputs


def _build_mrc(context: ObjectiveContext, examples, rngs) -> dict:
    inputs, regions, masks = _masked_region_inputs(context, examples, rngs)
    inputs["region_class_targets"] = torch.cat(
        [r.class_probs[masks[i, : len(r)]] for i, r in enumerate(regions)], dim=0
    )
    return inputs


def _build_itm(context: ObjectiveContext, examples, rngs) -> dict:
    """With probability `itm_negative_probability` the pair is mismatched (label 0): the image replaced by a random
    other image, or (`itm_hard_negative_probability` of them) the caption by a contradicting one."""
    pairs, labels = [], []
    for example, rng in zip(examples, rngs):
        if rng.random() < context.itm_negative_probability:
            pairs.append(mismatched_pair(context, example, rng))
            labels.append(0)
        else:
            pairs.append(example)
            labels.append(1)
    inputs, _ = context.encode(pairs)
    inputs["itm_labels"] = torch.tensor(labels, dtype=torch.long)
    return inputs


def _build_itc(context: ObjectiveContext, examples, rngs) -> dict:
    """Matched pairs only, with `itc_image_ids` (one id per distinct image of the batch) so that two captions of one
    image are not each other's negatives."""
    inputs, _ = context.encode(examples)
    ids: dict[str, int] = {}
    inputs["itc_image_ids"] = torch.tensor([ids.setdefault(e["image_id"], len(ids)) for e in examples])
    return inputs


UNITER_OBJECTIVES = (
    Objective("mlm", "mlm", _build_mlm),
    Objective("mrfr", "mrfr", _build_mrfr),
    Objective("mrc", "mrc", _build_mrc, region_fields=("class_probs",)),
    Objective("mrc-kl", "mrc-kl", _build_mrc, region_fields=("class_probs",)),
    Objective("itm", "itm", _build_itm, needs_other_images=True),
    Objective("wra", "itm-wra", _build_itm, needs_other_images=True),
    # A vlhub extension (not UNITER's recipe): image-text contrastive alignment, see `UniterForPreTraining`.
    Objective("itc", "itc", _build_itc),
)
