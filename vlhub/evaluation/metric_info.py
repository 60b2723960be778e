"""The `evaluate.MetricInfo` of the metric modules shipped with vlhub (vqa_accuracy, retrieval_recall, coco_caption)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import evaluate

__all__ = ["metric_info", "STRING_VS_STRINGS"]

# predictions: one string per example; references: several strings per example (answers, captions).
STRING_VS_STRINGS = ("string", "strings")


def _feature(kind: str):
    import datasets

    return {
        "string": datasets.Value("string"),
        "strings": datasets.Sequence(datasets.Value("string")),
        "int64": datasets.Value("int64"),
        "float64s": datasets.Sequence(datasets.Value("float64")),
    }[kind]


def metric_info(
    description: str, citation: str, inputs_description: str, kinds: tuple[str, str], **extra: Any
) -> evaluate.MetricInfo:
    """`evaluate.MetricInfo` whose features are `{"predictions": kinds[0], "references": kinds[1]}`, each kind one of
    "string", "strings" (a sequence of strings), "int64", "float64s" (a sequence of floats)."""
    import datasets
    import evaluate

    predictions, references = kinds
    return evaluate.MetricInfo(
        description=description,
        citation=citation,
        inputs_description=inputs_description,
        features=datasets.Features({"predictions": _feature(predictions), "references": _feature(references)}),
        **extra,
    )
