"""`RegionFeatures`: the one structure every region source produces and every processor consumes.

A detector, a feature file in any of the original formats, or a user's own boxes all end up here; each
architecture's processor then turns it into that model's inputs. Validation happens on construction so a
bad region set fails where it was made, not deep inside a forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from ..utils.tensors import all_finite

__all__ = [
    "RegionFeatures",
    "FLOAT16_MAX",
    "MAX_IMAGE_SIDE",
    "FLOAT16_FEATURES",
    "check_float16_range",
    "mark_float16_exact",
    "marked_float16_exact",
]

# Boxes that poke out of the image by floating-point noise (detectors clip in float32) are accepted.
_BOX_TOLERANCE_PX = 1e-2
# The largest finite float16. Features stored or rounded to float16 (UNITER's feature files, float16 region stores)
# must stay within it: anything larger becomes inf, and inf becomes NaN logits.
FLOAT16_MAX = float(torch.finfo(torch.float16).max)  # 65504
# RegionFeatures.metadata key: True when `features` hold float16 values exactly (read from a float16 region store), so
# a processor that rounds features to float16 (UNITER's) has nothing to do. Selecting regions keeps it; code that
# puts other values into `features` must drop it.
FLOAT16_FEATURES = "vlhub_float16_features"
# Attribute a processor sets on a batch's `region_features` tensor when float16 holds every value exactly (each row a
# float16 store's features passed through unchanged, or padding): the tensor's version counter at that time, so that
# any in-place change afterwards voids the mark. `Float16RegionTransfer` then skips its exactness check.
_FLOAT16_EXACT_VERSION = "_vlhub_float16_exact_version"


def mark_float16_exact(values: torch.Tensor) -> None:
    """Mark `values` (which float16 holds exactly) as such, until it is next changed in place."""
    setattr(values, _FLOAT16_EXACT_VERSION, values._version)


def marked_float16_exact(values: torch.Tensor) -> bool:
    """Whether `values` carries `mark_float16_exact`'s mark and was not changed in place since."""
    return getattr(values, _FLOAT16_EXACT_VERSION, None) == values._version


# The largest image side in pixels: 2**24 is where float32 (boxes are float32) stops holding every integer pixel.
MAX_IMAGE_SIDE = 2**24


def check_float16_range(values: torch.Tensor, what: str) -> None:
    """Raise `ValueError` when finite `values` exceed the float16 range (|x| > 65504), which float16 rounding
    would turn into inf. `what` names the values in the message (e.g. "regions[3] features")."""
    values = values.detach()
    if values.numel() == 0:
        return
    low, high = torch.aminmax(values)  # no |values| copy; NaN compares False (finiteness is checked elsewhere)
    if -FLOAT16_MAX <= float(low) and float(high) <= FLOAT16_MAX:
        return
    too_large = values.abs() > FLOAT16_MAX
    if too_large.any():
        index = too_large.nonzero()[0]
        raise ValueError(
            f"{what} hold {values[tuple(index)].item():g} at index {index.tolist()}, beyond the float16 limit of "
            f"{FLOAT16_MAX:g}: rounding it to float16 would make it infinite (and the model's outputs NaN). Rescale "
            "the features, or keep them in float32 (float16_storage=False for the processor, feature_dtype='float32' "
            "for a region store)"
        )


def _as_float_tensor(name: str, value, ndim: int) -> torch.Tensor:
    if isinstance(value, np.ndarray):
        value = np.ascontiguousarray(value)
        if not value.flags.writeable:  # e.g. memory-mapped store files: torch wants a writable buffer
            value = value.copy()
        value = torch.from_numpy(value)
    elif not isinstance(value, torch.Tensor):
        try:
            value = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"RegionFeatures.{name} must be a tensor or array, got {type(value).__name__}") from err
    if not (value.is_floating_point() or value.dtype in (torch.int32, torch.int64, torch.uint8)):
        raise TypeError(f"RegionFeatures.{name} must hold numbers, got dtype {value.dtype}")
    if value.ndim != ndim:
        raise ValueError(f"RegionFeatures.{name} must have {ndim} dimensions, got shape {tuple(value.shape)}")
    value = value.detach().to(device="cpu", dtype=torch.float32)
    if not all_finite(value):
        bad = (~torch.isfinite(value)).nonzero()[0].tolist()
        raise ValueError(f"RegionFeatures.{name} contains NaN or infinite values (first at index {bad})")
    return value


@dataclass(eq=False)
class RegionFeatures:
    """Region features of one image.

    Args:
        features: `(num_regions, feature_dim)` float features, e.g. 2048-d pooled ResNet features.
        boxes: `(num_regions, 4)` boxes in pixels as `(x1, y1, x2, y2)`, inside the image.
        image_size: `(height, width)` of the image the boxes refer to, in pixels.
        class_probs: optional `(num_regions, num_classes)` detector class probabilities, background first.
        scores: optional `(num_regions,)` detector confidences (max non-background class probability).
        attribute_probs: optional `(num_regions, num_attributes)` attribute probabilities.

    Every tensor is stored as a float32 CPU tensor. Construction raises `ValueError`/`TypeError` naming the
    field at fault for: a wrong number of dimensions, zero regions, fields that disagree on the number of
    regions, NaN/inf values, boxes with x2 < x1 or y2 < y1, boxes outside the image, an image size that is not
    positive or exceeds `MAX_IMAGE_SIDE` (2**24) pixels. Features may be any finite float32; where they are rounded
    to float16 (UNITER's processor, float16 region stores) values beyond `FLOAT16_MAX` (65504) are refused there.
    """

    features: torch.Tensor
    boxes: torch.Tensor
    image_size: tuple[int, int]
    class_probs: torch.Tensor | None = None
    scores: torch.Tensor | None = None
    attribute_probs: torch.Tensor | None = None
    metadata: dict = field(default_factory=dict)

    def __post_init__(self):
        self.features = _as_float_tensor("features", self.features, 2)
        self.boxes = _as_float_tensor("boxes", self.boxes, 2)
        num_regions = self.features.shape[0]
        if num_regions == 0:
            raise ValueError("RegionFeatures needs at least one region, got features of shape (0, ...)")
        if self.features.shape[1] == 0:
            raise ValueError("RegionFeatures.features has feature dimension 0")
        if self.boxes.shape != (num_regions, 4):
            raise ValueError(
                f"RegionFeatures.boxes must have shape ({num_regions}, 4) (x1, y1, x2, y2 in pixels) to match "
                f"features {tuple(self.features.shape)}, got {tuple(self.boxes.shape)}"
            )
        self.image_size = self._check_image_size(self.image_size)
        self._check_boxes()
        for name, ndim in (("class_probs", 2), ("scores", 1), ("attribute_probs", 2)):
            value = getattr(self, name)
            if value is None:
                continue
            value = _as_float_tensor(name, value, ndim)
            if value.shape[0] != num_regions:
                raise ValueError(f"RegionFeatures.{name} has {value.shape[0]} rows but there are {num_regions} regions")
            setattr(self, name, value)

    @staticmethod
    def _check_image_size(image_size) -> tuple[int, int]:
        try:
            height, width = (float(v) for v in image_size)
        except (TypeError, ValueError, OverflowError) as err:
            raise ValueError(f"RegionFeatures.image_size must be (height, width), got {image_size!r}") from err
        if any(isinstance(v, (bool, np.bool_)) for v in image_size):
            raise ValueError(f"RegionFeatures.image_size must be numbers (height, width), got {image_size!r}")
        if not (height > 0 and width > 0) or not (np.isfinite(height) and np.isfinite(width)):
            raise ValueError(f"RegionFeatures.image_size must be positive (height, width), got {image_size!r}")
        if height > MAX_IMAGE_SIDE or width > MAX_IMAGE_SIDE:
            raise ValueError(
                f"RegionFeatures.image_size must be at most {MAX_IMAGE_SIDE} pixels a side (float32 boxes lose whole "
                f"pixels beyond it), got {image_size!r}"
            )
        # Integral sizes stay ints (pixels); fractional ones are kept for stores that only know
        # normalised boxes (image_size=(1, 1) and boxes in [0, 1]).
        return tuple(int(v) if float(v).is_integer() else v for v in (height, width))

    def _check_boxes(self):
        x1, y1, x2, y2 = self.boxes.unbind(-1)
        bad = ((x2 < x1) | (y2 < y1)).nonzero().flatten()
        if len(bad):
            i = bad[0].item()
            raise ValueError(
                f"RegionFeatures.boxes must be (x1, y1, x2, y2) with x2 >= x1 and y2 >= y1; box {i} is "
                f"{self.boxes[i].tolist()}"
            )
        height, width = self.image_size
        tol = _BOX_TOLERANCE_PX if float(width) > 2 else 1e-6
        outside = ((x1 < -tol) | (y1 < -tol) | (x2 > width + tol) | (y2 > height + tol)).nonzero().flatten()
        if len(outside):
            i = outside[0].item()
            raise ValueError(
                f"RegionFeatures.boxes must lie inside the image of (height, width) = {self.image_size}; box {i} is "
                f"{self.boxes[i].tolist()} (pixels, x1 y1 x2 y2)"
            )

    # ------------------------------------------------------------------ accessors
    def __len__(self) -> int:
        return self.features.shape[0]

    @property
    def num_regions(self) -> int:
        return self.features.shape[0]

    @property
    def feature_dim(self) -> int:
        return self.features.shape[1]

    @property
    def height(self) -> int | float:
        return self.image_size[0]

    @property
    def width(self) -> int | float:
        return self.image_size[1]

    def normalized_boxes(self) -> torch.Tensor:
        """`(num_regions, 4)` boxes divided by (width, height, width, height)."""
        scale = torch.tensor([self.width, self.height, self.width, self.height], dtype=torch.float32)
        return self.boxes / scale

    def select(self, indices: Sequence[int] | torch.Tensor) -> "RegionFeatures":
        """A new RegionFeatures holding only `indices`, in that order."""
        index = torch.as_tensor(indices, dtype=torch.long)
        if index.numel() == 0:
            raise ValueError("RegionFeatures.select needs at least one index")

        if index.min() < -len(self) or index.max() >= len(self):
            raise IndexError(f"RegionFeatures.select: index out of range for {len(self)} regions: {index.tolist()}")
        return self.take(index.remainder(len(self)))  # negative indices count from the end, as with t[index]

    def take(self, index: torch.Tensor) -> "RegionFeatures":
        """`select` without checking `index`: for a long tensor of valid indices in `[0, len(self))` (e.g. from
        sorting this image's scores)."""

        def take(t):  # index_select: a third of advanced indexing's cost on a (36, 2048) image
            return None if t is None else t.index_select(0, index)

        return RegionFeatures.from_validated(
            features=take(self.features),
            boxes=take(self.boxes),
            image_size=self.image_size,
            class_probs=take(self.class_probs),
            scores=take(self.scores),
            attribute_probs=take(self.attribute_probs),
            metadata=dict(self.metadata),
        )

    @classmethod
    def from_validated(
        cls,
        features: torch.Tensor,
        boxes: torch.Tensor,
        image_size: tuple,
        class_probs: torch.Tensor | None = None,
        scores: torch.Tensor | None = None,
        attribute_probs: torch.Tensor | None = None,
        metadata: dict | None = None,
    ) -> "RegionFeatures":
        """Build without checking again: for float32 CPU tensors that already passed this class's validation (a vlhub
        region store validated them when they were written; `select` takes a subset of checked values)."""
        regions = cls.__new__(cls)
        regions.features, regions.boxes, regions.image_size = features, boxes, tuple(image_size)
        regions.class_probs, regions.scores, regions.attribute_probs = class_probs, scores, attribute_probs
        regions.metadata = {} if metadata is None else metadata
        return regions

    @classmethod
    def from_normalized_boxes(
        cls,
        features: torch.Tensor | np.ndarray,
        normalized_boxes: torch.Tensor | np.ndarray,
        image_size: tuple[int, int] | None = None,
        **kwargs: Any,
    ) -> "RegionFeatures":
        """Build from boxes in [0, 1] (x1, y1, x2, y2). Without `image_size` the boxes stay normalised and the
        image size is recorded as (1, 1), which every processor treats exactly like pixels of a 1×1 image."""
        boxes = _as_float_tensor("boxes", normalized_boxes, 2)
        if image_size is None:
            return cls(features=features, boxes=boxes, image_size=(1, 1), **kwargs)
        height, width = image_size
        scale = torch.tensor([width, height, width, height], dtype=torch.float32)
        return cls(features=features, boxes=boxes * scale, image_size=image_size, **kwargs)

    def to_dict(self) -> dict:
        """Plain tensors (for stores); `from_dict` inverts it."""
        out = {
            "features": self.features,
            "boxes": self.boxes,
            "image_size": torch.tensor(self.image_size, dtype=torch.float64),
        }
        for name in ("class_probs", "scores", "attribute_probs"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "RegionFeatures":
        missing = [k for k in ("features", "boxes", "image_size") if k not in data]
        if missing:
            raise KeyError(f"region data is missing the field(s) {missing}; has {sorted(data)}")
        size = data["image_size"]
        size = tuple(size.tolist()) if hasattr(size, "tolist") else tuple(size)
        return cls(
            features=data["features"],
            boxes=data["boxes"],
            image_size=size,
            class_probs=data.get("class_probs"),
            scores=data.get("scores"),
            attribute_probs=data.get("attribute_probs"),
        )

    def __repr__(self) -> str:
        extras = [n for n in ("class_probs", "scores", "attribute_probs") if getattr(self, n) is not None]
        return (
            f"RegionFeatures(num_regions={self.num_regions}, feature_dim={self.feature_dim}, "
            f"image_size={self.image_size}, extras={extras})"
        )
