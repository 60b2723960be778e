"""`python -m vlhub.extract` / `accelerate launch -m vlhub.extract`: region features for images → a region store.

    accelerate launch -m vlhub.extract IMAGES... --extractor DIR --output STORE [--batch-size N]

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
    return parser


def run(args: argparse.Namespace) -> int:
    from . import data  # noqa: F401  (registers the shapes world's region extractor, "shapes")
    from .processing.extraction import collect_images, extract_to_store
    from .processing.region_extractors import load_region_extractor

    images = collect_images(args.images)
    extractor = load_region_extractor(args.extractor)
    summary = extract_to_store(
        extractor,
        images,
        args.output,
        batch_size=args.batch_size,
        shard_size=args.shard_size,
        feature_dtype=args.feature_dtype,
        skip_errors=args.skip_errors,
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
