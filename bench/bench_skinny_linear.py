"""Few-row float32 linear products on the CPU: which kernel streams the weights fastest.

    python bench/bench_skinny_linear.py [--rows 1 2 5 10 20 40 60] [--rounds 15] [--inner 20] [--threads N]

A cached decoding step (rows = batch × beams × tokens per step) or a batch-1 encoder forward multiplies a few rows by
every weight matrix, so it is bound by reading the weights. For each BERT-base weight shape (out × in: 768×768,
3072×768, 768×3072, 30522×768) and row count, every kernel below computes the same linear map `x @ W.T + b`; they
are timed in interleaved rounds (each kernel once per round, in a rotating order, so a shared machine's load falls on
all alike; medians of `--inner` back-to-back calls per round). Reported: weight GB/s (weight bytes / time) and
GFLOP/s (2 · rows · in · out / time), and each kernel's largest difference from `F.linear` relative to its output's
largest magnitude (all float32, rounding-level).

kernels: "F.linear" (PyTorch's default CPU path, MKL sgemm), "packed" (oneDNN on a weight reordered once, no batch
hint: what `PackedLinear` runs), "packed-hint" (the same reordered with the real row count as oneDNN's batch-size
hint), "addmm-T" (the transposed product `b[:, None] + W @ x.T`, the weight as the large left operand, transposed
back as a view).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import interleaved_rounds  # noqa: E402

SHAPES = [(768, 768), (3072, 768), (768, 3072), (30522, 768)]  # (out_features, in_features) of BERT-base


def kernels(weight: torch.Tensor, bias: torch.Tensor, rows: int) -> dict:
    packed = torch.ops.mkldnn._reorder_linear_weight(weight)
    packed_hint = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
    pointwise = torch.ops.mkldnn._linear_pointwise
    bias_column = bias[:, None]
    return {
        "F.linear": lambda x: F.linear(x, weight, bias),
        "packed": lambda x: pointwise(x, packed, bias, "none", [], ""),
        "packed-hint": lambda x: pointwise(x, packed_hint, bias, "none", [], ""),
        "addmm-T": lambda x: torch.addmm(bias_column, weight, x.T).T,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 5, 10, 20, 40, 60])
    parser.add_argument("--shapes", nargs="+", default=[f"{o}x{i}" for o, i in SHAPES], help="OUTxIN")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--inner", type=int, default=20, help="calls per timed sample")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load {os.getloadavg()}")
    print(f"{'shape':>10} {'rows':>4} {'kernel':>12} {'ms':>8} {'GB/s':>6} {'GFLOP/s':>8} {'max rel diff':>12}")
    torch.manual_seed(0)
    with torch.no_grad():
        for shape in args.shapes:
            out_features, in_features = map(int, shape.split("x"))
            weight, bias = torch.randn(out_features, in_features) / in_features**0.5, torch.randn(out_features)
            for rows in args.rows:
                x = torch.randn(rows, in_features)
                calls = kernels(weight, bias, rows)
                reference = F.linear(x, weight, bias)
                diffs = {
                    name: ((call(x) - reference).abs().max() / reference.abs().max()).item()
                    for name, call in calls.items()
                }
                timed = {name: (lambda call=call: [call(x) for _ in range(args.inner)]) for name, call in calls.items()}
                for _ in range(2):  # warm-up
                    for call in timed.values():
                        call()
                times = interleaved_rounds(timed, args.rounds, "cpu")
                for name, samples in times.items():
                    seconds = statistics.median(wall for wall, _ in samples) / args.inner
                    gbs = weight.numel() * 4 / seconds / 1e9
                    gflops = 2 * rows * in_features * out_features / seconds / 1e9
                    print(
                        f"{shape:>10} {rows:>4} {name:>12} {seconds * 1e3:8.3f} {gbs:6.1f} {gflops:8.1f} "
                        f"{diffs[name]:12.1e}",
                        flush=True,
                    )
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
