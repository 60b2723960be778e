"""The `vlhub` command line.

    vlhub convert uniter CHECKPOINT --output-dir DIR [--config ORIGINAL_JSON] [--task TASK] [--tokenizer NAME]
    vlhub extract IMAGES... --extractor DIR --output STORE [--batch-size N] [--skip-errors]
"""

from __future__ import annotations

import argparse
import logging
import sys

from .conversion.common import CheckpointError


def _convert_uniter(args) -> int:
    from .conversion.uniter import convert_uniter

    report = convert_uniter(
        args.checkpoint,
        args.output_dir,
        config=args.config,
        task=args.task,
        tokenizer=args.tokenizer,
        answers=args.answers,
    )
    print(report.summary())
    print(f"wrote {args.output_dir}")
    return 0


def _add_convert(subparsers) -> argparse._SubParsersAction:
    convert = subparsers.add_parser("convert", help="convert an original release into a vlhub (Hugging Face) folder")
    architectures = convert.add_subparsers(dest="architecture", required=True, metavar="ARCHITECTURE")
    from .conversion.uniter import UNITER_TASKS

    uniter = architectures.add_parser("uniter", help="an original UNITER .pt checkpoint (ChenRocks/UNITER)")
    uniter.add_argument("checkpoint", help="the original .pt file")
    uniter.add_argument("--output-dir", required=True, help="folder to write")
    uniter.add_argument("--config", help="the original config json (e.g. config/uniter-base.json)")
    uniter.add_argument("--task", choices=sorted(UNITER_TASKS), help="head to build (default: detected from the keys)")
    uniter.add_argument("--tokenizer", default="google-bert/bert-base-cased", help="tokenizer name, folder or vocab.txt")
    uniter.add_argument("--answers", help="VQA answer vocabulary ans2label.json (default: looked for beside the checkpoint)")
    uniter.set_defaults(func=_convert_uniter)
    return architectures


def _add_extract(subparsers):
    from . import extract

    parser = subparsers.add_parser(
        "extract", help="region features for images into a region store (resumable; for several processes use "
        "`accelerate launch -m vlhub.extract ...`)")
    extract.add_arguments(parser)
    parser.set_defaults(func=extract.run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vlhub", description="vlhub command line tools")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_convert(subparsers)
    _add_extract(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    try:
        return int(args.func(args) or 0)
    except (CheckpointError, FileNotFoundError, OSError, ValueError) as err:
        print(f"vlhub {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
