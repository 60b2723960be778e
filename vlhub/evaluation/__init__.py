"""Evaluation: VQA accuracy, retrieval recall and the COCO caption metrics, as plain functions and as `evaluate` modules shipped in the
package (`vlhub.evaluation.load("vqa_accuracy")` works offline: nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .captions import CAPTION_METRICS, caption_scores
from .retrieval import DEFAULT_RECALL_KS, retrieval_chance, retrieval_recall
from .vqa import normalize_answer, vqa_accuracy_score

if TYPE_CHECKING:
    import evaluate

__all__ = [
    "CAPTION_METRICS",
    "caption_scores",
    "METRICS",
    "load",
    "metric_path",
    "normalize_answer",
    "retrieval_chance",
    "retrieval_recall",
    "vqa_accuracy_score",
    "DEFAULT_RECALL_KS",
]

_HERE = Path(__file__).parent
METRICS: tuple[str, ...] = ("vqa_accuracy", "retrieval_recall", "coco_caption")


def metric_path(name: str) -> Path:
    """Folder of the shipped `evaluate` module `name` (it holds `<name>.py`)."""
    if name not in METRICS:
        raise ValueError(f"unknown vlhub metric {name!r}; vlhub ships {list(METRICS)}")
    return _HERE / name


def load(name: str, **kwargs: Any) -> evaluate.EvaluationModule:
    """`evaluate.load` of a metric shipped with vlhub, from its local folder (keyword arguments go to
    `evaluate.load`, e.g. `experiment_id`, `num_process`, `process_id` for distributed evaluation)."""
    import evaluate

    return evaluate.load(str(metric_path(name)), **kwargs)
