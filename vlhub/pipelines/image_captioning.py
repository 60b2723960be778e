"""`pipeline("image-captioning")` (and `pipeline("image-to-text")`) for vlhub captioners: images or regions in,
captions out.

```python
captioner = pipeline("image-captioning", model="path/to/vlp-coco")
captioner("cat.jpg")                           # [{"generated_text": "a cat on a table"}]  (needs a region extractor)
captioner(regions)                             # vlhub.RegionFeatures
captioner([r1, r2, r3], batch_size=2, generate_kwargs={"num_beams": 5})   # [[{...}], [{...}], [{...}]]
```

transformers 5 rewrites the task "image-to-text" to its chat-style "image-text-to-text" pipeline, which cannot take
region features. `ImageToTextPipeline` is what vlhub registers for "image-to-text": it builds this pipeline for a
vlhub captioner and transformers' own `ImageTextToTextPipeline` (task "image-text-to-text", as transformers would)
for any other model. See `vlhub.pipelines.register_pipelines`.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Sequence

import torch
from transformers import BatchFeature, GenerationConfig, LogitsProcessor, LogitsProcessorList, Pipeline, PreTrainedModel

from ..processing.regions import RegionFeatures
from ..registry import architectures
from ..utils.compat import pipeline_generate_kwargs
from .visual_question_answering import ProcessorPipelineMixin, check_image

if TYPE_CHECKING:
    from ..processing.detector.image_io import ImageInput

__all__ = ["ImageCaptioningPipeline", "ImageToTextPipeline", "is_vlhub_model"]


def is_vlhub_model(model: object) -> bool:
    return isinstance(model, PreTrainedModel) and model.config.model_type in architectures()


class FiniteScoresGuard(LogitsProcessor):
    """Stops generation with an error when a step's scores hold NaN or +inf: a caption decoded from them would be an
    arbitrary token (the argmax of NaN), not an answer. -inf is a banned token (other processors set it) and passes."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if bool(torch.isnan(scores).any() or torch.isposinf(scores).any()):
            raise ValueError(
                f"the model's next-token scores hold NaN or infinite values (model dtype {scores.dtype}) at step "
                f"{input_ids.shape[-1]}; no caption is given. The inputs passed the magnitude checks, so the model's "
                "weights or its arithmetic overflowed"
            )
        return scores


class ImageCaptioningPipeline(ProcessorPipelineMixin, Pipeline):
    """Caption images with any vlhub captioner (the architecture's "captioning" model, e.g. Unified VLP).

    Inputs: an image (path, PIL image or array; needs the processor's region extractor), a `vlhub.RegionFeatures`,
    or a list of them. `generate_kwargs` (and `max_new_tokens`) are passed to `model.generate`; by default the
    pipeline decodes greedily up to 20 tokens. Returns `[{"generated_text": caption}]` per input.
    """

    _pipeline_calls_generate = True
    _default_generation_config = GenerationConfig(max_new_tokens=20)
    # A caption is chosen word after word among near-tied scores: bf16 changed 9-42% of the demo captioners'
    # captions (docs/performance.md), so a captioner runs bf16 only when asked (`dtype=torch.bfloat16`).
    bf16_when_fast = False
    task_heads = ("captioning",)
    default_task = "image-captioning"

    def _sanitize_parameters(self, generate_kwargs=None, max_new_tokens=None, **kwargs):
        if kwargs:
            raise TypeError(f"unexpected argument(s) {sorted(kwargs)}; pass generation settings in generate_kwargs")
        forward = dict(generate_kwargs or {})
        if max_new_tokens is not None:
            if "max_new_tokens" in forward:
                raise ValueError("max_new_tokens given twice (as an argument and in generate_kwargs)")
            forward["max_new_tokens"] = max_new_tokens
        return {}, forward, {}

    def __call__(
        self,
        images: RegionFeatures | ImageInput | Sequence[RegionFeatures | ImageInput] | None = None,
        image: RegionFeatures | ImageInput | Sequence[RegionFeatures | ImageInput] | None = None,
        **kwargs: Any,
    ) -> Any:
        if image is not None:  # `image=`, as the VQA and retrieval pipelines take it
            if images is not None:
                raise ValueError("pass images (positionally or as images=) or image=, not both")
            images = image
        if images is None:
            raise ValueError("image captioning needs images (paths, PIL images or vlhub.RegionFeatures)")
        many = isinstance(images, (list, tuple))
        if many and not images:
            raise ValueError("empty list of images")
        for i, image in enumerate(images if many else [images]):
            check_image(self.processor, image, f"images[{i}]" if many else "image", self.model)
        if many and "batch_size" not in kwargs and self._batch_size is None:
            kwargs["batch_size"] = min(len(images), 16)
        return super().__call__(list(images) if many else images, **kwargs)

    def preprocess(self, image: RegionFeatures | ImageInput) -> BatchFeature:
        if isinstance(image, RegionFeatures):
            return self.processor(regions=[image], return_tensors="pt")
        return self.processor(images=[image], return_tensors="pt")

    def _forward(self, model_inputs, **generate_kwargs):
        model_inputs = {k: v for k, v in model_inputs.items() if k in self.processor.model_input_names}
        # the user's settings over those given to pipeline(), over the pipeline's defaults (transformers' merge)
        generate_kwargs = pipeline_generate_kwargs(self, generate_kwargs)
        guards = LogitsProcessorList([*(generate_kwargs.get("logits_processor") or []), FiniteScoresGuard()])
        generate_kwargs = {**generate_kwargs, "logits_processor": guards}
        return {"sequences": self.model.generate(**model_inputs, **generate_kwargs)}

    def postprocess(self, model_outputs: dict[str, torch.Tensor]) -> list[dict[str, str]]:
        captions = self.processor.batch_decode(model_outputs["sequences"], skip_special_tokens=True)
        return [{"generated_text": caption} for caption in captions]


class ImageToTextPipeline(ProcessorPipelineMixin):
    """The "image-to-text" task: `ImageCaptioningPipeline` for a vlhub model, transformers' `ImageTextToTextPipeline`
    (as transformers 5 itself maps "image-to-text") for any other model."""

    _load_video_processor = False
    _pipeline_calls_generate = True

    def __new__(cls, model, *args, **kwargs):
        if is_vlhub_model(model):
            return ImageCaptioningPipeline(model, *args, **kwargs)
        from transformers.pipelines.image_text_to_text import ImageTextToTextPipeline

        warnings.warn(
            "The task `image-to-text` has been replaced by `image-text-to-text` in transformers 5; the pipeline is "
            "instantiated with the new task name.",
            UserWarning,
            stacklevel=3,
        )
        kwargs["task"] = "image-text-to-text"
        return ImageTextToTextPipeline(model, *args, **kwargs)
