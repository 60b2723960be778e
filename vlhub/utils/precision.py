"""Which floating-point precision is fast where the code runs, detected at run time, never assumed.

bf16 halves the bytes every weight and activation takes, but its products are only fast on hardware built for them:
GPUs that support bf16, and CPUs with bf16 matmul units: AMX tiles (Intel Xeon 4th generation and later) or the
AVX512-BF16 dot-product instructions (e.g. AMD Zen 4; measured on the project's 2-core EPYC: a 4-layer BERT-base
training step 1.65× faster under bf16 autocast than in fp32, and bf16 inference at batch 32 ~2× fp32). CPUs without
either (AVX2-only, older Xeons) emulate bf16 products with fp32 instructions, 5–8× slower than fp32 itself. So fp32
stays the CPU default, and `"auto"` picks bf16 only where such units are found.
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
    """Whether bf16 products are faster than fp32 on `device`: a CUDA device that supports bf16, or a CPU with bf16
    matmul units (AMX or AVX512-BF16)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(cpu_bf16_units())
    return False


def resolve_mixed_precision(value: str, device: torch.device | str) -> str:
    """accelerate's `mixed_precision` for `value` on `device`: "no", "fp16" and "bf16" as given; "auto" becomes "bf16"
    where `bf16_is_fast(device)` and "no" (fp32) elsewhere."""
    if value not in MIXED_PRECISION_CHOICES:
        raise ValueError(f"--mixed_precision must be one of {', '.join(MIXED_PRECISION_CHOICES)}, got {value!r}")
    if value != "auto":
        return value
    return "bf16" if bf16_is_fast(device) else "no"
