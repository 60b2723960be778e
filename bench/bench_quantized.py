"""Per-model speed and accuracy of fp32, fp32 on packed weights (the pipelines' default), bf16 and int8 dynamic
quantization (`quantize="int8"`), side by side in one run (issue 30 item 3).

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python bench/bench_quantized.py [--rounds 5] [--demo-dir runs/demo]

Speed: the UNITER, VL-BERT and ViLBERT VQA heads at base size (random weights, bench/encoders cases: 20 tokens, 36
regions) at batch 1 and 8, and the Unified VLP and TDEN captioners at base size (greedy, 20 words, batch 1), every
variant of a setting timed in the same interleaved rounds (bench/timing.py; medians). Accuracy against fp32:
- random inputs at base size: top-1 answer agreement and max / mean |logit difference| (`--examples` examples), and
  for the captioners the share of identical captions (`--examples` prompts, greedy);
- the shapes-world test set (1200 questions, 200 images) with the demo's trained tiny models (`--demo-dir`, what
  `vlhub demo` wrote; skipped when absent): top-1 agreement, logit differences, VQA accuracy, caption equality;
- the converted UNITER parity fixture (the original release's VQA checkpoint format, ../shared/fixtures/uniter or
  $VLHUB_FIXTURES_DIR): top-1 agreement and logit differences on its examples.
Random weights give near-tied answers, so their top-1 agreement is a lower bound; the trained models' is the one
that says what users get. Run bench/bench_dtypes.py beside it for the machine's matmul peaks.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import statistics
import tempfile
from pathlib import Path

import torch
from torch import nn

import vlhub
from bench.timing import interleaved_rounds
from vlhub.modeling.inference_dtype import quantize_linear_weights
from vlhub.modeling.packed_linear import pack_linear_weights

ENCODERS = ("uniter", "vl_bert", "vilbert")
DEMO_VQA = {"uniter": "uniter/uniter-shapes-vqa", "vilbert": "vilbert/vilbert-shapes-vqa"}
DEMO_CAPTIONER = "uniter/vlp-shapes-captioning"


def variants(model: nn.Module, packed: bool = True) -> dict[str, nn.Module]:
    """fp32 (the model), fp32 on packed weights (a copy), bf16 (a copy) and int8 (a copy)."""
    built = {"fp32": model}
    if packed:
        built["fp32 packed"] = copy.deepcopy(model)
        pack_linear_weights(built["fp32 packed"])
    built["bf16"] = copy.deepcopy(model).to(torch.bfloat16)
    built["int8"] = quantize_linear_weights(model)
    return built


def agreement(reference: torch.Tensor, logits: torch.Tensor) -> dict[str, float]:
    """Top-1 agreement with the fp32 logits and the max / mean absolute logit difference."""
    reference, logits = reference.float(), logits.float()
    difference = (logits - reference).abs()
    return {
        "top1": (logits.argmax(-1) == reference.argmax(-1)).float().mean().item(),
        "max": difference.max().item(),
        "mean": difference.mean().item(),
    }


def timed(calls: dict, rounds: int, items: int) -> dict[str, float]:
    """Items per second of each call, median of `rounds` interleaved rounds (after one warm-up call each)."""
    for call in calls.values():
        call()
    times = interleaved_rounds(calls, rounds, "cpu")
    return {name: items / statistics.median(wall for wall, _ in rounds_of) for name, rounds_of in times.items()}


def print_speed(what: str, speeds: dict[str, float], unit: str) -> None:
    fp32, packed = speeds["fp32"], speeds.get("fp32 packed")
    cells = "  ".join(f"{name} {value:.3g}" for name, value in speeds.items())
    ratios = f"int8/fp32 {speeds['int8'] / fp32:.2f}x"
    if "bf16" in speeds:
        ratios += f"  bf16/fp32 {speeds['bf16'] / fp32:.2f}x"
    if packed:
        ratios += f"  int8/packed {speeds['int8'] / packed:.2f}x"
    print(f"  speed  {what}: {cells} {unit}; {ratios}", flush=True)


def print_agreement(what: str, reference: torch.Tensor, outputs: dict[str, torch.Tensor]) -> None:
    for name, logits in outputs.items():
        found = agreement(reference, logits)
        print(
            f"  agree  {what}, {name}: top-1 {found['top1']:.1%} of {reference.shape[0]}; |logit diff| max "
            f"{found['max']:.3g} mean {found['mean']:.3g}",
            flush=True,
        )


def encoder(name: str, args: argparse.Namespace) -> None:
    case = importlib.import_module(f"bench.encoders.{name}")
    models = variants(case.build("sdpa"))
    print(f"{case.DESCRIPTION} (base, random weights)", flush=True)
    with torch.inference_mode():
        for batch in args.batch_sizes:
            inputs = case.make_inputs(models["fp32"], batch, 20, case.DEFAULT_REGIONS)
            calls = {
                variant: (lambda model=model: model(**inputs))
                for variant, model in models.items()
                if variant != "bf16" or batch in args.bf16_batch_sizes
            }
            print_speed(f"batch {batch}", timed(calls, args.rounds, batch), "examples/s")
        inputs = case.make_inputs(models["fp32"], args.examples, 20, case.DEFAULT_REGIONS)
        logits = {variant: models[variant](**inputs).logits for variant in ("fp32", "bf16", "int8")}
    print_agreement("random inputs", logits.pop("fp32"), logits)


def captioner(name: str, args: argparse.Namespace) -> None:
    if name == "unified_vlp":
        from bench.bench_vlp_decoding import prompt

        model = vlhub.UnifiedVlpForConditionalGeneration(vlhub.UnifiedVlpConfig()).eval()
        make_inputs, settings = (lambda batch: prompt(model.config, batch, "cpu")), {"eos_token_id": None}
        what = "Unified VLP-base captioner (100 regions)"
    else:
        from bench.bench_tden_decoding import build, inputs as tden_inputs

        model = build("cpu", "sdpa")
        make_inputs, settings = (lambda batch: tden_inputs(model, batch, 50, "cpu")), {"min_new_tokens": 20}
        what = "TDEN-base captioner (50 regions)"
    models = variants(model)
    settings = {**settings, "max_new_tokens": 20, "num_beams": 1, "do_sample": False}
    print(f"{what}, greedy, random weights", flush=True)
    with torch.inference_mode():
        inputs = make_inputs(1)
        calls = {
            variant: (lambda model=model: model.generate(**inputs, **settings)) for variant, model in models.items()
        }
        print_speed("batch 1", timed(calls, args.rounds, 1), "images/s")
        inputs = make_inputs(args.examples)
        captions = {variant: models[variant].generate(**inputs, **settings) for variant in ("fp32", "bf16", "int8")}
    for variant in ("bf16", "int8"):
        same = (captions[variant] == captions["fp32"]).all(-1).float().mean().item()
        print(f"  agree  random prompts, {variant}: identical captions {same:.1%} of {args.examples}", flush=True)


def pipelines(task: str, folder: Path) -> dict:
    """The pipeline a user gets in fp32 (plain), bf16 and with quantize="int8"."""
    from transformers import pipeline

    return {
        "fp32": pipeline(task, model=str(folder), pack_linear_weights=False, dtype=torch.float32),
        "bf16": pipeline(task, model=str(folder), pack_linear_weights=False, dtype=torch.bfloat16),
        "int8": pipeline(task, model=str(folder), quantize="int8"),
    }


def shapes_world_vqa(folder: Path, world, store) -> None:
    built = pipelines("visual-question-answering", folder)
    processor = built["fp32"].processor
    rows = world.vqa()["test"]
    logits = {variant: [] for variant in built}
    with torch.inference_mode():
        for start in range(0, len(rows), 64):
            chunk = rows.select(range(start, min(start + 64, len(rows))))
            inputs = processor(
                text=list(chunk["question"]), regions=[store[i] for i in chunk["image_id"]], return_tensors="pt"
            )
            inputs = {k: v for k, v in inputs.items() if k in processor.model_input_names}
            for variant, built_pipeline in built.items():
                logits[variant].append(built_pipeline.model(**inputs).logits.float())
    logits = {variant: torch.cat(parts) for variant, parts in logits.items()}
    print(f"{folder.name} (trained tiny model, shapes-world test set)", flush=True)
    for variant, found in logits.items():
        predicted = found.argmax(-1).tolist()
        accuracy = statistics.mean(
            dict(zip(row["labels"], row["scores"])).get(label, 0.0) for row, label in zip(rows, predicted)
        )
        print(f"  VQA accuracy {variant}: {accuracy:.4f}", flush=True)
    print_agreement("shapes world", logits.pop("fp32"), logits)


def shapes_world_captions(folder: Path, world, store) -> None:
    built = pipelines("image-captioning", folder)
    images = [image["image_id"] for image in world.images()["test"]]
    captions = {
        variant: [result[0]["generated_text"] for result in captioner([store[i] for i in images], batch_size=16)]
        for variant, captioner in built.items()
    }
    print(f"{folder.name} (trained tiny captioner, shapes-world test images, greedy)", flush=True)
    for variant in ("bf16", "int8"):
        same = statistics.mean(a == b for a, b in zip(captions[variant], captions["fp32"]))
        print(f"  agree  {variant}: identical captions {same:.1%} of {len(images)}", flush=True)


def converted_fixture() -> None:
    from tests.test_uniter_parity import ROOT, Fixture

    if not (ROOT / "raw_inputs.json").is_file():
        print(f"converted fixture: none at {ROOT}; skipped")
        return
    with tempfile.TemporaryDirectory() as work:
        fixture = Fixture(ROOT, Path(work))
        folder = fixture.convert("vqa")
        inputs = fixture.inputs(folder)
        models = variants(vlhub.UniterForQuestionAnswering.from_pretrained(folder).eval(), packed=False)
        with torch.inference_mode():
            logits = {variant: model(**inputs).logits for variant, model in models.items()}
    print("UNITER VQA converted from the original checkpoint format (parity fixture, tiny random weights)")
    print_agreement("fixture examples", logits.pop("fp32"), logits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument(
        "--bf16-batch-sizes",
        type=int,
        nargs="*",
        default=[1, 8],
        help="the encoders' batch sizes to time bf16 at (where it is known to be slow, fewer)",
    )
    parser.add_argument("--examples", type=int, default=16, help="random examples for the accuracy figures")
    parser.add_argument("--models", nargs="*", default=[*ENCODERS, "unified_vlp", "tden"])
    parser.add_argument("--demo-dir", type=Path, default=Path("runs/demo"), help="what `vlhub demo` wrote")
    parser.add_argument(
        "--accuracy-sets",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the converted fixture and the shapes-world test set (--no-accuracy-sets: only the base-size models)",
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"threads {torch.get_num_threads()}; quantized engine {torch.backends.quantized.engine}", flush=True)
    if args.accuracy_sets:
        accuracy_sets(args.demo_dir)
    for name in args.models:
        (encoder if name in ENCODERS else captioner)(name, args)


def accuracy_sets(demo_dir: Path) -> None:
    converted_fixture()
    from vlhub.training.data import shapes_region_store, shapes_world

    world = shapes_world(seed=0)
    store = shapes_region_store(world)
    for name, folder in DEMO_VQA.items():
        if (demo_dir / folder).is_dir():
            shapes_world_vqa(demo_dir / folder, world, store)
        else:
            print(f"shapes world: no {demo_dir / folder} (run `vlhub demo --model_type {name}`); skipped")
    if (demo_dir / DEMO_CAPTIONER).is_dir():
        shapes_world_captions(demo_dir / DEMO_CAPTIONER, world, store)


if __name__ == "__main__":
    main()
