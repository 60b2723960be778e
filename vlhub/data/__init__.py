"""Datasets shipped with vlhub: the procedurally generated shapes world (the embedded default for training)."""

from .shapes import SHAPES_VOCAB_FILE, SPLITS, ShapesWorld, shapes_tokenizer
from .shapes_features import ShapesFeatureExtractor, ShapesRegionExtractor  # importing registers "shapes"
from .shapes_language import ANSWER_TYPES, ANSWER_VOCABULARY
from .shapes_scene import COLOURS, OBJECT_ATTRIBUTES, OBJECT_CLASSES, SHAPES, SIZES

__all__ = [
    "ANSWER_TYPES",
    "ANSWER_VOCABULARY",
    "COLOURS",
    "OBJECT_ATTRIBUTES",
    "OBJECT_CLASSES",
    "SHAPES",
    "SHAPES_VOCAB_FILE",
    "SIZES",
    "SPLITS",
    "ShapesFeatureExtractor",
    "ShapesRegionExtractor",
    "ShapesWorld",
    "shapes_tokenizer",
]
