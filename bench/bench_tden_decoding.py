"""TDEN caption decoding: seconds and executed GFLOP per image, key/value cache on vs off.

    python bench/bench_tden_decoding.py [--batch-sizes 1 8] [--beams 1 3] [--steps 20] [--regions 51] [--device cpu]
                                        [--xmodaler] [--packed-linear]

TDEN-base captioner sizes (sentence encoder 12, object encoder 6, decoder 6 layers, 768 wide), random weights, 50
regions + [IMG], `steps` words per caption (EOS suppressed so every row decodes all steps). "cache" is
`generate(use_cache=True)`: one key/value cache over the sentence encoder and the decoder, the object encoder run
once. "no cache" is `generate(use_cache=False)`: every step re-runs the whole prefix through every stack (the
object encoder included, so it recomputes more than X-modaler, which keeps the object encoder's output but
recomputes the keys and values of the text history and of the regions at every step). Beam rows use transformers'
beam search (`length_penalty=0.0`) and, with `--xmodaler`, also `xmodaler_beam_search` (cached). FLOPs are counted
with `torch.utils.flop_counter` (matmuls and attention), per image. The captions with and without the cache are
checked identical. "cpu s" is the process' CPU time per image (all threads): on a shared machine, wall time well above
cpu s / threads means the cores were busy elsewhere. `--packed-linear` runs everything on oneDNN-packed linear weights
(`vlhub.pack_linear_weights`).
"""

import argparse
import statistics
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

import vlhub
from vlhub.modeling.packed_linear import pack_linear_weights


def build(device: str, attn_implementation: str):
    config = vlhub.TdenConfig(num_cross_encoder_layers=0)
    config._attn_implementation = attn_implementation
    return vlhub.TdenForConditionalGeneration(config).eval().to(device)


def inputs(model, batch: int, regions: int, device: str) -> dict:
    generator = torch.Generator().manual_seed(0)
    return {
        "region_features": torch.rand(batch, regions, model.config.region_feature_dim, generator=generator).to(device),
        "region_locations": torch.rand(batch, regions, 5, generator=generator).to(device),
        "region_attention_mask": torch.ones(batch, regions, dtype=torch.long, device=device),
    }


def run(model, batch_inputs, beams: int, steps: int, use_cache: bool, xmodaler: bool):
    if xmodaler:
        return model.xmodaler_beam_search(**batch_inputs, num_beams=beams, max_new_tokens=steps).sequences[:, 0]
    return model.generate(**batch_inputs, max_new_tokens=steps, min_new_tokens=steps, num_beams=beams,
                          do_sample=False, length_penalty=0.0 if beams > 1 else None, use_cache=use_cache)


def measure(model, batch_inputs, beams, steps, use_cache, xmodaler, repeats, device):
    batch = batch_inputs["region_features"].shape[0]
    with torch.no_grad():
        with FlopCounterMode(display=False) as counter:
            output = run(model, batch_inputs, beams, steps, use_cache, xmodaler)
        times, cpu_times = [], []
        for _ in range(repeats):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            start, cpu_start = time.perf_counter(), time.process_time()
            run(model, batch_inputs, beams, steps, use_cache, xmodaler)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
    return (output, statistics.median(times) / batch, statistics.median(cpu_times) / batch,
            counter.get_total_flops() / batch / 1e9)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--regions", type=int, default=51)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--attention", default="sdpa")
    parser.add_argument("--xmodaler", action="store_true", help="also time xmodaler_beam_search")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--skip-uncached-above-batch", type=int, default=None,
                        help="measure the (slow) uncached runs only up to this batch size")
    parser.add_argument("--packed-linear", action="store_true",
                        help="oneDNN-packed linear weights (vlhub.pack_linear_weights), for every run")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = build(args.device, args.attention)
    packed = pack_linear_weights(model) if args.packed_linear else 0
    print(f"device {args.device}, {args.attention}, {args.regions} regions, {args.steps} steps, fp32, "
          f"{torch.get_num_threads()} threads, linear weights {'packed for oneDNN' if packed else 'as is'}")
    print("| batch | beams | decoder | s/image cache | s/image no cache | speed-up | cpu s/image cache | "
          "cpu s/image no cache | GFLOP/image cache | GFLOP/image no cache | same captions |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for batch in args.batch_sizes:
        batch_inputs = inputs(model, batch, args.regions, args.device)
        for beams in args.beams:
            cached, t_cache, c_cache, f_cache = measure(model, batch_inputs, beams, args.steps, True, False,
                                                        args.repeats, args.device)
            if args.skip_uncached_above_batch is not None and batch > args.skip_uncached_above_batch:
                print(f"| {batch} | {beams} | generate | {t_cache:.3f} | | | {c_cache:.2f} | | {f_cache:.1f} | | |",
                      flush=True)
            else:
                plain, t_plain, c_plain, f_plain = measure(model, batch_inputs, beams, args.steps, False, False,
                                                           args.repeats, args.device)
                print(f"| {batch} | {beams} | generate | {t_cache:.3f} | {t_plain:.3f} | {t_plain / t_cache:.1f}x | "
                      f"{c_cache:.2f} | {c_plain:.2f} | {f_cache:.1f} | {f_plain:.1f} | {torch.equal(cached, plain)} |",
                      flush=True)
            if args.xmodaler and beams > 1:
                _, t_x, c_x, f_x = measure(model, batch_inputs, beams, args.steps, True, True, args.repeats,
                                           args.device)
                print(f"| {batch} | {beams} | xmodaler_beam_search | {t_x:.3f} | | | {c_x:.2f} | | {f_x:.1f} | | |",
                      flush=True)


if __name__ == "__main__":
    main()
