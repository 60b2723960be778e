"""`python -m vlhub.extract` / `accelerate launch -m vlhub.extract`: region features for images → a region store.

    accelerate launch -m vlhub.extract IMAGES... --extractor DIR --output STORE [--batch-size N]
        [--dtype auto|float32|bfloat16] [--quantize int8 [--calibration-images N]] [--decode-workers N]

`vlhub extract` runs the same code in one process. See `vlhub.processing.extraction`. The store records the
extractor's fingerprint and the detector's settings (`--dtype auto` resolved): continuing it with others is refused.
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
        help="the detector's compute dtype; auto (default): the one a continued store records, else bfloat16 where "
        "bf16 products were measured >= 1.2x faster than float32 on this machine (AMX, AVX512-BF16 or a bf16 GPU), "
        "else float32 (docs: performance)",
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
        help="images (the first by id) whose regions calibrate --quantize int8 (default 4; continuing a store: the "
        "images it was calibrated on)",
    )
    detector.add_argument(
        "--decode-workers",
        type=int,
        default=2,
        help="threads decoding the next images while the detector computes (default 2; 0: decode in turn)",
    )


def _extraction_source(
    folder, extractor, images: dict, args: argparse.Namespace, recorded: dict | None, device
) -> tuple[dict, str]:
    """What makes this run's features, as the store records it (the extractor folder's fingerprint and, for the
    detector, its compute dtype, "auto" resolved, and int8 calibration images), and a line saying how the detector
    runs and why ("" for other extractors)."""
    from .processing.detector import RegionExtractor
    from .processing.region_extractors import read_region_extractor_config, region_extractor_fingerprint

    kind, _ = read_region_extractor_config(folder)
    source = {"region_extractor_type": kind, "extractor": region_extractor_fingerprint(folder)}
    if not isinstance(extractor, RegionExtractor):
        if args.dtype != "auto" or args.quantize:
            raise ValueError(f"--dtype and --quantize apply to the detector only, not to {type(extractor).__name__}")
        return source, ""
    if args.quantize:
        if args.dtype == "bfloat16":
            raise ValueError("--quantize int8 runs res5 in int8 and the rest in float32: drop --dtype bfloat16")
        calibration = _calibration_images(images, args.calibration_images, args.quantize, recorded)
        source = {**source, "dtype": "float32", "quantize": args.quantize, "calibration_images": calibration}
        return source, f"the detector runs in {_compute_description(source)} (--quantize)"
    dtype, why = _detector_dtype(args.dtype, recorded, device)
    source = {**source, "dtype": dtype, "quantize": None, "calibration_images": None}
    return source, f"the detector runs in {dtype} ({why})"


def _calibration_images(images: dict, count: int | None, quantize: str, recorded: dict | None) -> list[str]:
    """The ids of the images whose regions calibrate int8: those a continued int8 store was calibrated on (unless
    another `count` is asked, which the store then refuses), else the first `count` (default 4) by id, so that every
    process of a run calibrates on the same images."""
    stored = recorded.get("calibration_images") if recorded and recorded.get("quantize") == quantize else None
    if stored and count in (None, len(stored)):
        missing = [image_id for image_id in stored if image_id not in images]
        if missing:
            raise ValueError(
                f"the store was calibrated on the images {missing}, which are not among the images given: give them "
                "too (they are skipped, being stored), so that the new features are calibrated as the stored ones"
            )
        return list(stored)
    from .utils.arguments import check_positive_int

    return sorted(images)[: check_positive_int(4 if count is None else count, "--calibration-images")]


def _detector_dtype(requested: str, recorded: dict | None, device) -> tuple[str, str]:
    """`--dtype` resolved, and why: as given; for "auto", what a continued store records, else bfloat16 where bf16
    products are fast on this run's device (`bf16_is_fast`: timed on a CPU), else float32. On a trained detector bf16
    found the same objects as float32 on 99-100% of scenes, its features within 3e-3 relative L2
    (docs/performance.md)."""
    if requested != "auto":
        return requested, "--dtype"
    if recorded is not None and recorded.get("dtype") in ("float32", "bfloat16"):
        return recorded["dtype"], "--dtype auto: the dtype the store was written in"
    from .utils import precision

    if precision.bf16_is_fast(device):
        return "bfloat16", f"--dtype auto: bf16 products are fast on {device}"
    return "float32", f"--dtype auto: bf16 products are not faster than float32 on {device}"


def _prepare_detector(extractor, images: dict, source: dict):
    """The detector set up as `source` says (dtype, int8) and its image decoder for the decode threads; other
    extractors take the image paths."""
    import torch

    if "dtype" not in source:  # not the detector
        return extractor, None
    if source["quantize"]:
        extractor.quantize([str(images[image_id]) for image_id in source["calibration_images"]])
    elif source["dtype"] == "bfloat16":
        extractor.to(torch.bfloat16)
    return extractor, extractor.load_image


def _compute_description(source: dict) -> str:
    if source["quantize"]:
        count = len(source["calibration_images"])
        return f"float32 with res5 in {source['quantize']}, calibrated on {count} image{'s' * (count != 1)}"
    return source["dtype"]


def run(args: argparse.Namespace) -> int:
    from accelerate import Accelerator, PartialState
    from accelerate.utils import broadcast_object_list

    from . import data  # noqa: F401  (registers the shapes world's region extractor, "shapes")
    from .processing.extraction import collect_images, extract_to_store
    from .processing.region_extractors import load_region_extractor, resolve_region_extractor_folder
    from .processing.stores import check_store_source, recorded_source

    accelerator = Accelerator()
    images = collect_images(args.images)
    folder = resolve_region_extractor_folder(args.extractor)
    extractor = load_region_extractor(folder)
    recorded = recorded_source(args.output)
    source, how = _extraction_source(folder, extractor, images, args, recorded, accelerator.device)
    if accelerator.num_processes > 1:  # "auto" is a timing: every process takes the main one's choice
        source, how = broadcast_object_list([(source, how)])[0]
    if how and accelerator.is_main_process:
        print(how, flush=True)
    check_store_source(args.output, source)  # before calibrating or extracting anything
    extractor, decode = _prepare_detector(extractor, images, source)
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
        source=source,
        accelerator=accelerator,
    )
    if accelerator.is_main_process:
        print(
            f"{summary.total} images: {summary.already_stored} already stored, {summary.extracted} extracted, "
            f"{len(summary.failed)} failed"
            + (f" (see {args.output}/failed.jsonl)" if summary.failed else "")
            + f"; store: {args.output}"
            + (f" (detector in {_compute_description(source)})" if "dtype" in source else "")
        )
    # Tear the process group down before the interpreter exits: a process leaving with gloo's threads still alive
    # can abort ("terminate called without an active exception", seen once in CI with 2 processes).
    PartialState().destroy_process_group()
    return 1 if summary.failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = add_arguments(argparse.ArgumentParser(prog="vlhub.extract", description=__doc__.splitlines()[0]))
    from .utils.errors import run_command

    args = parser.parse_args(argv)
    return run_command("vlhub.extract", lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
