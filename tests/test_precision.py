"""`--mixed_precision auto` and the run-time probe behind it: bf16 only where its products are fast (a bf16 GPU, a
CPU with AMX or AVX512-BF16), fp32 elsewhere; the other values pass through, anything else is refused by name."""

import pytest
import torch

from vlhub.training.arguments import VlhubTrainingArguments
from vlhub.utils import precision


@pytest.fixture
def cpu_with(monkeypatch):
    def set_flags(**flags):
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: dict(flags))

    return set_flags


@pytest.mark.parametrize(
    "flags, units, resolved",
    [
        ({"amx_bf16": True, "avx512_bf16": True}, ["AMX", "AVX512-BF16"], "bf16"),
        ({"amx_bf16": False, "avx512_bf16": True}, ["AVX512-BF16"], "bf16"),  # Zen 4: measured faster than fp32
        ({"avx2": True}, [], "no"),
        ({}, [], "no"),  # nothing reported
    ],
)
def test_auto_on_the_cpu_follows_its_bf16_units(cpu_with, flags, units, resolved):
    cpu_with(**flags)
    assert precision.cpu_bf16_units() == units
    assert precision.resolve_mixed_precision("auto", "cpu") == resolved
    assert VlhubTrainingArguments(output_dir="unused", mixed_precision="auto", use_cpu=True).mixed_precision == resolved


@pytest.mark.parametrize("supported, resolved", [(True, "bf16"), (False, "no")])
def test_auto_on_a_gpu_follows_its_bf16_support(monkeypatch, supported, resolved):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: supported)
    assert precision.resolve_mixed_precision("auto", "cuda") == resolved


def test_explicit_values_pass_through_and_others_are_refused(cpu_with):
    cpu_with(amx_bf16=True)
    for value in ("no", "fp16", "bf16"):
        assert precision.resolve_mixed_precision(value, "cpu") == value
    with pytest.raises(ValueError, match="must be one of no, fp16, bf16, auto, got 'fp8'"):
        VlhubTrainingArguments(output_dir="unused", mixed_precision="fp8")


def test_a_torch_without_the_probe_counts_as_no_bf16_units(monkeypatch):
    def missing():
        raise AttributeError("get_capabilities")

    monkeypatch.setattr(torch.cpu, "get_capabilities", missing)
    assert precision.cpu_bf16_units() == [] and not precision.bf16_is_fast("cpu")


def test_bf16_asked_for_on_a_cpu_without_bf16_units_is_kept_with_a_warning(cpu_with):
    cpu_with(avx2=True)
    with pytest.warns(UserWarning, match="without bf16 matmul units"):
        args = VlhubTrainingArguments(output_dir="unused", mixed_precision="bf16", use_cpu=True)
    assert args.mixed_precision == "bf16"
