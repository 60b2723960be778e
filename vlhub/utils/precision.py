"""Which floating-point precision is fast where the code runs, detected at run time, never assumed.

bf16 halves the bytes every weight and activation takes, but its matmuls are only fast on hardware built for them:
GPUs that support bf16, and CPUs with AMX tiles (Intel Xeon 4th generation and later). Other x86 CPUs emulate bf16
products with fp32 instructions, several times slower than fp32 itself (measured 5–8× on AVX2-only machines);
AVX512-BF16 (e.g. AMD Zen 4) has bf16 dot-product instructions, fast for large products, but not the tiles. So fp32
stays the CPU default, and `"auto"` picks bf16 only where AMX or a bf16-capable GPU is found.
"""

from __future__ import annotations

import torch

__all__ = ["cpu_bf16_units", "bf16_is_fast", "resolve_mixed_precision", "MIXED_PRECISION_CHOICES"]

MIXED_PRECISION_CHOICES = ("no", "fp16", "bf16", "auto")


def _cpu_capabilities() -> dict:
    try:
        return dict(torch.cpu.get_capabilities())
    except (AttributeError, RuntimeError):  # a torch build or platform that does not report them
        return {}


def cpu_bf16_units() -> list[str]:
    """The CPU's bf16 matmul units, as torch's CPU capability probe reports them: "AMX" (tiles), "AVX512-BF16"
    (dot-product instructions); empty where it has none (or none is reported)."""
    capabilities = _cpu_capabilities()
    return [name for flag, name in (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16")) if capabilities.get(flag)]


def bf16_is_fast(device: torch.device | str) -> bool:
    """Whether bf16 products are faster than fp32 on `device`: a CUDA device that supports bf16, or a CPU with AMX."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return "AMX" in cpu_bf16_units()
    return False


def resolve_mixed_precision(value: str, device: torch.device | str) -> str:
    """accelerate's `mixed_precision` for `value` on `device`: "no", "fp16" and "bf16" as given; "auto" becomes "bf16"
    where `bf16_is_fast(device)` and "no" (fp32) elsewhere."""
    if value not in MIXED_PRECISION_CHOICES:
        raise ValueError(f"--mixed_precision must be one of {', '.join(MIXED_PRECISION_CHOICES)}, got {value!r}")
    if value != "auto":
        return value
    return "bf16" if bf16_is_fast(device) else "no"
