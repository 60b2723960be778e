"""VL-BERT's pre-training objectives, as the original builds its batches (`pretrain/data/datasets/
conceptual_captions.py`, `general_corpus.py`, `pretrain/modules/resnet_vlbert_for_pretraining_multitask.py`).

Unlike UNITER, VL-BERT corrupts both modalities in every batch and trains all its losses at once:

- MLM with visual clues: whole-word masking (each word chosen with p = 0.15: all its pieces become [MASK] 80%, random
  pieces 10%, unchanged 10%; every piece of a chosen word is labelled);
- MVRC: each real object except the whole image (object 0) chosen with p = 0.15; 90% of the chosen are masked (their
  feature and [IMG] embedding replaced by the learned mask embeddings), all are labelled with the detector's class
  distribution; the whole-image feature is recomputed as the mean of the *unmasked* regions;
- the text-only corpus mixed 1:1: here the batch's captions again, without [CLS]/[SEP] and without regions (the
  original uses BooksCorpus + Wikipedia; "the shapes captions without regions serve as that corpus").

`mlm-mvrc` is that batch (the original's only mode); `mlm` and `mvrc` keep one corruption each, for experiments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from ...training.objectives import Objective, ObjectiveContext

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


__all__ = ["VL_BERT_OBJECTIVES", "whole_word_mask", "mask_objects"]


def whole_word_mask(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    tokenizer: PreTrainedTokenizerBase,
    random_ids: torch.Tensor,
    rngs: Sequence[np.random.Generator],
    probability: float = 0.15,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The original's `random_word_wwm` on word pieces: a word is a piece plus the `##` pieces after it; special
    tokens and padding are never chosen. Returns the corrupted ids and the labels (-100 where not chosen)."""
    corrupted, labels = input_ids.clone(), torch.full_like(input_ids, -100)
    special = set(tokenizer.all_special_ids)
    for row, rng in enumerate(rngs):
        ids = input_ids[row].tolist()
        tokens = tokenizer.convert_ids_to_tokens(ids)
        words: list[list[int]] = []
        for position, (token_id, token) in enumerate(zip(ids, tokens)):
            if not attention_mask[row, position] or token_id in special:
                continue
            if token.startswith("##") and words and words[-1][-1] == position - 1:
                words[-1].append(position)
            else:
                words.append([position])
        for word in words:
            draw = rng.random()
            if draw >= probability:
                continue
            draw /= probability
            for position in word:
                labels[row, position] = ids[position]
                if draw < 0.8:
                    corrupted[row, position] = tokenizer.mask_token_id
                elif draw < 0.9:
                    corrupted[row, position] = random_ids[int(rng.integers(len(random_ids)))]
    return corrupted, labels


def mask_objects(
    region_attention_mask: torch.Tensor, rngs: Sequence[np.random.Generator], probability: float = 0.15
) -> tuple[torch.Tensor, torch.Tensor]:
    """The original's `random_mask_region`: every real object but the whole image (object 0) is chosen with
    `probability`; a chosen object is masked 90% of the time and kept 10%. Returns `(masked, chosen)` `(batch, K)`."""
    masked = torch.zeros(region_attention_mask.shape, dtype=torch.bool)
    chosen = torch.zeros_like(masked)
    for row, rng in enumerate(rngs):
        count = int(region_attention_mask[row].sum())
        masked[row, 1:count], chosen[row, 1:count] = _draw_objects(count - 1, rng, probability)
    return masked, chosen


def _draw_objects(count: int, rng: np.random.Generator, probability: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`(masked, chosen)` `(count,)` of `count` objects, one draw each, in order."""
    masked, chosen = torch.zeros(count, dtype=torch.bool), torch.zeros(count, dtype=torch.bool)
    for index in range(count):
        draw = rng.random()
        if draw < probability:
            chosen[index] = True
            masked[index] = draw / probability < 0.9
    return masked, chosen


def _image_text_rows(context: ObjectiveContext, examples, rngs, words: bool, objects: bool) -> dict:
    inputs, regions = context.encode(examples)
    if words:
        inputs["input_ids"], inputs["labels"] = whole_word_mask(
            inputs["input_ids"],
            inputs["attention_mask"],
            context.tokenizer,
            context.random_token_ids,
            rngs,
            context.mlm_probability,
        )
    else:
        inputs["labels"] = torch.full_like(inputs["input_ids"], -100)
    if objects:
        masked, chosen = mask_objects(inputs["region_attention_mask"], rngs, context.region_mask_probability)
        features = inputs["region_features"]
        targets = torch.zeros(*features.shape[:2], regions[0].class_probs.shape[1])
        for row, region in enumerate(regions):
            # The objects the processor kept: all of them, or the first ones when it cut text and objects together
            # (`max_text_and_objects`, the original's Conceptual Captions loader).
            count = int(inputs["region_attention_mask"][row].sum()) - 1
            targets[row, 1 : count + 1] = region.class_probs[:count] * chosen[row, 1 : count + 1, None]
            # The whole-image feature is the mean of the unmasked objects (the original's CC dataset), of every one:
            # the original draws the masks before it cuts, so cut objects are drawn for and counted too.
            objects, unmasked = features[row, 1 : count + 1], ~masked[row, 1 : count + 1]
            if count < len(region):
                cut_masked, _ = _draw_objects(len(region) - count, rngs[row], context.region_mask_probability)
                objects = torch.cat([objects, region.features[count:].to(objects.dtype)])
                unmasked = torch.cat([unmasked, ~cut_masked])
            features[row, 0] = (objects * unmasked[:, None]).sum(0) / (unmasked.sum() + 1e-5)
        inputs["region_masks"] = masked
        inputs["region_class_targets"] = targets
    return inputs


def _text_only_rows(context: ObjectiveContext, examples, rngs, length: int) -> dict:
    """Captions as text-only corpus rows: word pieces without [CLS]/[SEP] (as `general_corpus.py`), at most `length`."""
    tokenizer = context.tokenizer
    rows = [tokenizer(e["caption"], add_special_tokens=False)["input_ids"][:length] for e in examples]
    input_ids = torch.full((len(rows), length), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention_mask[i, : len(row)] = 1
    input_ids, labels = whole_word_mask(
        input_ids, attention_mask, tokenizer, context.random_token_ids, rngs, context.mlm_probability
    )
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def _stack(image_text: dict, text_only: dict) -> dict:
    """One batch: the image-text rows, then the text-only rows (no object: zero features, zero region mask)."""
    extra = text_only["input_ids"].shape[0]
    batch = {key: torch.cat([image_text[key], text_only[key]]) for key in ("input_ids", "attention_mask", "labels")}
    batch["token_type_ids"] = torch.cat([image_text["token_type_ids"], torch.zeros_like(text_only["input_ids"])])
    for key, value in image_text.items():
        if key not in batch:
            batch[key] = torch.cat([value, value.new_zeros(extra, *value.shape[1:])])
    return batch


def _build(words: bool, objects: bool, text_only: bool):
    def build(context: ObjectiveContext, examples, rngs) -> dict:
        inputs = _image_text_rows(context, examples, rngs, words, objects)
        if not text_only:
            return inputs
        length = inputs["input_ids"].shape[1]
        return _stack(inputs, _text_only_rows(context, examples, rngs, length))

    return build


VL_BERT_OBJECTIVES = (
    Objective("mlm-mvrc", None, _build(words=True, objects=True, text_only=True), region_fields=("class_probs",)),
    Objective("mlm", None, _build(words=True, objects=False, text_only=True)),
    Objective("mvrc", None, _build(words=False, objects=True, text_only=False), region_fields=("class_probs",)),
)
