"""Encoder inference speed of every architecture, as examples/s and as a share of this machine's matmul peak.

    python bench/bench_encoders.py [--encoders uniter vl_bert ...] [--batch-sizes 1 8 32] [--bf16-batch-sizes 32]
                                   [--attention eager sdpa] [--text 20] [--regions N] [--repeats 5] [--device cpu]
                                   [--packed-linear] [--original-checkout [CASE=]PATH ...] [--size base|tiny]
                                   [--compile] [--json PATH]

The cases live in bench/encoders/<arch>.py (see its __init__ for the contract): the released model size with random
weights, since speed does not depend on the values. For every case, attention implementation and batch size the
script prints examples/s, the GFLOP one example executes (counted by torch.utils.flop_counter), and the achieved
GFLOP/s as a percentage of the matmul peak measured here first (a large square matmul in the same dtype), so
figures from different machines can be compared. bf16 runs with bf16 weights; its largest answer-logit difference
from fp32 is printed next to it (what the speed costs in accuracy). A CPU without bf16 matmul
instructions (AMX, or AVX512-BF16 as on AMD Zen 4) runs bf16 several times slower than fp32: the script says which
it has. Each timing is repeated (`--repeats`, after a warm-up
call): examples/s are printed for the median and the best repeat (the machine may be shared).

`--device cuda` runs on the GPU with its fast settings (bench/device.py: TF32 for fp32, cudnn.benchmark; "sdpa"
lets torch pick the flash or memory-efficient kernel); the peaks there are the GPU's, fp32, TF32 and bf16. `--compile`
also times each model through `torch.compile` (rows "<attention>+compile", beside the uncompiled ones: measured, not
assumed). `--size tiny` builds each case at the architecture's tiny preset (for a quick check of the wiring, not a
figure). `--json PATH` writes the rows and the machine's peaks for bench/run_all.sh.

`--packed-linear` runs vlhub's fp32 CPU inference on oneDNN-packed linear weights (`vlhub.pack_linear_weights`,
opt-in); the original code always runs as it is.

`--original-checkout PATH` also times the authors' original code: a case that defines `build_original` (see
bench/encoders/__init__.py) imports its original model from the checkout PATH of the original repository (vlhub
never ships that code), builds it at the same size with random weights, and times it on the same examples at the
fp32 batch sizes. Its FLOPs are counted the same way (they should match vlhub's), its logits are compared with
vlhub's when the case can copy the original's weights into vlhub's model (through vlhub's converter), and the
speed-up of each vlhub attention implementation over the original is printed per batch size. With several cases,
name the case: `--original-checkout vl_bert=~/VL-BERT vilbert=~/vilbert-multi-task`.

`--pipeline` times what a user gets instead: `pipeline("visual-question-answering")` answering one question about
one image's `RegionFeatures` (`--regions` detected regions, default 36; the processor may add a whole-image region)
with its defaults (a bfloat16 copy where bf16 measured fast on the device, else linear weights packed for float32
CPU inference where `packing_pays`; the row names the dtype), the same pipeline in float32 with
`pack_linear_weights=False`, and the plain model's float32 forward on the same encoded example (and the original
code's forward on an example of the same size when `--original-checkout` names the case), in interleaved rounds at
batch 1; then the speed-ups, by wall time and by the process's CPU time (the note "CPU" per row: with one thread, what
a call costs when other jobs share the cores, since the time spent waiting for a core is not counted).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from vlhub.modeling.packed_linear import pack_linear_weights

sys.path.insert(0, str(Path(__file__).resolve().parent))

import encoders  # noqa: E402  (bench/encoders, found through the path above)
from device import add_device_arguments, describe, machine, prepare_device, write_figures  # noqa: E402
from timing import interleaved_rounds, synchronize  # noqa: E402  (bench/timing.py)


def answer_logits(outputs) -> torch.Tensor:
    if isinstance(outputs, torch.Tensor):  # the original models' wrappers return the logits themselves
        return outputs
    return outputs.logits if hasattr(outputs, "logits") else outputs[0]


def forward_flops(model, inputs) -> int:
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(**inputs)
    return counter.get_total_flops()


def time_forward(model, inputs, repeats: int, device: str) -> tuple[float, float, torch.Tensor]:
    """Median and best seconds per forward after one warm-up call, and the answer logits (fp32)."""
    with torch.inference_mode():
        logits = answer_logits(model(**inputs)).float()
        times = []
        for _ in range(repeats):
            synchronize(device)
            start = time.perf_counter()
            model(**inputs)
            synchronize(device)
            times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2], times[0], logits


def to_device(inputs: dict, device: str, dtype: torch.dtype) -> dict:
    return {
        key: value.to(device=device, dtype=dtype if value.is_floating_point() else value.dtype)
        if isinstance(value, torch.Tensor)
        else value
        for key, value in inputs.items()
    }


def available_cases() -> list[str]:
    return sorted(info.name for info in pkgutil.iter_modules(encoders.__path__))


def original_checkouts(values: list[str], names: list[str], parser) -> dict[str, Path]:
    """`--original-checkout` values → {case: checkout}: `CASE=PATH`, or a bare PATH when one case is run."""
    checkouts = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep:
            if len(names) != 1:
                parser.error(f"--original-checkout {value}: name the case (CASE=PATH) when running {len(names)} cases")
            name, path = names[0], value
        if name not in names:
            parser.error(f"--original-checkout {value}: {name!r} is not among the cases run ({names})")
        case = importlib.import_module(f"encoders.{name}")
        if not hasattr(case, "build_original"):
            parser.error(f"--original-checkout {value}: the {name} case cannot build the original code's model")
        if not Path(path).expanduser().is_dir():
            parser.error(f"--original-checkout {value}: {path} is not a folder")
        checkouts[name] = Path(path).expanduser()
    return checkouts


def print_row(
    label: str,
    attention: str,
    dtype: torch.dtype,
    batch: int,
    median: float,
    best: float,
    flops: int,
    peak: float,
    note: str = "",
) -> dict:
    """Prints the row; returns it for `--json`."""
    percent = 100 * flops / median / 1e9 / peak
    print(
        f"{label:28s} {attention:8s} {str(dtype)[6:]:8s} {batch:5d} {batch / median:9.2f} {batch / best:9.2f}"
        f" {flops / batch / 1e9:9.2f} {percent:6.1f}%  {note}"
    )
    return {
        "case": label,
        "attention": attention,
        "dtype": str(dtype).removeprefix("torch."),
        "batch": batch,
        "examples_per_s": batch / median,
        "examples_per_s_best": batch / best,
        "gflop_per_example": flops / batch / 1e9,
        "percent_of_peak": percent,
        "note": note,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoders", nargs="+", default=None, help=f"cases to run (default all: {available_cases()})")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--bf16-batch-sizes", type=int, nargs="*", default=[32])
    parser.add_argument("--attention", nargs="+", default=["eager", "sdpa"])
    parser.add_argument("--text", type=int, default=20)
    parser.add_argument("--regions", type=int, default=None, help="regions per example (default: the case's own)")
    parser.add_argument("--repeats", type=int, default=5)
    add_device_arguments(parser)
    parser.add_argument("--size", choices=["base", "tiny"], default="base", help="tiny: a wiring check, not a figure")
    parser.add_argument("--compile", action="store_true", help="also time each model through torch.compile")
    parser.add_argument("--peak-size", type=int, default=None, help="side of the peak-measuring matmul")
    parser.add_argument(
        "--packed-linear",
        action="store_true",
        help="vlhub's models run their fp32 CPU inference on "
        "oneDNN-packed linear weights (vlhub.pack_linear_weights; the original code runs as it is)",
    )
    parser.add_argument(
        "--original-checkout",
        nargs="+",
        default=[],
        metavar="[CASE=]PATH",
        help="a checkout of the case's original repository: time the original code beside vlhub's",
    )
    parser.add_argument(
        "--pipeline",
        action="store_true",
        help="time the VQA pipeline at batch 1 from RegionFeatures (packed by default, and plain) beside the "
        "model's forward and the original code's (with --original-checkout), fp32, instead of the encoder table",
    )
    args = parser.parse_args()
    names = args.encoders or available_cases()
    unknown = sorted(set(names) - set(available_cases()))
    if unknown:
        parser.error(f"unknown encoder case(s) {unknown}; available: {available_cases()}")
    checkouts = original_checkouts(args.original_checkout, names, parser)
    if checkouts and args.size != "base":
        parser.error("--original-checkout builds the original code at its released size: use --size base")

    device = prepare_device(args.device, parser)
    info = machine(device, args.peak_size, ("fp32", "bf16") if args.bf16_batch_sizes else ("fp32",))
    peaks = {torch.float32: info["peak_gflops"]["tf32" if device == "cuda" else "fp32"]}
    peaks[torch.bfloat16] = info["peak_gflops"].get("bf16")
    print(describe(info) + f"; vlhub's linear weights {'packed for oneDNN' if args.packed_linear else 'as they are'}")
    print(
        f"{'encoder':28s} {'attn':8s} {'dtype':8s} {'batch':>5s} {'ex/s med':>9s} {'ex/s best':>9s} {'GFLOP/ex':>9s}"
        f" {'% peak':>7s}  note"
    )

    rows = []
    for name in names:
        case = importlib.import_module(f"encoders.{name}")
        if args.pipeline:
            compare_pipeline(case, checkouts.get(name), args, device, peaks[torch.float32])
            continue
        regions = args.regions or getattr(case, "DEFAULT_REGIONS", 36)
        label = case.DESCRIPTION + (" [tiny preset]" if args.size == "tiny" else "") + f" {args.text}t+{regions}r"
        if name in checkouts:
            compare_with_original(case, checkouts[name], label, args, regions, device, peaks[torch.float32])
        rows += encoder_rows(case, label, regions, args, device, peaks, fp32=name not in checkouts)
    write_figures(args.json, "encoders", info, rows, size=args.size, text=args.text)


def encoder_rows(case, label: str, regions: int, args, device: str, peaks: dict, fp32: bool) -> list[dict]:
    """Every attention implementation (and, with `--compile`, each compiled) at the fp32 batch sizes (unless `fp32`
    is false: measured beside the original code) and the bf16 ones; bf16 with bf16 weights."""
    rows = []
    for attention in args.attention:
        torch.manual_seed(0)
        model = case.build(attention, args.size).to(device)
        if args.packed_linear:
            pack_linear_weights(model)  # fp32 CPU inference only; bf16 rows run F.linear
        variants = {attention: model}
        if args.compile:
            variants[f"{attention}+compile"] = torch.compile(model)
        runs = [(torch.float32, b) for b in args.batch_sizes] if fp32 else []
        runs += [(torch.bfloat16, b) for b in args.bf16_batch_sizes]
        reference: dict[int, torch.Tensor] = {}
        for dtype, batch in runs:
            model.to(dtype)
            inputs = to_device(case.make_inputs(model, batch, args.text, regions), device, dtype)
            flops = forward_flops(model, inputs)
            for variant, runner in variants.items():
                median, best, logits = time_forward(runner, inputs, args.repeats, device)
                note = ""
                if dtype == torch.float32 and batch not in reference:
                    reference[batch] = logits
                elif batch in reference:
                    note = f"max |logit - fp32| {(logits - reference[batch]).abs().max().item():.3f}"
                rows.append(print_row(label, variant, dtype, batch, median, best, flops, peaks[dtype], note))
        model.float()
    return rows


def compare_with_original(case, checkout: Path, label: str, args, regions: int, device: str, peak: float) -> None:
    """The original code's model and vlhub's (each attention implementation) at every fp32 batch size, timed in
    interleaved rounds (each round runs every model once, in a rotating order) so that a shared machine's load
    falls on all of them alike; then vlhub's speed-up over the original per batch size."""
    torch.manual_seed(0)
    original = case.build_original(checkout).to(device)
    models = {}
    for attention in args.attention:
        torch.manual_seed(0)
        models[attention] = case.build(attention).to(device)
        if hasattr(case, "copy_original_weights"):
            case.copy_original_weights(original, models[attention])
        if args.packed_linear:
            pack_linear_weights(models[attention])
    speeds: dict[tuple[str, int], tuple[float, float]] = {}
    source = f"the original code ({getattr(case, 'ORIGINAL_REPOSITORY', 'original repository')})"
    for batch in args.batch_sizes:
        runs = {
            "original": (
                original,
                to_device(case.make_original_inputs(original, batch, args.text, regions), device, torch.float32),
            )
        }
        for attention, model in models.items():
            inputs = case.make_inputs(model, batch, args.text, regions)
            runs[attention] = model, to_device(inputs, device, torch.float32)
        flops = {key: forward_flops(model, inputs) for key, (model, inputs) in runs.items()}
        logits = {}
        with torch.inference_mode():
            for key, (model, inputs) in runs.items():
                logits[key] = answer_logits(model(**inputs)).float()  # also the warm-up call
            rounds = interleaved_rounds(
                {key: (lambda model=model, inputs=inputs: model(**inputs)) for key, (model, inputs) in runs.items()},
                args.repeats,
                device,
            )
            times = {key: [wall for wall, _ in rounds[key]] for key in runs}
        for key in runs:
            ordered = sorted(times[key])
            speeds[key, batch] = ordered[len(ordered) // 2], ordered[0]
            note = (
                source
                if key == "original"
                else (
                    f"max |logit - original| {(logits[key] - logits['original']).abs().max().item():.2e}"
                    if hasattr(case, "copy_original_weights")
                    else ""
                )
            )
            print_row(label, key, torch.float32, batch, *speeds[key, batch], flops[key], peak, note)
    for attention in models:
        ratios = []
        for batch in args.batch_sizes:
            (orig_median, orig_best), (median, best) = speeds["original", batch], speeds[attention, batch]
            ratios.append(f"batch {batch} {orig_median / median:.2f}x (best {orig_best / best:.2f}x)")
        print(
            f"{label}: vlhub {attention} / the original code, fp32 examples/s, median of interleaved rounds: "
            + ", ".join(ratios)
        )


def vqa_pipelines(model, text: int, regions: int) -> tuple[dict, object, dict]:
    """`model`'s VQA pipeline with its default packing and a plain one (on a copy of the model), around a processor
    whose tokenizer has the model's vocabulary size; one question of `text` tokens about `regions` random regions."""
    import copy
    import tempfile

    from transformers import BertTokenizer, pipeline

    import vlhub
    from vlhub.registry import get_architecture

    config = model.config
    # BERT's vocabulary layout (the released configs name [MASK] as 103), with made-up words
    vocab = [f"w{i}" for i in range(config.vocab_size)]
    vocab[0], vocab[100:104] = "[PAD]", ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = vocab[1000:]
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "vocab.txt").write_text("\n".join(vocab) + "\n")
        tokenizer = BertTokenizer(vocab=str(Path(folder) / "vocab.txt"), do_lower_case=False)
    processor = get_architecture(config.model_type).build_processor(
        tokenizer, config.region_feature_dim, max_regions=max(regions, 10)
    )
    processor = processor.for_task("vqa")
    generator = torch.Generator().manual_seed(0)
    xy = torch.rand(regions, 2, generator=generator) * 300
    example = {
        "image": vlhub.RegionFeatures(
            features=torch.rand(regions, config.region_feature_dim, generator=generator),
            boxes=torch.cat([xy, xy + 20 + torch.rand(regions, 2, generator=generator) * 200], dim=1),
            image_size=(600, 800),
            scores=torch.linspace(0.99, 0.3, regions),
        ),
        "question": " ".join(words[: text - 2]),  # [CLS] question [SEP]: `text` tokens (VL-BERT adds an answer slot)
    }
    built = {
        "pipeline": pipeline("visual-question-answering", model=model, processor=processor),
        "pipeline plain": pipeline(
            "visual-question-answering",
            model=copy.deepcopy(model),
            processor=processor,
            pack_linear_weights=False,
            dtype=torch.float32,
        ),
    }
    return built, processor, example


def compare_pipeline(case, checkout: Path | None, args, device: str, peak: float) -> None:
    """The VQA pipeline at batch 1 (packed by default, and plain) beside the plain model's forward on the same encoded
    example and the original code's forward (with a checkout), in interleaved rounds; then the speed-ups."""
    torch.manual_seed(0)
    model = case.build("sdpa").to(device)
    if model.config.model_type not in ("uniter", "vl_bert", "vilbert"):
        print(f"{case.DESCRIPTION}: not a VQA case of the pipeline comparison, skipped")
        return
    pipelines, processor, example = vqa_pipelines(model, args.text, args.regions or 36)
    plain_model = pipelines["pipeline plain"].model
    encoded = processor(text=[example["question"]], regions=[example["image"]], return_tensors="pt")
    inputs = {key: value.to(device) for key, value in encoded.items() if key in processor.model_input_names}
    text, regions = inputs["input_ids"].shape[1], inputs["region_features"].shape[1]
    label = f"{case.DESCRIPTION} {text}t+{regions}r"
    calls = {name: (lambda built=built: built(**example, top_k=5)) for name, built in pipelines.items()}
    calls["forward plain"] = lambda: plain_model(**inputs)
    if checkout is not None:
        original = case.build_original(checkout).to(device)
        original_inputs = to_device(case.make_original_inputs(original, 1, text, regions), device, torch.float32)
        calls["original"] = lambda: original(**original_inputs)
    flops = forward_flops(plain_model, inputs)
    with torch.inference_mode():
        for call in calls.values():
            call()  # warm-up
        rounds = interleaved_rounds(calls, args.repeats, device)
    medians, cpu_medians = {}, {}
    for name, timed in rounds.items():
        walls = sorted(wall for wall, _ in timed)
        medians[name], cpu_medians[name] = walls[len(walls) // 2], statistics.median(cpu for _, cpu in timed)
        dtype = pipelines["pipeline"].model.dtype if name == "pipeline" else torch.float32  # the default's choice
        print_row(label, name, dtype, 1, medians[name], walls[0], flops, peak, f"CPU {cpu_medians[name]:.3f} s")
    baselines = [name for name in ("original", "forward plain", "pipeline plain") if name in medians]
    for what, seconds in (("wall", medians), ("process CPU time", cpu_medians)):
        print(
            f"{label}: the default pipeline / "
            + ", ".join(f"{name} {seconds[name] / seconds['pipeline']:.2f}x" for name in baselines)
            + f" (batch 1, the default in {pipelines['pipeline'].inference_dtype}, median {what} of interleaved rounds)"
        )


if __name__ == "__main__":
    main()
