"""`quantize="int8"` on the pipelines: int8 dynamically quantized linear layers (a copy of the model), answers,
rankings and captions close to the float32 pipeline's, and the refusals (training, other dtypes and devices, packing
together with it, saving the quantized model)."""

import pytest
import torch
from transformers import pipeline

import vlhub
from vlhub.modeling.inference_dtype import count_quantized_linears, quantize_linear_weights

from .helpers import save_tiny
from .test_packed_linear_pipelines import QUESTIONS, REGION_SETS  # the same questions and region sets
from .test_unified_vlp_modeling import make_regions
from .test_pipelines import vqa_folder  # noqa: F401  (a fixture)
from .test_unified_vlp_pipelines import captioner_folder  # noqa: F401  (a fixture)

pytestmark = pytest.mark.skipif(
    "fbgemm" not in torch.backends.quantized.supported_engines
    and "x86" not in torch.backends.quantized.supported_engines,
    reason="this torch build has no int8 CPU engine",
)

# int8 weights (per output channel) and activations (per batch) on the tiny models: probabilities and logits within this
SCORE_TOLERANCE = 0.02
LOGIT_TOLERANCE = 0.05


def quantized_and_float(task: str, folder, **kwargs):
    quantized = pipeline(task, model=str(folder), quantize="int8", **kwargs)
    plain = pipeline(task, model=str(folder), pack_linear_weights=False, **kwargs)
    linears = sum(isinstance(module, torch.nn.Linear) for module in plain.model.modules())
    region_layers = quantized.model.base_model._region_feature_layers  # read as float32 weights: kept
    for path in region_layers:
        assert type(quantized.model.base_model.get_submodule(path)) is torch.nn.Linear
    assert quantized.quantized_linears == count_quantized_linears(quantized.model) == linears - len(region_layers) > 0
    assert quantized.packed_linears == 0 and plain.quantized_linears == 0
    return quantized, plain


def scores_by(results: list[dict], key: str, value: str) -> dict:
    return {result[key]: result[value] for result in results}


def test_vqa_pipeline_int8_answers_like_float32(vqa_folder):  # noqa: F811
    quantized, plain = quantized_and_float("visual-question-answering", vqa_folder)
    for batch_size in (1, 3):
        got = quantized(image=REGION_SETS, question=QUESTIONS, top_k=5, batch_size=batch_size)
        expected = plain(image=REGION_SETS, question=QUESTIONS, top_k=5, batch_size=batch_size)
        for one, other in zip(got, expected):
            one, other = scores_by(one, "answer", "score"), scores_by(other, "answer", "score")
            assert one.keys() == other.keys()  # all five answers, each scored within the tolerance
            for answer, score in other.items():
                assert one[answer] == pytest.approx(score, abs=SCORE_TOLERANCE)


def test_retrieval_pipeline_int8_ranks_like_float32(tmp_path, tiny_uniter_config, tiny_vocab):
    save_tiny(tmp_path / "itm", vlhub.UniterForImageTextRetrieval, tiny_uniter_config, tiny_vocab)
    quantized, plain = quantized_and_float("image-text-retrieval", tmp_path / "itm")
    for call in (
        dict(image=REGION_SETS[1], texts=QUESTIONS),
        dict(text=QUESTIONS[0], images=REGION_SETS, batch_size=2),
    ):
        got, expected = quantized(**call), plain(**call)
        key = "text" if "texts" in call else "image_index"
        got, expected = scores_by(got, key, "logit"), scores_by(expected, key, "logit")
        assert got.keys() == expected.keys()
        for item, logit in expected.items():
            assert got[item] == pytest.approx(logit, abs=LOGIT_TOLERANCE)


def test_captioning_pipeline_int8_captions_like_float32(captioner_folder):  # noqa: F811
    quantized, plain = quantized_and_float("image-captioning", captioner_folder)
    regions = [make_regions(count, seed) for count, seed in ((4, 0), (2, 1), (3, 2))]
    for settings in ({}, {"num_beams": 3}):
        got = quantized(regions, batch_size=2, generate_kwargs={"max_new_tokens": 8, **settings})
        expected = plain(regions, batch_size=2, generate_kwargs={"max_new_tokens": 8, **settings})
        assert got == expected  # these tiny models' captions: equal (their step scores differ by < LOGIT_TOLERANCE)
    inputs = plain.processor(regions=regions[:1], return_tensors="pt")
    inputs = {k: v for k, v in inputs.items() if k in plain.processor.model_input_names}
    with torch.no_grad():
        got, expected = quantized.model(**inputs).logits, plain.model(**inputs).logits
    torch.testing.assert_close(got, expected, atol=LOGIT_TOLERANCE, rtol=0)


def test_int8_pipeline_leaves_the_given_model_alone_and_refuses_saving(vqa_folder, tmp_path):  # noqa: F811
    model = vlhub.UniterForQuestionAnswering.from_pretrained(vqa_folder).eval()
    processor = vlhub.UniterProcessor.from_pretrained(vqa_folder)
    vqa = pipeline("visual-question-answering", model=model, processor=processor, quantize="int8")
    assert vqa.model is not model and count_quantized_linears(model) == 0
    for save in (vqa.model.save_pretrained, vqa.model.push_to_hub):
        with pytest.raises(ValueError, match="int8 dynamically quantized.*save the float32 model"):
            save(str(tmp_path / "saved"))
    assert not (tmp_path / "saved").exists()
    model.save_pretrained(tmp_path / "float32")  # the model it was made from still saves


def test_int8_pipeline_refusals(vqa_folder):  # noqa: F811
    with pytest.raises(ValueError, match="replaces packing"):
        pipeline("visual-question-answering", model=str(vqa_folder), quantize="int8", pack_linear_weights=True)
    with pytest.raises(ValueError, match="only 'int8'"):
        pipeline("visual-question-answering", model=str(vqa_folder), quantize="int4")
    with pytest.raises(ValueError, match="takes a float32 model"):
        pipeline("visual-question-answering", model=str(vqa_folder), quantize="int8", dtype=torch.bfloat16)
    model = vlhub.UniterForQuestionAnswering.from_pretrained(vqa_folder).train()
    processor = vlhub.UniterProcessor.from_pretrained(vqa_folder)
    with pytest.raises(ValueError, match="inference only"):
        pipeline("visual-question-answering", model=model, processor=processor, quantize="int8")


def test_quantize_refuses_a_model_off_the_cpu():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4)).eval().to("meta")
    with pytest.raises(ValueError, match="CPU only"):
        quantize_linear_weights(model)
