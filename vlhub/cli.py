"""The `vlhub` command line.

    vlhub convert uniter CHECKPOINT --output-dir DIR [--config ORIGINAL_JSON] [--task TASK] [--tokenizer NAME]
    vlhub convert detector FILE --output-dir DIR [--config YAML] [--format frcnn|detectron2]
        [--objects-vocab TXT] [--attributes-vocab TXT]
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
    return _print_report(report, args.output_dir)


def _print_report(report, output_dir) -> int:
    print(report.summary())
    print(f"wrote {output_dir}")
    return 0


def _convert_detector(args) -> int:
    from .conversion.detector import convert_detector

    report = convert_detector(
        args.file,
        args.output_dir,
        config=args.config,
        format=args.format,
        objects_vocab=args.objects_vocab,
        attributes_vocab=args.attributes_vocab,
    )
    return _print_report(report, args.output_dir)


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

    from .conversion.detector import DETECTOR_FORMATS

    detector = architectures.add_parser(
        "detector", help="bottom-up-attention Faster R-CNN weights (MMF/HF pytorch_model.bin or detectron2 .pkl)"
    )
    detector.add_argument("file", help="pytorch_model.bin (MMF/HF FRCNN port) or a detectron2 .pkl")
    detector.add_argument("--output-dir", required=True, help="folder to write")
    detector.add_argument("--config", help="the port's config.yaml (default: config.yaml beside FILE, if any)")
    detector.add_argument("--format", choices=DETECTOR_FORMATS, help="source format (default: detected)")
    detector.add_argument("--objects-vocab", help="objects_vocab.txt (default: beside FILE; else placeholder names)")
    detector.add_argument("--attributes-vocab", help="attributes_vocab.txt (default: beside FILE; else placeholders)")
    detector.set_defaults(func=_convert_detector)
    return architectures


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vlhub", description="vlhub command line tools")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_convert(subparsers)
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
