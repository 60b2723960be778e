"""Resize and normalise an RGB image the way each reference port does."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from .configuration import DetectorConfig

__all__ = ["PreparedImage", "resized_size", "prepare_image"]


@dataclass
class PreparedImage:
    """One image ready for the backbone.

    `tensor`: `(3, h, w)` float32, channels in the config's `input_format`, `(x - mean) / std`.
    `original_size` / `resized_size`: `(H, W)` / `(h, w)` in pixels. `scale`: the resize factor as computed (for
    box scaling the Caffe way); `scales_yx`: `(H / h, W / w)` (for box scaling the detectron2 / HF way).
    """

    tensor: torch.Tensor
    original_size: tuple[int, int]
    resized_size: tuple[int, int]
    scale: float

    @property
    def scales_yx(self) -> tuple[float, float]:
        return (self.original_size[0] / self.resized_size[0], self.original_size[1] / self.resized_size[1])


def resized_size(height: int, width: int, min_size: int, max_size: int) -> tuple[tuple[int, int], float]:
    """Shortest edge to `min_size`, longest capped at `max_size`, rounded half up (`int(x + 0.5)`) as in
    detectron2's / the HF port's `ResizeShortestEdge`. Returns `((new_h, new_w), scale)`."""
    scale = min_size / min(height, width)
    if height < width:
        new_h, new_w = min_size, scale * width
    else:
        new_h, new_w = scale * height, min_size
    if max(new_h, new_w) > max_size:
        cap = max_size / max(new_h, new_w)
        new_h, new_w = new_h * cap, new_w * cap
        scale *= cap
    return (int(new_h + 0.5), int(new_w + 0.5)), scale


def prepare_image(rgb: np.ndarray, config: DetectorConfig) -> PreparedImage:
    """`rgb`: `(H, W, 3)` uint8. Resizes with the configured backend, orders channels, normalises."""
    height, width = rgb.shape[:2]
    (new_h, new_w), scale = resized_size(height, width, config.min_size, config.max_size)
    if min(new_h, new_w) < config.feature_stride:
        raise ValueError(
            f"a {height}x{width} image resizes to {new_h}x{new_w}, smaller than the feature stride "
            f"{config.feature_stride}; its aspect ratio is too extreme for this detector"
        )
    channels = rgb[:, :, ::-1] if config.input_format == "BGR" else rgb
    if config.resize_backend == "pil":
        # detectron2: Pillow bilinear on the uint8 array (antialiased when shrinking, rounded to uint8).
        resized = np.asarray(Image.fromarray(np.ascontiguousarray(channels)).resize((new_w, new_h), Image.BILINEAR))
        image = torch.from_numpy(resized.astype(np.float32)).permute(2, 0, 1)
    else:
        # MMF / HF port: bilinear interpolation of the float image, no antialiasing.
        image = torch.from_numpy(np.ascontiguousarray(channels)).permute(2, 0, 1).float()
        if (new_h, new_w) != (height, width):
            image = F.interpolate(image[None], size=(new_h, new_w), mode="bilinear", align_corners=False)[0]
    mean = torch.tensor(config.pixel_mean, dtype=torch.float32).view(3, 1, 1)
    std = torch.tensor(config.pixel_std, dtype=torch.float32).view(3, 1, 1)
    return PreparedImage(((image - mean) / std).contiguous(), (height, width), (new_h, new_w), scale)
