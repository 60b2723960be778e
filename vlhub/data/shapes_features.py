"""Region features for the shapes world (or any image with boxes): a fixed convolutional backbone + RoIAlign.

The backbone is not trained: its filters are designed by hand, so the weights are the same numbers on every
machine and the features mean something a tiny model can learn from quickly:

- channel 0, *foreground*: how far a pixel's colour is from the background colour (the median of the image
  border), squashed to [0, 1];
- channels 1–3, *colour*: the RGB value where there is foreground (0 on the background);
- channels 4–7, *edges*: the absolute response of oriented 3×3 derivative filters (0°, 90°, 45°, 135°) to the
  foreground map — squares have axis-aligned edges, diamonds diagonal ones, triangles both, circles all.

`torchvision.ops.roi_align` pools each channel over each box on a `pool_size × pool_size` grid (the foreground
grid is the object's silhouette), and a fixed ±1 random projection (integers from
`np.random.default_rng(projection_seed)`) maps the `8 · pool_size²` values to `feature_dim`. Features agree across
machines to float32 rounding of the convolutions.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torchvision.ops import roi_align

from ..processing.regions import RegionFeatures
from .shapes_scene import OBJECT_ATTRIBUTES, OBJECT_CLASSES

__all__ = ["ShapesFeatureExtractor"]

_FOREGROUND_THRESHOLD = 0.15  # summed |RGB - background| (in [0, 3]) below which a pixel is background noise
_FOREGROUND_RAMP = 0.30  # … and above threshold + ramp it is fully foreground
_EDGE_FILTERS = (
    ((-1, 0, 1), (-2, 0, 2), (-1, 0, 1)),  # vertical edges (horizontal gradient)
    ((-1, -2, -1), (0, 0, 0), (1, 2, 1)),  # horizontal edges
    ((0, 1, 2), (-1, 0, 1), (-2, -1, 0)),  # 45° edges
    ((-2, -1, 0), (-1, 0, 1), (0, 1, 2)),  # 135° edges
)
NUM_BACKBONE_CHANNELS = 1 + 3 + 2 + len(_EDGE_FILTERS)

ImageLike = Image.Image | np.ndarray | torch.Tensor


def _to_pixel_values(image: ImageLike, index: int) -> torch.Tensor:
    """`(3, H, W)` float32 in [0, 1] from a PIL image, an `(H, W, 3)` uint8 array, or a `(3, H, W)` float tensor."""
    if isinstance(image, Image.Image):
        image = np.asarray(image.convert("RGB"))
    if isinstance(image, np.ndarray):
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise ValueError(
                f"images[{index}] must be an (height, width, 3) uint8 RGB array, got shape {image.shape} and dtype "
                f"{image.dtype}"
            )
        return torch.from_numpy(np.array(image, copy=True)).permute(2, 0, 1).float() / 255.0
    if isinstance(image, torch.Tensor):
        if image.ndim != 3 or image.shape[0] != 3 or not image.is_floating_point():
            raise ValueError(
                f"images[{index}] as a tensor must be (3, height, width) float in [0, 1], got shape "
                f"{tuple(image.shape)} and dtype {image.dtype}"
            )
        return image.float()
    raise TypeError(f"images[{index}] must be a PIL image, a numpy array or a tensor, got {type(image).__name__}")


class ShapesFeatureExtractor:
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
    ):
        if feature_dim < 1:
            raise ValueError(f"feature_dim must be a positive integer, got {feature_dim}")
        if pool_size < 1:
            raise ValueError(f"pool_size must be a positive integer, got {pool_size}")
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
    def backbone(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """`(batch, 3, H, W)` in [0, 1] → `(batch, NUM_BACKBONE_CHANNELS, H, W)` feature maps."""
        border = torch.cat(
            [pixel_values[:, :, 0, :], pixel_values[:, :, -1, :], pixel_values[:, :, :, 0], pixel_values[:, :, :, -1]],
            dim=2,
        )
        background = border.median(dim=2).values[:, :, None, None]
        distance = (pixel_values - background).abs().sum(dim=1, keepdim=True)
        foreground = ((distance - _FOREGROUND_THRESHOLD) / _FOREGROUND_RAMP).clamp(0.0, 1.0)
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

    # ---------------------------------------------------------------------------------------------- extraction
    def _targets(self, labels: Sequence[str], index: int) -> tuple[torch.Tensor, torch.Tensor]:
        num_classes = len(OBJECT_CLASSES)
        class_probs = torch.zeros(len(labels), num_classes)
        attribute_probs = torch.zeros(len(labels), len(OBJECT_ATTRIBUTES))
        for row, label in enumerate(labels):
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

    def __call__(self, images, boxes, labels=None) -> RegionFeatures | list[RegionFeatures]:
        """One image (PIL / `(H, W, 3)` uint8 / `(3, H, W)` float tensor) with `(num_boxes, 4)` boxes → RegionFeatures;
        lists of images, boxes (and labels) → a list."""
        single = not isinstance(images, (list, tuple))
        if single:
            images, boxes = [images], [boxes]
            labels = None if labels is None else [labels]
        if len(boxes) != len(images) or (labels is not None and len(labels) != len(images)):
            raise ValueError(
                f"got {len(images)} images, {len(boxes)} box sets and "
                f"{'no' if labels is None else len(labels)} label sets: pass one of each per image"
            )
        pixel_values = [_to_pixel_values(image, i) for i, image in enumerate(images)]
        box_tensors = []
        for i, (pixels, image_boxes) in enumerate(zip(pixel_values, boxes)):
            image_boxes = torch.as_tensor(np.asarray(image_boxes, dtype=np.float32))
            if image_boxes.numel() == 0:
                image_boxes = image_boxes.reshape(0, 4)
            if image_boxes.ndim != 2 or image_boxes.shape[1] != 4:
                raise ValueError(f"boxes[{i}] must be (num_boxes, 4) pixel boxes x1 y1 x2 y2, got {tuple(image_boxes.shape)}")
            if labels is not None and len(labels[i]) != len(image_boxes):
                raise ValueError(f"image {i} has {len(image_boxes)} boxes but {len(labels[i])} labels")
            if self.include_whole_image:
                height, width = pixels.shape[1:]
                whole = torch.tensor([[0.0, 0.0, float(width), float(height)]])
                image_boxes = torch.cat([whole, image_boxes])
            box_tensors.append(image_boxes)
        # Same-sized images go through the backbone as one batch.
        sizes = {tuple(p.shape) for p in pixel_values}
        if len(sizes) == 1:
            feature_maps = [self.backbone(torch.stack(pixel_values))]
            features = self.pool(feature_maps[0], box_tensors)
        else:
            features = [self.pool(self.backbone(p[None]), [b])[0] for p, b in zip(pixel_values, box_tensors)]
        results = []
        for i, (pixels, image_boxes, image_features) in enumerate(zip(pixel_values, box_tensors, features)):
            class_probs = attribute_probs = None
            if labels is not None:
                class_probs, attribute_probs = self._targets(list(labels[i]), i)
                if self.include_whole_image:
                    background = torch.zeros(1, len(OBJECT_CLASSES))
                    background[0, 0] = 1.0
                    no_attribute = torch.zeros(1, len(OBJECT_ATTRIBUTES))
                    no_attribute[0, 0] = 1.0
                    class_probs = torch.cat([background, class_probs])
                    attribute_probs = torch.cat([no_attribute, attribute_probs])
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
