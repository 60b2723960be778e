"""ViLBERT's pre-training objectives, as the original Conceptual Captions pipeline builds them (beta
`concept_cap_dataset.py`: `random_cap`, `random_word`, `random_region`; `ConceptCapLoaderTrain`):

- every batch trains all three losses at once ("joint", the original's): with probability 0.5 the caption is
  replaced by a random other caption (alignment label 1; class 0 = aligned), word pieces are masked 15% (BERT
  80/10/10), detected regions are masked 15% and 90% of the masked ones get their features zeroed; the global image
  token (row 0) is the mean of the region features *after* masking, as the beta loader computes it. Like the beta
  release, masked words and regions also count for mismatched pairs.
- "joint-12in1": the same, as the multi-task repository's `--objective 1` (its README's pre-training command):
  masked words and regions of mismatched pairs do not count.
- "mlm", "region-kl" and "alignment" are each of them alone, for other mixes.

The original draws the random caption from the whole dataset; here it comes from another example of the batch
(another image's caption, so it is a mismatch), or, in a batch of one, the image is replaced instead.
"""

from __future__ import annotations

import torch

from ...training.masking import mask_tokens
from ...training.objectives import Objective, ObjectiveContext

__all__ = ["VILBERT_OBJECTIVES"]

# Of the masked regions, this share gets zeroed features; the rest keep theirs (`random_region`).
_ZEROED_SHARE = 0.9


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
        if others:
            pairs.append({**example, "caption": others[int(rng.integers(len(others)))]["caption"]})
        else:  # no other image in the batch: mismatch the image instead
            pairs.append({**example, "image_id": context.other_image(example["image_id"], rng)})
        labels.append(1)
    return pairs, torch.tensor(labels, dtype=torch.long)


def _mask_words(context: ObjectiveContext, inputs: dict, rngs) -> None:
    tokenizer = context.tokenizer
    inputs["input_ids"], inputs["labels"] = mask_tokens(
        inputs["input_ids"], inputs["attention_mask"], tokenizer.all_special_ids, tokenizer.mask_token_id,
        context.random_token_ids, rngs, context.mlm_probability,
    )


def _mask_regions(context: ObjectiveContext, inputs: dict, regions, rngs) -> None:
    """Masks detected regions (rows 1..n; row 0 is the global token), zeroes 90% of them, recomputes the global
    token, and adds `region_labels` and the detector class distributions `region_class_targets` per row."""
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
        features[i, 0] = features[i, 1 : n + 1].sum(0) / n
        targets[i, 1 : n + 1] = selected.class_probs
    inputs["region_features"], inputs["region_labels"], inputs["region_class_targets"] = features, labels, targets


def _builder(words: bool, regions: bool, negatives: bool, matched_only: bool = False):
    def build(context: ObjectiveContext, examples, rngs) -> dict:
        pairs, alignment = _pairs(context, examples, rngs, negatives)
        inputs, selected = context.encode(pairs)
        if words:
            _mask_words(context, inputs, rngs)
        if regions:
            _mask_regions(context, inputs, selected, rngs)
        if negatives:
            inputs["alignment_labels"] = alignment
        if matched_only:  # 12-in-1 `--objective 1`: no masked-word or masked-region loss on mismatched pairs
            mismatched = alignment.bool()
            inputs["labels"][mismatched] = -100
            inputs["region_labels"][mismatched] = 0
        return inputs

    return build


VILBERT_OBJECTIVES = (
    Objective("joint", None, _builder(True, True, True), region_fields=("class_probs",), needs_other_images=True),
    Objective("joint-12in1", None, _builder(True, True, True, matched_only=True), region_fields=("class_probs",),
              needs_other_images=True),
    Objective("mlm", None, _builder(True, False, False)),
    Objective("region-kl", None, _builder(False, True, False), region_fields=("class_probs",)),
    Objective("alignment", None, _builder(False, False, True), needs_other_images=True),
)
