"""Corruption of text and regions for masked pre-training objectives, as the original data pipelines did it.

Every function takes one `numpy.random.Generator` per example, so the corruption of an example is a pure function of
its seed: a resumed or multi-process run masks exactly what an uninterrupted single-process run masks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["mask_tokens", "mask_regions", "random_token_ids"]


def random_token_ids(tokenizer: PreTrainedTokenizerBase) -> torch.Tensor:
    """Ids an MLM "random token" may take: every non-special, non-`[unused…]` entry of the vocabulary.

    For BERT's cased vocabulary this is the original's `range(id('!'), vocab_size)`.
    """
    special = set(tokenizer.all_special_ids)
    vocab = tokenizer.get_vocab()
    ids = sorted(i for token, i in vocab.items() if i not in special and not token.startswith("[unused"))
    if not ids:
        raise ValueError("the tokenizer's vocabulary has no ordinary (non-special) tokens to draw random tokens from")
    return torch.tensor(ids, dtype=torch.long)


def mask_tokens(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    special_ids: Sequence[int],
    mask_token_id: int,
    random_ids: torch.Tensor,
    rngs: Sequence[np.random.Generator],
    probability: float = 0.15,
    at_least_one: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking: each word piece (not [CLS]/[SEP]/padding) is selected with `probability`; a selected piece
    becomes [MASK] (80%), a random piece (10%) or stays (10%). With `at_least_one`, an example with nothing selected
    gets its first word piece masked (UNITER's `random_word`); without it (X-modaler's `must_mask=False`) it keeps
    no target.

    input_ids, attention_mask: `(batch, T)`. Returns the corrupted `input_ids` and `labels` `(batch, T)` holding the
    original id at selected positions and -100 elsewhere.
    """
    if len(rngs) != input_ids.shape[0]:
        raise ValueError(f"need one random generator per example: {len(rngs)} for a batch of {input_ids.shape[0]}")
    special = torch.tensor(sorted(set(special_ids)), dtype=input_ids.dtype)
    candidates = (attention_mask.bool() & ~torch.isin(input_ids, special)).numpy()
    # Row by row in numpy (the draws stay per example); one tensor of each at the end.
    original = input_ids.numpy()
    corrupted, labels = original.copy(), np.full_like(original, -100)
    random_ids = random_ids.numpy()
    for row, rng in enumerate(rngs):
        positions = np.flatnonzero(candidates[row])
        if positions.size == 0:
            raise ValueError(f"example {row} has no word piece to mask (only special tokens)")
        draws = rng.random((positions.size, 3))
        selected = draws[:, 0] < probability
        if at_least_one and not selected.any():
            selected[0] = True
            draws[0, 1] = 0.0  # the forced position always becomes [MASK]
        chosen, draws = positions[selected], draws[selected]
        labels[row, chosen] = original[row, chosen]
        masked = draws[:, 1] < 0.8
        corrupted[row, chosen[masked]] = mask_token_id
        randomized = ~masked & (draws[:, 1] < 0.9)
        # int(): toward zero, as astype for these non-negative draws
        corrupted[row, chosen[randomized]] = random_ids[(draws[randomized, 2] * len(random_ids)).astype(np.int64)]
    return torch.from_numpy(corrupted), torch.from_numpy(labels)


def mask_regions(
    region_attention_mask: torch.Tensor, rngs: Sequence[np.random.Generator], probability: float = 0.15
) -> torch.Tensor:
    """Masked region modelling: each real region is masked with `probability`, at least one per example (the
    original's `_get_img_mask`). region_attention_mask `(batch, R)` → bool masks `(batch, R)`."""
    if len(rngs) != region_attention_mask.shape[0]:
        raise ValueError(
            f"need one random generator per example: {len(rngs)} for a batch of {region_attention_mask.shape[0]}"
        )
    masks = np.zeros(tuple(region_attention_mask.shape), dtype=bool)
    for row, (rng, num_regions) in enumerate(zip(rngs, region_attention_mask.sum(1).tolist())):
        if num_regions == 0:
            raise ValueError(f"example {row} has no regions to mask")
        selected = rng.random(num_regions) < probability
        if not selected.any():
            selected[rng.integers(num_regions)] = True
        masks[row, :num_regions] = selected
    return torch.from_numpy(masks)
