"""`python -m vlhub.extract` / `accelerate launch -m vlhub.extract`: region features for images → a region store.

    accelerate launch -m vlhub.extract IMAGES... --extractor DIR --output STORE [--batch-size N]
        [--dtype auto|float32|bfloat16] [--quantize int8 [--calibration-images N]] [--decode-workers N]

`vlhub extract` runs the same code in one process. See `vlhub.processing.extraction`.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("images", nargs="+", help="image files, folders (searched recursively) or .txt lists of paths")
    parser.add_argument(
        "--extractor",
        required=True,
        help="a region-extractor folder, or a processor/model folder with region_extractor/ "
        "(local or a Hub repo); its config.json's region_extractor_type picks the class",
    )
    parser.add_argument("--output", required=True, help="the region store folder to write (or to continue)")
    parser.add_argument("--batch-size", type=int, default=1, help="images per extractor call (default 1)")
    parser.add_argument("--shard-size", type=int, default=256, help="images per store shard (default 256)")
    parser.add_argument(
        "--feature-dtype",
        choices=["float32", "float16"],
        default="float32",
        help="how features are stored (default float32)",
    )
    parser.add_argument(
        "--skip-errors", action="store_true", help="record unreadable images in OUTPUT/failed.jsonl instead of stopping"
    )
    _add_detector_arguments(parser)
    return parser


def _add_detector_arguments(parser: argparse.ArgumentParser) -> None:
    detector = parser.add_argument_group("the bottom-up-attention detector's speed settings")
    detector.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16"],
        default="auto",
        help="the detector's compute dtype; auto (default): float32 (bf16's selected boxes were measured to differ "
        "from float32's: docs, performance)",
    )
    detector.add_argument(
        "--quantize",
        choices=["int8"],
        help="run the detector's res5 head (~90%% of its FLOPs) in int8 on the CPU, calibrated on the first "
        "--calibration-images images (by id); features differ from float32 (docs: performance)",
    )
    detector.add_argument(
        "--calibration-images",
        type=int,
        default=4,
        help="images (the first by id) whose regions calibrate --quantize int8 (default 4)",
    )
    detector.add_argument(
        "--decode-workers",
        type=int,
        default=2,
        help="threads decoding the next images while the detector computes (default 2; 0: decode in turn)",
    )


def _prepare_detector(extractor, images: dict, args: argparse.Namespace):
    """The detector set up as asked (dtype, int8) and its image decoder for the decode threads; other extractors
    take the image paths, and refuse the detector's settings."""
    import torch

    from .processing.detector import RegionExtractor

    if not isinstance(extractor, RegionExtractor):
        if args.dtype != "auto" or args.quantize:
            raise ValueError(f"--dtype and --quantize apply to the detector only, not to {type(extractor).__name__}")
        return extractor, None
    if args.quantize:
        if args.calibration_images < 1:
            raise ValueError(f"--calibration-images must be at least 1, got {args.calibration_images}")
        if args.dtype == "bfloat16":
            raise ValueError("--quantize int8 runs res5 in int8 and the rest in float32: drop --dtype bfloat16")
        # The first images by id: every process of a run, and a resumed run, calibrate on the same images.
        extractor.quantize([str(images[image_id]) for image_id in sorted(images)[: args.calibration_images]])
    elif args.dtype == "bfloat16":
        # Not chosen by "auto", even where bf16 units exist (`fastest_inference_dtype`): on the fixture detectors
        # bf16 selected boxes equal to float32's on far fewer than 99% of images (docs/performance.md).
        extractor.to(torch.bfloat16)
    return extractor, extractor.load_image


def run(args: argparse.Namespace) -> int:
    from . import data  # noqa: F401  (registers the shapes world's region extractor, "shapes")
    from .processing.extraction import collect_images, extract_to_store
    from .processing.region_extractors import load_region_extractor

    images = collect_images(args.images)
    extractor, decode = _prepare_detector(load_region_extractor(args.extractor), images, args)
    summary = extract_to_store(
        extractor,
        images,
        args.output,
        batch_size=args.batch_size,
        shard_size=args.shard_size,
        feature_dtype=args.feature_dtype,
        skip_errors=args.skip_errors,
        decode=decode,
        decode_workers=args.decode_workers,
    )
    from accelerate import PartialState

    state = PartialState()
    if state.is_main_process:
        print(
            f"{summary.total} images: {summary.already_stored} already stored, {summary.extracted} extracted, "
            f"{len(summary.failed)} failed"
            + (f" (see {args.output}/failed.jsonl)" if summary.failed else "")
            + f"; store: {args.output}"
        )
    # Tear the process group down before the interpreter exits: a process leaving with gloo's threads still alive
    # can abort ("terminate called without an active exception", seen once in CI with 2 processes).
    state.destroy_process_group()
    return 1 if summary.failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = add_arguments(argparse.ArgumentParser(prog="vlhub.extract", description=__doc__.splitlines()[0]))
    from .utils.errors import run_command

    args = parser.parse_args(argv)
    return run_command("vlhub.extract", lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
