"""What the browser app does, without the browser: load vlhub folders into pipelines once, extract an image's regions
once, and answer, caption and rank through the same pipelines as the Python API. `vlhub.app.ui` puts a Gradio page
on top of `VlhubApp`; its handlers here are plain functions (tests call them directly).

Bad input raises `AppInputError` (a `ValueError`) with a message for the page; the app keeps serving.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import torch
from PIL import Image, UnidentifiedImageError

if TYPE_CHECKING:
    from ..processing.region_extractors import RegionExtractorLike

__all__ = [
    "AppInputError",
    "AppModel",
    "ExampleImage",
    "RegionView",
    "VlhubApp",
    "TASKS",
    "TASK_LABELS",
    "MAX_IMAGE_PIXELS",
    "demo_folders",
    "example_images",
    "load_app_model",
]

TASKS = ("vqa", "captioning", "retrieval")
TASK_LABELS = {"vqa": "Ask", "captioning": "Caption", "retrieval": "Rank"}  # the page's tabs
TASK_NAMES = {"vqa": "VQA", "captioning": "captioning", "retrieval": "retrieval"}
PIPELINE_TASKS = {
    "vqa": "visual-question-answering",
    "captioning": "image-captioning",
    "retrieval": "image-text-retrieval",
}
# 40 megapixels: an 8K photo passes; beyond that an image costs the extractor seconds and hundreds of MB.
MAX_IMAGE_PIXELS = 40_000_000
# The demo's fine-tuned folders (`scripts/demo.sh`), in runs/demo/ or runs/demo/<model_type>/.
DEMO_FOLDER_SUFFIXES = ("-shapes-vqa", "-shapes-retrieval", "-shapes-itr", "-captioning")
_REGION_CACHE_SIZE = 64  # (model, image) pairs whose regions are kept


class AppInputError(ValueError):
    """An input the app cannot use (shown in the page as a message; the app keeps serving)."""


def demo_folders(root: str | Path = "runs/demo") -> list[Path]:
    """The fine-tuned folders `scripts/demo.sh` wrote under `root` (directly or one level down), sorted."""
    root = Path(root)
    found = [
        folder
        for pattern in ("*", "*/*")
        for folder in root.glob(pattern)
        if folder.name.endswith(DEMO_FOLDER_SUFFIXES) and (folder / "config.json").is_file()
    ]
    return sorted(found)


def _read_config(folder: Path) -> dict:
    if not folder.is_dir():
        raise AppInputError(f"{folder} is not a folder")
    path = folder / "config.json"
    if not path.is_file():
        raise AppInputError(f"{folder} is not a model folder: it has no config.json")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise AppInputError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(config, dict):
        raise AppInputError(f"{path} does not hold a config (a JSON object)")
    return config


@dataclass
class AppModel:
    """One open folder: its architecture, the task its head does and the pipeline for it (loaded once), and for each
    task of the page that it cannot do, the one-line reason."""

    name: str
    folder: Path
    architecture_name: str
    head: str
    task: str
    pipeline: object
    unavailable: dict[str, str] = field(default_factory=dict)
    packed_linears: int = 0
    inference_dtype: str = "float32"

    @property
    def region_extractor(self) -> RegionExtractorLike | None:
        return self.pipeline.processor.region_extractor

    def describe(self) -> str:
        packed = f", {self.packed_linears} linear weights packed for the CPU" if self.packed_linears else ""
        dtype = f", runs in {self.inference_dtype}" if self.inference_dtype != "float32" else ""
        return f"{self.name}: {self.architecture_name} {self.head} ({self.folder}{packed}{dtype})"


def _head_task(architecture, head: str) -> str | None:
    """The task ("vqa", "captioning", "retrieval") the page can run with a folder holding model class `head`: its
    task head, or a pre-training model's image-text matching for ranking (zero-shot, as the retrieval pipeline does)."""
    for task in TASKS:
        if architecture.task_models.get(task) == head:
            return task
    if architecture.task_models.get("pretraining") == head and architecture.has_task("retrieval"):
        return "retrieval"
    return None


def load_app_model(
    folder: str | Path,
    region_extractor: RegionExtractorLike | None = None,
    pack: bool | None = None,
    name: str | None = None,
) -> AppModel:
    """Open a vlhub folder for the page: check that it is one, build the pipeline of the task its head does, attach
    `region_extractor` when the folder's processor has none, and pack its linear weights for the CPU (`pack`: None
    where packing pays, as the pipelines do; True always; False never)."""
    from transformers import pipeline

    from ..demo import task_unavailable_reason
    from ..registry import architectures

    folder = Path(folder)
    config = _read_config(folder)
    model_type = config.get("model_type")
    known = architectures()
    if model_type not in known:
        raise AppInputError(
            f"{folder} is not a vlhub model folder: its config.json has model_type {model_type!r}; "
            f"vlhub's are {', '.join(sorted(known))}"
        )
    architecture = known[model_type]
    heads = config.get("architectures") or []
    head = heads[0] if heads else None
    task = _head_task(architecture, head)
    if task is None:
        raise AppInputError(
            f"{folder} holds {architecture.name}'s {head or 'unnamed'} model, which answers, captions "
            "and ranks nothing: open a folder fine-tuned for VQA, captioning or retrieval"
        )
    try:
        built = pipeline(PIPELINE_TASKS[task], model=str(folder), pack_linear_weights=pack)
    except (OSError, ValueError, KeyError) as err:
        raise AppInputError(f"{folder} could not be loaded as a {architecture.name} {task} model: {err}") from err
    if built.processor.region_extractor is None:
        if region_extractor is None:
            raise AppInputError(
                f"{folder}'s processor has no region extractor, so it cannot take images: start the "
                "app with --extractor FOLDER (a region-extractor or detector folder)"
            )
        built.processor.region_extractor = region_extractor
    built.model.eval()
    unavailable = {}
    for other in TASKS:
        if other != task:
            why = task_unavailable_reason(model_type, other, for_training=False)
            unavailable[other] = why or (
                f"this folder holds {head}, a {TASK_NAMES[task]} model; open one fine-tuned for {TASK_NAMES[other]}"
            )
    return AppModel(
        name=name or folder.name,
        folder=folder,
        architecture_name=architecture.name,
        head=head,
        task=task,
        pipeline=built,
        unavailable=unavailable,
        packed_linears=built.packed_linears,
        inference_dtype=built.inference_dtype,
    )


@dataclass(frozen=True)
class ExampleImage:
    """An example image of the page: a shapes-world image with its objects' boxes and descriptions."""

    path: Path
    image_id: str
    boxes: tuple
    labels: tuple
    question: str


def example_images(folder: str | Path, count: int = 4, seed: int = 0) -> list[ExampleImage]:
    """The first `count` held-out test images of the demo's shapes world (`ShapesWorld(seed)`), written as PNGs into
    `folder`, each with its objects and one of its test questions. An image depends only on its split and index, so
    these are the images the demo's models were never trained on."""
    from ..data import ShapesWorld

    world = ShapesWorld(seed=seed, num_train=1, num_validation=0, num_test=count)
    questions = {}
    for row in world.vqa()["test"]:
        questions.setdefault(row["image_id"], row["question"])
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    examples = []
    for index, scene in enumerate(world.scenes("test")):
        image_id = f"test-{index:06d}"
        path = folder / f"shapes-{image_id}.png"
        if not path.is_file():
            temporary = path.with_suffix(".tmp")
            Image.fromarray(scene.image).save(temporary, format="PNG")
            temporary.replace(path)
        examples.append(
            ExampleImage(
                path,
                image_id,
                tuple(tuple(map(float, o.box)) for o in scene.objects),
                tuple(o.label for o in scene.objects),
                questions[image_id],
            )
        )
    return examples


@dataclass
class RegionView:
    """An image's regions as one model sees them, with what the page shows about them."""

    image: Image.Image
    regions: object  # vlhub.RegionFeatures
    labels: list[str]
    seconds: float
    source: str

    def summary(self) -> str:
        return f"{len(self.regions)} regions ({self.source}), extracted in {self.seconds * 1000:.0f} ms"


def _region_labels(extractor, regions) -> list[str]:
    """Per region, the detector's most likely object class (and attribute) name, when the extractor names its
    classes; else nothing."""
    from ..processing.detector import RegionExtractor

    if not isinstance(extractor, RegionExtractor) or regions.class_probs is None:
        return []
    objects = [extractor.object_names[i - 1] for i in regions.class_probs[:, 1:].argmax(dim=1).add(1).tolist()]
    if regions.attribute_probs is None or regions.attribute_probs.shape[1] != len(extractor.attribute_names):
        return objects
    attributes = [extractor.attribute_names[i] for i in regions.attribute_probs.argmax(dim=1).tolist()]
    return [f"{a} {o}" for a, o in zip(attributes, objects)]


class VlhubApp:
    """The page's models and handlers. `models`: name → `AppModel`; `problems`: the folders that could not be opened,
    each with its one-line reason (shown in the page)."""

    def __init__(
        self,
        models: list[AppModel],
        problems: list[str] = (),
        examples: list[ExampleImage] = (),
        max_image_pixels: int = MAX_IMAGE_PIXELS,
    ) -> None:
        self.models = {}
        for model in models:
            if model.name in self.models:  # two folders of the same name (runs/a/x, runs/b/x): tell them apart
                model.name = str(model.folder)
            self.models[model.name] = model
        self.problems = list(problems)
        self.examples = list(examples)
        self._known_images = {}
        for example in self.examples:
            self._known_images[hashlib.sha256(example.path.read_bytes()).hexdigest()] = example
        self.max_image_pixels = max_image_pixels
        self._regions: OrderedDict[tuple[str, str], RegionView] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def from_folders(
        cls,
        folders: Iterable[str | Path],
        region_extractor: RegionExtractorLike | None = None,
        pack: bool | None = None,
        examples_dir: str | Path | None = None,
        max_image_pixels: int = MAX_IMAGE_PIXELS,
    ) -> "VlhubApp":
        """Open each folder (those that fail are listed in `problems`, not fatal); `examples_dir` receives the example
        images (None: no examples)."""
        models, problems = [], []
        for folder in folders:
            try:
                models.append(load_app_model(folder, region_extractor, pack))
            except AppInputError as err:
                problems.append(str(err))
        examples = example_images(examples_dir) if examples_dir is not None else []
        return cls(models, problems, examples, max_image_pixels)

    # -- inputs -------------------------------------------------------------------------------------------------
    def model(self, name: str | None, task: str | None = None) -> AppModel:
        if not self.models:
            raise AppInputError(
                "no model is open: " + ("; ".join(self.problems) or "start the app with --model FOLDER")
            )
        if name not in self.models:
            raise AppInputError(f"no open model is called {name!r}; open: {', '.join(self.models)}")
        model = self.models[name]
        if task is not None and task in model.unavailable:
            raise AppInputError(f"{TASK_LABELS[task]} is not available for {name}: {model.unavailable[task]}")
        return model

    def load_image(self, path: str | Path | None) -> tuple[Image.Image, str]:
        """The RGB image at `path` (an upload) and the digest of its bytes, or `AppInputError` saying what is wrong."""
        if path is None or not str(path):
            raise AppInputError("no image yet: upload one or pick an example")
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as err:
            raise AppInputError(f"the upload {path.name} cannot be read: {err.strerror or err}") from err
        try:
            with Image.open(path) as opened:
                width, height = opened.size
                if width * height > self.max_image_pixels:
                    raise AppInputError(
                        f"{path.name} is {width}x{height} pixels, more than the app's limit of "
                        f"{self.max_image_pixels:,} pixels: make it smaller"
                    )
                opened.load()
                image = opened.convert("RGB")
        except AppInputError:
            raise
        except (UnidentifiedImageError, Image.DecompressionBombError) as err:
            # (PIL's own message names the server's temporary copy, not the user's file)
            raise AppInputError(f"{path.name} is not an image the app can read (PNG, JPEG, WebP, ...)") from err
        except (OSError, SyntaxError, ValueError) as err:  # truncated or corrupt image data
            raise AppInputError(f"{path.name} is a damaged image: {str(err).replace(str(path), path.name)}") from err
        return image, hashlib.sha256(data).hexdigest()

    # -- handlers -----------------------------------------------------------------------------------------------
    def regions(self, name: str | None, path: str | Path | None) -> RegionView:
        """The regions `name`'s extractor finds in the image at `path` (kept for the next question). An example image
        of the shapes world gets its objects' boxes and descriptions, as the demo's region store does."""
        from ..data import ShapesRegionExtractor

        model = self.model(name)
        image, digest = self.load_image(path)
        key = (model.name, digest)
        with self._lock:
            if key in self._regions:
                self._regions.move_to_end(key)
                return self._regions[key]
        extractor = model.region_extractor
        example = self._known_images.get(digest)
        start = time.perf_counter()
        try:
            with torch.inference_mode():
                if example is not None and isinstance(extractor, ShapesRegionExtractor):
                    regions = extractor(image, boxes=[list(b) for b in example.boxes], labels=list(example.labels))
                    labels, source = list(example.labels), f"the shapes world's objects of {example.image_id}"
                else:
                    regions = model.pipeline.processor.regions_from_images([image])[0]
                    labels, source = _region_labels(extractor, regions), "found by the region extractor"
        except (ValueError, TypeError) as err:
            raise AppInputError(f"no regions from this image: {err}") from err
        view = RegionView(image, regions, labels, time.perf_counter() - start, source)
        with self._lock:
            self._regions[key] = view
            while len(self._regions) > _REGION_CACHE_SIZE:
                self._regions.popitem(last=False)
        return view

    def ask(self, name: str | None, path: str | Path | None, question: str | None, top_k: int = 5) -> list[dict]:
        """The VQA pipeline's top-`top_k` answers `[{"answer", "score"}]` to `question` about the image."""
        model = self.model(name, "vqa")
        if not question or not question.strip():
            raise AppInputError("type a question first")
        view = self.regions(name, path)
        return self._run(model, image=view.regions, question=question.strip(), top_k=top_k)

    def caption(self, name: str | None, path: str | Path | None, num_beams: int = 1) -> str:
        """The captioning pipeline's caption of the image: greedy (`num_beams` 1) or beam search."""
        model = self.model(name, "captioning")
        if int(num_beams) < 1:
            raise AppInputError(f"the beam size must be at least 1, got {num_beams}")
        view = self.regions(name, path)
        generate_kwargs = {"num_beams": int(num_beams)} if int(num_beams) > 1 else {}
        return self._run(model, view.regions, generate_kwargs=generate_kwargs)[0]["generated_text"]

    def rank(self, name: str | None, path: str | Path | None, texts: str | None) -> list[dict]:
        """The retrieval pipeline's ranking `[{"text", "score", "logit"}]` (best first) of the candidate texts, one per
        line (blank lines are not candidates)."""
        model = self.model(name, "retrieval")
        candidates = [line.strip() for line in (texts or "").splitlines() if line.strip()]
        if not candidates:
            raise AppInputError("type the candidate texts first, one per line")
        view = self.regions(name, path)
        return self._run(model, image=view.regions, texts=candidates)

    @staticmethod
    def _run(model: AppModel, *args, **kwargs):
        try:
            with torch.inference_mode():
                return model.pipeline(*args, **kwargs)
        except (ValueError, TypeError) as err:  # e.g. a text the tokenizer rejects, regions the model cannot take
            raise AppInputError(str(err)) from err
