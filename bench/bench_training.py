"""Training and VQA-inference throughput (examples/s) of UNITER on this machine.

    python bench/bench_training.py [--sizes tiny base] [--steps 12] [--warmup 3]

Pre-training: the real loop (`vlhub.training.train`: collation with masking, forward, backward, AdamW, logging) on a
synthetic corpus shaped like the target data — tiny: the shapes world's 128-d features, ~4 regions; base: the
released uniter-base with 2048-d bottom-up features and 36 regions. Reported per objective (one objective per step,
as UNITER trains) and for the default mix. VQA inference: `UniterForQuestionAnswering` forward in batches, and the
`visual-question-answering` pipeline one question at a time.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import torch

import vlhub
from vlhub.data import shapes_tokenizer
from vlhub.training import CaptionCorpus, ObjectiveMix, PretrainingTask, TrainingArguments, objectives_for, train
from vlhub.registry import get_architecture
from vlhub.training import build_config

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


def pretraining_throughput(size: str, objectives: dict, batch: int, steps: int, warmup: int) -> float:
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
        args = TrainingArguments(
            output_dir=out,
            max_steps=warmup + steps,
            per_device_batch_size=batch,
            logging_steps=10**6,
            learning_rate=1e-4,
        )
        train(task, args, callbacks=[lambda state: stamps.append(time.perf_counter())])
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)  # the next measurement builds its own Accelerator
    GradientState._reset_state()
    return steps * batch / (stamps[-1] - stamps[warmup - 1])


def vqa_inference_throughput(batch: int, repeats: int) -> tuple[float, float]:
    from transformers import pipeline

    corpus = synthetic_corpus("tiny", num_images=64)
    processor = vlhub.UniterProcessor(
        feature_extractor=vlhub.UniterRegionProcessor(region_feature_dim=128), tokenizer=shapes_tokenizer()
    )
    config = build_config(UNITER, "tiny", processor, corpus.sample_regions())
    config.id2label = {i: f"answer{i}" for i in range(25)}
    config.label2id = {v: k for k, v in config.id2label.items()}
    torch.manual_seed(0)
    model = vlhub.UniterForQuestionAnswering(config).eval()
    questions = [caption for _, caption in corpus.train[:batch]]
    images = [corpus.regions[i] for i, _ in corpus.train[:batch]]
    with torch.inference_mode():
        model(**processor(text=questions, regions=images))
        start = time.perf_counter()
        for _ in range(repeats):
            model(**processor(text=questions, regions=images))
        batched = repeats * batch / (time.perf_counter() - start)
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        processor.save_pretrained(folder)
        vqa = pipeline("visual-question-answering", model=folder)
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
        help="Examples per step for each size (default: 32 for tiny, 8 for base).",
    )
    args = parser.parse_args()
    batches = dict(zip(args.sizes, args.batch)) if args.batch else {"tiny": 32, "base": 8}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
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
    for size in args.sizes:
        for name, mix in mixes.items():
            rate = pretraining_throughput(size, mix, batches[size], args.steps, args.warmup)
            print(f"pre-training  {size:4s} batch {batches[size]:3d}  {name:12s} {rate:8.1f} examples/s", flush=True)
    batched, single = vqa_inference_throughput(batch=64, repeats=5)
    print(f"VQA inference tiny  batch 64 (processor + model)       {batched:8.1f} examples/s")
    print(f"VQA inference tiny  pipeline, one question per call     {single:8.1f} examples/s")


if __name__ == "__main__":
    main()
