"""Size limits checked before anything is allocated: an array a file *declares* (its header's shape and dtype) is
compared with the bytes the file really holds and with a limit no genuine file comes near, so a damaged or hostile
file is a clear error instead of a MemoryError, a signal, or gigabytes of fill values."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

__all__ = ["MAX_ARRAY_BYTES", "declared_nbytes", "check_declared_array"]

# The largest array one field of a feature file, pickle or checkpoint may declare: 2 GiB. The published releases'
# arrays are far smaller (100 regions x 2048 float32 features are 0.8 MB; the detector's largest weight is 13 MB).
MAX_ARRAY_BYTES = 1 << 31


def declared_nbytes(shape: Iterable[int], dtype: np.typing.DTypeLike) -> int:
    """The bytes an array of `shape` and `dtype` needs (Python integers: no overflow for absurd shapes)."""
    return math.prod(int(n) for n in shape) * np.dtype(dtype).itemsize


def check_declared_array(
    shape: Iterable[int], dtype: np.typing.DTypeLike, what: str, available: int | None = None
) -> int:
    """The declared size of an array of `shape` and `dtype`, after checking it: a negative dimension, more than
    `MAX_ARRAY_BYTES`, or more than the `available` bytes that hold its data raise `ValueError` naming `what`."""
    if any(int(n) < 0 for n in shape):
        raise ValueError(f"{what} declares a negative dimension in its shape {tuple(shape)}")
    nbytes = declared_nbytes(shape, dtype)
    if nbytes > MAX_ARRAY_BYTES:
        raise ValueError(
            f"{what} declares an array of shape {tuple(int(n) for n in shape)} ({nbytes} bytes of {np.dtype(dtype)}), "
            f"above the limit of {MAX_ARRAY_BYTES} bytes for one array; the file is damaged or not a feature file"
        )
    if available is not None and nbytes > available:
        raise ValueError(
            f"{what} declares {nbytes} bytes (shape {tuple(int(n) for n in shape)}, {np.dtype(dtype)}) but holds only "
            f"{available}; the file is truncated or damaged"
        )
    return nbytes
