"""Checks of the ids and numbers users pass to processors and pipelines, written once: a wrong type or value is an
error naming the argument, never silently cut (`1.7 -> 1`), never an IndexError deep inside the model."""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["check_positive_int", "check_token_ids"]


def check_positive_int(value: object, name: str) -> int:
    """`value` as an int when it is an integer (Python or numpy, not a bool) of at least 1; else a `TypeError` (not
    an integer: `1.7`, `"3"`) or `ValueError` (`0`, negative) naming `name`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a positive integer, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{name} must be a positive integer (at least 1), got {value}")
    return int(value)


def _is_row(value) -> bool:
    return isinstance(value, (Sequence, np.ndarray, torch.Tensor)) and not isinstance(value, (str, bytes))


def _rows(token_ids, name: str) -> list:
    """`token_ids` as a list of rows: one row (a sequence of ids) or a batch (a sequence of rows)."""
    if isinstance(token_ids, (np.ndarray, torch.Tensor)):
        if token_ids.ndim not in (1, 2):
            raise ValueError(f"{name} must be one row of ids or a batch of rows, got {token_ids.ndim} dimensions")
        return [token_ids] if token_ids.ndim == 1 else list(token_ids)
    if not _is_row(token_ids):
        raise TypeError(f"{name} must be a list of ids or a list of lists of ids, got {type(token_ids).__name__}")
    if len(token_ids) == 0:
        raise ValueError(f"{name} is empty: pass at least one text's word-piece ids")
    nested = [_is_row(item) for item in token_ids]
    if all(nested):
        return list(token_ids)
    if any(nested):
        raise ValueError(f"{name} mixes ids and lists of ids: pass one list of ids, or a list of such lists")
    return [token_ids]


def check_token_ids(
    token_ids: Sequence[int] | Sequence[Sequence[int]] | np.ndarray | torch.Tensor,
    vocab_size: int,
    name: str = "token_ids",
) -> list[list[int]]:
    """Word-piece ids as a list of rows of Python ints, each row non-empty, of an integer dtype (floats are refused,
    not truncated) and within `[0, vocab_size)`. Errors name the row and the first id at fault."""
    checked = []
    for i, row in enumerate(_rows(token_ids, name)):
        where = f"{name}[{i}]"
        try:
            array = row.detach().cpu().numpy() if isinstance(row, torch.Tensor) else np.asarray(row)
        except (OverflowError, ValueError) as err:
            raise ValueError(f"{where} is not a row of integer ids ({err})") from err
        if array.ndim != 1:
            raise ValueError(f"{where} must be a flat row of ids, got shape {array.shape}")
        if array.size == 0:
            raise ValueError(f"{where} is empty; a text needs at least one word piece")
        if array.dtype.kind == "O" and all(
            isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in array.tolist()
        ):  # Python ints beyond int64
            position, value = next((p, v) for p, v in enumerate(array.tolist()) if not 0 <= v < vocab_size)
            raise ValueError(
                f"{where} holds id {value} at position {position}, outside the vocabulary [0, {vocab_size})"
            )
        if array.dtype.kind not in "iu":
            first = next(
                (v for v in array.tolist() if isinstance(v, bool) or not isinstance(v, numbers.Integral)),
                array.tolist()[0],
            )
            raise TypeError(
                f"{where} must hold integer ids, got {first!r} (dtype {array.dtype}); ids are never rounded or cut"
            )
        outside = (array < 0) | (array >= vocab_size)
        if outside.any():
            position = int(outside.argmax())
            raise ValueError(
                f"{where} holds id {int(array[position])} at position {position}, outside the "
                f"vocabulary [0, {vocab_size})"
            )
        checked.append(array.tolist())
    return checked
