"""Scenes of the shapes world: what objects an image holds, where they are, and their pixels.

Rasterisation is done with numpy on the pixel-centre grid (a pixel belongs to a shape when its centre lies inside
it), not with an anti-aliasing drawing library, so an image depends only on the sampled integers and IEEE
arithmetic: identical on every machine. Random numbers come from `np.random.default_rng` and only its
`integers` method is used.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

__all__ = [
    "COLOURS",
    "SHAPES",
    "SIZES",
    "MAX_OBJECTS_LIMIT",
    "OBJECT_CLASSES",
    "OBJECT_ATTRIBUTES",
    "ShapeObject",
    "Scene",
    "sample_scene",
    "spatial_relation",
    "size_from_extent",
    "shape_silhouette",
]

# Palette: name → RGB. Far apart from each other and from the pale backgrounds below.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (215, 35, 35),
    "green": (30, 160, 60),
    "blue": (35, 75, 215),
    "yellow": (235, 205, 30),
    "purple": (145, 50, 185),
    "orange": (240, 130, 20),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "diamond")
SIZES: tuple[str, ...] = ("small", "large")
# Counts are answers of a fixed vocabulary ("0" … "6"), so a world may hold at most this many objects.
MAX_OBJECTS_LIMIT = 6

# The region label spaces, laid out like a detector's (background / no-attribute first): a class is colour + shape
# (what masked-region classification predicts), the attribute is the size.
OBJECT_CLASSES: tuple[str, ...] = ("__background__", *(f"{c} {s}" for c in COLOURS for s in SHAPES))
OBJECT_ATTRIBUTES: tuple[str, ...] = ("__no_attribute__", *SIZES)

_BACKGROUNDS: tuple[tuple[int, int, int], ...] = ((236, 236, 236), (242, 236, 222), (226, 234, 240), (232, 240, 228))
_BACKGROUND_NOISE = 6  # ± grey levels per pixel: "uniform-ish"
_COLOUR_JITTER = 12  # ± levels per channel per object, so no two reds are byte-identical
# Half extent (centre to edge, pixels) as a fraction of the image side; the gap between small and large keeps sizes
# unambiguous from the box alone.
_HALF_EXTENT = {"small": (0.065, 0.085), "large": (0.13, 0.16)}
_MARGIN_PX = 2  # between an object and the image border
_GAP_PX = 3  # between the boxes of two objects
_MAX_PLACEMENT_TRIES = 200
# A spatial relation is stated only when one axis clearly dominates (ratio) and the offset is visible (pixels).
_RELATION_RATIO = 1.5
_RELATION_MIN_OFFSET = 0.06  # of the image side


@dataclass(frozen=True)
class ShapeObject:
    """One object. `box` is `(x1, y1, x2, y2)` in pixels (pixel edges: the object covers columns x1 … x2-1)."""

    shape: str
    colour: str
    size: str
    center: tuple[int, int]  # (x, y) in pixels
    half_extent: int
    box: tuple[int, int, int, int]

    @property
    def label(self) -> str:
        """Its description, e.g. `"large red circle"`."""
        return f"{self.size} {self.colour} {self.shape}"


@dataclass(frozen=True)
class Scene:
    """An image `(height, width, 3)` uint8 and the objects drawn on it (in drawing order)."""

    image: np.ndarray
    objects: tuple[ShapeObject, ...]

    @property
    def image_size(self) -> tuple[int, int]:
        return self.image.shape[0], self.image.shape[1]


def _shape_mask(shape: str, cx: int, cy: int, r: int, size: int) -> np.ndarray:
    """Boolean `(size, size)` mask of the pixels whose centres lie inside the shape (computed on the shape's own
    window only: the rest of the image is outside)."""
    mask = np.zeros((size, size), dtype=bool)
    x0, y0 = max(cx - r - 1, 0), max(cy - r - 1, 0)
    x1, y1 = min(cx + r + 1, size), min(cy + r + 1, size)
    dx = (np.arange(x0, x1, dtype=np.float64) + 0.5)[None, :] - cx
    dy = (np.arange(y0, y1, dtype=np.float64) + 0.5)[:, None] - cy
    if shape == "circle":
        inside = dx * dx + dy * dy <= r * r
    elif shape == "square":
        inside = (np.abs(dx) <= r) & (np.abs(dy) <= r)
    elif shape == "diamond":
        inside = np.abs(dx) + np.abs(dy) <= r
    elif shape == "triangle":  # apex at the top centre, base along the bottom edge of the 2r × 2r square
        from_top = dy + r
        inside = (from_top >= 0) & (dy <= r) & (np.abs(dx) <= from_top / 2)
    else:
        raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")
    mask[y0:y1, x0:x1] = inside
    return mask


def _mask_box(mask: np.ndarray) -> tuple[int, int, int, int]:
    rows = np.flatnonzero(mask.any(axis=1))
    cols = np.flatnonzero(mask.any(axis=0))
    return int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1


def _overlaps(box, other, gap: int) -> bool:
    return not (
        box[2] + gap <= other[0] or other[2] + gap <= box[0] or box[3] + gap <= other[1] or other[3] + gap <= box[1]
    )


def _choice(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


def sample_scene(rng: np.random.Generator, image_size: int, min_objects: int, max_objects: int) -> Scene:
    """Draw a scene: a pale noisy background and `min_objects … max_objects` non-overlapping objects.

    When objects do not fit after `_MAX_PLACEMENT_TRIES` tries (tiny images), the scene keeps those already placed
    if that is at least `min_objects`; otherwise it is an error naming the image size.
    """
    count = int(rng.integers(min_objects, max_objects + 1))
    background = np.array(_choice(rng, _BACKGROUNDS), dtype=np.int16)
    noise = rng.integers(-_BACKGROUND_NOISE, _BACKGROUND_NOISE + 1, size=(image_size, image_size, 3))
    canvas = background[None, None, :] + noise.astype(np.int16)
    colour_names = tuple(COLOURS)
    objects: list[ShapeObject] = []
    for _ in range(count):
        shape, colour, size = _choice(rng, SHAPES), _choice(rng, colour_names), _choice(rng, SIZES)
        low, high = _HALF_EXTENT[size]
        r = int(rng.integers(max(2, round(low * image_size)), max(2, round(high * image_size)) + 1))
        jitter = rng.integers(-_COLOUR_JITTER, _COLOUR_JITTER + 1, size=3)
        placed = None
        for _try in range(_MAX_PLACEMENT_TRIES):
            lo, hi = r + _MARGIN_PX, image_size - r - _MARGIN_PX
            if hi < lo:
                break
            cx, cy = int(rng.integers(lo, hi + 1)), int(rng.integers(lo, hi + 1))
            mask = _shape_mask(shape, cx, cy, r, image_size)
            box = _mask_box(mask)
            if not any(_overlaps(box, o.box, _GAP_PX) for o in objects):
                placed = ShapeObject(shape, colour, size, (cx, cy), r, box)
                break
        if placed is None:
            break
        canvas[mask] = np.array(COLOURS[colour], dtype=np.int16) + jitter.astype(np.int16)
        objects.append(placed)
    if len(objects) < min_objects:
        raise ValueError(
            f"could not place {min_objects} non-overlapping objects on a {image_size}x{image_size} image; use a "
            "larger image_size or fewer objects"
        )
    image = np.clip(canvas, 0, 255).astype(np.uint8)
    return Scene(image=image, objects=tuple(objects))


@functools.lru_cache(maxsize=None)
def shape_silhouette(shape: str, half_extent: int) -> np.ndarray:
    """The boolean mask `sample_scene` draws for `shape` with `half_extent`, cropped to its box (read-only)."""
    side = 2 * half_extent + 4
    mask = _shape_mask(shape, side // 2, side // 2, half_extent, side)
    x1, y1, x2, y2 = _mask_box(mask)
    silhouette = mask[y1:y2, x1:x2].copy()
    silhouette.flags.writeable = False
    return silhouette


def size_from_extent(extent: int, image_side: int) -> str:
    """The size name of an object whose box is `extent` pixels across (its longer side) on an image `image_side`
    pixels across: the threshold lies half-way between the largest small and the smallest large half extent."""
    threshold = (_HALF_EXTENT["small"][1] + _HALF_EXTENT["large"][0]) * image_side + 1  # extent ~ 2 * half + 1
    return "large" if extent > threshold else "small"


def spatial_relation(a: ShapeObject, b: ShapeObject, image_size: int) -> tuple[str, str] | None:
    """Where `a` is relative to `b`: `(relation, secondary)`, relation in left/right/above/below along the dominant
    axis and `secondary` the relation along the other axis (what a careless annotator might say). None when
    neither axis clearly dominates or the objects are too close to tell."""
    dx = a.center[0] - b.center[0]
    dy = a.center[1] - b.center[1]
    horizontal = "left" if dx < 0 else "right"
    vertical = "above" if dy < 0 else "below"
    min_offset = _RELATION_MIN_OFFSET * image_size
    if abs(dx) >= _RELATION_RATIO * abs(dy) and abs(dx) >= min_offset:
        return horizontal, vertical
    if abs(dy) >= _RELATION_RATIO * abs(dx) and abs(dy) >= min_offset:
        return vertical, horizontal
    return None
