"""The pipelines run float32 CPU inference on packed linear weights where that pays (by default: a captioner on every
CPU, an encoder on AVX512 CPUs; `pack_linear_weights=True` always, `False` never): the same answers, scores, rankings
and captions as the plain path, and the packed path never engages for training or another dtype."""

import pytest
import torch
from transformers import pipeline

import vlhub
from vlhub.modeling.packed_linear import PackedLinear, packed_linear_available

from .helpers import random_regions, save_tiny
from .test_unified_vlp_modeling import make_regions
from .test_pipelines import vqa_folder  # noqa: F401  (a fixture)
from .test_unified_vlp_pipelines import captioner_folder  # noqa: F401  (a fixture)

pytestmark = pytest.mark.skipif(not packed_linear_available(), reason="this torch build has no oneDNN")

QUESTIONS = ["what colour is the cat ?", "is the dog on the table ?", "what is red ?"]
REGION_SETS = [random_regions(n, 16, seed=n) for n in (3, 5, 8)]
RELATIVE = 2e-6  # packing changes the summation order only


def packed_layers(model) -> int:
    return sum(type(module) is PackedLinear for module in model.modules())


def packed_and_plain(task: str, folder, **kwargs):
    packed = pipeline(task, model=str(folder), pack_linear_weights=True, **kwargs)
    plain = pipeline(task, model=str(folder), pack_linear_weights=False, **kwargs)
    assert packed.packed_linears == packed_layers(packed.model) > 0
    assert plain.packed_linears == packed_layers(plain.model) == 0
    return packed, plain


def assert_same_scores(packed: list, plain: list, key: str) -> None:
    assert [[r[name] for name in r if name != key] for r in packed] == [
        [r[name] for name in r if name != key] for r in plain
    ]
    for got, expected in zip(packed, plain):
        assert got[key] == pytest.approx(expected[key], rel=RELATIVE, abs=1e-7)


def test_vqa_pipeline_packed_gives_the_same_answers(vqa_folder):  # noqa: F811
    packed, plain = packed_and_plain("visual-question-answering", vqa_folder)
    for batch_size in (1, 3):
        got = packed(image=REGION_SETS, question=QUESTIONS, top_k=5, batch_size=batch_size)
        expected = plain(image=REGION_SETS, question=QUESTIONS, top_k=5, batch_size=batch_size)
        for one, other in zip(got, expected):
            assert_same_scores(one, other, "score")


def test_retrieval_pipeline_packed_gives_the_same_ranking(tmp_path, tiny_uniter_config, tiny_vocab):
    save_tiny(tmp_path / "itm", vlhub.UniterForImageTextRetrieval, tiny_uniter_config, tiny_vocab)
    packed, plain = packed_and_plain("image-text-retrieval", tmp_path / "itm")
    assert_same_scores(
        packed(image=REGION_SETS[1], texts=QUESTIONS), plain(image=REGION_SETS[1], texts=QUESTIONS), "logit"
    )
    assert_same_scores(
        packed(text=QUESTIONS[0], images=REGION_SETS, batch_size=2),
        plain(text=QUESTIONS[0], images=REGION_SETS, batch_size=2),
        "logit",
    )


def test_captioning_pipeline_packed_gives_the_same_captions(captioner_folder):  # noqa: F811
    packed, plain = packed_and_plain("image-captioning", captioner_folder)
    regions = [make_regions(count, seed) for count, seed in ((4, 0), (2, 1), (3, 2))]
    for settings in ({}, {"num_beams": 3}):
        got = packed(regions, batch_size=2, generate_kwargs={"max_new_tokens": 8, **settings})
        assert got == plain(regions, batch_size=2, generate_kwargs={"max_new_tokens": 8, **settings})


def test_packing_does_not_engage_for_other_dtypes_or_training(vqa_folder):  # noqa: F811
    double = pipeline("visual-question-answering", model=str(vqa_folder), dtype=torch.float64, pack_linear_weights=True)
    assert double.packed_linears == 0 and packed_layers(double.model) == 0
    packed, plain = packed_and_plain("visual-question-answering", vqa_folder)
    inputs = packed.processor(text=QUESTIONS[:2], regions=REGION_SETS[:2], return_tensors="pt")
    gradients = []
    for model in (packed.model, plain.model):
        model.train()
        torch.manual_seed(0)  # the same dropout masks
        model.zero_grad()
        model(**inputs).logits.square().sum().backward()
        gradients.append([parameter.grad for parameter in model.parameters()])
    for got, expected in zip(*gradients):
        assert torch.equal(got, expected)  # F.linear itself when a gradient is needed


def test_pack_linear_weights_must_be_a_bool(vqa_folder):  # noqa: F811
    with pytest.raises(TypeError, match="pack_linear_weights must be True or False"):
        pipeline("visual-question-answering", model=str(vqa_folder), pack_linear_weights="no")


@pytest.mark.parametrize(
    "encoder_speedup, decoder_speedup",
    [(1.4, 1.5), (0.92, 1.45), (1.19, 1.58), (0.9, 0.95)],  # AVX512 EPYC, AVX2 EPYC, AVX512 Xeon, a CPU where neither
)
def test_the_default_packs_where_it_pays(monkeypatch, encoder_speedup, decoder_speedup, vqa_folder, captioner_folder):  # noqa: F811
    """The default (`pack_linear_weights=None`) packs where the packed kernels measured at least
    `PACKING_MIN_SPEEDUP` times faster for that kind of work (an encoder's rows, a decoding step's); True and False
    override it."""
    packed_linear = vlhub.modeling.packed_linear
    speedups = {
        packed_linear.PROBE_ROWS["encoder"]: encoder_speedup,
        packed_linear.PROBE_ROWS["decoder"]: decoder_speedup,
    }
    monkeypatch.setattr(packed_linear, "packed_speedup", speedups.__getitem__)
    monkeypatch.setattr(packed_linear, "packed_min_rows", lambda: 2)  # its own probes are not this test's subject
    assert packed_linear.packing_pays(decodes=False) == (encoder_speedup >= packed_linear.PACKING_MIN_SPEEDUP)
    vqa = pipeline("visual-question-answering", model=str(vqa_folder))
    assert (vqa.packed_linears > 0) == (encoder_speedup >= 1.3)
    assert vqa.packed_linears == packed_layers(vqa.model)
    captioner = pipeline("image-captioning", model=str(captioner_folder))
    assert (captioner.packed_linears > 0) == (decoder_speedup >= 1.3)
    assert pipeline("visual-question-answering", model=str(vqa_folder), pack_linear_weights=True).packed_linears > 0
    assert pipeline("image-captioning", model=str(captioner_folder), pack_linear_weights=False).packed_linears == 0
