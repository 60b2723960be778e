"""Timing shared by the benchmark scripts."""

import time
from collections.abc import Callable

import torch


def synchronize(device: str) -> None:
    """Wait for the device's queued work (a CUDA device's kernels run asynchronously)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def interleaved_rounds(calls: dict[str, Callable[[], object]], rounds: int, device: str) -> dict[str, list[tuple]]:
    """`rounds` rounds in which every call runs once, in an order rotated from round to round, so that a shared
    machine's load falls on all of them alike. Returns {name: [(wall seconds, process CPU seconds) per round]}."""
    names = list(calls)
    times = {name: [] for name in names}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            synchronize(device)
            start, cpu_start = time.perf_counter(), time.process_time()
            calls[name]()
            synchronize(device)
            times[name].append((time.perf_counter() - start, time.process_time() - cpu_start))
    return times
