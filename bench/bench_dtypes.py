"""Matmul peaks of this CPU in fp32, bf16 and int8 (dynamic quantization), side by side in one run (interleaved
rounds, medians). Part of issue 30 item 3; the per-model speed/accuracy comparison is still to be added.

    PYTHONPATH=$PWD python bench/bench_dtypes.py --rounds 7
"""

import argparse
import statistics

import torch
from torch import nn

from bench.timing import interleaved_rounds
from vlhub.modeling.inference_dtype import fastest_inference_dtype, quantize_linear_weights, read_cpu_flags


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--width", type=int, default=1024)
    args = parser.parse_args()
    torch.manual_seed(0)
    linear = nn.Linear(args.width, args.width).eval()
    bf16_linear = nn.Linear(args.width, args.width).eval().to(torch.bfloat16)
    int8_linear = quantize_linear_weights(nn.Sequential(linear).eval())
    inputs = torch.randn(args.tokens, args.width)
    bf16_inputs = inputs.to(torch.bfloat16)
    repeats = 10
    calls = {
        "fp32": lambda: [linear(inputs) for _ in range(repeats)],
        "bf16": lambda: [bf16_linear(bf16_inputs) for _ in range(repeats)],
        "int8": lambda: [int8_linear(inputs) for _ in range(repeats)],
    }
    with torch.inference_mode():
        times = interleaved_rounds(calls, args.rounds, "cpu")
    flops = 2 * args.tokens * args.width * args.width * repeats
    flags = sorted(flag for flag in read_cpu_flags() if flag.startswith(("avx", "amx")))
    print(f"CPU flags: {' '.join(flags)}; threads {torch.get_num_threads()}; chosen dtype {fastest_inference_dtype()}")
    for name, rounds in times.items():
        median = statistics.median(wall for wall, _ in rounds)
        print(f"{name}: {flops / median / 1e9:.1f} GFLOP/s (median of {args.rounds})")


if __name__ == "__main__":
    main()
