"""One PNG per example the demo shows: the image with its regions drawn and labelled, and the model's answers
(question and answer, top-ranked captions, generated caption) written beside it. Drawn with Pillow's `ImageDraw`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from .utils.files import atomic_write

__all__ = ["ExamplePicture", "write_example_picture", "draw_regions"]

_SCALE = 4  # the shapes world's 64-pixel images are drawn 4x larger
_TEXT_WIDTH = 440
_LINE_HEIGHT = 14
_MARGIN = 8
_BOX_COLOUR = (20, 20, 20)
_TEXT_COLOUR = (10, 10, 10)
_HEADING_COLOUR = (40, 70, 160)


@dataclass
class ExamplePicture:
    """What one picture shows.

    Attributes:
        image: `(height, width, 3)` uint8 RGB array or a PIL image.
        boxes: `(num_regions, 4)` pixel boxes `x1 y1 x2 y2` of the regions the model saw.
        title: first line (e.g. the image id).
        region_labels: a short label per box (e.g. "large red circle"), or empty.
        sections: (heading, lines) pairs written beside the image, e.g. ("VQA", ["Q: ...", "A: ..."]).
    """

    image: np.ndarray | Image.Image
    boxes: Sequence[Sequence[float]]
    title: str
    region_labels: Sequence[str] = ()
    sections: list[tuple[str, list[str]]] = field(default_factory=list)


def _wrap(text: str, font, width: int, draw: ImageDraw.ImageDraw) -> list[str]:
    lines, current = [], ""
    for word in text.split(" "):
        candidate = f"{current} {word}".strip()
        if current and draw.textlength(candidate, font=font) > width:
            lines.append(current)
            current = word
        else:
            current = candidate
    return [*lines, current] if current else lines


def write_example_picture(path: str | os.PathLike, example: ExamplePicture) -> str:
    """Draw `example` and write it as a PNG to `path` (atomically); returns the path."""
    if example.region_labels and len(example.region_labels) != len(example.boxes):
        raise ValueError(f"{len(example.region_labels)} region labels for {len(example.boxes)} boxes")
    scaled = draw_regions(example.image, example.boxes, scale=_SCALE)
    font = ImageFont.load_default()
    measure = ImageDraw.Draw(scaled)
    text_lines: list[tuple[str, tuple[int, int, int]]] = [(example.title, _HEADING_COLOUR)]
    if example.region_labels:
        text_lines.append(
            ("regions: " + "; ".join(f"{i}: {label}" for i, label in enumerate(example.region_labels)), _TEXT_COLOUR)
        )
    for heading, lines in example.sections:
        text_lines.append((heading, _HEADING_COLOUR))
        text_lines += [(line, _TEXT_COLOUR) for line in lines]
    wrapped = [
        (part, colour)
        for text, colour in text_lines
        for part in (_wrap(text, font, _TEXT_WIDTH - 2 * _MARGIN, measure) or [""])
    ]
    height = max(scaled.height, len(wrapped) * _LINE_HEIGHT) + 2 * _MARGIN
    canvas = Image.new("RGB", (scaled.width + _TEXT_WIDTH + 2 * _MARGIN, height), (255, 255, 255))
    canvas.paste(scaled, (_MARGIN, _MARGIN))
    draw = ImageDraw.Draw(canvas)
    x = scaled.width + 2 * _MARGIN
    for row, (line, colour) in enumerate(wrapped):
        draw.text((x, _MARGIN + row * _LINE_HEIGHT), line, fill=colour, font=font)
    atomic_write(path, lambda temporary: canvas.save(temporary, format="PNG"))
    return str(path)


def draw_regions(
    image: np.ndarray | Image.Image, boxes: Sequence[Sequence[float]], labels: Sequence[str] = (), scale: int = 1
) -> Image.Image:
    """`image` (array or PIL image) enlarged `scale` times (nearest neighbour, so small images stay crisp) with its
    regions' boxes drawn, each numbered by its index and followed by its label when `labels` has one per box."""
    image = image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(image))
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    if labels and len(labels) != len(boxes):
        raise ValueError(f"{len(labels)} region labels for {len(boxes)} boxes")
    if len(boxes) and (boxes[:, 2] < boxes[:, 0]).any() | (boxes[:, 3] < boxes[:, 1]).any():
        raise ValueError("boxes must be x1 y1 x2 y2 with x2 >= x1 and y2 >= y1")
    drawn = image.convert("RGB").resize((image.width * scale, image.height * scale), Image.NEAREST)
    draw, font = ImageDraw.Draw(drawn), ImageFont.load_default()
    for i, box in enumerate(boxes):
        x1, y1, x2, y2 = (float(v) * scale for v in box)
        draw.rectangle((x1, y1, x2, y2), outline=_BOX_COLOUR, width=2)
        text = f"{i} {labels[i]}" if labels else str(i)
        left, top, right, bottom = draw.textbbox((x1 + 2, y1 + 1), text, font=font)
        if labels:  # a label runs over the picture: on a white ground so it stays readable
            draw.rectangle((left - 1, top - 1, right + 1, bottom + 1), fill=(255, 255, 255))
        draw.text((x1 + 2, y1 + 1), text, fill=_BOX_COLOUR, font=font)
    return drawn
