"""Unified VLP's pre-training objectives, as the original builds its examples (`vlp/seq2seq_loader.py`,
`Preprocess4Seq2seq`; `vlp/run_img2txt_dist.py`).

VLP has one loss, masked language modelling over the caption, under one of two attention patterns:

- seq2seq (`s2s`): the image block sees only itself, each caption token the image and the caption up to itself
  (token types 4/5);
- bidirectional (`bi`): every position sees every other (token types 0/1).

Masking (both patterns): the candidates are the caption's word pieces **and its final [SEP]** ([CLS], the region
slots and the first [SEP] never); `n = min(3, max(1, round(0.15 * caption length)))` of them (length without [SEP],
Python's banker's rounding) are chosen uniformly, and each becomes [MASK] 80%, a random word piece 10%, or stays
10%. The model predicts them at `masked_positions`.

The original draws the pattern per example (`random.choices([s2s, bi], weights=[0.75, 0.25])` for Conceptual
Captions): that is the objective `s2s-bi`, the default. `s2s` and `bi` keep one pattern per batch (for experiments,
and `s2s` is the captioning fine-tuning objective).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ...training.objectives import Objective, ObjectiveContext

__all__ = ["UNIFIED_VLP_OBJECTIVES", "MAX_PREDICTIONS", "S2S_PROBABILITY", "vlp_masked_positions", "vlp_mlm_batch"]

MAX_PREDICTIONS = 3  # the original's --max_pred
S2S_PROBABILITY = 0.75  # the original's --s2s_prob for Conceptual Captions (bi_prob 0.25)
REGION_FIELDS = ("class_probs", "scores")  # vis_pe needs the detector's class distribution and confidence


def vlp_masked_positions(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    text_start: int,
    mask_token_id: int,
    random_ids: torch.Tensor,
    rngs: Sequence[np.random.Generator],
    probability: float = 0.15,
    max_predictions: int = MAX_PREDICTIONS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The original's caption masking.

    input_ids, attention_mask: `(batch, L)` laid out `[CLS] regions [SEP] caption [SEP] pad`, the caption starting at
    `text_start`. Returns `(corrupted input_ids (batch, L), masked_positions (batch, P), labels (batch, P))`, P the
    batch's largest number of predictions; unused slots have position 0 and label -100.
    """
    if len(rngs) != input_ids.shape[0]:
        raise ValueError(f"need one random generator per example: {len(rngs)} for a batch of {input_ids.shape[0]}")
    corrupted = input_ids.clone()
    chosen: list[list[int]] = []
    for row, rng in enumerate(rngs):
        end = int(attention_mask[row].sum())  # the real tokens: the caption's final [SEP] is at end - 1
        candidates = np.arange(text_start, end)
        if candidates.size < 1:
            raise ValueError(f"example {row} has no caption tokens after position {text_start} to mask")
        count = min(max_predictions, max(1, round((candidates.size - 1) * probability)))
        positions = sorted(rng.permutation(candidates)[:count].tolist())
        for position in positions:
            draw = rng.random()
            if draw < 0.8:
                corrupted[row, position] = mask_token_id
            elif draw < 0.9:
                corrupted[row, position] = random_ids[int(rng.integers(len(random_ids)))]
        chosen.append(positions)
    width = max(len(p) for p in chosen)
    masked_positions = torch.zeros(len(chosen), width, dtype=torch.long)
    labels = torch.full((len(chosen), width), -100, dtype=torch.long)
    for row, positions in enumerate(chosen):
        masked_positions[row, : len(positions)] = torch.tensor(positions, dtype=torch.long)
        labels[row, : len(positions)] = input_ids[row, positions]
    return corrupted, masked_positions, labels


def _token_types(inputs: dict, text_start: int, seq2seq: torch.Tensor, config_types: dict) -> torch.Tensor:
    """Token types of each real token for its example's pattern (seq2seq 4/5, bidirectional 0/1)."""
    positions = torch.arange(inputs["input_ids"].shape[1])[None]
    is_text = positions >= text_start
    flags = seq2seq[:, None]
    image = torch.where(flags, config_types["s2s_image"], config_types["bi_image"])
    text = torch.where(flags, config_types["s2s_text"], config_types["bi_text"])
    types = torch.where(is_text, text, image)
    return torch.where(inputs["attention_mask"].bool(), types, inputs["token_type_ids"])


# The processor's segment ids (UnifiedVlpProcessor: "seq2seq" 4/5, "bidirectional" 0/1).
_TYPES = {"s2s_image": 4, "s2s_text": 5, "bi_image": 0, "bi_text": 1}


def vlp_mlm_batch(
    context: ObjectiveContext, examples: Sequence[dict], rngs: Sequence[np.random.Generator], seq2seq: bool | None
) -> dict:
    """One batch of masked captions. `seq2seq`: True / False for the whole batch, or None to draw each example's
    pattern (seq2seq with probability `S2S_PROBABILITY`, as the original)."""
    inputs, _ = context.encode(examples)
    text_start = inputs["region_features"].shape[1] + 2  # [CLS], the region slots, [SEP]
    # The pattern is drawn first from each example's generator, so it does not depend on the masking draws.
    flags = torch.tensor([bool(rng.random() < S2S_PROBABILITY) if seq2seq is None else seq2seq for rng in rngs])
    inputs["token_type_ids"] = _token_types(inputs, text_start, flags, _TYPES)
    inputs["input_ids"], inputs["masked_positions"], inputs["labels"] = vlp_masked_positions(
        inputs["input_ids"],
        inputs["attention_mask"],
        text_start,
        context.tokenizer.mask_token_id,
        context.random_token_ids,
        rngs,
        context.mlm_probability,
    )
    if seq2seq is not True:
        # seq2seq is the pre-training model's default: an `s2s` batch carries no flag, so the captioner (which
        # is always seq2seq) trains on the same batches.
        inputs["seq2seq"] = flags if seq2seq is None else seq2seq
    return inputs


def _build(seq2seq: bool | None):
    def build(context: ObjectiveContext, examples, rngs) -> dict:
        return vlp_mlm_batch(context, examples, rngs, seq2seq)

    return build


UNIFIED_VLP_OBJECTIVES = (
    Objective("s2s-bi", None, _build(None), region_fields=REGION_FIELDS),
    Objective("s2s", None, _build(True), region_fields=REGION_FIELDS),
    Objective("bi", None, _build(False), region_fields=REGION_FIELDS),
)
