"""Datasets keyed by `SampleKey` and the collators that turn their examples into model inputs.

`CaptionDataset` yields `{"image_id", "caption", "objective", "seed"}`; `PretrainingCollator` looks the regions up,
runs the model's processor (the same one used at inference) and applies the batch's objective.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from ..processing.regions import RegionFeatures, marked_float16_exact
from .masking import random_token_ids
from .objectives import Objective, ObjectiveContext
from .sampling import SampleKey, example_rng

if TYPE_CHECKING:
    from ..processing.processor_base import VisionLanguageProcessor

__all__ = ["CaptionDataset", "PretrainingCollator", "RegionLookup", "Float16RegionTransfer", "InlineSmallTensors"]

RegionLookup = Mapping[str, RegionFeatures]


class CaptionDataset(Dataset):
    """(image_id, caption) pairs read by `SampleKey` (or a plain index, for inspection).

    `pairs`: a sequence of `(image_id, caption)`.
    """

    def __init__(self, pairs: Sequence[tuple[str, str]]) -> None:
        self.pairs = pairs if isinstance(pairs, Sequence) else list(pairs)  # CaptionPairs stay Arrow columns
        for i, (image_id, caption) in enumerate(self.pairs[:1000]):
            if not isinstance(caption, str) or not caption.strip():
                raise ValueError(f"caption {i} (image {image_id!r}) is empty or not a string: {caption!r}")

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, key: SampleKey | int) -> dict:
        if isinstance(key, SampleKey):
            image_id, caption = self.pairs[key.index]
            return {"image_id": image_id, "caption": caption, "objective": key.objective, "seed": key.seed}
        image_id, caption = self.pairs[key]
        return {"image_id": image_id, "caption": caption}


class PretrainingCollator:
    """Examples of one objective → the model's inputs and targets for that objective.

    Args:
        processor: the model's processor (tokenizer + region processor).
        regions: image_id → `RegionFeatures` (a `RegionStore`, a dict, ...).
        objectives: name → `Objective` (the mix's objectives).
        image_ids: the images mismatched pairs are drawn from (default: every image in `regions`).
        pairs: the caption table `(image_id, caption)` random captions are drawn from (objectives that replace the
            caption of a pair, as ViLBERT's); default: none (such objectives then use the batch's other captions).
        mlm_probability, region_mask_probability, itm_negative_probability: 0.15, 0.15, 0.5 as the original.
        contradict: `(image_id, caption, rng) -> a caption false of that image, or None` (the data's hard ITM
            negatives, e.g. `ShapesWorld.contradicting_caption`); None: mismatched pairs only swap images.
        itm_hard_negative_probability: share of mismatched pairs made with `contradict` (0: none, as the original).

    Returns a dict of tensors plus `"objective"` (the model's `objective=` argument, when the objective has one).
    """

    def __init__(
        self,
        processor: VisionLanguageProcessor,
        regions: RegionLookup,
        objectives: Mapping[str, Objective],
        image_ids: Sequence[str] | None = None,
        mlm_probability: float = 0.15,
        region_mask_probability: float = 0.15,
        itm_negative_probability: float = 0.5,
        pairs: Sequence[tuple[str, str]] | None = None,
        contradict: Callable[[str, str, np.random.Generator], str | None] | None = None,
        itm_hard_negative_probability: float = 0.0,
    ) -> None:
        for name, value in (
            ("mlm_probability", mlm_probability),
            ("region_mask_probability", region_mask_probability),
            ("itm_negative_probability", itm_negative_probability),
            ("itm_hard_negative_probability", itm_hard_negative_probability),
        ):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        self.processor = processor
        self.regions = regions
        self._batch_regions: dict[str, RegionFeatures] = {}
        self.objectives = dict(objectives)
        # Kept as given: an `ArrowStrings` of millions of ids stays in Arrow memory.
        self.image_ids = image_ids if image_ids is not None else list(regions.keys())
        needing = sorted(o.name for o in self.objectives.values() if o.needs_other_images)
        if needing and (len(self.image_ids) < 2 or len(set(self.image_ids[:2])) < 2 and len(set(self.image_ids)) < 2):
            raise ValueError(f"objective(s) {needing} pair captions with other images: at least two images are needed")
        self.context = ObjectiveContext(
            tokenizer=processor.tokenizer,
            random_token_ids=random_token_ids(processor.tokenizer),
            mlm_probability=mlm_probability,
            region_mask_probability=region_mask_probability,
            itm_negative_probability=itm_negative_probability,
            encode=self.encode,
            other_image=self.random_other_image,
            other_caption=self.random_other_caption if pairs is not None else None,
            contradict=contradict,
            itm_hard_negative_probability=itm_hard_negative_probability,
        )
        self.pairs = pairs

    def lookup(self, image_id: str) -> RegionFeatures:
        if image_id in self._batch_regions:
            return self._batch_regions[image_id]
        try:
            return self.regions[image_id]
        except KeyError:
            raise KeyError(f"no region features for image {image_id!r} in the region store") from None

    def encode(self, examples: Sequence[dict]) -> tuple[dict, list[RegionFeatures]]:
        """Processor inputs for the examples' captions and images, and each example's selected regions (in the
        order the processor keeps them, so per-region targets line up with `region_features`)."""
        selector = self.processor.feature_extractor
        regions = [selector.select(self.lookup(e["image_id"])) for e in examples]
        inputs = self.processor(text=[e["caption"] for e in examples], regions=regions, return_tensors="pt")
        return dict(inputs), regions

    def random_other_image(self, image_id: str, rng: np.random.Generator) -> str:
        if self._batch_regions:  # a streamed batch: the other image comes from the batch itself
            others = [other for other in self._batch_regions if other != image_id]
            if not others:
                raise ValueError(
                    "a streamed batch holds captions of one image only, so no caption can be paired "
                    "with another image; raise --per_device_train_batch_size or --shuffle_buffer_size"
                )
            return others[int(rng.integers(len(others)))]
        while True:
            candidate = self.image_ids[int(rng.integers(len(self.image_ids)))]
            if candidate != image_id:
                return candidate

    def random_other_caption(self, image_id: str, rng: np.random.Generator) -> str:
        """A caption drawn uniformly from the whole caption table, redrawn while it belongs to `image_id`."""
        for _ in range(1000):
            other_id, caption = self.pairs[int(rng.integers(len(self.pairs)))]
            if other_id != image_id:
                return caption
        raise ValueError(
            f"1000 random captions of the caption table all belong to image {image_id!r}: a mismatched "
            "caption needs captions of other images"
        )

    def __call__(self, examples: Sequence[dict]) -> dict:
        names = {e["objective"] for e in examples}
        if len(names) != 1:
            raise ValueError(f"a pre-training batch must hold one objective, got {sorted(names)}")
        objective = self.objectives[names.pop()]
        rngs = [example_rng(SampleKey(0, objective.name, tuple(e["seed"]))) for e in examples]
        # Streamed examples bring their regions (`StreamedCaptionBatches`); in insertion order, so draws are stable.
        self._batch_regions = {e["image_id"]: e["regions"] for e in examples if "regions" in e}
        try:
            batch = objective.build(self.context, examples, rngs)
        finally:
            self._batch_regions = {}
        if objective.model_objective is not None:
            batch["objective"] = objective.model_objective
        return batch


class Float16RegionTransfer:
    """Wraps a collate function run in DataLoader workers: a batch's `region_features` that float16 holds exactly
    (features stored as float16, as UNITER's are) leave the worker as float16; others stay float32.

    Every batch a worker returns is copied into new shared memory, whose pages are faulted in anew each time:
    measured on 2 cores, 15 ms for a batch's 9.4 MB of float32 features against 6 ms for the same values as float16
    (the check, bit for bit, ~1.3 ms). Every vlhub model casts `region_features` to its own dtype first, so its
    outputs are unchanged. Picklable, like the function it wraps.
    """

    def __init__(self, function: Callable[[Sequence[Any]], dict]) -> None:
        self.function = function

    def __call__(self, examples: Sequence[Any]) -> dict:
        batch = self.function(examples)
        features = batch.get("region_features")
        if isinstance(features, torch.Tensor) and features.dtype == torch.float32:
            halved = features.to(torch.float16)
            # The processor marks features a float16 store gave it unchanged: exact without checking.
            if marked_float16_exact(features) or _same_bits(halved.to(torch.float32), features):
                batch["region_features"] = halved
        return batch


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two float32 tensors of one shape hold the same bits, i.e. the receiver of the float16 copy gets back
    exactly these values. Compared as int64 words where the layout allows (0.9 against 1.6 ms for `torch.equal` on a
    batch's features), else as int32."""
    try:
        return torch.equal(a.view(torch.int64), b.view(torch.int64))
    except RuntimeError:  # an int64 view needs an even last dimension of stride 1
        return torch.equal(a.view(torch.int32), b.view(torch.int32))


class InlineSmallTensors:
    """Wraps a collate function run in DataLoader workers: the batch's small tensors (ids, masks, labels, locations:
    up to `max_bytes` each) travel to the main process inside the pickled batch, as bytes, instead of each in a new
    shared-memory segment whose file descriptor the main process fetches over a socket. The main process gets the
    same tensors (dtype, shape, values; contiguous, in ordinary memory). Measured on 2 cores, a batch of 8 small
    tensors and one of 4.7 MB: 5.7-8.0 against 11-13 ms a batch from 2 workers, 1.9 against 3.5-4.7 ms of the main
    process's time. Large tensors (the region features) still go through shared memory. Picklable."""

    def __init__(self, function: Callable[[Sequence[Any]], dict], max_bytes: int = 128 << 10) -> None:
        self.function = function
        self.max_bytes = max_bytes

    def __call__(self, examples: Sequence[Any]) -> dict:
        batch = self.function(examples)
        if isinstance(batch, MutableMapping):
            for key, value in batch.items():
                if _inlinable(value, self.max_bytes):
                    batch[key] = _InlineTensor(value)
        return batch


_INLINE_DTYPES = {
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.float32,
    torch.float64,
}


def _inlinable(value, max_bytes: int) -> bool:
    return (
        type(value) is torch.Tensor
        and value.device.type == "cpu"
        and value.dtype in _INLINE_DTYPES
        and not value.requires_grad
        and value.is_contiguous()
        and not value.__dict__
        and value.numel() * value.element_size() <= max_bytes
    )


class _InlineTensor:
    """A tensor that pickles as its bytes and unpickles as a tensor again (`InlineSmallTensors`)."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def __reduce__(self):
        tensor = self.tensor
        return _rebuild_tensor, (tensor.numpy().tobytes(), tensor.dtype, tuple(tensor.shape))


def _rebuild_tensor(data: bytes, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)
