"""vlhub's pipelines, registered with transformers' pipeline registry on `import vlhub`.

transformers 5 removed its own "visual-question-answering" pipeline and (since 5.2x) lists the task in
`transformers.pipelines.REMOVED_TASKS`, which `pipeline()` consults *before* the registry — so even a registered
pipeline raises KeyError. `register_pipelines` withdraws exactly that entry (and its "vqa" alias) and registers
vlhub's pipeline in its place. This is the one place vlhub touches transformers' module globals;
tests/test_pipelines.py fails if a transformers upgrade changes the mechanism.
"""

from __future__ import annotations

import transformers.pipelines as _transformers_pipelines
from transformers import AutoModelForVisualQuestionAnswering
from transformers.pipelines import PIPELINE_REGISTRY

from .image_text_retrieval import AutoModelForImageTextRetrieval, ImageTextRetrievalPipeline
from .visual_question_answering import VisualQuestionAnsweringPipeline

__all__ = [
    "AutoModelForImageTextRetrieval",
    "ImageTextRetrievalPipeline",
    "VisualQuestionAnsweringPipeline",
    "register_pipelines",
]

_WITHDRAWN_TASKS = ("visual-question-answering", "vqa")


def register_pipelines() -> None:
    removed = getattr(_transformers_pipelines, "REMOVED_TASKS", None)
    if isinstance(removed, dict):
        for task in _WITHDRAWN_TASKS:
            removed.pop(task, None)
    _transformers_pipelines.TASK_ALIASES["vqa"] = "visual-question-answering"
    PIPELINE_REGISTRY.register_pipeline(
        "visual-question-answering",
        pipeline_class=VisualQuestionAnsweringPipeline,
        pt_model=AutoModelForVisualQuestionAnswering,
        type="multimodal",
    )
    PIPELINE_REGISTRY.register_pipeline(
        "image-text-retrieval",
        pipeline_class=ImageTextRetrievalPipeline,
        pt_model=AutoModelForImageTextRetrieval,
        type="multimodal",
    )
