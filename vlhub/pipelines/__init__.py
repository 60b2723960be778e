"""vlhub's pipelines, registered with transformers' pipeline registry on `import vlhub`.

transformers 5 removed its own "visual-question-answering" pipeline and (since 5.2x) lists the task in
`transformers.pipelines.REMOVED_TASKS`, which `pipeline()` consults *before* the registry — so even a registered
pipeline raises KeyError. `register_pipelines` withdraws exactly that entry (and its "vqa" alias) and registers
vlhub's pipeline in its place. This is the one place vlhub touches transformers' module globals;
tests/test_pipelines.py fails if a transformers upgrade changes the mechanism.

Captioning: transformers 5 also rewrites the task "image-to-text" to "image-text-to-text" (in
`_resolve_deprecated_task`, before the registry is consulted), whose chat-style pipeline cannot take region
features. `register_pipelines` lets "image-to-text" through that rewrite and registers `ImageToTextPipeline` for it,
which builds vlhub's captioning pipeline for a vlhub model and transformers' own "image-text-to-text" pipeline for
any other; "image-captioning" is vlhub's captioning pipeline. tests/test_unified_vlp_pipelines.py checks both.

Why the patch and not only the public route (`PIPELINE_REGISTRY.register_pipeline`):
tests/test_pipelines.py::test_public_registration_alone_cannot_serve_the_removed_tasks registers vlhub's pipelines,
restores transformers' own `REMOVED_TASKS` and `_resolve_deprecated_task`, and shows that
`pipeline("visual-question-answering", model=...)` then raises KeyError and that "image-to-text" is rewritten to
"image-text-to-text" before the registry is read. Per-checkpoint `custom_pipelines` would need
`trust_remote_code=True` for every vlhub checkpoint. When that test fails, transformers serves registered tasks again:
remove the patch.
"""

from __future__ import annotations

import functools

import transformers.pipelines as _transformers_pipelines
from transformers import AutoModelForImageTextToText, AutoModelForVisualQuestionAnswering
from transformers.pipelines import PIPELINE_REGISTRY

from .image_captioning import ImageCaptioningPipeline, ImageToTextPipeline
from .image_text_retrieval import AutoModelForImageTextRetrieval, ImageTextRetrievalPipeline
from .visual_question_answering import VisualQuestionAnsweringPipeline

__all__ = [
    "AutoModelForImageTextRetrieval",
    "ImageCaptioningPipeline",
    "ImageTextRetrievalPipeline",
    "ImageToTextPipeline",
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
    _register_captioning()


def _register_captioning() -> None:
    # Absent before transformers 5.19, which did not rewrite "image-to-text": nothing to let through then.
    resolve = getattr(_transformers_pipelines, "_resolve_deprecated_task", None)
    if resolve is not None and not getattr(resolve, "_lets_image_to_text_through", False):

        @functools.wraps(resolve)  # `__wrapped__`: transformers' own resolver (the test above restores it)
        def _resolve_deprecated_task(task: str) -> str:
            return task if task == "image-to-text" else resolve(task)

        _resolve_deprecated_task._lets_image_to_text_through = True
        _transformers_pipelines._resolve_deprecated_task = _resolve_deprecated_task
    for task, pipeline_class in (("image-captioning", ImageCaptioningPipeline), ("image-to-text", ImageToTextPipeline)):
        PIPELINE_REGISTRY.register_pipeline(
            task, pipeline_class=pipeline_class, pt_model=AutoModelForImageTextToText, type="multimodal"
        )
