"""TDEN caption decoding: seconds and executed GFLOP per image, with the key/value cache and without.

    python bench/bench_tden_decoding.py [--batch-sizes 1 8] [--beams 1 3] [--steps 20] [--regions 51] [--device cpu]
                                        [--baselines [recompute] ['no cache']] [--xmodaler] [--packed-linear]
                                        [--original-checkout PATH [--profile-original]] [--size base|small]
                                        [--dtype fp32|bf16] [--json PATH]

TDEN-base captioner sizes (sentence encoder 12, object encoder 6, decoder 6 layers, 768 wide), random weights, 50
regions + [IMG], `steps` words per caption (EOS suppressed so every row decodes all steps). Runs:

- "cache": `generate(use_cache=True)`: one key/value cache over the sentence encoder and the decoder (self-attention
  keys and values, and the decoder's cross-attention keys and values of the regions), the object encoder run once.
- "recompute": what X-modaler does (the issue's baseline). The object encoder runs once, but at every step each
  sentence-encoder and decoder layer projects all its earlier inputs to keys and values again (X-modaler keeps the
  layer inputs, `ENC_HISTORY_STATES`, not their keys and values), and each decoder layer projects the kept object
  encoder output to cross-attention keys and values again. It is the same `generate()` given a cache whose layers
  do that work (`XmodalerRecomputeCache`), so the model's code and the beam search are those of "cache".
- "no cache": `generate(use_cache=False)`: every step re-runs the whole prefix through every stack, the object
  encoder included (more than X-modaler recomputes).
- with `--xmodaler`, also `custom_generate=xmodaler_beam_search` (cached) for the beam rows.
- with `--original-checkout PATH`, X-modaler's own code, imported from PATH, a checkout of YehLi/xmodaler (vlhub never
  ships it; see bench/xmodaler_tden.py for the stand-ins its imports need): its `TDENCaptioner` built by its config
  system from the checkout's `configs/image_caption/tden/tden.yaml` at these sizes, decoding with its `GreedyDecoder`
  and `BeamSearcher` as written (fp32; its `.cuda()` calls return the tensor on the CPU). Its random weights are
  copied into vlhub's model through vlhub's converter before anything runs, so every row decodes with the same weights
  and its captions are compared with `generate()`'s; a -1e4 bias on the EOS logit keeps both from ending a caption
  early. It executes exactly the "recompute" run's FLOPs (tests/test_bench_tden_original.py). `--profile-original`
  then prints where its time goes at the first batch size and the largest beam: its linear layers' time and FLOPs by
  role, and torch.profiler's operators.

Beam rows use transformers' beam search (`length_penalty=0.0`). FLOPs are counted with `torch.utils.flop_counter`
(matmuls and attention; the bench gives it the formula of the CPU's SDPA kernel, which it lacks), per image. Every
baseline's captions are checked identical to the cached ones. All runs of one batch size and beam width are timed
in `--repeats` interleaved rounds (every run once per round, in a rotating order), so that a shared machine's load
falls on all of them alike; the table gives the median per run. "cpu s" is the process' CPU time per image (all
threads): on a shared machine, wall time well above cpu s / threads means the cores were busy elsewhere.
`--packed-linear` runs vlhub's model on oneDNN-packed linear weights (`vlhub.pack_linear_weights`); X-modaler's code
always runs as it is. `--size small` (4-layer stacks, 256 wide) is a wiring check, not a figure. `--dtype bf16` decodes
with bf16 weights (run_all.sh on a GPU; captions may then differ from a baseline's by rounding); `--device cuda` runs
with the GPU's fast settings (bench/device.py). `--json PATH` writes the table's rows for bench/run_all.sh.
"""

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

import vlhub
from vlhub.modeling.packed_linear import PackedLinear, pack_linear_weights
from vlhub.modeling.tden import xmodaler_beam_search
from vlhub.modeling.tden.modeling_tden import TdenBeamCache
from vlhub.utils.compat import CACHE_NAME

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: timing, and xmodaler_tden for --original-checkout

from device import add_device_arguments, describe, machine, prepare_device, write_figures  # noqa: E402
from timing import interleaved_rounds  # noqa: E402  (bench/timing.py, found through the path above)

SIZES = {
    "base": {},  # TDEN-base: the config's defaults
    "small": dict(
        hidden_size=256,
        num_hidden_layers=4,
        num_visual_layers=2,
        num_decoder_layers=2,
        num_attention_heads=4,
        intermediate_size=512,
    ),
}

# torch's FLOP counter has no formula for the CPU kernel of scaled_dot_product_attention (it has the CUDA ones), so
# sdpa's attention products would go uncounted on the CPU while eager attention's matmuls are counted: the same
# formula as the CUDA kernels'.
_CPU_SDPA = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
if _CPU_SDPA not in flop_counter.flop_registry:

    @flop_counter.register_flop_formula(_CPU_SDPA)
    def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


# ------------------------------------------------------------------ X-modaler's own decoding cost (the baseline)
# X-modaler keeps, per sentence-encoder and decoder layer, the layer's *inputs* of the earlier steps
# (`ENC_HISTORY_STATES`) and projects them to keys and values again at every step; the decoder's cross-attention
# projects the kept object-encoder output to keys and values again at every step. The object encoder runs once.
# These cache layers reproduce exactly that work inside transformers' attention modules: the model's code is
# unchanged, only what the cache hands back is recomputed. A forward pre-hook on each attention module leaves the
# step's new inputs (self-attention) or the object-encoder output (cross-attention, first step) on the module.
def _heads(attention, states: torch.Tensor) -> torch.Tensor:
    return states.view(*states.shape[:2], -1, attention.attention_head_size).transpose(1, 2)


def _alone(linear, states: torch.Tensor) -> torch.Tensor:
    """One projection by itself, as X-modaler's `nn.Linear` computes it (with `--packed-linear` the query, key and
    value of a self-attention form one group whose call would compute all three)."""
    return linear.forward_alone(states) if isinstance(linear, PackedLinear) else linear(states)


class HistoryLayer(DynamicLayer):
    """Self-attention: keeps the layer inputs `(rows, 1, length, hidden)` in `keys` (so that the length, beam
    reorders and repeats work as for keys) and re-projects the earlier ones at every step."""

    def __init__(self, attention):
        super().__init__()
        self.attention = attention

    def update(self, key_states, value_states, *args, **kwargs):
        new = self.attention.step_inputs
        if self.is_initialized:
            history = self.keys[:, 0]
            key_states = torch.cat([_heads(self.attention, _alone(self.attention.key, history)), key_states], dim=-2)
            value_states = torch.cat(
                [_heads(self.attention, _alone(self.attention.value, history)), value_states], dim=-2
            )
            new = torch.cat([history, new], dim=1)
        self.is_initialized = True
        self.keys = self.values = new.unsqueeze(1)
        return key_states, value_states


class RegionLayer(DynamicLayer):
    """Cross-attention: keeps the object encoder's output and re-projects it at every read of `keys`/`values`."""

    def __init__(self, attention):
        super().__init__()
        self.attention, self.memory = attention, None

    def _project(self, linear):
        return None if self.memory is None else _heads(self.attention, linear(self.memory))

    # Read by the cross-attention at every later step; the setters ignore what DynamicLayer's own code assigns.
    keys = property(lambda self: self._project(self.attention.key), lambda self, value: None)
    values = property(lambda self: self._project(self.attention.value), lambda self, value: None)

    def update(self, key_states, value_states, *args, **kwargs):
        self.memory, self.is_initialized = self.attention.step_inputs, True
        return key_states, value_states

    def get_seq_length(self) -> int:
        return 0 if self.memory is None else self.memory.shape[1]

    def reorder_cache(self, beam_idx):
        if self.memory is not None:
            self.memory = self.memory.index_select(0, beam_idx.to(self.memory.device))

    def batch_repeat_interleave(self, repeats: int):
        if self.memory is not None:
            self.memory = self.memory.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices):
        if self.memory is not None:
            self.memory = self.memory[indices]


class _LayerStackCache(DynamicCache):  # a DynamicCache (beam search asks for one) whose layers are the above
    def __init__(self, layer_class, attentions: dict):
        Cache.__init__(self, layer_class_to_replicate=lambda: layer_class(attentions.get(len(self.layers))))


class XmodalerRecomputeCache(TdenBeamCache):
    """The cache `generate()` is given for the X-modaler-style baseline (use inside `recompute_hooks(model)`)."""

    def __init__(self, model):
        stacks = list(model.tden.encoder.layer) + list(model.tden.decoder.layer)
        self_attention = {layer.attention.self.layer_idx: layer.attention.self for layer in stacks}
        cross = {layer.crossattention.self.layer_idx: layer.crossattention.self for layer in model.tden.decoder.layer}
        super().__init__(_LayerStackCache(HistoryLayer, self_attention), _LayerStackCache(RegionLayer, cross))


@contextlib.contextmanager
def recompute_hooks(model):
    def keep_inputs(module, args, kwargs):  # self-attention: the step's new layer inputs
        module.step_inputs = args[0] if args else kwargs["hidden_states"]

    def keep_regions(module, args, kwargs):  # cross-attention: the object encoder's output (first step only)
        states = kwargs.get("encoder_hidden_states", args[1] if len(args) > 1 else None)
        if states is not None:
            module.step_inputs = states

    stacks = list(model.tden.encoder.layer) + list(model.tden.decoder.layer)
    hooks = [layer.attention.self.register_forward_pre_hook(keep_inputs, with_kwargs=True) for layer in stacks]
    hooks += [
        layer.crossattention.self.register_forward_pre_hook(keep_regions, with_kwargs=True)
        for layer in model.tden.decoder.layer
    ]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def build(device: str, attn_implementation: str, size: str = "base", dtype: torch.dtype = torch.float32):
    config = vlhub.TdenConfig(num_cross_encoder_layers=0, **SIZES[size])
    config._attn_implementation = attn_implementation
    return vlhub.TdenForConditionalGeneration(config).eval().to(device, dtype)


def inputs(model, batch: int, regions: int, device: str) -> dict:
    generator = torch.Generator().manual_seed(0)
    dtype = model.dtype
    return {
        "region_features": torch.rand(batch, regions, model.config.region_feature_dim, generator=generator).to(
            device, dtype
        ),
        "region_locations": torch.rand(batch, regions, 5, generator=generator).to(device, dtype),
        "region_attention_mask": torch.ones(batch, regions, dtype=torch.long, device=device),
    }


def run(model, batch_inputs, beams: int, steps: int, mode: str):
    """mode: "cache", "recompute" (X-modaler's work), "no cache" (`use_cache=False`) or "xmodaler"
    (`custom_generate=xmodaler_beam_search`, cached)."""
    if mode == "xmodaler":
        return model.generate(
            **batch_inputs, num_beams=beams, max_new_tokens=steps, custom_generate=xmodaler_beam_search
        )[:, 1:]
    kwargs = dict(
        max_new_tokens=steps,
        min_new_tokens=steps,
        num_beams=beams,
        do_sample=False,
        length_penalty=0.0 if beams > 1 else None,
        use_cache=mode != "no cache",
    )
    if mode != "recompute":
        return model.generate(**batch_inputs, **kwargs)
    with recompute_hooks(model):
        return model.generate(**batch_inputs, **kwargs, **{CACHE_NAME: XmodalerRecomputeCache(model)})


def measure_interleaved(decoders: dict, batch: int, repeats: int, device: str) -> dict:
    """Each `decoders[name]()` once under the FLOP counter (also the warm-up; its output is kept), then `repeats`
    rounds in which every decoder runs once, in an order rotated from round to round, so that a shared machine's
    load falls on all of them alike. Returns {name: (output, median seconds per image, median CPU seconds per
    image, GFLOP per image)}."""
    outputs, flops = {}, {}
    with torch.no_grad():
        for name, decode in decoders.items():
            with FlopCounterMode(display=False) as counter:
                outputs[name] = decode()
            flops[name] = counter.get_total_flops()
        times = interleaved_rounds(decoders, repeats, device)
    return {
        name: (
            outputs[name],
            statistics.median(wall for wall, _ in times[name]) / batch,
            statistics.median(cpu for _, cpu in times[name]) / batch,
            flops[name] / batch / 1e9,
        )
        for name in decoders
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--regions", type=int, default=51)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--attention", default="sdpa")
    parser.add_argument(
        "--baselines",
        nargs="*",
        choices=["recompute", "no cache"],
        default=["recompute", "no cache"],
        help="what the cache is compared with (see above)",
    )
    parser.add_argument("--xmodaler", action="store_true", help="also time xmodaler_beam_search")
    add_device_arguments(parser)
    parser.add_argument("--size", choices=sorted(SIZES), default="base", help="small: a wiring check, not a figure")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="the model's weights")
    parser.add_argument(
        "--skip-uncached-above-batch",
        type=int,
        default=None,
        help="measure the (slow) baselines only up to this batch size",
    )
    parser.add_argument(
        "--packed-linear",
        action="store_true",
        help="oneDNN-packed linear weights (vlhub.pack_linear_weights), for every run",
    )
    parser.add_argument(
        "--original-checkout",
        metavar="PATH",
        default=None,
        help="a checkout of YehLi/xmodaler: also time X-modaler's own TDENCaptioner and decoders",
    )
    parser.add_argument(
        "--profile-original",
        action="store_true",
        help="with --original-checkout: where the original's time goes, at the first batch size and the largest beam",
    )
    args = parser.parse_args()
    if args.original_checkout is not None:
        import xmodaler_tden  # bench/xmodaler_tden.py: imports X-modaler's code from the checkout

        if not (Path(args.original_checkout).expanduser() / xmodaler_tden.CAPTION_CONFIG).is_file():
            parser.error(
                f"--original-checkout {args.original_checkout}: not a checkout of "
                f"{xmodaler_tden.ORIGINAL_REPOSITORY} (no {xmodaler_tden.CAPTION_CONFIG})"
            )
    if args.profile_original and args.original_checkout is None:
        parser.error("--profile-original needs --original-checkout")
    if args.original_checkout is not None and (args.size, args.dtype) != ("base", "fp32"):
        parser.error("--original-checkout runs X-modaler's code at TDEN-base in fp32: drop --size and --dtype")
    prepare_device(args.device, parser)
    info = machine(args.device, peak_dtypes=())
    print(describe(info))
    torch.manual_seed(0)
    model = build(args.device, args.attention, args.size, torch.bfloat16 if args.dtype == "bf16" else torch.float32)
    original = None
    if args.original_checkout is not None:
        original = xmodaler_tden.build_original(args.original_checkout, model.config, args.steps, args.device)
        xmodaler_tden.suppress_eos(original, model.config.eos_token_id)
        xmodaler_tden.copy_original_weights(original, model)  # vlhub's model decodes with the original's weights
    packed = pack_linear_weights(model) if args.packed_linear else 0
    print(
        f"device {args.device}, {args.attention}, {args.regions} regions, {args.steps} steps, {args.dtype}, "
        f"{torch.get_num_threads()} threads, vlhub's linear weights {'packed for oneDNN' if packed else 'as is'}"
        + (", weights of X-modaler's model (its own init) in both" if original is not None else "")
    )
    print("| batch | beams | decoder | run | s/image | cpu s/image | GFLOP/image | cache's speed-up | same captions |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for batch in args.batch_sizes:
        batch_inputs = inputs(model, batch, args.regions, args.device)
        for beams in args.beams:
            decoders = {"cache": "cache"}
            if args.skip_uncached_above_batch is None or batch <= args.skip_uncached_above_batch:
                decoders.update({mode: mode for mode in args.baselines})
            if args.xmodaler and beams > 1:
                decoders["xmodaler_beam_search"] = "xmodaler"
            decoders = {
                name: (lambda mode=mode: run(model, batch_inputs, beams, args.steps, mode))
                for name, mode in decoders.items()
            }
            if original is not None:
                original_batch = xmodaler_tden.original_inputs(original, batch_inputs, args.steps)
                decoders["original code"] = lambda: xmodaler_tden.decode_original(original, original_batch, beams)
            results = measure_interleaved(decoders, batch, args.repeats, args.device)
            cached, t_cache, _, _ = results["cache"]
            for name, (output, t, c, f) in results.items():
                if name in ("cache", "xmodaler_beam_search"):  # vlhub's cached decoders: no speed-up to show
                    decoder, run_name, speed_up, same = ("generate" if name == "cache" else name), "cache", "", ""
                else:  # the baselines; X-modaler's code returns the words without the prompt
                    original_code = name == "original code"
                    decoder = (
                        f"X-modaler {'BeamSearcher' if beams > 1 else 'GreedyDecoder'}" if original_code else "generate"
                    )
                    reference = cached[:, -args.steps :] if original_code else cached
                    run_name, speed_up, same = name, f"{t / t_cache:.1f}x", torch.equal(reference, output)
                rows.append(dict(batch=batch, beams=beams, decoder=decoder, run=run_name, s_per_image=t, gflop=f))
                print(
                    f"| {batch} | {beams} | {decoder} | {run_name} | {t:.3f} | {c:.2f} | {f:.1f} | {speed_up} | "
                    f"{same} |",
                    flush=True,
                )
    write_figures(args.json, "tden_decoding", info, rows, size=args.size, dtype=args.dtype, steps=args.steps)
    if args.profile_original:
        batch, beams = args.batch_sizes[0], max(args.beams)
        original_batch = xmodaler_tden.original_inputs(
            original, inputs(model, batch, args.regions, args.device), args.steps
        )
        xmodaler_tden.profile_original(original, original_batch, beams)


if __name__ == "__main__":
    main()
