"""Which floating-point precision is fast where the code runs, measured at run time, never assumed.

bf16 halves the bytes every weight and activation takes, but its products are only fast on hardware built for them:
GPUs that support bf16, and some CPUs with bf16 matmul units: AMX tiles (Intel Xeon 4th generation and later) or the
AVX512-BF16 dot-product instructions. The flag alone does not say it: on the project's AVX512-BF16 AMD EPYC (Zen 4) a
4-layer BERT-base training step ran 1.65× faster under bf16 autocast than in fp32 and bf16 inference at batch 32 ~2×
fp32, while on an Intel Xeon with AVX512-BF16 and no AMX bf16 products ran at ~0.5× fp32 (78–84 against 137–161
GFLOP/s on one thread, 2026-11-29). CPUs without either unit (AVX2-only, older Xeons) emulate bf16 products with fp32
instructions, 5–8× slower than fp32 itself. So fp32 stays the CPU default, and `"auto"` picks bf16 on a CPU only where
it has such units and a bf16 product measured at least `BF16_MIN_SPEEDUP` times faster than float32 there
(`cpu_bf16_speedup`, once per process, ~0.1 s).
"""

from __future__ import annotations

import functools

import torch
from torch.nn import functional as F

from .kernel_probe import log_measurement, measured_speedup

__all__ = [
    "cpu_bf16_units",
    "cpu_int8_dot_product_units",
    "cpu_bf16_speedup",
    "bf16_is_fast",
    "resolve_mixed_precision",
    "MIXED_PRECISION_CHOICES",
    "BF16_MIN_SPEEDUP",
]

MIXED_PRECISION_CHOICES = ("no", "fp16", "bf16", "auto")
# bf16 rounds every product: it is chosen only where it saves clearly more than the probe's noise.
BF16_MIN_SPEEDUP = 1.2
# The probe's product: 128 rows by a 1024×1024 weight (~0.27 GFLOP, ~2 ms in fp32 on the CPUs measured): large enough
# for the kernels' steady speed, small enough that the probe costs ~0.1 s.
_PROBE_SHAPE = (128, 1024, 1024)


def _cpu_capabilities() -> dict:
    try:
        return dict(torch.cpu.get_capabilities())
    except (AttributeError, RuntimeError):  # a torch build or platform that does not report them
        return {}


def _reported_units(units: tuple[tuple[str, str], ...]) -> list[str]:
    """The names of `units` (`(torch's capability flag, name)` pairs) that torch reports on this CPU."""
    capabilities = _cpu_capabilities()
    return [name for flag, name in units if capabilities.get(flag)]


def cpu_bf16_units() -> list[str]:
    """The CPU's bf16 matmul units, as torch's CPU capability probe reports them: "AMX" (tiles), "AVX512-BF16"
    (dot-product instructions); empty where it has none (or none is reported)."""
    return _reported_units((("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16")))


def cpu_int8_dot_product_units() -> list[str]:
    """The CPU's int8 dot-product units, as torch's CPU capability probe reports them: "AMX-INT8" (tiles),
    "AVX512-VNNI", "AVX-VNNI"; empty where it has none. They sum u8·s8 products straight into int32, where the older
    AVX2/AVX512 int8 kernels add pairs of products in int16 first, which saturates on full 8-bit ranges."""
    return _reported_units((("amx_int8", "AMX-INT8"), ("avx512_vnni", "AVX512-VNNI"), ("avx_vnni", "AVX-VNNI")))


@functools.cache
def cpu_bf16_speedup() -> float:
    """How many times faster a bf16 linear product runs than the same float32 one on a core of this CPU: measured
    once per process (`measured_speedup`, ~0.1 s)."""
    rows, inputs, outputs = _PROBE_SHAPE
    generator = torch.Generator().manual_seed(0)
    activations = torch.randn(rows, inputs, generator=generator)
    weight = torch.randn(outputs, inputs, generator=generator)
    activations_bf16, weight_bf16 = activations.bfloat16(), weight.bfloat16()
    speedup = measured_speedup(lambda: F.linear(activations, weight), lambda: F.linear(activations_bf16, weight_bf16))
    fast = f"bf16 is fast here (from {BF16_MIN_SPEEDUP}x)" if speedup >= BF16_MIN_SPEEDUP else "float32 stays"
    log_measurement("a bf16 linear product against float32", speedup, fast)
    return speedup


def bf16_is_fast(device: torch.device | str) -> bool:
    """Whether bf16 products are faster than fp32 on `device`: a CUDA device that supports bf16, or a CPU with bf16
    matmul units (AMX or AVX512-BF16) on which a bf16 product measured at least `BF16_MIN_SPEEDUP` times faster than
    float32 (`cpu_bf16_speedup`; never probed on a CPU without the units, where bf16 is emulated)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(cpu_bf16_units()) and cpu_bf16_speedup() >= BF16_MIN_SPEEDUP
    return False


def resolve_mixed_precision(value: str, device: torch.device | str) -> str:
    """accelerate's `mixed_precision` for `value` on `device`: "no", "fp16" and "bf16" as given; "auto" becomes "bf16"
    where `bf16_is_fast(device)` and "no" (fp32) elsewhere."""
    if value not in MIXED_PRECISION_CHOICES:
        raise ValueError(f"--mixed_precision must be one of {', '.join(MIXED_PRECISION_CHOICES)}, got {value!r}")
    if value != "auto":
        return value
    return "bf16" if bf16_is_fast(device) else "no"
