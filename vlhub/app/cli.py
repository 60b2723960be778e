"""`vlhub app` / `python -m vlhub.app`: serve the browser app over vlhub folders.

    vlhub app [--model FOLDER ...] [--extractor FOLDER] [--host 127.0.0.1] [--port 7860]

With no --model it opens the folders `bash scripts/demo.sh` trained (runs/demo/). Gradio is an extra:
`pip install 'vlhub[app]'`. This module imports it only when the app starts.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

from .core import MAX_IMAGE_PIXELS, VlhubApp, demo_folders

INSTALL_HINT = "the app needs gradio: pip install 'vlhub[app]'"


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="FOLDER",
        help="a vlhub folder (trained, fine-tuned or converted); repeat for several. Default: the "
        "demo's folders under --demo-dir",
    )
    parser.add_argument(
        "--extractor",
        metavar="FOLDER",
        help="a region-extractor (e.g. detector) folder for the folders whose processor has none",
    )
    parser.add_argument("--demo-dir", default="runs/demo", help="where `scripts/demo.sh` wrote its folders")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 for every interface)",
    )
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument(
        "--max-image-pixels",
        type=int,
        default=MAX_IMAGE_PIXELS,
        help=f"larger uploads are refused with a message (default {MAX_IMAGE_PIXELS:,})",
    )
    parser.add_argument(
        "--no-pack",
        action="store_true",
        help="keep the plain linear layers (default: packed for the CPU where that pays, as the pipelines do)",
    )
    return parser


def build(args: argparse.Namespace) -> VlhubApp:
    """The app for parsed arguments: a ValueError (one line) when there is nothing to serve."""
    from ..processing.region_extractors import load_region_extractor

    folders = args.model or demo_folders(args.demo_dir)
    if not folders:
        raise ValueError(
            f"no model folders: pass --model FOLDER, or train the demo's into {args.demo_dir} with "
            "`bash scripts/demo.sh`"
        )
    extractor = load_region_extractor(args.extractor) if args.extractor else None
    examples_dir = tempfile.mkdtemp(prefix="vlhub-app-examples-")
    app = VlhubApp.from_folders(
        folders,
        extractor,
        pack=False if args.no_pack else None,
        examples_dir=examples_dir,
        max_image_pixels=args.max_image_pixels,
    )
    for problem in app.problems:
        print(f"vlhub app: not opened: {problem}", file=sys.stderr)
    if not app.models:
        raise ValueError("no folder could be opened (see above)")
    return app


def run(args: argparse.Namespace) -> int:
    try:
        import gradio  # noqa: F401
    except ImportError as err:
        raise ImportError(INSTALL_HINT) from err
    from .ui import launch

    app = build(args)
    for model in app.models.values():
        print(f"vlhub app: {model.describe()}")
    print(f"vlhub app: serving on http://{args.host}:{args.port} (Ctrl+C stops it)", flush=True)
    launch(app, host=args.host, port=args.port)
    return 0


def main(argv: list[str] | None = None) -> int:
    from ..cli import main as vlhub_main

    return vlhub_main(["app", *(sys.argv[1:] if argv is None else argv)])
