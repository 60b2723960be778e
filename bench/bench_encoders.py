"""Encoder inference speed of every architecture, as examples/s and as a share of this machine's matmul peak.

    python bench/bench_encoders.py [--encoders uniter vl_bert ...] [--batch-sizes 1 8 32] [--bf16-batch-sizes 32]
                                   [--attention eager sdpa] [--text 20] [--regions N] [--repeats 5] [--device cpu]

The cases live in bench/encoders/<arch>.py (see its __init__ for the contract): the released model size with random
weights, since speed does not depend on the values. For every case, attention implementation and batch size the
script prints examples/s, the GFLOP one example executes (counted by torch.utils.flop_counter), and the achieved
GFLOP/s as a percentage of the matmul peak measured here first (a large square matmul in the same dtype), so
figures from different machines can be compared. bf16 runs with bf16 weights; its largest answer-logit difference
from fp32 is printed next to it (what the speed costs in accuracy). Without AMX, bf16 on a CPU is several times
slower than fp32: the script says whether this CPU has AMX.

`--original-checkout PATH` also times the architecture's ORIGINAL code from a checkout of its repository (your
own clone; nothing of it is copied into vlhub), for the cases whose module defines `build_original` (see
bench/encoders/__init__.py): the same-size model with random weights, side by side, each vlhub row noting its
speedup over the original at the same dtype and batch (GFLOP/ex and % peak count what each executes, the
original's extra heads included). The models of a case take turns forward by forward, and the
timings are repeated: examples/s at the median and the best (minimum) time, so a shared machine's noise shows.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import pkgutil
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent))

import encoders  # noqa: E402  (bench/encoders, found through the path above)


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def matmul_peak_gflops(dtype: torch.dtype, device: str, size: int = 4096, repeats: int = 10) -> float:
    """Best GFLOP/s of a square matmul: the ceiling an encoder's dense layers can approach."""
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


def has_amx() -> bool:
    try:
        return "amx_bf16" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def answer_logits(outputs) -> torch.Tensor:
    return outputs.logits if hasattr(outputs, "logits") else outputs[0]


def forward_flops(model, inputs) -> int:
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(**inputs)
    return counter.get_total_flops()


def time_forwards(runs: list[tuple], repeats: int, device: str) -> list[tuple[float, float, torch.Tensor]]:
    """For each `(model, inputs)`: median and minimum seconds per forward and the answer logits (fp32), after one
    warm-up call each. The models take turns, one forward per round, so a shared machine's changing load falls on
    all of them alike."""
    times: list[list[float]] = [[] for _ in runs]
    with torch.inference_mode():
        logits = [answer_logits(model(**inputs)).float() for model, inputs in runs]
        for _ in range(repeats):
            for (model, inputs), spent in zip(runs, times):
                synchronize(device)
                start = time.perf_counter()
                model(**inputs)
                synchronize(device)
                spent.append(time.perf_counter() - start)
    return [(sorted(t)[len(t) // 2], min(t), out) for t, out in zip(times, logits)]


def to_device(inputs: dict, device: str, dtype: torch.dtype) -> dict:
    return {
        key: value.to(device=device, dtype=dtype if value.is_floating_point() else value.dtype)
        for key, value in inputs.items()
    }


def available_cases() -> list[str]:
    return sorted(info.name for info in pkgutil.iter_modules(encoders.__path__))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoders", nargs="+", default=None, help=f"cases to run (default all: {available_cases()})")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--bf16-batch-sizes", type=int, nargs="*", default=[32])
    parser.add_argument("--attention", nargs="+", default=["eager", "sdpa"])
    parser.add_argument("--text", type=int, default=20)
    parser.add_argument("--regions", type=int, default=None, help="regions per example (default: the case's own)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--original-checkout", type=Path, default=None,
                        help="a checkout of the original repository: also time its model (cases with build_original)")
    args = parser.parse_args()
    names = args.encoders or available_cases()
    unknown = sorted(set(names) - set(available_cases()))
    if unknown:
        parser.error(f"unknown encoder case(s) {unknown}; available: {available_cases()}")
    if args.original_checkout is not None and not args.original_checkout.is_dir():
        parser.error(f"--original-checkout {args.original_checkout} is not a directory")

    device = args.device
    peaks = {torch.float32: matmul_peak_gflops(torch.float32, device)}
    if args.bf16_batch_sizes:
        peaks[torch.bfloat16] = matmul_peak_gflops(torch.bfloat16, device)
    hardware = torch.cuda.get_device_name() if device.startswith("cuda") else f"CPU, AMX {'yes' if has_amx() else 'no'}"
    print(f"torch {torch.__version__}, {hardware}, {torch.get_num_threads()} threads, {os.cpu_count()} cores")
    print("matmul peak: " + ", ".join(f"{str(d).removeprefix('torch.')} {g:.0f} GFLOP/s" for d, g in peaks.items()))
    print(f"{'encoder':36s} {'code':8s} {'attn':5s} {'dtype':8s} {'batch':>5s} {'ex/s':>9s} {'best':>9s} {'GFLOP/ex':>9s}"
          f" {'% peak':>7s}  note")
    print("(ex/s at the median time of the repeats, best: at the minimum; % peak from the median)")

    for name in names:
        case = importlib.import_module(f"encoders.{name}")
        regions = args.regions or getattr(case, "DEFAULT_REGIONS", 36)
        label = case.DESCRIPTION + f" {args.text}t+{regions}r"
        sources = [("original", lambda a: case.build_original(args.original_checkout, a), case.make_original_inputs)
                   ] if args.original_checkout and hasattr(case, "build_original") else []
        sources.append(("vlhub", case.build, case.make_inputs))
        variants = []  # (code, attention, model, make_inputs); None from build_original: no such attention there
        for code, build, make_inputs in sources:
            for attention in args.attention:
                torch.manual_seed(0)
                model = build(attention)
                if model is not None:
                    variants.append((code, attention, model.to(device), make_inputs))
        fp32_logits: dict[tuple, torch.Tensor] = {}
        for dtype, batch in [(torch.float32, b) for b in args.batch_sizes] + [(torch.bfloat16, b)
                                                                              for b in args.bf16_batch_sizes]:
            runs, flops = [], []
            for code, attention, model, make_inputs in variants:
                model.to(dtype)
                inputs = to_device(make_inputs(model, batch, args.text, regions), device, dtype)
                runs.append((model, inputs))
                flops.append(forward_flops(model, inputs))
            timings = time_forwards(runs, args.repeats, device)
            original = min(((t[0], t[1]) for v, t in zip(variants, timings) if v[0] == "original"), default=None)
            for (code, attention, _, _), count, (median, best, logits) in zip(variants, flops, timings):
                notes = []
                if dtype == torch.float32:
                    fp32_logits[(code, attention, batch)] = logits
                elif (code, attention, batch) in fp32_logits:
                    difference = (logits - fp32_logits[(code, attention, batch)]).abs().max().item()
                    notes.append(f"max |logit - fp32| {difference:.3f}")
                if code != "original" and original is not None:
                    notes.append(f"{original[0] / median:.2f}x the original (best times: {original[1] / best:.2f}x)")
                print(
                    f"{label:36s} {code:8s} {attention:5s} {str(dtype)[6:]:8s} {batch:5d} {batch / median:9.2f}"
                    f" {batch / best:9.2f} {count / batch / 1e9:9.2f} {100 * count / median / 1e9 / peaks[dtype]:6.1f}%"
                    f"  {'; '.join(notes)}", flush=True
                )
            del runs
        del variants
        gc.collect()


if __name__ == "__main__":
    main()
