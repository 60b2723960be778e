"""Unified VLP caption decoding: seconds and executed GFLOP per image, with the key/value cache and without it.

    python bench/bench_vlp_decoding.py [--size base] [--batch-sizes 1 8] [--searches greedy beam] [--beams 5]
                                       [--new-tokens 20] [--repeats 2] [--device cpu|cuda] [--packed-linear]

"without cache" (`use_cache=False`) re-feeds the whole sequence (prompt + words + trailing [MASK]) at every step:
what the original decoder costs, since it re-projects the keys and values of every earlier position at each step.
"with cache" feeds the prompt once, then `[previous word, MASK]` per step. Beam search is transformers' own
(`num_beams`, cached or not) and the original's (`custom_generate=vlp_beam_search`, always cached). Captions of the
cached and uncached runs are compared (fp32: they must be identical). FLOP are counted by
`torch.utils.flop_counter.FlopCounterMode` (matrix products, attention), on one run. "cpu s" is the process' CPU time
per image (all threads): on a shared machine, wall time well above cpu s / threads means the cores were busy elsewhere.
`--packed-linear` runs both (cached and uncached) on oneDNN-packed linear weights (`vlhub.pack_linear_weights`).
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

import vlhub
from vlhub.modeling.packed_linear import pack_linear_weights
from vlhub.modeling.unified_vlp import vlp_beam_search

SIZES = {
    "base": dict(),  # the released VLP: bert-base-cased sizes, 100 regions, 2048-d features
    "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024),
}


def prompt(config, batch: int, device) -> dict:
    g = torch.Generator().manual_seed(0)
    regions = config.num_regions
    input_ids = torch.tensor([config.bos_token_id, *[config.region_token_id] * regions, config.eos_token_id])
    input_ids = input_ids.expand(batch, -1).clone()
    inputs = dict(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        token_type_ids=torch.full_like(input_ids, config.s2s_image_token_type_id),
        region_features=torch.rand(batch, regions, config.region_feature_dim, generator=g),
        region_locations=torch.randn(batch, regions, config.region_location_dim, generator=g),
    )
    return {k: v.to(device) for k, v in inputs.items()}


def run(model, inputs, search: str, beams: int, new_tokens: int, use_cache: bool):
    kwargs = dict(max_new_tokens=new_tokens, eos_token_id=None, do_sample=False)
    if search == "greedy":
        return model.generate(**inputs, num_beams=1, use_cache=use_cache, **kwargs)
    if search == "beam":
        return model.generate(**inputs, num_beams=beams, use_cache=use_cache, **kwargs)
    return model.generate(**inputs, num_beams=beams, custom_generate=vlp_beam_search, **kwargs)


def measure(model, inputs, search, beams, new_tokens, use_cache, repeats, device):
    """(ids, s / image, CPU s / image, GFLOP / image) of the fastest timed run. With `repeats=0` the FLOP-counted run
    is the timed one (cheaper, and the counter's overhead is small next to a base-size forward)."""
    start, cpu_start = time.perf_counter(), time.process_time()
    with FlopCounterMode(display=False) as counter:
        ids = run(model, inputs, search, beams, new_tokens, use_cache)
    times = [(time.perf_counter() - start, time.process_time() - cpu_start)] if repeats == 0 else []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start, cpu_start = time.perf_counter(), time.process_time()
        run(model, inputs, search, beams, new_tokens, use_cache)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start, time.process_time() - cpu_start))
    batch = inputs["input_ids"].shape[0]
    wall, cpu = min(times)
    return ids, wall / batch, cpu / batch, counter.get_total_flops() / batch / 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="base")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument(
        "--searches", nargs="+", choices=["greedy", "beam", "vlp-beam"], default=["greedy", "beam", "vlp-beam"]
    )
    parser.add_argument("--beams", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs after the counted one (0: time that one)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--skip-uncached-above-batch",
        type=int,
        default=None,
        help="measure the (slow) uncached runs only up to this batch size",
    )
    parser.add_argument(
        "--packed-linear",
        action="store_true",
        help="oneDNN-packed linear weights (vlhub.pack_linear_weights), for both cached and uncached",
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    config = vlhub.UnifiedVlpConfig(**SIZES[args.size])
    model = vlhub.UnifiedVlpForConditionalGeneration(config).eval().to(device)
    packed = pack_linear_weights(model) if args.packed_linear else 0
    print(
        f"Unified VLP {args.size} ({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters), "
        f"{config.num_regions} regions, {args.new_tokens} new tokens, device {device}, "
        f"{torch.get_num_threads()} threads, linear weights {'packed for oneDNN' if packed else 'as is'}"
    )
    print("| search | batch | cache | s / image | cpu s / image | GFLOP / image | speed-up | same captions |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    with torch.no_grad():
        for search in args.searches:
            for batch in args.batch_sizes:
                inputs = prompt(config, batch, device)
                cached_ids, cached_s, cached_cpu, cached_flop = measure(
                    model, inputs, search, args.beams, args.new_tokens, True, args.repeats, device
                )
                print(
                    f"| {search} | {batch} | on | {cached_s:.3f} | {cached_cpu:.2f} | {cached_flop:.1f} | | |",
                    flush=True,
                )
                if search == "vlp-beam" or (
                    args.skip_uncached_above_batch is not None and batch > args.skip_uncached_above_batch
                ):
                    continue
                ids, seconds, cpu, flop = measure(
                    model, inputs, search, args.beams, args.new_tokens, False, min(args.repeats, 1), device
                )
                same = torch.equal(ids, cached_ids)
                print(
                    f"| {search} | {batch} | off | {seconds:.3f} | {cpu:.2f} | {flop:.1f} | "
                    f"{seconds / cached_s:.1f}x time, "
                    f"{flop / cached_flop:.1f}x FLOP | {same} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
