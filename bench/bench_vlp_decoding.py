"""Unified VLP caption decoding: seconds and executed GFLOP per image, with the key/value cache and without it.

    python bench/bench_vlp_decoding.py [--size base] [--batch-sizes 1 8] [--searches greedy beam] [--beams 5]
                                       [--new-tokens 20] [--repeats 2] [--device cpu|cuda] [--packed-linear]
                                       [--original-checkout PATH [--int8] [--profile]] [--dtype fp32|bf16]
                                       [--json PATH]

"without cache" (`use_cache=False`) re-feeds the whole sequence (prompt + words + trailing [MASK]) at every step:
what the original decoder costs, since it re-projects the keys and values of every earlier position at each step.
"with cache" feeds the prompt once, then `[previous word, MASK]` per step. Beam search is transformers' own
(`num_beams`, cached or not) and the original's (`custom_generate=vlp_beam_search`, always cached). Captions of the
cached and uncached runs are compared (fp32: they must be identical). FLOP are counted by
`torch.utils.flop_counter.FlopCounterMode` (matrix products, attention), on one run. "cpu s" is the process' CPU time
per image (all threads): on a shared machine, wall time well above cpu s / threads means the cores were busy elsewhere.
`--packed-linear` runs both (cached and uncached) on oneDNN-packed linear weights (`vlhub.pack_linear_weights`).
`--dtype bf16` decodes with bf16 weights (what run_all.sh uses on a GPU; captions then may differ between the cached
and uncached runs by rounding); `--device cuda` runs on the GPU with its fast settings (bench/device.py). `--json PATH`
writes the table's rows for bench/run_all.sh.

`--original-checkout PATH` instead compares with the original decoder, imported from PATH, a checkout of
LuoweiZhou/VLP (vlhub never ships it; see bench/vlp_original.py): its `BertForSeq2SeqDecoder` at the same sizes, its
random weights copied into vlhub's model through vlhub's converter, so that both decode with the same weights. Per
search and batch size, the original, vlhub's `generate()` (cached) and the same on packed linear weights are timed
in `--repeats` interleaved rounds (every run once per round, in a rotating order, so a shared machine's load falls
on all alike; medians). Greedy runs every step on both sides (no end token, as the original); "vlp-beam" is the
original's beam search against vlhub's `custom_generate=vlp_beam_search` (its rules: identical captions required);
"beam" is the original's beam search against transformers' `num_beams` search (other rules: the share of equal
captions is reported, not required). `--int8` adds vlhub on int8 dynamically quantized linear layers (the
pipelines' `quantize="int8"`), whose captions are compared with vlhub's float32 ones (counted, not required equal).
`--profile` then runs vlhub's packed decoding of the first search and batch size once more under the torch profiler
and splits its CPU time: the linear products (with the weight bytes they read, hence GB/s), growing the key/value
cache (`aten::cat`), re-ordering it by the beams' parents (`aten::index_select`), attention, building the attention
masks, and the rest. The linear products alone bound the speed-up: a decoder whose every other cost were zero would
still take their time, so `original s / linear s` is the most this machine's kernels allow at that batch size.
"""

from __future__ import annotations

import argparse
import copy
import functools
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

import vlhub
from vlhub.modeling.inference_dtype import quantize_linear_weights
from vlhub.modeling.packed_linear import pack_linear_weights
from vlhub.modeling.unified_vlp import vlp_beam_search

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: timing, and vlp_original for --original-checkout

from device import add_device_arguments, describe, machine, prepare_device, write_figures  # noqa: E402
from timing import interleaved_rounds, synchronize  # noqa: E402  (bench/timing.py, found through the path above)

SIZES = {
    "base": dict(),  # the released VLP: bert-base-cased sizes, 100 regions, 2048-d features
    "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024),
}


def prompt(config, batch: int, device, dtype: torch.dtype = torch.float32) -> dict:
    g = torch.Generator().manual_seed(0)
    regions = config.num_regions
    input_ids = torch.tensor([config.bos_token_id, *[config.region_token_id] * regions, config.eos_token_id])
    input_ids = input_ids.expand(batch, -1).clone()
    inputs = dict(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        token_type_ids=torch.full_like(input_ids, config.s2s_image_token_type_id),
        region_features=torch.rand(batch, regions, config.region_feature_dim, generator=g).to(dtype),
        region_locations=torch.randn(batch, regions, config.region_location_dim, generator=g).to(dtype),
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
    synchronize(device.type)
    start, cpu_start = time.perf_counter(), time.process_time()
    with FlopCounterMode(display=False) as counter:
        ids = run(model, inputs, search, beams, new_tokens, use_cache)
    synchronize(device.type)
    times = [(time.perf_counter() - start, time.process_time() - cpu_start)] if repeats == 0 else []
    for _ in range(repeats):
        synchronize(device.type)
        start, cpu_start = time.perf_counter(), time.process_time()
        run(model, inputs, search, beams, new_tokens, use_cache)
        synchronize(device.type)
        times.append((time.perf_counter() - start, time.process_time() - cpu_start))
    batch = inputs["input_ids"].shape[0]
    wall, cpu = min(times)
    return ids, wall / batch, cpu / batch, counter.get_total_flops() / batch / 1e9


def compare_with_original(args, config, device) -> None:
    """The `--original-checkout` table: the original decoder against vlhub's, plain and packed, same weights."""
    import vlp_original

    original = vlp_original.build_original(args.original_checkout, config, beams=1).to(device)
    model = vlhub.UnifiedVlpForConditionalGeneration(config).eval().to(device)
    vlp_original.copy_original_weights(original, model)
    packed_model = copy.deepcopy(model)
    packed = pack_linear_weights(packed_model)
    int8_model = quantize_linear_weights(model) if args.int8 else None
    print(
        f"Unified VLP {args.size} ({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters), "
        f"{config.num_regions} regions, {args.new_tokens} words per caption (no early stop), device {device}, "
        f"{torch.get_num_threads()} threads; original: {args.original_checkout}; packed: {packed} linear weights; "
        f"medians of {args.repeats} interleaved rounds"
    )
    int8_columns = " int8 s / image | int8 speed-up | int8 captions equal to fp32's |" if args.int8 else ""
    print(
        "| search | batch | original s / image | vlhub s / image | packed s / image | speed-up | packed speed-up "
        f"| same captions |{int8_columns}"
    )
    print("| --- " * (8 + 3 * bool(args.int8)) + "|")
    steps = args.new_tokens
    profiled = None  # (call, batch, original s / image) of the first row, for --profile
    with torch.no_grad():
        for search in args.searches:
            beams = 1 if search == "greedy" else args.beams
            for batch in args.batch_sizes:
                inputs = prompt(config, batch, device)
                original_batch = vlp_original.original_inputs(inputs, steps, config)
                prompt_length = inputs["input_ids"].shape[1]
                calls = {
                    "original": lambda: vlp_original.decode_original(original, original_batch, beams, steps),
                    "vlhub": lambda: run_like_original(model, inputs, search, beams, steps)[:, prompt_length:],
                    "packed": lambda: run_like_original(packed_model, inputs, search, beams, steps)[:, prompt_length:],
                }
                if int8_model is not None:  # not exact: its captions are compared, not required equal
                    calls["int8"] = lambda: run_like_original(int8_model, inputs, search, beams, steps)[
                        :, prompt_length:
                    ]
                outputs = {name: call() for name, call in calls.items()}  # also a warm-up
                if not torch.equal(outputs["vlhub"], outputs["packed"]):
                    raise AssertionError(f"{search}, batch {batch}: packed weights changed the captions")
                same = (outputs["original"] == _zero_after_end(outputs["vlhub"], config, search)).all(dim=1)
                if search != "beam" and not same.all():
                    raise AssertionError(f"{search}, batch {batch}: vlhub's captions differ from the original's")
                times = interleaved_rounds(calls, args.repeats, device.type)
                seconds = {name: statistics.median(wall for wall, _ in times[name]) / batch for name in calls}
                print(
                    f"| {search} | {batch} | {seconds['original']:.3f} | {seconds['vlhub']:.3f} | "
                    f"{seconds['packed']:.3f} | {seconds['original'] / seconds['vlhub']:.2f}x | "
                    f"{seconds['original'] / seconds['packed']:.2f}x | {int(same.sum())}/{batch} |"
                    + (
                        f" {seconds['int8']:.3f} | {seconds['original'] / seconds['int8']:.2f}x | "
                        f"{int((outputs['int8'] == outputs['vlhub']).all(dim=1).sum())}/{batch} |"
                        if int8_model is not None
                        else ""
                    ),
                    flush=True,
                )
                if args.profile and profiled is None:
                    # bound now: the calls' lambdas read the loop variables when they run
                    packed_run = functools.partial(run_like_original, packed_model, inputs, search, beams, steps)
                    profiled = (packed_run, batch, seconds["original"])
    if profiled is not None:
        with torch.no_grad():
            profile_decoding(*profiled)


# Profiler op names -> the part of a decoding step they are (self CPU time; the first match counts).
_STEP_PARTS = (
    ("linear products", ("mkldnn::_linear_pointwise", "aten::addmm", "aten::mm")),
    ("key/value cache growth (cat)", ("aten::cat",)),
    ("beam re-ordering (index_select)", ("aten::index_select",)),
    ("attention", ("aten::_scaled_dot_product", "aten::scaled_dot_product")),
    ("attention masks (vmap)", ("Vmapped",)),
)
_LINEAR_KERNELS = _STEP_PARTS[0][1]


def profile_decoding(call, batch: int, original_seconds: float) -> None:
    """Print where one run of `call` (vlhub's decoding of `batch` images) spends its CPU time (see `--profile`)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as profiler:
        call()
    seconds = {name: 0.0 for name, _ in _STEP_PARTS} | {"other": 0.0}
    weight_bytes = 0
    for event in profiler.events():
        if event.name in _LINEAR_KERNELS:
            # The weight is the last matrix among the first three operands: (input, weight, bias), (input, residual,
            # weight) of the fused residual add, (bias, input, weight.T) of addmm, (input, weight) of mm.
            rows, columns = [shape for shape in event.input_shapes[:3] if len(shape) == 2][-1]
            weight_bytes += rows * columns * 4  # float32 weights
        part = next((name for name, prefixes in _STEP_PARTS if event.name.startswith(prefixes)), "other")
        seconds[part] += event.self_cpu_time_total / 1e6
    total = sum(seconds.values())
    print(f"\nWhere vlhub's packed decoding spends its CPU time (torch profiler, self time; batch {batch}):")
    print("| part | s / image | share |")
    print("| --- | --- | --- |")
    for name, value in seconds.items():
        print(f"| {name} | {value / batch:.3f} | {value / total:.0%} |")
    linear = seconds["linear products"] / batch
    print(
        f"The linear products read {weight_bytes / batch / 1e9:.2f} GB of weights per image "
        f"({weight_bytes / batch / 1e9 / linear:.1f} GB/s): with every other cost at zero, {linear:.3f} s per image, "
        f"at most {original_seconds / linear:.2f}x the original's {original_seconds:.3f} s."
    )


def run_like_original(model, inputs, search: str, beams: int, steps: int):
    """vlhub's decoding under the original's rules where it has them: greedy for every step (no end token), the
    original's beam search with its end-token handling (`vlp_beam_search`); "beam" is transformers' beam search with
    no end token and no length penalty (the original's `length_penalty` 0)."""
    if search == "vlp-beam":
        return model.generate(**inputs, max_new_tokens=steps, num_beams=beams, custom_generate=vlp_beam_search)
    kwargs = dict(length_penalty=0.0) if beams > 1 else {}
    return model.generate(
        **inputs, max_new_tokens=steps, num_beams=beams, eos_token_id=None, do_sample=False, use_cache=True, **kwargs
    )


def _zero_after_end(ids, config, search: str):
    """The original's beam search pads its best sequence with 0 after the end token; greedy never stops."""
    if search == "greedy":
        return ids
    ended = (ids == config.eos_token_id).long().cumsum(dim=1) - (ids == config.eos_token_id).long()
    return ids.masked_fill(ended > 0, 0)


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
    add_device_arguments(parser)
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="the model's weights")
    parser.add_argument(
        "--skip-uncached-above-batch",
        type=int,
        default=None,
        help="measure the (slow) uncached runs only up to this batch size",
    )
    parser.add_argument(
        "--int8",
        action="store_true",
        help="with --original-checkout: also time vlhub on int8 dynamically quantized linear layers "
        '(quantize="int8"; not exact: how many of its captions equal fp32\'s is reported)',
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="with --original-checkout: split the CPU time of vlhub's packed decoding of the first row by part "
        "(torch profiler) and print the speed-up the linear products alone allow",
    )
    parser.add_argument(
        "--packed-linear",
        action="store_true",
        help="oneDNN-packed linear weights (vlhub.pack_linear_weights), for both cached and uncached",
    )
    parser.add_argument(
        "--original-checkout",
        metavar="PATH",
        help="a checkout of LuoweiZhou/VLP: compare with its own decoder (see the description)",
    )
    args = parser.parse_args()
    device = torch.device(prepare_device(args.device, parser))
    torch.manual_seed(0)
    config = vlhub.UnifiedVlpConfig(**SIZES[args.size])
    if args.int8 and not args.original_checkout:
        parser.error("--int8 is a column of the --original-checkout table: give --original-checkout PATH")
    if args.profile and not args.original_checkout:
        parser.error("--profile splits the --original-checkout comparison's packed run: give --original-checkout PATH")
    if args.original_checkout:
        if args.repeats < 1:
            parser.error("--original-checkout needs --repeats ≥ 1 (timed interleaved rounds)")
        if args.dtype != "fp32":
            parser.error("--original-checkout compares fp32 captions: drop --dtype")
        try:
            return compare_with_original(args, config, device)
        except FileNotFoundError as error:
            parser.error(str(error))
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = vlhub.UnifiedVlpForConditionalGeneration(config).eval().to(device, dtype)
    packed = pack_linear_weights(model) if args.packed_linear else 0
    info = machine(device.type, peak_dtypes=())
    print(describe(info))
    rows = decode_table(model, config, args, device, dtype, packed)
    write_figures(args.json, "vlp_decoding", info, rows, size=args.size, dtype=args.dtype, beams=args.beams)


def decode_table(model, config, args, device, dtype, packed: int) -> list[dict]:
    """The cached and uncached runs of every search and batch size, printed as a table; returns its rows."""
    rows = []
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
                inputs = prompt(config, batch, device, dtype)
                cached_ids, cached_s, cached_cpu, cached_flop = measure(
                    model, inputs, search, args.beams, args.new_tokens, True, args.repeats, device
                )
                print(
                    f"| {search} | {batch} | on | {cached_s:.3f} | {cached_cpu:.2f} | {cached_flop:.1f} | | |",
                    flush=True,
                )
                rows.append(dict(search=search, batch=batch, cache=True, s_per_image=cached_s, gflop=cached_flop))
                if search == "vlp-beam" or (
                    args.skip_uncached_above_batch is not None and batch > args.skip_uncached_above_batch
                ):
                    continue
                ids, seconds, cpu, flop = measure(
                    model, inputs, search, args.beams, args.new_tokens, False, min(args.repeats, 1), device
                )
                same = torch.equal(ids, cached_ids)
                rows.append(dict(search=search, batch=batch, cache=False, s_per_image=seconds, gflop=flop, same=same))
                print(
                    f"| {search} | {batch} | off | {seconds:.3f} | {cpu:.2f} | {flop:.1f} | "
                    f"{seconds / cached_s:.1f}x time, "
                    f"{flop / cached_flop:.1f}x FLOP | {same} |",
                    flush=True,
                )
    return rows


if __name__ == "__main__":
    main()
