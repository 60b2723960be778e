"""What every benchmark script shares about the device it runs on.

- `add_device_arguments`: `--device cpu|cuda` and `--json PATH` (the run's figures, for bench/collect_table.py).
- `prepare_device`: refuses `--device cuda` where torch sees no GPU (a parser error, not a traceback), and on a GPU
  turns on its fast settings: cuDNN's autotuner (`cudnn.benchmark`, the detector's convolutions) and TF32 matrix
  products for float32 work. Attention runs through transformers' "sdpa", whose kernel (flash, memory-efficient or
  math) torch picks per call; bf16 runs as each bench's dtype option says (bf16 weights or autocast).
- `machine`: the device's name and its measured matrix-product peaks (GFLOP/s of a large square matmul: fp32 and bf16,
  and on a GPU also fp32 through TF32), so that every figure can be read as a share of what the device can do.
- `write_figures`: the `--json` file, written atomically.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import time
from pathlib import Path

import torch

try:
    from timing import synchronize  # bench/timing.py, where a bench put bench/ on sys.path
except ImportError:  # imported as bench.device (from the repository root)
    from bench.timing import synchronize

DEVICES = ("cpu", "cuda")


def add_device_arguments(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    """`--device` (default: `default`, or cuda when torch sees a GPU) and `--json`."""
    if default is None:
        default = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default=default,
        help="where to run (cuda: bf16 as the dtype options say, TF32, cudnn.benchmark, sdpa kernels)",
    )
    parser.add_argument(
        "--json", type=Path, metavar="PATH", help="also write this run's figures to PATH as JSON (for run_all.sh)"
    )


def cuda_refusal() -> str | None:
    """Why `--device cuda` cannot run here, or None where it can."""
    if torch.cuda.is_available():
        return None
    built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "built without CUDA"
    return f"--device cuda: torch sees no CUDA GPU here (torch {torch.__version__}, {built}); use --device cpu"


def prepare_device(device: str, parser: argparse.ArgumentParser) -> str:
    """Check that `device` can run, and set its fast settings; returns it."""
    if device == "cuda":
        refusal = cuda_refusal()
        if refusal:
            parser.error(refusal)
        torch.backends.cudnn.benchmark = True  # shapes repeat within a bench: let cuDNN pick its fastest kernels
        torch.backends.cuda.matmul.fp32_precision = "tf32"  # torch's current API (not the legacy allow_tf32)
        torch.backends.cudnn.conv.fp32_precision = "tf32"
    return device


def matmul_peak_gflops(dtype: torch.dtype, device: str, size: int = 4096, repeats: int = 10) -> float:
    """Best GFLOP/s of a square matmul in `dtype`: the ceiling a model's dense layers can approach."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    torch.matmul(a, b)
    synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.matmul(a, b)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


@contextlib.contextmanager
def strict_fp32(device: str):
    """float32 products without TF32 (to measure the plain fp32 peak of a GPU beside its TF32 one)."""
    if device != "cuda":
        yield
        return
    saved = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.fp32_precision = saved


def hardware(device: str) -> str:
    """The device in words: the GPU's name, or the CPU's model with its vector and bf16 units."""
    if device == "cuda":
        return torch.cuda.get_device_name()
    from vlhub.utils.precision import cpu_bf16_units

    name = platform.processor() or "CPU"
    flags: set[str] = set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    vectors = "AVX512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{name} ({vectors}; bf16 matmul units: {', '.join(cpu_bf16_units()) or 'none'})"


def machine(
    device: str, peak_size: int | None = None, peak_dtypes: tuple[str, ...] = ("fp32", "bf16"), peak_repeats: int = 10
) -> dict:
    """The device, its threads and its measured matmul peaks (GFLOP/s) in `peak_dtypes` (fp32, bf16; on a GPU fp32
    is measured both strict and through TF32, the setting its fp32 runs use; none: no peaks, as for the benches whose
    figures are not shares of a peak, when run_all.sh measures them once). `peak_size` defaults to 4096 on a CPU and
    8192 on a GPU. A CPU without bf16 units emulates bf16 products (~0.2 GFLOP/s on a 2-core AVX2 EPYC: minutes per
    large product), so its bf16 peak is measured at 512² at most (`peak_sizes` says which size each peak used)."""
    size = peak_size or (8192 if device == "cuda" else 4096)
    peaks, sizes = {}, {}
    if "fp32" in peak_dtypes:
        with strict_fp32(device):
            peaks["fp32"], sizes["fp32"] = matmul_peak_gflops(torch.float32, device, size, peak_repeats), size
        if device == "cuda":
            peaks["tf32"], sizes["tf32"] = matmul_peak_gflops(torch.float32, device, size, peak_repeats), size
    if "bf16" in peak_dtypes:
        from vlhub.utils.precision import bf16_is_fast

        bf16_size = size if bf16_is_fast(device) else min(size, 512)
        peaks["bf16"] = matmul_peak_gflops(torch.bfloat16, device, bf16_size, peak_repeats)
        sizes["bf16"] = bf16_size
    return {
        "device": device,
        "hardware": hardware(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cores": os.cpu_count(),
        "peak_gflops": peaks,
        "peak_sizes": sizes,
    }


def describe(info: dict) -> str:
    """One line: the device, torch, threads and the peaks measured."""
    line = f"{info['hardware']}, torch {info['torch']}, {info['threads']} threads"
    if info["peak_gflops"]:
        line += "; matmul peak GFLOP/s: " + peak_list(info)
    return line


def peak_list(info: dict) -> str:
    """ "fp32 31.2 (2048²), bf16 0.2 (512²)": each measured peak with the side of its square product."""
    return ", ".join(f"{name} {value:.1f} ({info['peak_sizes'][name]}²)" for name, value in info["peak_gflops"].items())


def write_figures(path: Path | None, bench: str, info: dict, figures: list[dict], **settings) -> None:
    """`{"bench", "machine", "settings", "figures"}` to `path` (atomically), when `--json` asked for it."""
    if path is None:
        return
    from vlhub.utils.files import atomic_write_json

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"bench": bench, "machine": info, "settings": settings, "figures": figures})


def main() -> None:
    """`python bench/device.py --device cuda --json machine.json`: the device and its peaks alone (run_all.sh)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    add_device_arguments(parser)
    parser.add_argument("--peak-size", type=int, default=None, help="side of the square matmul (default 4096/8192)")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    info = machine(prepare_device(args.device, parser), args.peak_size, peak_repeats=args.repeats)
    print(describe(info))
    write_figures(args.json, "machine", info, [])


if __name__ == "__main__":
    main()
