"""`pipeline("visual-question-answering")` for vlhub models: answers with scores from regions or images."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import torch
from transformers import BatchFeature, Pipeline

from ..evaluation.vqa import predictable_answer_logits
from ..processing.processor_base import check_text
from ..modeling.modeling_utils import check_region_feature_magnitude
from ..processing.regions import RegionFeatures
from ..utils.arguments import check_positive_int
from ..utils.tensors import all_finite

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from ..processing.detector.image_io import ImageInput
    from ..processing.processor_base import VisionLanguageProcessor

__all__ = [
    "VisualQuestionAnsweringPipeline",
    "top_k_parameter",
    "check_image",
    "check_finite_output",
    "ProcessorPipelineMixin",
    "TopKPipelineMixin",
]


def top_k_parameter(top_k: int | None) -> dict:
    """The postprocess parameters for a user's `top_k` (validated)."""
    if top_k is None:
        return {}
    return {"top_k": check_positive_int(top_k, "top_k")}


def check_finite_output(values: torch.Tensor, what: str) -> None:
    """A pipeline's raw model output must be finite: NaN or infinity (an input the checks let through, or a model
    whose weights or arithmetic overflow) is an error, never an answer."""
    if not all_finite(values):
        raise ValueError(
            f"the model's {what} hold NaN or infinite values (model dtype {values.dtype}); no result is given. The "
            "inputs passed the magnitude checks, so the model's weights or its arithmetic overflowed"
        )


def refuse_other_heads(model: PreTrainedModel, task: str, heads: tuple[str, ...]) -> None:
    """A checkpoint saved with a head that cannot do `task` (one of the architecture's `heads`, as its declaration
    names them) is refused, naming the task and what the folder holds: loading it for `task` would put a randomly
    initialised head behind the pipeline (a VQA head on a captioner answers LABEL_0). Models without a recorded
    class (`config.architectures`, e.g. built in memory) and other libraries' models are not judged."""
    from ..registry import architectures

    config = model.config
    architecture = architectures().get(config.model_type)
    if architecture is None or not config.architectures:
        return
    held = config.architectures[0]
    wanted = [architecture.task_models[head] for head in heads if head in architecture.task_models]
    if held in wanted:
        return
    what = [head for head, name in architecture.task_models.items() if name == held]
    where = getattr(config, "_name_or_path", "") or "the model"
    raise ValueError(
        f"pipeline('{task}'): {where} holds {held} ({architecture.name}'s {' / '.join(what) or 'base'} model), which "
        f"cannot do {task}; pass a folder holding {' or '.join(wanted) or f'a {task} head'} (e.g. fine-tuned with "
        f"finetune.py --task {heads[0]})"
    )


class ProcessorPipelineMixin:
    """A vlhub pipeline loads the model's processor (tokenizer + region processor), nothing else: no image
    processor, feature extractor or tokenizer of its own. It takes only models whose saved head can do its task
    (`task_heads`: the architecture heads, by their task name in the declaration, that can).

    A float32 model on the CPU gets its linear weights packed for oneDNN (`vlhub.pack_linear_weights`: the same
    results to ~1e-6 relative, one more copy of the linear weights in memory) where that was measured faster on this
    machine (`vlhub.modeling.packed_linear.packing_pays`: the packed and the plain kernels timed once per process on
    a product of the pipeline's kind, a decoding step's few rows or a batch-1 sequence's rows; so far decoding packed
    on every CPU kind measured, an encoder only on an AVX512 EPYC). `pack_linear_weights=True` packs wherever it can,
    `False` never (arguments of `pipeline(...)`). Packing never engages for training, another dtype or another device, so the model
    stays usable for anything else.

    `quantize="int8"` runs a copy of the model whose linear layers are int8 dynamically quantized
    (`vlhub.modeling.inference_dtype.quantize_linear_weights`: CPU, float32 models, inference only; results close to
    float32, not equal; the copy's `save_pretrained` raises). It replaces packing: every linear layer is quantized,
    so none is left to pack, and `pack_linear_weights=True` together with it is an error. `packed_linears` and
    `quantized_linears` say how many layers each path took.

    Left to choose the dtype (`pipeline(...)`'s default `dtype="auto"`), a pipeline whose answers are a ranking
    (`bf16_when_fast`: VQA, retrieval) runs a bfloat16 copy of a float32 model where bf16 products are clearly faster
    than float32's on its device (`fastest_inference_dtype`: on a CPU, AMX or AVX512-BF16 units and a product timed
    once per process; a CUDA GPU that supports bf16); the model passed is left as it was. Answers are close to
    float32's, not equal (99.8-100% of the top answers unchanged on the demo's trained models). `dtype=torch.float32`
    keeps float32, as do `pack_linear_weights=True` and `quantize`. `inference_dtype` says what the pipeline runs."""

    _load_processor = True
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = False
    task_heads: tuple[str, ...] = ()
    # Whether bf16 is chosen for the user where it is fast: a ranking keeps its top answers in bf16; a caption, word
    # after word, does not as often (the captioning pipeline turns it off).
    bf16_when_fast: bool = True

    def __init__(
        self,
        model: PreTrainedModel,
        *args: Any,
        pack_linear_weights: bool | None = None,
        quantize: str | None = None,
        **kwargs: Any,
    ) -> None:
        refuse_other_heads(model, kwargs.get("task") or self.default_task, self.task_heads)
        # "auto" is what `pipeline(...)` passes when the user names no dtype (Pipeline.__init__ drops it).
        dtype_left_to_choose = kwargs.get("dtype") == "auto" and kwargs.get("torch_dtype") is None
        super().__init__(model, *args, **kwargs)
        if pack_linear_weights is not None and not isinstance(pack_linear_weights, bool):
            raise TypeError(
                f"pack_linear_weights must be True or False (or None: pack where it pays), got {pack_linear_weights!r}"
            )
        self.packed_linears = 0  # how many linear layers run on packed weights
        self.quantized_linears = 0  # how many run int8 dynamically quantized
        if quantize is not None:
            from ..modeling.inference_dtype import count_quantized_linears, quantize_linear_weights

            if pack_linear_weights:
                raise ValueError(
                    f"quantize={quantize!r} replaces packing (every linear layer is quantized): pass "
                    "pack_linear_weights=True or quantize, not both"
                )
            self.model = quantize_linear_weights(self.model, quantize)
            self.quantized_linears = count_quantized_linears(self.model)
        elif dtype_left_to_choose and not pack_linear_weights and self._runs_bf16_for_speed():
            from ..modeling.inference_dtype import copy_in_dtype

            self.model = copy_in_dtype(self.model, torch.bfloat16)
        elif self.model.device.type == "cpu" and self.model.dtype == torch.float32:
            from ..modeling.packed_linear import pack_linear_weights as pack
            from ..modeling.packed_linear import packing_pays

            if pack_linear_weights or (
                pack_linear_weights is None and packing_pays(decodes=self._pipeline_calls_generate)
            ):
                self.packed_linears = pack(self.model)
        self.inference_dtype = "int8" if self.quantized_linears else str(self.model.dtype).removeprefix("torch.")

    def _runs_bf16_for_speed(self) -> bool:
        """Whether this pipeline, left to choose, runs its float32 model in bfloat16 (the class docstring). Only a
        model whose float parameters are all float32 and all on one CPU or CUDA device: one spread over devices or
        offloaded (accelerate's device maps) is left as it was placed."""
        places = {(parameter.device, parameter.dtype) for parameter in self.model.parameters()}
        if not self.bf16_when_fast or len(places) != 1:
            return False
        device, dtype = places.pop()
        if device.type not in ("cpu", "cuda") or dtype != torch.float32:
            return False
        from ..modeling import inference_dtype

        return inference_dtype.fastest_inference_dtype(device) == torch.bfloat16


class TopKPipelineMixin(ProcessorPipelineMixin):
    """A ranking pipeline: its only call parameter is `top_k` (validated, for postprocess)."""

    def _sanitize_parameters(self, top_k=None, **kwargs):
        return {}, {}, top_k_parameter(top_k)


def check_image(
    processor: VisionLanguageProcessor,
    image: RegionFeatures | ImageInput,
    name: str,
    model: PreTrainedModel | None = None,
) -> None:
    """Check one pipeline input image up front, where its index is known: `RegionFeatures` are encoded once (type,
    feature size, selection, encoding limits), anything else needs the processor's region extractor. Errors name the
    input as `name` (e.g. `image[2]`), not as the processor's one-example batch `regions[0]`. The encoded features
    must stay within what `model`'s arithmetic takes in its dtype (`check_region_feature_magnitude`)."""
    if isinstance(image, RegionFeatures):
        features, _ = processor.feature_extractor.encode_example(image, name)
        if model is not None:
            check_region_feature_magnitude(features, model, f"{name} features")
    elif processor.region_extractor is None:
        raise ValueError(
            f"{name} is a {type(image).__name__} but this processor has no region extractor, so it cannot take "
            "images: pass vlhub.RegionFeatures (e.g. read from a feature file), or a processor with a region extractor"
        )


def _check_pairs(processor, pairs: list, single: bool, model=None) -> None:
    for i, pair in enumerate(pairs):
        if not isinstance(pair, dict) or "image" not in pair or "question" not in pair:
            raise ValueError(f"each input must be a dict with 'image' and 'question', got {pair!r} as input {i}")
        suffix = "" if single else f"[{i}]"
        check_text(pair["question"], f"question{suffix}")
        check_image(processor, pair["image"], f"image{suffix}", model)


def _as_pairs(image, question) -> tuple[list[dict], bool]:
    """Normalise the accepted call forms into a list of {"image", "question"} and whether one item was given."""
    if isinstance(image, dict) and question is None:
        return [image], True
    if isinstance(image, (list, tuple)) and question is None and image and isinstance(image[0], dict):
        return list(image), False
    if image is None or question is None:
        raise ValueError("visual question answering needs image= and question= (or a list of {'image', 'question'})")
    images_list = isinstance(image, (list, tuple))
    questions_list = isinstance(question, (list, tuple))
    if not images_list and not questions_list:
        return [{"image": image, "question": question}], True
    for given, is_list, name in ((image, images_list, "image"), (question, questions_list, "question")):
        if is_list and not given:
            raise ValueError(f"{name}= is an empty list: nothing to answer")
    images = list(image) if images_list else [image] * len(question)
    questions = list(question) if questions_list else [question] * len(images)
    if len(images) != len(questions):
        raise ValueError(f"got {len(images)} images but {len(questions)} questions; pass one question per image")
    return [{"image": i, "question": q} for i, q in zip(images, questions)], False


class VisualQuestionAnsweringPipeline(TopKPipelineMixin, Pipeline):
    """Answer questions about images with any vlhub VQA head (the architecture's "vqa" model).

    ```python
    vqa = pipeline("visual-question-answering", model="path/to/uniter-vqa")
    vqa(image=regions, question="what colour is the cat?", top_k=3)   # regions: vlhub.RegionFeatures
    vqa(image="cat.jpg", question="...")   # when the processor carries a region extractor
    vqa(image=[r1, r2], question=["q1", "q2"], batch_size=2)
    ```
    Returns `[{"score": float, "answer": str}, ...]` (top_k, best first) per input; scores are the answer
    probabilities (sigmoid, as the models are trained with binary cross-entropy on soft scores). An answer
    vocabulary's "unknown" answer (`config.unknown_answer_id`, e.g. `<unk>` of converted Unified VLP checkpoints) is
    never listed, as the original evaluations never predict it.
    """

    task_heads = ("vqa",)
    default_task = "visual-question-answering"

    def __call__(
        self,
        image: RegionFeatures | ImageInput | dict | Sequence[RegionFeatures | ImageInput | dict] | None = None,
        question: str | list[str] | None = None,
        **kwargs: Any,
    ) -> Any:
        pairs, single = _as_pairs(image, question)
        _check_pairs(self.processor, pairs, single, self.model)
        if not single and "batch_size" not in kwargs and self._batch_size is None:
            kwargs["batch_size"] = min(len(pairs), 16)
        results = super().__call__(pairs if not single else pairs[0], **kwargs)
        return results

    def preprocess(self, inputs: dict) -> BatchFeature:
        if not isinstance(inputs, dict) or "image" not in inputs or "question" not in inputs:
            raise ValueError(f"each input must be a dict with 'image' and 'question', got {inputs!r}")
        image, question = inputs["image"], inputs["question"]
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"the question must be a non-empty string, got {question!r}")
        if isinstance(image, RegionFeatures):
            return self.processor(text=[question], regions=[image], return_tensors="pt")
        return self.processor(text=[question], images=[image], return_tensors="pt")

    def _forward(self, model_inputs):
        model_inputs = {k: v for k, v in model_inputs.items() if k in self.processor.model_input_names}
        return {"logits": self.model(**model_inputs).logits}

    def postprocess(self, model_outputs: dict[str, torch.Tensor], top_k: int = 5) -> list[dict[str, float | str]]:
        check_finite_output(model_outputs["logits"], "answer logits")
        # sigmoid(-inf) = 0 for the "unknown" answer of converted checkpoints, which is never listed.
        probabilities = torch.sigmoid(predictable_answer_logits(model_outputs["logits"].float(), self.model.config))[0]
        top_k = min(
            top_k, probabilities.shape[-1] - (getattr(self.model.config, "unknown_answer_id", None) is not None)
        )
        scores, ids = probabilities.topk(top_k)
        id2label = self.model.config.id2label
        return [{"score": score.item(), "answer": id2label[i.item()]} for score, i in zip(scores, ids)]
