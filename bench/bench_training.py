"""Training and VQA-inference throughput (examples/s) of UNITER on this machine.

    python bench/bench_training.py [--sizes tiny base] [--steps 12] [--warmup 3] [--device cpu|cuda]
                                   [--mixed-precision no|fp16|bf16|auto] [--skip-vqa-inference] [--json PATH]

Pre-training: the real loop (`vlhub.training.train`: collation with masking, forward, backward, AdamW, logging) on a
synthetic corpus shaped like the target data — tiny: the shapes world's 128-d features, ~4 regions; base: the
released uniter-base with 2048-d bottom-up features and 36 regions. Reported per objective (one objective per step,
as UNITER trains) and for the default mix. VQA inference: `UniterForQuestionAnswering` forward in batches, and the
`visual-question-answering` pipeline one question at a time.

`--device cuda` trains through accelerate on the GPU (bench/device.py's fast settings) with `--mixed-precision bf16`
by default, uniter-base at batch 64 (the issue's goal); on the CPU fp32 and batch 8. Steps/s are timed between
optimizer steps, after the device finished each (`torch.cuda.synchronize`). `--json PATH` writes the rows for
bench/run_all.sh.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import vlhub
from vlhub.data import shapes_tokenizer
from vlhub.training import CaptionCorpus, ObjectiveMix, PretrainingTask, VlhubTrainingArguments, objectives_for, train
from vlhub.registry import get_architecture
from vlhub.training import build_config
from vlhub.utils.precision import MIXED_PRECISION_CHOICES

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: timing, device

from device import add_device_arguments, describe, machine, prepare_device, write_figures  # noqa: E402
from timing import synchronize  # noqa: E402

UNITER = get_architecture("uniter")

SHAPES = {
    "tiny": dict(feature_dim=128, regions=(1, 4), words=(6, 14)),
    "base": dict(feature_dim=2048, regions=(36, 36), words=(8, 16)),
}


def synthetic_corpus(size: str, num_images: int = 256, seed: int = 0) -> CaptionCorpus:
    spec = SHAPES[size]
    rng = np.random.default_rng(seed)
    tokenizer = shapes_tokenizer()
    words = [w for w in tokenizer.get_vocab() if w.isalpha()]
    regions, pairs = {}, []
    for i in range(num_images):
        count = int(rng.integers(spec["regions"][0], spec["regions"][1] + 1))
        xy = rng.random((count, 2)) * 30
        boxes = np.concatenate([xy, xy + 2 + rng.random((count, 2)) * 30], axis=1)
        probs = rng.dirichlet(np.ones(25), size=count)
        image_id = f"img{i}"
        regions[image_id] = vlhub.RegionFeatures(
            features=rng.random((count, spec["feature_dim"]), dtype=np.float32),
            boxes=boxes,
            image_size=(64, 64),
            class_probs=probs,
            scores=np.ones(count),
        )
        for _ in range(2):
            length = int(rng.integers(*spec["words"]))
            pairs.append((image_id, " ".join(rng.choice(words, length))))
    return CaptionCorpus(train=pairs, validation=[], regions=regions, name="synthetic", description="synthetic")


def pretraining_throughput(
    size: str, objectives: dict, batch: int, steps: int, warmup: int, device: str = "cpu", mixed_precision: str = "no"
) -> float:
    corpus = synthetic_corpus(size)
    tokenizer = shapes_tokenizer()
    processor = vlhub.UniterProcessor(
        feature_extractor=vlhub.UniterRegionProcessor(region_feature_dim=SHAPES[size]["feature_dim"]),
        tokenizer=tokenizer,
    )
    torch.manual_seed(0)
    model = vlhub.UniterForPreTraining(build_config(UNITER, size, processor, corpus.sample_regions()))
    task = PretrainingTask(model, processor, corpus, ObjectiveMix(objectives, objectives_for("uniter")))
    stamps: list[float] = []
    with tempfile.TemporaryDirectory() as out:
        args = VlhubTrainingArguments(
            output_dir=out,
            max_steps=warmup + steps,
            per_device_train_batch_size=batch,
            logging_steps=10**6,
            learning_rate=1e-4,
            use_cpu=device == "cpu",
            mixed_precision=mixed_precision,
        )

        def stamp(state) -> None:
            synchronize(device)  # the step's kernels have run
            stamps.append(time.perf_counter())

        train(task, args, callbacks=[stamp])
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)  # the next measurement builds its own Accelerator
    GradientState._reset_state()
    return steps * batch / (stamps[-1] - stamps[warmup - 1])


def vqa_inference_throughput(batch: int, repeats: int, device: str = "cpu") -> tuple[float, float]:
    from transformers import pipeline

    corpus = synthetic_corpus("tiny", num_images=64)
    processor = vlhub.UniterProcessor(
        feature_extractor=vlhub.UniterRegionProcessor(region_feature_dim=128), tokenizer=shapes_tokenizer()
    )
    config = build_config(UNITER, "tiny", processor, corpus.sample_regions())
    config.id2label = {i: f"answer{i}" for i in range(25)}
    config.label2id = {v: k for k, v in config.id2label.items()}
    torch.manual_seed(0)
    model = vlhub.UniterForQuestionAnswering(config).eval().to(device)
    questions = [caption for _, caption in corpus.train[:batch]]
    images = [corpus.regions[i] for i, _ in corpus.train[:batch]]

    def answer_batch():
        model(**processor(text=questions, regions=images, return_tensors="pt").to(device))

    with torch.inference_mode():
        answer_batch()
        synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            answer_batch()
        synchronize(device)
        batched = repeats * batch / (time.perf_counter() - start)
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        processor.save_pretrained(folder)
        # float32, as the batched forward above (left to choose, the pipeline may run bf16 where that is fast)
        vqa = pipeline("visual-question-answering", model=folder, device=device, dtype=torch.float32)
        vqa(image=images[0], question=questions[0])
        start = time.perf_counter()
        for question, regions in zip(questions, images):
            vqa(image=regions, question=question)
        one_by_one = len(questions) / (time.perf_counter() - start)
    return batched, one_by_one


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["tiny", "base"], choices=list(SHAPES))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--objectives",
        nargs="+",
        default=None,
        help="Which of mlm, mrfr, mrc-kl, itm, wra, 'default mix' to time (default: all).",
    )
    parser.add_argument(
        "--batch",
        type=int,
        nargs="+",
        default=None,
        help="Examples per step for each size (default: 32 for tiny; base 64 on a GPU, 8 on a CPU).",
    )
    add_device_arguments(parser)
    parser.add_argument(
        "--mixed-precision",
        choices=MIXED_PRECISION_CHOICES,
        default=None,
        help="accelerate's mixed precision (default: bf16 on a GPU, no on a CPU)",
    )
    parser.add_argument("--skip-vqa-inference", action="store_true", help="time pre-training only")
    args = parser.parse_args()
    device = prepare_device(args.device, parser)
    mixed_precision = args.mixed_precision or ("bf16" if device == "cuda" else "no")
    if args.batch and len(args.batch) != len(args.sizes):
        parser.error(f"--batch gives {len(args.batch)} sizes for {len(args.sizes)} --sizes")
    defaults = {"tiny": 32, "base": 64 if device == "cuda" else 8}
    batches = dict(zip(args.sizes, args.batch)) if args.batch else defaults
    if args.warmup < 1 or args.steps < 1:
        parser.error("--warmup and --steps must be at least 1 (steps are timed after the warm-up ones)")
    info = machine(device, peak_dtypes=())
    print(describe(info) + f"; mixed precision {mixed_precision}")
    mixes = {
        "mlm": {"mlm": 1},
        "mrfr": {"mrfr": 1},
        "mrc-kl": {"mrc-kl": 1},
        "itm": {"itm": 1},
        "wra": {"wra": 1},
        "default mix": {"wra": 2, "mlm": 2, "mrfr": 1, "mrc-kl": 1},
    }
    if args.objectives:
        mixes = {name: mixes[name] for name in args.objectives}
    rows = []
    for size in args.sizes:
        for name, mix in mixes.items():
            batch = batches[size]
            rate = pretraining_throughput(size, mix, batch, args.steps, args.warmup, device, mixed_precision)
            print(
                f"pre-training  {size:4s} batch {batch:3d}  {name:12s} {rate:8.1f} examples/s, "
                f"{rate / batch:6.2f} steps/s",
                flush=True,
            )
            rows.append(
                dict(kind="pre-training", size=size, batch=batch, objectives=name, examples_per_s=rate)
                | dict(steps_per_s=rate / batch, mixed_precision=mixed_precision)
            )
    if not args.skip_vqa_inference:
        batched, single = vqa_inference_throughput(batch=64, repeats=5, device=device)
        print(f"VQA inference tiny  batch 64 (processor + model)       {batched:8.1f} examples/s")
        print(f"VQA inference tiny  pipeline, one question per call     {single:8.1f} examples/s")
        rows.append(dict(kind="vqa inference", size="tiny", batch=64, examples_per_s=batched))
        rows.append(dict(kind="vqa pipeline", size="tiny", batch=1, examples_per_s=single))
    write_figures(args.json, "training", info, rows, steps=args.steps, warmup=args.warmup)


if __name__ == "__main__":
    main()
