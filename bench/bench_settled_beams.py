"""What the original beam searches gain by leaving out the steps that cannot change a result, on a trained captioner.

Unified VLP's `vlp_beam_search` drops an image from the batch once every beam has emitted [SEP] at one step (the
original's back-tracking never reads past it); TDEN's `xmodaler_beam_search` once every beam has ended (X-modaler's
later steps only append word 0). Random weights, as in `bench_vlp_decoding.py` and `bench_tden_decoding.py`, seldom
end early, so this bench takes a trained captioner folder (e.g. `vlhub demo`'s) and shapes-world test images:

    python bench/bench_settled_beams.py runs/demo/uniter/vlp-shapes-captioning --batch-sizes 1 8
    python bench/bench_settled_beams.py runs/demo/tden/tden-shapes-captioning --beams 3

It times the search as it is against the same search made to run every image for every step (its `_images_going`
replaced by "all": what the original code does), in interleaved rounds, and checks that the captions are the same.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from device import describe, machine  # noqa: E402
from timing import interleaved_rounds  # noqa: E402


def search_module(model_type: str):
    """The module of the architecture's original beam search, and the search."""
    if model_type == "unified_vlp":
        from vlhub.modeling.unified_vlp import generation_unified_vlp as module

        return module, module.vlp_beam_search
    if model_type == "tden":
        from vlhub.modeling.tden import generation_tden as module

        return module, module.xmodaler_beam_search
    raise SystemExit(f"{model_type} has no original beam search here (unified_vlp and tden have)")


@contextlib.contextmanager
def every_step(module):
    """The search with no image ever leaving the batch: every image decoded for every step, as the original does."""
    kept = module._images_going
    module._images_going = lambda *args: torch.ones(args[0].shape[0], dtype=torch.bool, device=args[0].device)
    try:
        yield
    finally:
        module._images_going = kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="a trained captioner folder (Unified VLP or TDEN) with its processor")
    parser.add_argument("--images", type=int, default=40, help="shapes-world test images to caption")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--beams", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=3, help="the shapes world's seed")
    args = parser.parse_args()

    from transformers import AutoModelForImageTextToText, AutoProcessor

    from vlhub.data import ShapesWorld

    model = AutoModelForImageTextToText.from_pretrained(args.folder).eval()
    processor = AutoProcessor.from_pretrained(args.folder)
    module, search = search_module(model.config.model_type)
    world = ShapesWorld(seed=args.seed, num_train=1, num_validation=0, num_test=args.images)
    regions = processor.region_extractor([example["image"] for example in world.images()["test"]])
    settings = dict(custom_generate=search, num_beams=args.beams, max_new_tokens=args.max_new_tokens)

    def caption(batch_size: int) -> list[list[int]]:
        captions = []
        for start in range(0, len(regions), batch_size):
            inputs = processor(regions=regions[start : start + batch_size], return_tensors="pt")
            inputs = {k: v for k, v in inputs.items() if k in processor.model_input_names}
            captions += model.generate(**inputs, **settings).tolist()
        return captions

    print(describe(machine("cpu", peak_dtypes=())))
    print(
        f"{args.folder}: {model.config.model_type}, beam {args.beams}, {args.max_new_tokens} words, "
        f"{args.images} images"
    )
    print("| batch | every step (s / image) | images leave when settled (s / image) | speed-up | same captions |")
    print("| --- | --- | --- | --- | --- |")
    with torch.inference_mode():
        for batch_size in args.batch_sizes:
            with every_step(module):
                reference = caption(batch_size)
            same = sum(a == b for a, b in zip(caption(batch_size), reference))

            def every() -> None:
                with every_step(module):
                    caption(batch_size)

            times = interleaved_rounds({"every": every, "settled": lambda: caption(batch_size)}, args.rounds, "cpu")
            every_s, settled_s = (statistics.median(w for w, _ in times[name]) / len(regions) for name in times)
            print(
                f"| {batch_size} | {every_s:.4f} | {settled_s:.4f} | {every_s / settled_s:.2f}x "
                f"| {same}/{len(regions)} |"
            )


if __name__ == "__main__":
    main()
