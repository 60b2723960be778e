"""Extracting region features for a folder (or a list) of images into a vlhub region store.

The work is split across processes by accelerate (`accelerate launch -m vlhub.extract ...`): every process
reads which images the store already holds, takes its share of the rest through
`Accelerator.split_between_processes`, and writes its own series of shards. A run that is interrupted keeps
every finished shard; running the same command again extracts only what is missing.
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from ..utils.arguments import check_positive_int
from ..utils.errors import VlhubUserError, user_error_types
from .regions import RegionFeatures
from .stores.shards import RegionStoreWriter, stored_image_ids

if TYPE_CHECKING:
    from accelerate import Accelerator

__all__ = ["IMAGE_EXTENSIONS", "collect_images", "extract_to_store", "ExtractionSummary", "ImageExtractionError"]

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp")
FAILURES_FILE = "failed.jsonl"


def collect_images(inputs: Sequence[str | os.PathLike]) -> dict[str, Path]:
    """Image files named by `inputs` (files, folders searched recursively, or `.txt` lists of paths), keyed
    by image id: the path relative to its folder without extension (`val2014/COCO_val2014_000000000042`
    → `COCO_val2014_000000000042` for a folder argument `val2014/`), or the file stem for single files.

    Raises when an input does not exist, when nothing is found, or when two files would get the same id.
    """
    images: dict[str, Path] = {}

    def add(image_id: str, path: Path):
        if image_id in images and images[image_id] != path:
            raise ValueError(f"two images would get the id {image_id!r}: {images[image_id]} and {path}")
        images[image_id] = path

    for item in inputs:
        path = Path(item)
        if path.is_dir():
            for file in sorted(path.rglob("*")):
                if file.suffix.lower() in IMAGE_EXTENSIONS and file.is_file():
                    add(file.relative_to(path).with_suffix("").as_posix(), file)
        elif path.suffix.lower() == ".txt" and path.is_file():
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                line = line.strip()
                if line:
                    listed = (path.parent / line) if not os.path.isabs(line) else Path(line)
                    if not listed.is_file():
                        raise FileNotFoundError(f"{path} line {number}: no image file {listed}")
                    add(listed.stem, listed)
        elif path.is_file():
            add(path.stem, path)
        else:
            raise FileNotFoundError(f"no image, folder or .txt list at {path}")
    if not images:
        raise ValueError(f"no image files ({', '.join(IMAGE_EXTENSIONS)}) found in {list(map(str, inputs))}")
    return images


class ImageExtractionError(VlhubUserError, RuntimeError):
    """An image could not be read or its regions extracted (the message names the file); `--skip-errors` records
    such images instead of stopping."""


@dataclass
class ExtractionSummary:
    """What one process did (and, after `gather`, what all did)."""

    total: int
    already_stored: int
    extracted: int = 0
    failed: list[dict] = field(default_factory=list)


# One pending image: its id, its file, and what the extractor is given for it (the path, or the decoded image, or
# the error decoding raised, re-raised where the extractor would have raised it).
Item = tuple[str, Path, Any]


def _decoded(decode: Callable[[Path], Any], path: Path) -> Any:
    try:
        return decode(path)
    except Exception as err:  # noqa: BLE001 — handed to the batch, which reports it with the file's name
        return err


def _batches(
    pending: list[tuple[str, Path]], batch_size: int, decode: Callable[[Path], Any] | None, workers: int
) -> Iterator[list[Item]]:
    """`pending` in batches. With `decode`, `workers` threads decode the next batches' images while the caller
    computes on this one (at most two batches ahead, which bounds the memory held by decoded images)."""
    batches = [pending[start : start + batch_size] for start in range(0, len(pending), batch_size)]
    if decode is None or workers == 0:
        for batch in batches:
            yield [
                (image_id, path, str(path) if decode is None else _decoded(decode, path)) for image_id, path in batch
            ]
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="vlhub-decode") as pool:
        submitted: deque[tuple[list, list[Future]]] = deque()

        def finished() -> list[Item]:
            batch, futures = submitted.popleft()
            return [(image_id, path, future.result()) for (image_id, path), future in zip(batch, futures)]

        for batch in batches:
            submitted.append((batch, [pool.submit(_decoded, decode, path) for _, path in batch]))
            if len(submitted) > 2:
                yield finished()
        while submitted:
            yield finished()


def _extract_batch(extractor, batch: list[Item], skip_errors: bool, failures: list[dict]):
    """Run the extractor on one batch; with `skip_errors`, a failing batch is retried image by image so that one
    bad file costs only itself (and is recorded)."""
    try:
        for _, _, image in batch:
            if isinstance(image, Exception):
                raise image
        with torch.inference_mode():
            return list(zip([image_id for image_id, _, _ in batch], extractor([image for _, _, image in batch])))
    except Exception as err:  # noqa: BLE001 — any failure of one image is reported with its file name
        if not skip_errors:
            names = ", ".join(str(p) for _, p, _ in batch)
            # An unreadable image is the user's input (one line from the command lines); anything else is a bug.
            error_type = ImageExtractionError if isinstance(err, user_error_types()) else RuntimeError
            raise error_type(f"region extraction failed for {names}: {type(err).__name__}: {err}") from err
        if len(batch) > 1:
            results = []
            for item in batch:
                results.extend(_extract_batch(extractor, [item], skip_errors, failures))
            return results
        image_id, path, _ = batch[0]
        failures.append({"image_id": image_id, "path": str(path), "error": f"{type(err).__name__}: {err}"})
        logger.warning("skipping %s: %s", path, err)
        return []


def extract_to_store(
    extractor: Callable[[list[str]], Sequence[RegionFeatures]],
    images: dict[str, Path],
    output: str | os.PathLike,
    batch_size: int = 1,
    shard_size: int = 256,
    feature_dtype: str = "float32",
    skip_errors: bool = False,
    accelerator: Accelerator | None = None,
    progress: bool = True,
    decode: Callable[[Path], Any] | None = None,
    decode_workers: int = 2,
    source: Mapping[str, Any] | None = None,
) -> ExtractionSummary:
    """Extract `images` (`{image_id: path}`) with `extractor` into the region store at `output`.

    Images the store already holds are skipped (resume). With an `accelerate.Accelerator`, each process takes
    its share and writes its own shards; the summary returned on every process covers all processes.
    `skip_errors=True` records unreadable images in `failed.jsonl` instead of stopping. The extractor is given
    the image paths, or with `decode` (a file → what the extractor takes, e.g. the detector's `load_image`) what
    `decode` returns, computed by `decode_workers` threads while the extractor works on the previous batch.
    `source` (JSON values by name: the extractor's fingerprint and settings, as `vlhub extract` states them) is
    recorded by a new store and must equal what a continued store records (`RegionStoreWriter`).
    """
    from accelerate import Accelerator
    from accelerate.utils import gather_object
    from tqdm.auto import tqdm

    batch_size = check_positive_int(batch_size, "batch_size")
    if decode_workers < 0:
        raise ValueError(f"decode_workers must be at least 0, got {decode_workers}")
    accelerator = accelerator or Accelerator()
    output = Path(output)
    # Every process must see the same "already stored" set, so read it before anyone writes.
    completed = stored_image_ids(output) if output.exists() else set()
    accelerator.wait_for_everyone()
    pending = [(image_id, images[image_id]) for image_id in sorted(images) if image_id not in completed]
    summary = ExtractionSummary(total=len(images), already_stored=len(images) - len(pending))
    if isinstance(extractor, torch.nn.Module):  # the detector; a plain callable has no device to move
        extractor = extractor.to(accelerator.device)
    failures: list[dict] = []
    with accelerator.split_between_processes(pending) as mine:
        # A context: an error closes the bar first, so the error's line starts a line of its own.
        with (
            tqdm(
                total=len(pending),
                desc="extracting regions",
                unit="img",
                disable=not (progress and accelerator.is_local_main_process),
            ) as bar,
            RegionStoreWriter(
                output,
                shard_size=shard_size,
                feature_dtype=feature_dtype,
                process_index=accelerator.process_index,
                source=source,
            ) as writer,
        ):
            for batch in _batches(mine, batch_size, decode, decode_workers):
                for image_id, regions in _extract_batch(extractor, batch, skip_errors, failures):
                    if not isinstance(regions, RegionFeatures):
                        raise TypeError(f"the extractor returned {type(regions).__name__}, not RegionFeatures")
                    writer.add(image_id, regions)
                    summary.extracted += 1
                # the bar counts all processes' work (approximately) by scaling the main process's progress
                bar.update(len(batch) * accelerator.num_processes)
    accelerator.wait_for_everyone()
    all_extracted = sum(gather_object([summary.extracted]))
    all_failures = [f for part in gather_object([failures]) for f in part]
    summary.extracted, summary.failed = all_extracted, all_failures
    if accelerator.is_main_process and all_failures:
        with open(output / FAILURES_FILE, "a") as handle:
            for failure in all_failures:
                handle.write(json.dumps(failure) + "\n")
    return summary
