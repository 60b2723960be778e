"""The dtype a pipeline chooses when left to: a bfloat16 copy of a float32 CPU model for the ranking pipelines (VQA,
retrieval) where bf16 was measured fast on this CPU (`fastest_inference_dtype`), float32 elsewhere and whenever the
user names a dtype, packs or quantizes; the model passed is never changed. `copy_in_dtype` makes the copy."""

import pytest
import torch
from transformers import pipeline

import vlhub
from vlhub.modeling import inference_dtype
from vlhub.modeling.inference_dtype import copy_in_dtype
from vlhub.pipelines.visual_question_answering import ProcessorPipelineMixin, VisualQuestionAnsweringPipeline

from .helpers import save_tiny
from .test_packed_linear_pipelines import QUESTIONS, REGION_SETS
from .test_pipelines import vqa_folder  # noqa: F401  (a fixture)
from .test_unified_vlp_pipelines import captioner_folder  # noqa: F401  (a fixture)


@pytest.fixture
def bf16_measured(monkeypatch):
    """This CPU as one whose bf16 products measured fast (the probe's answer), with the choice the suite turns off
    (conftest's `float32_pipelines`) back on."""
    monkeypatch.setattr(ProcessorPipelineMixin, "bf16_when_fast", True)
    monkeypatch.setattr(inference_dtype, "fastest_inference_dtype", lambda device="cpu": torch.bfloat16)


def test_copy_in_dtype_casts_a_copy_and_keeps_ties(tiny_uniter_config):
    torch.manual_seed(0)
    model = vlhub.UniterForPreTraining(tiny_uniter_config).eval()
    model.register_buffer("float_buffer", torch.ones(3))
    model.register_buffer("index_buffer", torch.arange(3))
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    copy = copy_in_dtype(model, torch.bfloat16)
    assert copy is not model and copy.dtype == torch.bfloat16 and model.dtype == torch.float32
    for name, tensor in model.state_dict().items():  # the original, untouched
        assert tensor.dtype == before[name].dtype and torch.equal(tensor, before[name]), name
    for name, tensor in copy.state_dict().items():
        expected = before[name].to(torch.bfloat16) if before[name].is_floating_point() else before[name]
        assert tensor.dtype == expected.dtype and torch.equal(tensor, expected), name
    decoder, embeddings = copy.get_output_embeddings().weight, copy.get_input_embeddings().weight
    assert decoder is embeddings  # still tied, as in the original
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert all(parameter.requires_grad for parameter in copy.parameters())
    with pytest.raises(ValueError, match="floating-point dtype"):
        copy_in_dtype(model, torch.int8)


def test_ranking_pipelines_run_bf16_where_it_is_fast(
    bf16_measured,
    vqa_folder,  # noqa: F811
    tmp_path,
    tiny_uniter_config,
    tiny_vocab,
):
    vqa = pipeline("visual-question-answering", model=str(vqa_folder))
    plain = pipeline("visual-question-answering", model=str(vqa_folder), dtype=torch.float32)
    assert vqa.model.dtype == torch.bfloat16 and vqa.inference_dtype == "bfloat16" and vqa.packed_linears == 0
    assert plain.model.dtype == torch.float32 and plain.inference_dtype == "float32"
    got = vqa(image=REGION_SETS, question=QUESTIONS, top_k=5)
    expected = plain(image=REGION_SETS, question=QUESTIONS, top_k=5)
    for one, other in zip(got, expected):  # the same five answers, scores within bf16's rounding
        scores = {answer["answer"]: answer["score"] for answer in one}
        assert scores.keys() == {answer["answer"] for answer in other}
        for answer in other:
            assert scores[answer["answer"]] == pytest.approx(answer["score"], abs=0.02)

    save_tiny(tmp_path / "itm", vlhub.UniterForImageTextRetrieval, tiny_uniter_config, tiny_vocab)
    retrieval = pipeline("image-text-retrieval", model=str(tmp_path / "itm"))
    assert retrieval.model.dtype == torch.bfloat16
    logits = {result["text"]: result["logit"] for result in retrieval(image=REGION_SETS[1], texts=QUESTIONS)}
    plain = pipeline("image-text-retrieval", model=str(tmp_path / "itm"), dtype=torch.float32)
    for result in plain(image=REGION_SETS[1], texts=QUESTIONS):
        assert logits[result["text"]] == pytest.approx(result["logit"], abs=0.05)


def test_a_given_model_is_left_alone(bf16_measured, vqa_folder):  # noqa: F811
    model = vlhub.UniterForQuestionAnswering.from_pretrained(vqa_folder).eval()
    vqa = pipeline("visual-question-answering", model=model, processor=str(vqa_folder))
    assert vqa.model is not model and vqa.model.dtype == torch.bfloat16 and model.dtype == torch.float32


def test_float32_where_asked_or_where_bf16_is_not_chosen(
    bf16_measured,
    vqa_folder,  # noqa: F811
    captioner_folder,  # noqa: F811
    monkeypatch,
):
    folder = str(vqa_folder)
    for kwargs in ({"dtype": torch.float32}, {"dtype": "float32"}, {"pack_linear_weights": True}):
        vqa = pipeline("visual-question-answering", model=folder, **kwargs)
        assert vqa.model.dtype == torch.float32, kwargs
    assert pipeline("visual-question-answering", model=folder, pack_linear_weights=True).packed_linears > 0
    assert pipeline("visual-question-answering", model=folder, dtype=torch.bfloat16).inference_dtype == "bfloat16"
    if {"fbgemm", "x86"} & set(torch.backends.quantized.supported_engines):
        assert pipeline("visual-question-answering", model=folder, quantize="int8").inference_dtype == "int8"
    # a captioner stays float32: bf16 changes too many captions to be chosen for the user
    assert pipeline("image-captioning", model=str(captioner_folder)).model.dtype == torch.float32
    # a pipeline built by hand names no dtype for `pipeline(...)` to have left open: the model's own
    model = vlhub.UniterForQuestionAnswering.from_pretrained(folder).eval()
    processor = vlhub.UniterProcessor.from_pretrained(folder)
    assert VisualQuestionAnsweringPipeline(model=model, processor=processor).model is model
    # a model whose parameters are not all float32 on one device (e.g. placed by a device map) stays as placed
    model.get_input_embeddings().to(torch.float64)
    assert pipeline("visual-question-answering", model=model, processor=processor).model is model
    # where bf16 did not measure fast, float32 stays
    monkeypatch.setattr(inference_dtype, "fastest_inference_dtype", lambda device="cpu": torch.float32)
    assert pipeline("visual-question-answering", model=folder).inference_dtype == "float32"


def test_fastest_inference_dtype_asks_about_the_device(monkeypatch):
    asked = []
    monkeypatch.setattr(inference_dtype, "bf16_is_fast", lambda device: asked.append(str(device)) or device == "cuda")
    assert inference_dtype.fastest_inference_dtype("cuda") == torch.bfloat16
    assert inference_dtype.fastest_inference_dtype() == torch.float32
    assert asked == ["cuda", "cpu"]
