"""Which of two ways to compute the same product is faster on this machine, measured at run time.

CPU kinds differ more than their feature flags say: on the project's AVX512-BF16 AMD EPYC a bf16 linear product ran
~2× float32, on an Intel Xeon with the same AVX512-BF16 flag (no AMX) ~0.5× (`bench/bench_dtypes.py`), and
oneDNN's packed float32 weights ran a batch-1 encoder 1.4× MKL's default path on the EPYC and ~1.0× on the Xeon. So
the defaults that depend on such speeds (bf16 under `--mixed_precision auto`, `fastest_inference_dtype`, packing in
the pipelines) time both candidates on a product of the size they will run, once per process, instead of reading
the flags alone.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable

import torch

from .arguments import check_positive_int

__all__ = ["log_measurement", "measured_speedup"]

logger = logging.getLogger(__name__)


def measured_speedup(baseline: Callable[[], object], candidate: Callable[[], object], rounds: int = 7) -> float:
    """How many times faster ``candidate`` runs than ``baseline``: the ratio of their median times over ``rounds``
    interleaved calls each (so a load that comes and goes falls on both alike), after one warm-up call of each.
    Both run without autograd, on one thread: what is compared is the kernels' speed on a core, which threads
    multiply alike, while several threads on cores that other jobs share measure the load instead (a 0.44x ratio
    read 1.49x that way)."""
    check_positive_int(rounds, "rounds")
    baseline_times, candidate_times = [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            baseline()
            candidate()
            for _ in range(rounds):
                for function, times in ((baseline, baseline_times), (candidate, candidate_times)):
                    start = time.perf_counter()
                    function()
                    times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(baseline_times) / max(statistics.median(candidate_times), 1e-9)


def log_measurement(what: str, speedup: float, consequence: str = "") -> None:
    """One line at INFO saying what a probe measured (and what follows from it), so that a run's log tells why it
    ran as it did."""
    logger.info("%s: %.2fx on this CPU%s", what, speedup, f"; {consequence}" if consequence else "")
