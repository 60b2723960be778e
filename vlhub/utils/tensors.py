"""Small-tensor helpers for the data path: per-image work that must stay on the calling thread, and cheap checks.

One image is ~74k values (36 regions x 2048), above PyTorch's parallel grain size (32,768 elements), so every
elementwise op on it wakes the intra-op thread pool. On cores that are busy (the model's forward pass, DataLoader
workers, other processes) such an op can wait milliseconds for a thread to be scheduled: measured on 2 busy cores, a
float16 -> float32 conversion took 5.4 ms with 2 threads and 0.014 ms with one. DataLoader workers already run with
one thread; `single_threaded` gives the main process (`--dataloader_num_workers 0`, pipelines) the same.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

__all__ = ["single_threaded", "SingleThreaded", "all_finite", "float32_tensor"]


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """Run the block with one PyTorch intra-op thread, then restore the count (switching costs well under 1 µs)."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class SingleThreaded:
    """Wraps a callable (a collate function) so it runs `single_threaded`; picklable for DataLoader workers."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function
        functools.update_wrapper(self, function, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with single_threaded():
            return self.function(*args, **kwargs)


def all_finite(values: torch.Tensor) -> bool:
    """Whether every value is finite. The sum is finite when all values are (barring float overflow of huge but
    finite values, which falls back to the exact elementwise test): one reduction instead of a boolean tensor."""
    if not values.is_floating_point():
        return True
    if values.numel() == 0 or bool(torch.isfinite(values.sum())):
        return True
    return bool(torch.isfinite(values).all())


def float32_tensor(array: np.ndarray) -> torch.Tensor:
    """A float32 tensor copied out of an array (possibly read-only, e.g. memory-mapped), converted on the calling
    thread. numpy's float16 conversion is ~20x slower than PyTorch's, and `torch.from_numpy` refuses to share a
    read-only buffer without a warning, so the raw bytes are copied first (a plain memcpy)."""
    if not array.flags.writeable:
        array = array.copy()
    if array.dtype == np.float32:  # nothing to convert (a copy above, or the caller's own writable array, as below)
        return torch.from_numpy(np.ascontiguousarray(array))
    with single_threaded():
        return torch.from_numpy(np.ascontiguousarray(array)).to(torch.float32)
