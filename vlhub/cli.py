"""The `vlhub` command line.

vlhub convert NAME ...   (one subcommand per registered converter: `vlhub convert --help`), e.g.
vlhub convert uniter CHECKPOINT --output-dir DIR [--config ORIGINAL_JSON] [--task TASK] [--tokenizer NAME]
vlhub convert detector FILE --output-dir DIR [--config YAML] [--format frcnn|detectron2|caffe]
    [--objects-vocab TXT] [--attributes-vocab TXT]
vlhub extract IMAGES... --extractor DIR --output STORE [--batch-size N] [--skip-errors] [--quantize int8]
vlhub import-features SOURCE --format FORMAT --output STORE
vlhub app [--model FOLDER ...] [--extractor FOLDER] [--host 127.0.0.1] [--port 7860]   (pip install 'vlhub[app]')
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from .utils.errors import named_input, run_command


def _print_report(report, output_dir) -> int:
    print(report.summary())
    print(f"wrote {output_dir}")
    return 0


def _run_converter(converter):
    def run(args) -> int:
        return _print_report(converter.convert(args), args.output_dir)

    return run


def _add_convert(subparsers) -> argparse._SubParsersAction:
    """`vlhub convert <name>`: one subcommand per registered converter (`vlhub.conversion.registry`)."""
    from .conversion import converters

    convert = subparsers.add_parser("convert", help="convert an original release into a vlhub (Hugging Face) folder")
    architectures = convert.add_subparsers(dest="architecture", required=True, metavar="ARCHITECTURE")
    for name, converter in converters().items():
        parser = architectures.add_parser(name, help=converter.help)
        converter.add_arguments(parser)
        parser.set_defaults(func=_run_converter(converter))
    return architectures


def _import_features(args) -> int:
    from .processing.stores import import_features, open_feature_file

    options = {}
    if args.format == "vlp-h5":
        if not args.boxes:
            raise ValueError("--format vlp-h5 needs --boxes (the bbox h5 file)")
        options = {
            "boxes": args.boxes,
            "class_probs": args.class_probs,
            "image_sizes": json.loads(Path(args.image_sizes).read_text()) if args.image_sizes else None,
            "image_size_from_boxes": args.image_size_from_boxes,
        }
    # A reading library's own error (h5py, pyarrow, sqlite3, pickle, MemoryError) names the source, too.
    with named_input(args.source, f"a {args.format} feature source"):
        reader = open_feature_file(args.format, args.source, **options)
        # One original format per store (a copied vlhub store keeps the source it records): importing features of
        # another format, or adding them to a store `vlhub extract` wrote, is refused as mixing two extractions.
        source = None if args.format == "vlhub" else {"imported_from": args.format}
        written = import_features(
            reader, args.output, shard_size=args.shard_size, feature_dtype=args.feature_dtype, source=source
        )
    print(f"{len(reader)} images in {args.source}: {written} written, {len(reader) - written} already in {args.output}")
    return 0


def _add_import_features(subparsers):
    from .processing.stores import FEATURE_FORMATS

    parser = subparsers.add_parser(
        "import-features",
        help="copy an original project's feature file into a vlhub region store",
        description="formats: " + "; ".join(f"{k}: {v}" for k, v in FEATURE_FORMATS.items()),
    )
    parser.add_argument(
        "source", help="the feature file, LMDB or folder (for vlp-h5: the feature h5 or its pattern with {shard})"
    )
    parser.add_argument("--format", required=True, choices=sorted(FEATURE_FORMATS))
    parser.add_argument("--output", required=True, help="the region store folder to write (or to continue)")
    parser.add_argument("--shard-size", type=int, default=512)
    parser.add_argument("--feature-dtype", choices=["float32", "float16"], default="float32")
    parser.add_argument("--boxes", help="vlp-h5: the bbox h5 file")
    parser.add_argument("--class-probs", help="vlp-h5: the class-probability h5 file or pattern")
    parser.add_argument("--image-sizes", help="vlp-h5: a JSON file {image_id: [height, width]}")
    parser.add_argument(
        "--image-size-from-boxes",
        action="store_true",
        help="vlp-h5 without --image-sizes: use each image's largest box coordinates",
    )
    parser.set_defaults(func=_import_features)


def _add_extract(subparsers):
    from . import extract

    parser = subparsers.add_parser(
        "extract",
        help="region features for images into a region store (resumable; for several processes use "
        "`accelerate launch -m vlhub.extract ...`)",
    )
    extract.add_arguments(parser)
    parser.set_defaults(func=extract.run)


def _store_info(args) -> int:
    from .processing.stores import RegionStore

    summary = RegionStore(args.folder).summary()
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0

    def describe(values: dict) -> str:
        return ", ".join(f"{key}={value}" for key, value in values.items())

    print(
        f"region store {summary['folder']} (format version {summary['format_version']}): {summary['images']:,} images "
        f"in {summary['shards']:,} shards, {summary['bytes'] / 1e6:,.1f} MB"
    )
    print(f"layout: {describe(summary['layout'])}")
    source = summary["source"]
    unknown = "not recorded (written before vlhub kept one, or by a writer that stated none)"
    print(f"source: {describe(source)}" if source else f"source: {unknown}")
    return 0


def _add_store_info(subparsers):
    parser = subparsers.add_parser(
        "store-info", help="what a region store holds: images, shards, layout and the extraction that made its features"
    )
    parser.add_argument("folder", help="the region store folder")
    parser.add_argument("--json", action="store_true", help="print it as JSON")
    parser.set_defaults(func=_store_info)


def _add_app(subparsers):
    from .app import cli as app_cli

    parser = subparsers.add_parser(
        "app",
        help="a browser app over vlhub folders: regions, answers, captions, rankings (needs vlhub[app])",
        description=app_cli.__doc__.splitlines()[0],
    )
    app_cli.add_arguments(parser)
    parser.set_defaults(func=app_cli.run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vlhub", description="vlhub command line tools")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error about an input too (or set VLHUB_DEBUG=1)"
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_convert(subparsers)
    _add_extract(subparsers)
    _add_import_features(subparsers)
    _add_store_info(subparsers)
    _add_app(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    # A bad input (vlhub.utils.errors.user_error_types) is one line and exit status 2; a bug keeps its traceback.
    return run_command(f"vlhub {args.command}", lambda: args.func(args), debug=args.debug or args.verbose)


if __name__ == "__main__":
    sys.exit(main())
