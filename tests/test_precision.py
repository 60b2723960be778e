"""`--mixed_precision auto` and the run-time probe behind it: bf16 only where its products are fast (a bf16 GPU, a
CPU with AMX or AVX512-BF16 units on which a bf16 product measured clearly faster than fp32), fp32 elsewhere; the
other values pass through, anything else is refused by name."""

import pytest
import torch

from vlhub.modeling.inference_dtype import fastest_inference_dtype
from vlhub.training.arguments import VlhubTrainingArguments
from vlhub.utils import precision


@pytest.fixture
def cpu_with(monkeypatch):
    """Sets the CPU's reported flags and what its bf16 probe measures (never probed without bf16 units)."""

    def set_cpu(bf16_speedup=None, **flags):
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: dict(flags))

        def probe():
            assert bf16_speedup is not None, "the bf16 probe ran on a CPU without bf16 units"
            return bf16_speedup

        monkeypatch.setattr(precision, "cpu_bf16_speedup", probe)

    return set_cpu


@pytest.mark.parametrize(
    "flags, bf16_speedup, units, resolved",
    [
        ({"amx_bf16": True, "avx512_bf16": True}, 3.0, ["AMX", "AVX512-BF16"], "bf16"),
        ({"amx_bf16": False, "avx512_bf16": True}, 2.0, ["AVX512-BF16"], "bf16"),  # the AVX512-BF16 EPYC (Zen 4)
        ({"amx_bf16": False, "avx512_bf16": True}, 0.5, ["AVX512-BF16"], "no"),  # the AVX512-BF16 Xeon without AMX
        ({"avx512_bf16": True}, precision.BF16_MIN_SPEEDUP, ["AVX512-BF16"], "bf16"),
        ({"avx512_bf16": True}, 1.1, ["AVX512-BF16"], "no"),  # faster, but not by enough to round every product
        ({"avx2": True}, None, [], "no"),
        ({}, None, [], "no"),  # nothing reported
    ],
)
def test_auto_on_the_cpu_follows_its_measured_bf16_speed(cpu_with, flags, bf16_speedup, units, resolved):
    cpu_with(bf16_speedup, **flags)
    assert precision.cpu_bf16_units() == units
    assert precision.resolve_mixed_precision("auto", "cpu") == resolved
    assert VlhubTrainingArguments(output_dir="unused", mixed_precision="auto", use_cpu=True).mixed_precision == resolved
    assert fastest_inference_dtype() == (torch.bfloat16 if resolved == "bf16" else torch.float32)


def test_the_bf16_probe_measures_once_per_process(monkeypatch):
    """The probe times real products here (what it returns depends on this CPU) and is not repeated."""
    calls = []
    real = precision.measured_speedup
    monkeypatch.setattr(precision, "measured_speedup", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    precision.cpu_bf16_speedup.cache_clear()
    try:
        first = precision.cpu_bf16_speedup()
        assert first > 0 and precision.cpu_bf16_speedup() == first and len(calls) == 1
    finally:
        precision.cpu_bf16_speedup.cache_clear()


@pytest.mark.parametrize("supported, resolved", [(True, "bf16"), (False, "no")])
def test_auto_on_a_gpu_follows_its_bf16_support(monkeypatch, supported, resolved):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: supported)
    assert precision.resolve_mixed_precision("auto", "cuda") == resolved


def test_explicit_values_pass_through_and_others_are_refused(cpu_with):
    cpu_with(3.0, amx_bf16=True)
    for value in ("no", "fp16", "bf16"):
        assert precision.resolve_mixed_precision(value, "cpu") == value
    with pytest.raises(ValueError, match="must be one of no, fp16, bf16, auto, got 'fp8'"):
        VlhubTrainingArguments(output_dir="unused", mixed_precision="fp8")


def test_a_torch_without_the_probe_counts_as_no_bf16_units(monkeypatch):
    def missing():
        raise AttributeError("get_capabilities")

    monkeypatch.setattr(torch.cpu, "get_capabilities", missing)
    assert precision.cpu_bf16_units() == [] and not precision.bf16_is_fast("cpu")


@pytest.mark.parametrize(
    "flags, bf16_speedup, message",
    [
        ({"avx2": True}, None, "without bf16 matmul units .* emulated: no faster than fp32"),
        ({"avx512_bf16": True}, 0.44, "whose bf16 products measured 0.44x fp32's speed: no faster than fp32"),
    ],
)
def test_bf16_asked_for_where_it_does_not_pay_is_kept_with_a_warning(cpu_with, flags, bf16_speedup, message):
    cpu_with(bf16_speedup, **flags)
    with pytest.warns(UserWarning, match=message):
        args = VlhubTrainingArguments(output_dir="unused", mixed_precision="bf16", use_cpu=True)
    assert args.mixed_precision == "bf16"
