"""vlhub's browser app on a Hugging Face Space (Gradio SDK): `python app.py`, as a Space runs it.

The Space holds this file, requirements.txt, README.md (the Space's card), the `vlhub/` package folder of this
repository, and the models: every folder under `models/` beside this file, and the Hub repositories (or folders)
named in the Space variable VLHUB_MODELS (comma-separated). VLHUB_EXTRACTOR names a region-extractor folder or repo
for models whose processor carries none. See docs/app.md.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the vlhub/ package uploaded beside this file


def _local(name: str) -> Path:
    """A folder as is; anything else is a Hub repository, downloaded (cached) first."""
    if Path(name).is_dir():
        return Path(name)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(name))


def model_folders() -> list[Path]:
    named = [name.strip() for name in os.environ.get("VLHUB_MODELS", "").split(",") if name.strip()]
    shipped = sorted(folder for folder in (HERE / "models").glob("*") if (folder / "config.json").is_file())
    return shipped + [_local(name) for name in named]


def build():
    from vlhub.app import VlhubApp
    from vlhub.processing.region_extractors import load_region_extractor

    extractor = os.environ.get("VLHUB_EXTRACTOR")
    folders = model_folders()
    if not folders:
        raise SystemExit("no models: add folders under models/ or name Hub repositories in the VLHUB_MODELS variable")
    return VlhubApp.from_folders(
        folders,
        load_region_extractor(_local(extractor)) if extractor else None,
        examples_dir=tempfile.mkdtemp(prefix="vlhub-space-examples-"),
    )


def main() -> None:
    from vlhub.app import launch

    # A Space sets GRADIO_SERVER_NAME=0.0.0.0; elsewhere the app stays on this machine.
    launch(
        build(),
        host=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
    )


if __name__ == "__main__":
    main()
