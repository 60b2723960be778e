"""The README's main job on the embedded default, end to end and offline:

    python -m vlhub.demo [--output_dir runs/demo] [--pretrain_steps 200] [--finetune_steps 600]

1. pre-trains a tiny UNITER on the shapes world (`pretrain.py`'s code, the original's objective mix),
2. fine-tunes it for VQA (`finetune.py`'s code),
3. reports its VQA accuracy on held-out test images against the majority-answer baseline,
4. answers a few held-out questions through `pipeline("visual-question-answering")`, with regions read from the
   shapes world's region store,
5. pre-trains a tiny Unified VLP (seq2seq + bidirectional masked LM) and fine-tunes it for captioning, reports the
   COCO caption metrics on held-out images against the most-frequent-caption baseline, and prints captions of
   held-out images from `pipeline("image-captioning")` next to their references (`--caption_steps 0` skips this).

The same as running `python pretrain.py` then `python finetune.py`; one process here so the world is generated once.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

__all__ = ["main"]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="runs/demo")
    parser.add_argument("--pretrain_steps", type=int, default=200)
    parser.add_argument("--finetune_steps", type=int, default=600)
    parser.add_argument("--num_examples", type=int, default=6, help="Held-out questions to answer at the end.")
    parser.add_argument("--caption_steps", type=int, default=600, help="Unified VLP: pre-training steps, then as "
                        "many captioning fine-tuning steps (0: no captioning part).")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from transformers import pipeline

    import vlhub  # noqa: F401  (registers the model, processor and pipeline)

    from .training.cli import finetune_main, pretrain_main
    from .training.data import shapes_region_store, shapes_world

    start = time.time()
    out = Path(args.output_dir)
    common = ["--seed", str(args.seed), "--logging_steps", "25"]
    print(f"== 1/4 pre-training a tiny UNITER on the shapes world ({args.pretrain_steps} steps)", flush=True)
    pretrain_main(["--output_dir", str(out / "uniter-shapes"), "--max_steps", str(args.pretrain_steps), *common])
    print(f"== 2/4 fine-tuning it for VQA ({args.finetune_steps} steps)", flush=True)
    result = finetune_main(["--model_name_or_path", str(out / "uniter-shapes"), "--output_dir",
                            str(out / "uniter-shapes-vqa"), "--max_steps", str(args.finetune_steps), *common])
    scores = result.eval_results
    print("== 3/4 VQA accuracy (official rule) on held-out images", flush=True)
    for split in ("validation", "test"):
        print(f"   {split:10s}: fine-tuned UNITER {scores[f'{split}_vqa_accuracy']:.4f}   "
              f"majority-answer baseline {scores[f'{split}_majority_baseline']:.4f}")
    print(f"   (recorded in {out / 'uniter-shapes-vqa' / 'README.md'})")

    print("== 4/4 answering held-out questions with pipeline('visual-question-answering')", flush=True)
    world = shapes_world(seed=0)
    store = shapes_region_store(world)
    vqa = pipeline("visual-question-answering", model=str(out / "uniter-shapes-vqa"))
    test = world.vqa()["test"]
    stride = max(1, len(test) // args.num_examples)
    for row in (test[i] for i in range(0, stride * args.num_examples, stride)):
        best = vqa(image=store[row["image_id"]], question=row["question"], top_k=1)[0]
        print(f"   {row['image_id']}  Q: {row['question']:45s} A: {best['answer']:8s} ({best['score']:.2f})   "
              f"annotators: {row['multiple_choice_answer']}")
    image_row = world.images()["test"][0]
    best = vqa(image=image_row["image"], question=test[0]["question"], top_k=1)[0]
    print(f"   from the raw image of {image_row['image_id']} (regions found by the processor's extractor): "
          f"Q: {test[0]['question']}  A: {best['answer']} ({best['score']:.2f})")
    if args.caption_steps > 0:
        scores = {**scores, **_captioning(args, out, common, world, store)}
    print(f"done in {time.time() - start:.0f} s")
    return scores


def _captioning(args, out: Path, common: list[str], world, store) -> dict:
    from transformers import pipeline

    from .training.captioning import references_by_image
    from .training.cli import finetune_main, pretrain_main

    steps = str(args.caption_steps)
    print(f"== 5/6 pre-training a tiny Unified VLP ({steps} steps), fine-tuning it for captioning ({steps} steps)",
          flush=True)
    pretrain_main(["--model_type", "unified_vlp", "--config_name", "tiny", "--output_dir", str(out / "vlp-shapes"),
                   "--max_steps", steps, *common])
    result = finetune_main(["--task", "captioning", "--model_name_or_path", str(out / "vlp-shapes"), "--output_dir",
                            str(out / "vlp-shapes-captioning"), "--max_steps", steps, *common])
    scores = {f"captioning_{k}": v for k, v in result.eval_results.items()}
    print("== 6/6 caption metrics (COCO evaluation) on held-out test images, and captions of held-out images")
    metrics = [k[len("test_"):] for k in result.eval_results if k.startswith("test_") and "baseline" not in k
               and not k.endswith("num_images")]
    for metric in metrics:
        print(f"   {metric:8s}: fine-tuned VLP {result.eval_results[f'test_{metric}']:.4f}   most-frequent-caption "
              f"baseline {result.eval_results[f'test_baseline_{metric}']:.4f}")
    captioner = pipeline("image-captioning", model=str(out / "vlp-shapes-captioning"))
    references = references_by_image(zip(world.captions()["test"]["image_id"], world.captions()["test"]["caption"]))
    for image_id in list(references)[: args.num_examples]:
        caption = captioner(store[image_id])[0]["generated_text"]
        print(f"   {image_id}  caption: {caption:50s} references: {' | '.join(references[image_id])}")
    return scores


if __name__ == "__main__":
    main()
