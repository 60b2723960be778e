"""Model cards of trained checkpoints, rendered from the template in `model_cards/vlhub_training.md`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..version import __version__ as vlhub_version

__all__ = ["CardInfo", "write_training_card", "TEMPLATE_PATH"]

# Shipped inside the package (`model_cards/` at the repository root links to it), so installed copies find it.
TEMPLATE_PATH = Path(__file__).resolve().parents[1] / "model_cards" / "vlhub_training.md"


@dataclass
class CardInfo:
    """What a task tells the card about itself.

    title: the card's heading. summary: one paragraph on what the model does. trainer: "pretrain.py"/"finetune.py".
    dataset_name / dataset_description: what it was trained on. pipeline_tag: the Hub's task tag. usage: a Python
    snippet. metric_task: the task type recorded with the evaluation results (e.g. "visual-question-answering").
    baseline_note: a sentence comparing the result with a baseline (e.g. the majority answer), when there is one.
    """

    title: str
    summary: str
    trainer: str
    dataset_name: str
    dataset_description: str
    pipeline_tag: str | None
    usage: str
    metric_task: str
    base_model: str | None = None
    baseline_note: str | None = None
    tags: list[str] = field(default_factory=list)


def write_training_card(
    folder: str | os.PathLike,
    info: CardInfo,
    *,
    step: int,
    max_steps: int,
    command: str,
    hyperparameters: dict,
    eval_results: dict[str, float],
    template_path: str | os.PathLike = TEMPLATE_PATH,
) -> Path:
    """Write `folder/README.md`: metadata (with `model-index` evaluation results), data, command, settings, results."""
    import accelerate
    import torch
    import transformers
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    if not Path(template_path).is_file():
        raise FileNotFoundError(
            f"model card template not found at {template_path} (it ships in the package's model_cards/ folder)"
        )
    results = [
        EvalResult(
            task_type=info.metric_task,
            dataset_type=info.dataset_name,
            dataset_name=info.dataset_name,
            metric_type=name,
            metric_name=name,
            metric_value=float(value),
        )
        for name, value in eval_results.items()
    ]
    card_data = ModelCardData(
        library_name="transformers",
        pipeline_tag=info.pipeline_tag,
        tags=["vlhub", "region-features", *info.tags],
        base_model=info.base_model if info.base_model and not os.path.exists(info.base_model) else None,
        model_name=info.title,
        eval_results=results or None,
    )
    card = ModelCard.from_template(
        card_data,
        template_path=str(template_path),
        title=info.title,
        summary=info.summary,
        trainer=info.trainer,
        step=step,
        max_steps=max_steps,
        base_model=info.base_model,
        dataset_description=info.dataset_description,
        command=command,
        hyperparameters=sorted((k, _format(v)) for k, v in hyperparameters.items()),
        eval_results=[(k, _format(v)) for k, v in eval_results.items()],
        baseline_note=info.baseline_note,
        usage=info.usage.strip(),
        versions=[
            ("vlhub", vlhub_version),
            ("transformers", transformers.__version__),
            ("accelerate", accelerate.__version__),
            ("torch", torch.__version__),
        ],
    )
    path = Path(folder) / "README.md"
    card.save(path)
    return path


def _format(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value)) or "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}:{v:g}" if isinstance(v, (int, float)) else f"{k}:{v}" for k, v in value.items())
    return "-" if value is None else str(value)
