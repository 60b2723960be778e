"""The machine's fastest accurate inference dtype, and opt-in int8 dynamic quantization of linear layers."""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from torch import nn

from .packed_linear import PackedLinear

# CPU flags (as /proc/cpuinfo spells them) that mean native bf16 matmul units.
BF16_UNIT_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})


def read_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU feature flags of the first processor listed in ``cpuinfo`` (empty where the file is absent)."""
    if not cpuinfo.is_file():
        return frozenset()
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def choose_inference_dtype(cpu_flags: frozenset[str]) -> torch.dtype:
    """bfloat16 where the CPU has bf16 units (AMX, AVX512-BF16), else float32: bf16 emulated in fp32 is slower."""
    return torch.bfloat16 if cpu_flags & BF16_UNIT_FLAGS else torch.float32


@functools.cache
def fastest_inference_dtype() -> torch.dtype:
    """This machine's choice, probed once per process."""
    return choose_inference_dtype(read_cpu_flags())


def quantize_linear_weights(model: nn.Module, dtype: str = "int8") -> nn.Module:
    """Int8 dynamic quantization of ``model``'s ``nn.Linear`` layers (weights int8, activations quantized per batch).

    CPU inference only: the quantized model cannot be trained, moved to a GPU or saved with ``save_pretrained``.
    """
    if dtype != "int8":
        raise ValueError(f"quantize_linear_weights supports only 'int8', got {dtype!r}")
    if model.training:
        raise ValueError("int8 dynamic quantization is for inference only: call model.eval() first")
    devices = {parameter.device.type for parameter in model.parameters()}
    if devices - {"cpu"}:
        raise ValueError(f"int8 dynamic quantization runs on the CPU only; the model is on {sorted(devices)}")
    if any(isinstance(module, PackedLinear) for module in model.modules()):
        # quantize_dynamic matches nn.Linear by exact type: packed layers would silently stay fp32.
        raise ValueError("the model's linear weights are packed (pack_linear_weights): quantize an unpacked model")
    return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
