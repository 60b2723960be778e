"""Matmul peaks of this CPU in fp32, bf16 and int8 (dynamic quantization), side by side in one run (interleaved
rounds, medians). Part of issue 30 item 3; the per-model speed/accuracy comparison is still to be added.

    PYTHONPATH=$PWD python bench/bench_dtypes.py --rounds 7 [--device cpu|cuda] [--json PATH]

On `--device cuda` int8 is skipped (dynamic quantization's kernels are the CPU's).
"""

import argparse
import statistics

import torch
from torch import nn

from bench.device import add_device_arguments, describe, machine, prepare_device, write_figures
from bench.timing import interleaved_rounds
from vlhub.modeling.inference_dtype import fastest_inference_dtype, quantize_linear_weights, read_cpu_flags


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--width", type=int, default=1024)
    add_device_arguments(parser, default="cpu")
    args = parser.parse_args()
    device = prepare_device(args.device, parser)
    torch.manual_seed(0)
    linear = nn.Linear(args.width, args.width).eval()
    int8_linear = quantize_linear_weights(nn.Sequential(linear).eval()) if device == "cpu" else None
    linear = linear.to(device)
    bf16_linear = nn.Linear(args.width, args.width).eval().to(device, torch.bfloat16)
    inputs = torch.randn(args.tokens, args.width, device=device)
    bf16_inputs = inputs.to(torch.bfloat16)
    repeats = 10
    calls = {
        "fp32": lambda: [linear(inputs) for _ in range(repeats)],
        "bf16": lambda: [bf16_linear(bf16_inputs) for _ in range(repeats)],
    }
    if int8_linear is not None:
        calls["int8"] = lambda: [int8_linear(inputs) for _ in range(repeats)]
    with torch.inference_mode():
        times = interleaved_rounds(calls, args.rounds, device)
    flops = 2 * args.tokens * args.width * args.width * repeats
    flags = sorted(flag for flag in read_cpu_flags() if flag.startswith(("avx", "amx")))
    print(f"CPU flags: {' '.join(flags)}; threads {torch.get_num_threads()}; chosen dtype {fastest_inference_dtype()}")
    info = machine(device, peak_dtypes=())
    print(describe(info))
    rows = []
    for name, rounds in times.items():
        median = statistics.median(wall for wall, _ in rounds)
        print(f"{name}: {flops / median / 1e9:.1f} GFLOP/s (median of {args.rounds})")
        rows.append({"dtype": name, "gflops": flops / median / 1e9})
    write_figures(args.json, "dtypes", info, rows, tokens=args.tokens, width=args.width)


if __name__ == "__main__":
    main()
