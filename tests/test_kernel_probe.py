"""The run-time kernel probe behind the defaults that depend on this machine's speed (bf16, packing)."""

import time

import pytest

from vlhub.modeling import packed_linear
from vlhub.utils.kernel_probe import measured_speedup


def test_measured_speedup_is_the_ratio_of_median_times():
    # sleeps give times far apart whatever the load: the ratio's side is what is checked, not its value
    assert measured_speedup(lambda: time.sleep(0.02), lambda: time.sleep(0.002), rounds=3) > 2
    assert measured_speedup(lambda: time.sleep(0.002), lambda: time.sleep(0.02), rounds=3) < 0.5


def test_measured_speedup_calls_each_once_per_round_after_a_warm_up():
    calls = {"baseline": 0, "candidate": 0}
    measured_speedup(
        lambda: calls.__setitem__("baseline", calls["baseline"] + 1),
        lambda: calls.update(candidate=calls["candidate"] + 1),
        rounds=4,
    )
    assert calls == {"baseline": 5, "candidate": 5}
    with pytest.raises(ValueError, match=r"rounds must be a positive integer \(at least 1\), got 0"):
        measured_speedup(lambda: None, lambda: None, rounds=0)


@pytest.mark.skipif(not packed_linear.packed_linear_available(), reason="torch without oneDNN's packed linear")
def test_the_packing_probe_times_both_kernels_once_per_row_count(monkeypatch):
    calls = []
    real = packed_linear.measured_speedup
    monkeypatch.setattr(
        packed_linear, "measured_speedup", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs)
    )
    packed_linear.packed_speedup.cache_clear()
    try:
        speedup = packed_linear.packed_speedup(packed_linear.PROBE_ROWS["decoder"])
        assert speedup > 0 and packed_linear.packed_speedup(packed_linear.PROBE_ROWS["decoder"]) == speedup
        assert len(calls) == 1
        assert packed_linear.packing_pays(decodes=True) == (speedup >= packed_linear.PACKING_MIN_SPEEDUP)
    finally:
        packed_linear.packed_speedup.cache_clear()


def test_the_probe_runs_on_one_thread_and_gives_the_threads_back_even_when_a_kernel_fails():
    import torch

    threads = torch.get_num_threads()
    seen = []
    measured_speedup(lambda: seen.append(torch.get_num_threads()), lambda: None, rounds=2)
    assert set(seen) == {1} and torch.get_num_threads() == threads

    def broken():
        raise RuntimeError("no such kernel")

    with pytest.raises(RuntimeError, match="no such kernel"):
        measured_speedup(lambda: None, broken)
    assert torch.get_num_threads() == threads
