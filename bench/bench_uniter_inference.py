"""UNITER-base VQA inference speed on this machine: fp32 vs bf16, eager vs sdpa attention, batch 1 and 8.

    python bench/bench_uniter_inference.py [--layers 12] [--regions 36] [--text 20] [--repeats 5]

Random weights at the released uniter-base size (the speed does not depend on the values). Prints examples/s and
the largest difference of bf16 answer logits from fp32 (what the speed costs in accuracy).
"""

from __future__ import annotations

import argparse
import time

import torch

import vlhub


def make_inputs(batch: int, text: int, regions: int, config) -> dict:
    generator = torch.Generator().manual_seed(0)
    return {
        "input_ids": torch.randint(1000, config.vocab_size, (batch, text), generator=generator),
        "attention_mask": torch.ones(batch, text, dtype=torch.long),
        "region_features": torch.rand(batch, regions, config.region_feature_dim, generator=generator),
        "region_locations": torch.rand(batch, regions, 7, generator=generator),
        "region_attention_mask": torch.ones(batch, regions, dtype=torch.long),
    }


def time_forward(model, inputs, repeats: int, autocast_dtype=None) -> tuple[float, torch.Tensor]:
    def run():
        with torch.inference_mode(), torch.autocast("cpu", dtype=autocast_dtype, enabled=autocast_dtype is not None):
            return model(**inputs).logits

    logits = run()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    return (time.perf_counter() - start) / repeats, logits.float()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--regions", type=int, default=36)
    parser.add_argument("--text", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()

    flags = open("/proc/cpuinfo").read() if __import__("os").path.exists("/proc/cpuinfo") else ""
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, AMX {'yes' if 'amx_bf16' in flags else 'no'}")
    for attention in ("eager", "sdpa"):
        config = vlhub.UniterConfig(num_hidden_layers=args.layers, id2label={i: str(i) for i in range(3129)})
        config._attn_implementation = attention
        torch.manual_seed(0)
        model = vlhub.UniterForQuestionAnswering(config).eval()
        for batch in args.batch_sizes:
            inputs = make_inputs(batch, args.text, args.regions, config)
            fp32_seconds, fp32_logits = time_forward(model, inputs, args.repeats)
            bf16_seconds, bf16_logits = time_forward(model, inputs, args.repeats, torch.bfloat16)
            half_seconds, half_logits = time_forward(model.to(torch.bfloat16), inputs, args.repeats, torch.bfloat16)
            model.float()
            drift = (bf16_logits - fp32_logits).abs().max().item()
            half_drift = (half_logits - fp32_logits).abs().max().item()
            print(
                f"{attention:5s} batch {batch:2d}: fp32 {batch / fp32_seconds:6.2f} ex/s"
                f" | bf16 autocast {batch / bf16_seconds:6.2f} ex/s (max |logit diff| {drift:.3f})"
                f" | bf16 weights {batch / half_seconds:6.2f} ex/s (max |logit diff| {half_drift:.3f})"
            )


if __name__ == "__main__":
    main()
