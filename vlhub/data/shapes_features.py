"""The shapes world's region extractor (for any image with boxes): a fixed convolutional backbone + RoIAlign.

Registered as `region_extractor_type` "shapes" (see `vlhub.processing.region_extractors`) when this module is
imported, e.g. by `import vlhub.data`.

The backbone is not trained: its filters are designed by hand, so the weights are the same numbers on every
machine and the features mean something a tiny model can learn from quickly:

- channel 0, *foreground*: how far a pixel's colour is from the background colour (the median of the image
  border), squashed to [0, 1];
- channels 1–3, *colour*: the RGB value where there is foreground (0 on the background);
- channels 4–5, *hue*: (cos, sin) of the pixel's hue angle where there is foreground — colour names are sectors of
  the hue circle, so they are linearly separable here (they are not in RGB: orange lies between red and yellow);
- channels 6–9, *edges*: the absolute response of oriented 3×3 derivative filters (0°, 90°, 45°, 135°) to the
  foreground map — squares have axis-aligned edges, diamonds diagonal ones, triangles both, circles all.

`torchvision.ops.roi_align` pools each channel over each box on a `pool_size × pool_size` grid (the foreground
grid is the object's silhouette), and a fixed ±1/√feature_dim random projection (integers from
`np.random.default_rng(projection_seed)`) maps the `10 · pool_size²` values to `feature_dim`. Features agree across
machines to float32 rounding of the convolutions. Without boxes, the extractor finds the objects itself
(`detect_boxes`: connected foreground blobs), which on shapes-world images gives exactly the ground-truth boxes.
Without labels, it names each region's object itself (`describe_objects`: the palette colour nearest to the
silhouette's mean colour, the shape whose drawn silhouette overlaps it best, the size from the box), so regions of a
raw image carry `class_probs` and `attribute_probs` as a detector's would: Unified VLP's region vector needs them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torchvision.ops import roi_align

from ..processing.region_extractors import (
    REGION_EXTRACTOR_TYPE_KEY,
    read_region_extractor_config,
    register_region_extractor,
)
from ..processing.detector.image_io import load_rgb_image
from ..processing.regions import RegionFeatures
from ..utils.arguments import check_positive_int
from .shapes_scene import COLOURS, OBJECT_ATTRIBUTES, OBJECT_CLASSES, SHAPES, shape_silhouette, size_from_extent

__all__ = ["ShapesRegionExtractor", "ShapesFeatureExtractor", "NUM_BACKBONE_CHANNELS"]

_FOREGROUND_THRESHOLD = 0.15  # summed |RGB - background| (in [0, 3]) below which a pixel is background noise
_FOREGROUND_RAMP = 0.30  # … and above threshold + ramp it is fully foreground
_MIN_OBJECT_PIXELS = 4  # smaller foreground blobs are not reported as objects by `detect_boxes`
_EDGE_FILTERS = (
    ((-1, 0, 1), (-2, 0, 2), (-1, 0, 1)),  # vertical edges (horizontal gradient)
    ((-1, -2, -1), (0, 0, 0), (1, 2, 1)),  # horizontal edges
    ((0, 1, 2), (-1, 0, 1), (-2, -1, 0)),  # 45° edges
    ((-2, -1, 0), (-1, 0, 1), (0, 1, 2)),  # 135° edges
)
NUM_BACKBONE_CHANNELS = 1 + 3 + 2 + len(_EDGE_FILTERS)

ImageLike = str | os.PathLike | Image.Image | np.ndarray | torch.Tensor
ImageBoxes = torch.Tensor | Sequence[Sequence[float]]  # one image's (num_boxes, 4) pixel boxes
CONFIG_NAME = "config.json"
EXTRACTOR_TYPE = "shapes"
# The most pixels one image may have: 2048 x 2048. The backbone holds ~14 float32 maps of the image (~250 MB here), and
# `detect_boxes` takes ~10 s on a picture of noise this size (the shapes world's pictures are 128 x 128).
MAX_IMAGE_PIXELS = 1 << 22  # `region_extractor_type` in config.json, telling loaders which class wrote the folder


def _check_pixels(height: int, width: int, index: int) -> None:
    if height * width > MAX_IMAGE_PIXELS:
        raise ValueError(
            f"images[{index}]: {height}x{width} pixels is above the shapes extractor's limit of "
            f"{MAX_IMAGE_PIXELS} pixels"
        )


def _overlap(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two boolean masks aligned at their top-left corners."""
    height, width = max(a.shape[0], b.shape[0]), max(a.shape[1], b.shape[1])
    padded = np.zeros((2, height, width), dtype=bool)
    padded[0, : a.shape[0], : a.shape[1]] = a
    padded[1, : b.shape[0], : b.shape[1]] = b
    return (padded[0] & padded[1]).sum() / (padded[0] | padded[1]).sum()


def _best_matching_shape(silhouette: np.ndarray) -> str:
    """The shape whose silhouette, as the shapes world draws it at the half extents that fit this box, overlaps
    `silhouette` (an object's foreground cropped to its box) the most."""
    extent = max(silhouette.shape)
    half_extents = range(max(1, extent // 2 - 1), extent // 2 + 2)
    return max(SHAPES, key=lambda shape: max(_overlap(silhouette, shape_silhouette(shape, r)) for r in half_extents))


def _to_pixel_values(image: ImageLike, index: int) -> torch.Tensor:
    """`(3, H, W)` float32 in [0, 1] from an image path, a PIL image, an `(H, W, 3)` uint8 array, or a `(3, H, W)`
    float tensor. Paths and PIL images are read by the detector's loader (`load_rgb_image`: its readable errors for
    damaged files, decompression bombs and sizes), every image is held to `MAX_IMAGE_PIXELS`."""
    if isinstance(image, (str, os.PathLike, Image.Image)):
        image = load_rgb_image(image, f"images[{index}]", min_side=1, max_pixels=MAX_IMAGE_PIXELS)
    if isinstance(image, np.ndarray):
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise ValueError(
                f"images[{index}] must be an (height, width, 3) uint8 RGB array, got shape {image.shape} and dtype "
                f"{image.dtype}"
            )
        _check_pixels(*image.shape[:2], index)
        return torch.from_numpy(np.array(image, copy=True)).permute(2, 0, 1).float() / 255.0
    if isinstance(image, torch.Tensor):
        if image.ndim != 3 or image.shape[0] != 3 or not image.is_floating_point():
            raise ValueError(
                f"images[{index}] as a tensor must be (3, height, width) float in [0, 1], got shape "
                f"{tuple(image.shape)} and dtype {image.dtype}"
            )
        _check_pixels(*image.shape[1:], index)
        return image.float()
    raise TypeError(
        f"images[{index}] must be an image path, a PIL image, a numpy array or a tensor, got {type(image).__name__}"
    )


def _connected_components(mask: torch.Tensor) -> torch.Tensor:
    """A label per pixel of the `(H, W)` bool `mask`, equal for pixels of one 8-connected foreground blob (the
    smallest flat index in it); background pixels keep their own index.

    Hook and compress (Shiloach-Vishkin): each round every blob's root hooks onto the smallest root among its
    neighbouring pixels, then pointer jumping makes every pixel point at its root. Every blob still to merge takes
    part in a merge each round, so their number at least halves: at most log2(H·W) + 1 rounds of O(H·W log) work,
    whatever the blobs' shapes (propagating labels pixel by pixel needed one pass per pixel of a blob's longest path:
    minutes for a 512-pixel serpentine line)."""
    height, width = mask.shape
    index = torch.arange(height * width).view(height, width)
    sources, targets = [], []
    for dy, dx in ((0, 1), (1, 0), (1, 1), (1, -1)):  # each 8-neighbour pair once
        x0, x1 = max(0, -dx), width - max(0, dx)
        both = mask[: height - dy, x0:x1] & mask[dy:, x0 + dx : x1 + dx]
        sources.append(index[: height - dy, x0:x1][both])
        targets.append(index[dy:, x0 + dx : x1 + dx][both])
    sources, targets = torch.cat(sources), torch.cat(targets)
    parent = index.reshape(-1).clone()
    max_rounds = int(np.log2(height * width + 1)) + 2
    for _ in range(max_rounds + 1):
        low = torch.minimum(parent[sources], parent[targets])
        high = torch.maximum(parent[sources], parent[targets])
        if torch.equal(low, high):
            return parent.view(height, width)
        parent.scatter_reduce_(0, high, low, "amin")
        while True:  # pointer jumping: halves every path, so log2(H·W) passes at most
            grandparent = parent[parent]
            if torch.equal(grandparent, parent):
                break
            parent = grandparent
    raise RuntimeError(f"connected components did not settle in {max_rounds} rounds on a {height}x{width} mask")


class ShapesRegionExtractor:
    """Images + boxes → `RegionFeatures` through a fixed convolutional backbone and RoIAlign.

    Args:
        feature_dim: size of each region's feature vector.
        pool_size: RoIAlign output grid (pool_size × pool_size per channel).
        include_whole_image: prepend a region covering the whole image (class background, no attribute). Off by
            default: the shapes world's regions are its objects, as a detector's would be.
        class_smoothing: probability mass spread uniformly over the other object classes in `class_probs` (the
            true class keeps `1 - class_smoothing`), so targets look like a detector's soft class distribution.
        projection_seed: seed of the fixed ±1 projection from `NUM_BACKBONE_CHANNELS · pool_size²` to
            `feature_dim`.

    Call with one image and its `(num_boxes, 4)` pixel boxes `(x1, y1, x2, y2)` (and optionally the object labels,
    e.g. `"large red circle"`, which fill `class_probs`/`attribute_probs`), or with lists of them for a batch.
    Every region gets `scores = 1` (ground-truth boxes are certain).
    """

    def __init__(
        self,
        feature_dim: int = 128,
        pool_size: int = 4,
        include_whole_image: bool = False,
        class_smoothing: float = 0.1,
        projection_seed: int = 0,
    ) -> None:
        feature_dim = check_positive_int(feature_dim, "feature_dim")
        pool_size = check_positive_int(pool_size, "pool_size")
        if not 0.0 <= class_smoothing < 1.0:
            raise ValueError(f"class_smoothing must be in [0, 1), got {class_smoothing}")
        self.feature_dim = feature_dim
        self.pool_size = pool_size
        self.include_whole_image = include_whole_image
        self.class_smoothing = class_smoothing
        self.projection_seed = projection_seed
        self.edge_filters = torch.tensor(_EDGE_FILTERS, dtype=torch.float32).unsqueeze(1) / 4.0  # (4, 1, 3, 3)
        raw_dim = NUM_BACKBONE_CHANNELS * pool_size * pool_size
        signs = np.random.default_rng(projection_seed).integers(0, 2, size=(raw_dim, feature_dim)) * 2 - 1
        self.projection = torch.from_numpy(signs.astype(np.float32)) / float(np.sqrt(feature_dim))
        self._label_index = {}
        for class_id, name in enumerate(OBJECT_CLASSES[1:], start=1):
            for attribute_id, size in enumerate(OBJECT_ATTRIBUTES[1:], start=1):
                self._label_index[f"{size} {name}"] = (class_id, attribute_id)

    # ------------------------------------------------------------------------------------------------ backbone
    @staticmethod
    def foreground(pixel_values: torch.Tensor) -> torch.Tensor:
        """`(batch, 3, H, W)` → `(batch, 1, H, W)` in [0, 1]: distance of each pixel's colour from the background colour
        (the per-channel median of the image border)."""
        border = torch.cat(
            [pixel_values[:, :, 0, :], pixel_values[:, :, -1, :], pixel_values[:, :, :, 0], pixel_values[:, :, :, -1]],
            dim=2,
        )
        background = border.median(dim=2).values[:, :, None, None]
        distance = (pixel_values - background).abs().sum(dim=1, keepdim=True)
        return ((distance - _FOREGROUND_THRESHOLD) / _FOREGROUND_RAMP).clamp(0.0, 1.0)

    def backbone(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """`(batch, 3, H, W)` in [0, 1] → `(batch, NUM_BACKBONE_CHANNELS, H, W)` feature maps."""
        foreground = self.foreground(pixel_values)
        colour = pixel_values * foreground
        red, green, blue = pixel_values.unbind(dim=1)
        # Hue as a point on the unit circle: colour names are sectors of it, so they become linearly separable.
        hue = torch.atan2(3.0**0.5 * (green - blue), 2.0 * red - green - blue).unsqueeze(1)
        hue = torch.cat([hue.cos(), hue.sin()], dim=1) * foreground
        edges = F.conv2d(foreground, self.edge_filters, padding=1).abs()
        return torch.cat([foreground, colour, hue, edges], dim=1)

    def pool(self, feature_maps: torch.Tensor, boxes: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """RoIAlign over each image's `(num_boxes, 4)` pixel boxes → per image `(num_boxes, feature_dim)`."""
        pooled = roi_align(
            feature_maps, list(boxes), output_size=self.pool_size, spatial_scale=1.0, sampling_ratio=2, aligned=True
        )
        features = pooled.flatten(1) @ self.projection
        return list(features.split([len(b) for b in boxes]))

    def detect_boxes(self, pixel_values: torch.Tensor) -> list[torch.Tensor]:
        """Objects of `(batch, 3, H, W)` images as `(num_objects, 4)` pixel boxes, one per 8-connected foreground blob
        of at least `_MIN_OBJECT_PIXELS` pixels, ordered by (y1, x1): the shapes world's "detector"."""
        boxes = []
        for mask in self.foreground(pixel_values)[:, 0] > 0.5:
            height, width = mask.shape
            labels = _connected_components(mask)
            rows, cols = mask.nonzero(as_tuple=True)
            blobs, blob_of = labels[rows, cols].unique(return_inverse=True)

            def reduce(values, how):
                return torch.full((len(blobs),), -1, dtype=values.dtype).scatter_reduce(
                    0, blob_of, values, how, include_self=False
                )

            y1, x1, y2, x2 = (
                reduce(rows, "amin"),
                reduce(cols, "amin"),
                reduce(rows, "amax") + 1,
                reduce(cols, "amax") + 1,
            )
            last_pixel = reduce(rows * width + cols, "amax")
            large = torch.bincount(blob_of, minlength=len(blobs)) >= _MIN_OBJECT_PIXELS
            # (y1, x1), ties by each blob's last pixel: the order the earlier label propagation gave
            order = sorted(large.nonzero()[:, 0].tolist(), key=lambda b: (int(y1[b]), int(x1[b]), int(last_pixel[b])))
            image_boxes = torch.stack([x1, y1, x2, y2], dim=1)[order] if order else torch.empty(0, 4)
            boxes.append(image_boxes.to(torch.float32).reshape(-1, 4))
        return boxes

    def describe_objects(self, pixel_values: torch.Tensor, boxes: torch.Tensor) -> list[str | None]:
        """The shapes-world description (`"<size> <colour> <shape>"`) of the object in each of one `(3, H, W)`
        image's `(num_boxes, 4)` pixel boxes, read from its foreground silhouette: the shapes world's detector head.
        None for a box without foreground (background, as a detector would class it)."""
        silhouette = self.foreground(pixel_values[None])[0, 0] > 0.5
        height, width = silhouette.shape
        palette = torch.tensor(list(COLOURS.values()), dtype=torch.float32) / 255.0
        labels = []
        for x1, y1, x2, y2 in boxes.round().long().tolist():
            x1, y1, x2, y2 = max(x1, 0), max(y1, 0), min(x2, width), min(y2, height)
            mask = silhouette[y1:y2, x1:x2]
            if x2 <= x1 or y2 <= y1 or not mask.any():
                labels.append(None)
                continue
            colour = pixel_values[:, y1:y2, x1:x2][:, mask].mean(dim=1)
            colour_name = list(COLOURS)[int((palette - colour).norm(dim=1).argmin())]
            shape = _best_matching_shape(mask.numpy())
            size = size_from_extent(max(x2 - x1, y2 - y1), (height + width) / 2)
            labels.append(f"{size} {colour_name} {shape}")
        return labels

    # ---------------------------------------------------------------------------------------------- extraction
    def _targets(self, labels: Sequence[str | None], index: int, described: bool) -> tuple[torch.Tensor, torch.Tensor]:
        num_classes = len(OBJECT_CLASSES)
        class_probs = torch.zeros(len(labels), num_classes)
        attribute_probs = torch.zeros(len(labels), len(OBJECT_ATTRIBUTES))
        for row, label in enumerate(labels):
            if label is None and described:  # a described box without foreground: background, no attribute
                class_probs[row, 0] = attribute_probs[row, 0] = 1.0
                continue
            if label not in self._label_index:
                raise ValueError(
                    f"labels[{index}][{row}] = {label!r} is not a shapes-world object; expected '<size> <colour> "
                    f"<shape>', e.g. 'large red circle'"
                )
            class_id, attribute_id = self._label_index[label]
            class_probs[row, 1:] = self.class_smoothing / (num_classes - 2)
            class_probs[row, class_id] = 1.0 - self.class_smoothing
            attribute_probs[row, attribute_id] = 1.0
        return class_probs, attribute_probs

    def _box_tensor(self, boxes, index: int, num_labels: int | None) -> torch.Tensor:
        tensor = torch.as_tensor(np.asarray(boxes, dtype=np.float32))
        if tensor.numel() == 0:
            tensor = tensor.reshape(0, 4)
        if tensor.ndim != 2 or tensor.shape[1] != 4:
            raise ValueError(
                f"boxes[{index}] must be (num_boxes, 4) pixel boxes x1 y1 x2 y2, got {tuple(tensor.shape)}"
            )
        if num_labels is not None and num_labels != len(tensor):
            raise ValueError(f"image {index} has {len(tensor)} boxes but {num_labels} labels; pass one label per box")
        return tensor

    @staticmethod
    def _one_hot_first(rows: torch.Tensor) -> torch.Tensor:
        first = torch.zeros(1, rows.shape[1])
        first[0, 0] = 1.0
        return torch.cat([first, rows])

    def __call__(
        self,
        images: ImageLike | Sequence[ImageLike],
        boxes: ImageBoxes | Sequence[ImageBoxes] | None = None,
        labels: Sequence[str] | Sequence[Sequence[str]] | None = None,
    ) -> RegionFeatures | list[RegionFeatures]:
        """Region features of one image or a list of images.

        Args:
            images: an image (path, PIL image, `(H, W, 3)` uint8 array or `(3, H, W)` float tensor in [0, 1]) or a
                list of them.
            boxes: per image, `(num_boxes, 4)` pixel boxes `(x1, y1, x2, y2)`; None finds the objects with
                `detect_boxes` (for images of the shapes world, exactly their ground-truth boxes).
            labels: per image, one object description per box (`"<size> <colour> <shape>"`), filling `class_probs`
                and `attribute_probs`; None describes each region's object from its pixels (`describe_objects`).

        Returns a `RegionFeatures` for a single image, a list for a list.
        """
        single = not isinstance(images, (list, tuple))
        if single:
            images = [images]
            boxes = None if boxes is None else [boxes]
            labels = None if labels is None else [labels]
        for name, value in (("box sets", boxes), ("label sets", labels)):
            if value is not None and len(value) != len(images):
                raise ValueError(f"got {len(images)} images but {len(value)} {name}; pass one per image")
        pixel_values = [_to_pixel_values(image, i) for i, image in enumerate(images)]
        same_size = len({tuple(p.shape) for p in pixel_values}) == 1
        if boxes is None:
            boxes = (
                self.detect_boxes(torch.stack(pixel_values))
                if same_size
                else [self.detect_boxes(p[None])[0] for p in pixel_values]
            )
        box_tensors = []
        for i, (pixels, image_boxes) in enumerate(zip(pixel_values, boxes)):
            image_boxes = self._box_tensor(image_boxes, i, None if labels is None else len(labels[i]))
            if self.include_whole_image:
                height, width = pixels.shape[1:]
                image_boxes = torch.cat([torch.tensor([[0.0, 0.0, float(width), float(height)]]), image_boxes])
            if len(image_boxes) == 0:
                raise ValueError(
                    f"image {i} has no regions (no boxes given or no object found); pass boxes, or use "
                    "include_whole_image=True"
                )
            box_tensors.append(image_boxes)
        described = labels is None
        if described:  # the whole-image region is background by construction
            labels = [
                self.describe_objects(p, b[1:] if self.include_whole_image else b)
                for p, b in zip(pixel_values, box_tensors)
            ]
        if same_size:  # one backbone pass for the batch
            features = self.pool(self.backbone(torch.stack(pixel_values)), box_tensors)
        else:
            features = [self.pool(self.backbone(p[None]), [b])[0] for p, b in zip(pixel_values, box_tensors)]
        results = []
        for i, (pixels, image_boxes, image_features) in enumerate(zip(pixel_values, box_tensors, features)):
            class_probs, attribute_probs = self._targets(list(labels[i]), i, described)
            if self.include_whole_image:  # the whole image is background with no attribute
                class_probs, attribute_probs = self._one_hot_first(class_probs), self._one_hot_first(attribute_probs)
            results.append(
                RegionFeatures(
                    features=image_features,
                    boxes=image_boxes,
                    image_size=tuple(pixels.shape[1:]),
                    class_probs=class_probs,
                    attribute_probs=attribute_probs,
                    scores=torch.ones(len(image_boxes)),
                )
            )
        return results[0] if single else results

    # --------------------------------------------------------------------------------------------- persistence
    def to_dict(self) -> dict:
        """The settings that rebuild this extractor exactly (its weights are derived from them)."""
        return {
            REGION_EXTRACTOR_TYPE_KEY: EXTRACTOR_TYPE,
            "feature_dim": self.feature_dim,
            "pool_size": self.pool_size,
            "include_whole_image": self.include_whole_image,
            "class_smoothing": self.class_smoothing,
            "projection_seed": self.projection_seed,
        }

    def save_pretrained(self, save_directory: str | os.PathLike) -> None:
        """Write `config.json` (the settings; the fixed weights follow from them)."""
        directory = Path(save_directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / CONFIG_NAME).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> "ShapesRegionExtractor":
        """Load a folder written by `save_pretrained`."""
        _, settings = read_region_extractor_config(directory, EXTRACTOR_TYPE)
        return cls(**settings)

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items() if k != REGION_EXTRACTOR_TYPE_KEY)
        return f"{type(self).__name__}({settings})"


ShapesFeatureExtractor = ShapesRegionExtractor  # the name before "region extractor" became the one name for the concept

register_region_extractor(EXTRACTOR_TYPE, ShapesRegionExtractor)
