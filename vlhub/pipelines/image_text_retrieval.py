"""`pipeline("image-text-retrieval")`: rank many texts against one image, or many images against one text."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import torch
from transformers import AutoConfig, PreTrainedModel
from transformers.pipelines.base import ChunkPipeline

from ..processing.regions import RegionFeatures
from ..processing.processor_base import check_text
from ..registry import get_architecture
from .visual_question_answering import TopKPipelineMixin, check_finite_output, check_image

if TYPE_CHECKING:
    from ..processing.detector.image_io import ImageInput

__all__ = ["ImageTextRetrievalPipeline", "AutoModelForImageTextRetrieval"]


class AutoModelForImageTextRetrieval:
    """Loads the retrieval head a checkpoint was saved with (transformers has no Auto class for retrieval).

    A checkpoint's `config.architectures` names its class; a pre-training checkpoint is loaded as is and scored
    with the matching score its architecture declares (`Architecture.match_score`, zero-shot retrieval).
    """

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str | os.PathLike, *args: Any, **kwargs: Any
    ) -> PreTrainedModel:
        from ..modeling.auto import model_class_for

        hub_kwargs = {
            k: kwargs[k]
            for k in ("revision", "token", "cache_dir", "local_files_only", "trust_remote_code")
            if k in kwargs
        }
        config = kwargs.pop("config", None) or AutoConfig.from_pretrained(pretrained_model_name_or_path, **hub_kwargs)
        _check_can_rank(config)
        model_class = model_class_for(config)
        return model_class.from_pretrained(pretrained_model_name_or_path, *args, config=config, **kwargs)


def _check_can_rank(config) -> None:
    """An architecture without a retrieval head (and without ITM) cannot rank pairs: say so, with its reason."""
    try:
        architecture = get_architecture(config.model_type)
    except ValueError:
        return
    if not architecture.has_task("retrieval"):
        why = architecture.unsupported_tasks.get("retrieval", "it has no image-text matching or retrieval head")
        raise ValueError(f"image-text retrieval is not available for {architecture.name}: {why}")


def _retrieval_scores(model, outputs) -> torch.Tensor:
    """One score per pair, a logit (higher: a better match): the retrieval head's logit, or for a pre-training model
    the matching score its architecture declares (`Architecture.match_score`: which field and class mean "match")."""
    architecture = get_architecture(model.config.model_type)
    if architecture.is_pretraining_head(model):
        if architecture.match_score is None:
            raise ValueError(
                f"a {architecture.name} pre-training checkpoint cannot rank image-text pairs zero-shot "
                "(its architecture declares no matching score): use a retrieval checkpoint"
            )
        return architecture.match_score(outputs)
    logits = outputs.logits
    if logits.ndim != 2 or logits.shape[1] != 1:
        raise ValueError(f"a retrieval model must give one score per pair, got logits of shape {tuple(logits.shape)}")
    return logits[:, 0]


class ImageTextRetrievalPipeline(TopKPipelineMixin, ChunkPipeline):
    """Rank image-text pairs with a single-stream cross-encoder (every pair is encoded jointly).

    ```python
    retrieval = pipeline("image-text-retrieval", model="path/to/uniter-itm")
    retrieval(image=regions, texts=["a cat on a mat", "two dogs"])        # rank texts for one image
    retrieval(text="a cat on a mat", images=[regions_a, regions_b])      # rank images for one text
    ```
    Returns `[{"score", "logit", "text"}, ...]` or `[{"score", "logit", "image_index"}, ...]`, best first; `score`
    is the sigmoid of the pair's logit. Pairs are scored in batches of `batch_size`.
    """

    task_heads = ("retrieval", "pretraining")  # a pre-training checkpoint ranks with its ITM head (zero-shot)
    default_task = "image-text-retrieval"

    def __call__(
        self,
        image: RegionFeatures | ImageInput | None = None,
        texts: str | Sequence[str] | None = None,
        text: str | None = None,
        images: RegionFeatures | ImageInput | Sequence[RegionFeatures | ImageInput] | None = None,
        **kwargs: Any,
    ) -> list[dict[str, float | str | int]]:
        if image is not None and texts is not None and text is None and images is None:
            query = {"image": image, "texts": _non_empty_list(texts, "texts")}
        elif text is not None and images is not None and image is None and texts is None:
            query = {"text": text, "images": _non_empty_list(images, "images")}
        else:
            raise ValueError(
                "pass either image= with texts=[...] (rank texts) or text= with images=[...] (rank images)"
            )
        self._check_query(query)
        if "batch_size" not in kwargs and self._batch_size is None:
            kwargs["batch_size"] = min(len(query.get("texts") or query.get("images")), 16)
        return super().__call__(query, **kwargs)

    def _check_query(self, query: dict) -> None:
        """Every text and image checked up front, so an error names the user's item (`texts[2]`, `images[1]`)."""
        if "texts" in query:
            check_image(self.processor, query["image"], "image", self.model)
            for i, text in enumerate(query["texts"]):
                check_text(text, f"texts[{i}]")
        else:
            check_text(query["text"], "text")
            for i, image in enumerate(query["images"]):
                check_image(self.processor, image, f"images[{i}]", self.model)

    def _regions(self, image) -> RegionFeatures:
        return image if isinstance(image, RegionFeatures) else self.processor.regions_from_images([image])[0]

    def preprocess(self, query: dict) -> Iterator[dict[str, Any]]:
        if "texts" in query:
            regions = self._regions(query["image"])
            candidates = [(regions, t, {"text": t}) for t in query["texts"]]
        else:
            candidates = [
                (self._regions(img), query["text"], {"image_index": i}) for i, img in enumerate(query["images"])
            ]
        for n, (regions, text, label) in enumerate(candidates):
            inputs = self.processor(text=[text], regions=[regions], return_tensors="pt")
            yield {"candidate": label, "is_last": n == len(candidates) - 1, **inputs}

    def _forward(self, inputs):
        candidate, is_last = inputs.pop("candidate"), inputs.pop("is_last")
        model_inputs = {k: v for k, v in inputs.items() if k in self.processor.model_input_names}
        scores = _retrieval_scores(self.model, self.model(**model_inputs))
        check_finite_output(scores, "retrieval scores")
        return {"candidate": candidate, "is_last": is_last, "logits": scores}

    def postprocess(
        self, model_outputs: list[dict[str, Any]], top_k: int | None = None
    ) -> list[dict[str, float | str | int]]:
        ranked = []
        for output in model_outputs:
            logit = output["logits"].reshape(-1)[0].float()
            ranked.append({"score": torch.sigmoid(logit).item(), "logit": logit.item(), **output["candidate"]})
        ranked.sort(key=lambda r: r["logit"], reverse=True)
        return ranked[:top_k] if top_k else ranked


def _non_empty_list(value, name):
    items = [value] if isinstance(value, (str, RegionFeatures)) else list(value)
    if not items:
        raise ValueError(f"{name} is empty: nothing to rank")
    return items
