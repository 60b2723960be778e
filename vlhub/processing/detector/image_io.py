"""Images in, 8-bit RGB arrays out: the one place that decides how odd images are read.

Accepted: a path (str / os.PathLike), a `PIL.Image.Image`, or a numpy array `(H, W)`, `(H, W, 1)`, `(H, W, 3)`
(RGB) or `(H, W, 4)` (RGBA). Conversions (documented, not guessed):

- grayscale → the value repeated in R, G and B;
- alpha is dropped (not composited), as `PIL.Image.convert("RGB")` in the reference ports does;
- palette images → their RGB colours;
- 16-bit images (PIL modes "I;16*"/"I", numpy uint16) → 8 bit by `round(v / 257)` (65535 → 255); 16-bit colour
  PNGs are reduced to 8 bits by Pillow itself when it opens them;
- float arrays are refused (their range, 0..1 or 0..255, cannot be told apart).

A corrupt or truncated file, an image smaller than the detector's stride, or one above the pixel limit raises a
`ValueError` naming the image and the problem.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np
from PIL import Image, UnidentifiedImageError

__all__ = ["load_rgb_image", "as_image_list", "ImageInput"]

# One image in any form the detector reads (see the module docstring).
ImageInput = str | os.PathLike | Image.Image | np.ndarray


def as_image_list(images: ImageInput | Sequence[ImageInput]) -> tuple[list[ImageInput], bool]:
    """`(list of images, whether a single image was given)`."""
    if isinstance(images, (str, os.PathLike, Image.Image, np.ndarray)):
        return [images], True
    if isinstance(images, (list, tuple)):
        if not images:
            raise ValueError("no images given: pass a path, a PIL image, a numpy array or a non-empty list of them")
        return list(images), False
    raise TypeError(
        f"images must be a path, a PIL.Image, a numpy array (H, W[, C]) or a list of them, got {type(images).__name__}"
    )


def _sixteen_to_eight(values: np.ndarray, name: str) -> np.ndarray:
    values = values.astype(np.int64)
    if values.min() < 0 or values.max() > 65535:
        raise ValueError(f"{name}: 16-bit image values must lie in 0..65535, got {values.min()}..{values.max()}")
    return np.round(values / 257.0).astype(np.uint8)


def _from_pil(image: Image.Image, name: str) -> np.ndarray:
    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        gray = _sixteen_to_eight(np.asarray(image), name)
        return np.repeat(gray[:, :, None], 3, axis=2)
    if image.mode == "F":
        raise ValueError(f"{name}: floating-point images (PIL mode 'F') are not supported; convert to 8 or 16 bit")
    return np.asarray(image.convert("RGB"))


def _from_array(array: np.ndarray, name: str) -> np.ndarray:
    if array.dtype == np.uint16:
        array = _sixteen_to_eight(array, name)
    elif array.dtype != np.uint8:
        raise ValueError(
            f"{name}: numpy images must be uint8 (0..255) or uint16 (0..65535), got dtype {array.dtype}; "
            "scale float images to uint8 first"
        )
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3 or array.shape[2] not in (1, 3, 4):
        raise ValueError(
            f"{name}: numpy images must have shape (H, W), (H, W, 1), (H, W, 3) or (H, W, 4), got {array.shape}"
        )
    if array.shape[2] == 1:
        array = np.repeat(array, 3, axis=2)
    return np.ascontiguousarray(array[:, :, :3])


def load_rgb_image(image: ImageInput, name: str = "image", min_side: int = 16, max_pixels: int = 1 << 27) -> np.ndarray:
    """`(H, W, 3)` uint8 RGB array of one image (see the module docstring for the accepted forms)."""
    if isinstance(image, (str, os.PathLike)):
        path = os.fspath(image)
        name = f"{name} ({path!r})"
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{name}: no such image file")
        try:
            with Image.open(path) as opened:
                width, height = opened.size
                if width * height > max_pixels:
                    raise ValueError(f"{name}: {height}x{width} pixels is above the limit of {max_pixels} pixels")
                opened.load()  # decode now so truncated data fails here
                array = _from_pil(opened, name)
        except (UnidentifiedImageError, OSError, Image.DecompressionBombError, SyntaxError) as err:
            raise ValueError(f"{name}: cannot read the image (corrupt, truncated or not an image file): {err}") from err
    elif isinstance(image, Image.Image):
        width, height = image.size
        if width * height > max_pixels:
            raise ValueError(f"{name}: {height}x{width} pixels is above the limit of {max_pixels} pixels")
        array = _from_pil(image, name)
    elif isinstance(image, np.ndarray):
        array = _from_array(image, name)
    else:
        raise TypeError(f"{name}: expected a path, a PIL.Image or a numpy array, got {type(image).__name__}")
    height, width = array.shape[:2]
    if height < min_side or width < min_side:
        raise ValueError(
            f"{name}: {height}x{width} pixels is too small; the detector needs at least {min_side} pixels per side "
            "(its feature stride)"
        )
    if height * width > max_pixels:
        raise ValueError(f"{name}: {height}x{width} pixels is above the limit of {max_pixels} pixels")
    return array
