"""VlBertProcessor: text layouts, the whole-image object 0, box geometry in the resized image, saving and loading."""

import pytest
import torch
from transformers import AutoProcessor, BertTokenizer

import vlhub
from vlhub import VlBertProcessor, VlBertRegionProcessor, vl_bert_locations, vl_bert_resized_size

from .helpers import random_regions


def _processor(vocab, **settings):
    region_settings = {k: settings.pop(k) for k in list(settings) if k in ("min_size", "max_size", "max_regions")}
    return VlBertProcessor(
        feature_extractor=VlBertRegionProcessor(region_feature_dim=16, **region_settings),
        tokenizer=BertTokenizer(vocab=str(vocab), do_lower_case=True),
        **settings,
    )


@pytest.mark.parametrize(
    "size, expected",
    [
        ((1024, 768), (800, 600)),
        ((400, 900), (444, 999)),
        ((640, 427), (899, 600)),
        ((600, 800), (600, 800)),
        ((3000, 600), (1000, 200)),
    ],
)
def test_resized_size_is_the_originals(size, expected):
    assert vl_bert_resized_size(*size) == expected


def test_locations_are_centre_and_size_in_the_resized_clamped_image():
    # 1024 x 768 → 800 x 600 (scale 0.78125); the box touching the right border is clamped to x = 799.
    boxes = torch.tensor([[100.0, 200.0, 300.0, 400.0], [500.0, 0.0, 1023.0, 767.0]])
    locations = vl_bert_locations(boxes, (768, 1024))
    s = 0.78125
    x1, y1, x2, y2 = 100 * s, 200 * s, 300 * s, 400 * s
    torch.testing.assert_close(
        locations[0], torch.tensor([(x1 + x2) / 2 / 800, (y1 + y2) / 2 / 600, (x2 - x1) / 800, (y2 - y1) / 600])
    )
    torch.testing.assert_close(
        locations[1], torch.tensor([(500 * s + 799) / 2 / 800, 599 / 2 / 600, (799 - 500 * s) / 800, 599 / 600])
    )


def test_whole_image_is_object_zero(tiny_vocab):
    processor = _processor(tiny_vocab)
    regions = [random_regions(3, 16, seed=1), random_regions(5, 16, seed=2, image_size=(60, 30))]
    out = processor(text=["a red cat", "two dogs"], regions=regions)
    assert out["region_features"].shape == (2, 6, 16) and out["region_locations"].shape == (2, 6, 4)
    assert out["region_attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0], [1] * 6]
    for i, r in enumerate(regions):
        n = len(r)
        torch.testing.assert_close(out["region_features"][i, 0], r.features.mean(0))
        torch.testing.assert_close(out["region_features"][i, 1 : n + 1], r.features)  # regions kept in the given order
        whole = vl_bert_locations(
            torch.tensor([[0.0, 0.0, r.image_size[1] - 1.0, r.image_size[0] - 1.0]]), r.image_size
        )
        torch.testing.assert_close(out["region_locations"][i, 0], whole[0])
        torch.testing.assert_close(out["region_locations"][i, 1 : n + 1], vl_bert_locations(r.boxes, r.image_size))


def test_text_layouts(tiny_vocab):
    tok = BertTokenizer(vocab=str(tiny_vocab), do_lower_case=True)
    cls, sep, mask = tok.cls_token_id, tok.sep_token_id, tok.mask_token_id
    words = tok("What colour is the cat", add_special_tokens=False)["input_ids"]
    plain = _processor(tiny_vocab)(text=["What colour is the cat"])
    assert plain["input_ids"][0].tolist() == [cls, *words, sep]
    assert plain["token_type_ids"][0].tolist() == [0] * (len(words) + 2)
    vqa = _processor(tiny_vocab, answer_slot=True)(text=["What colour is the cat", "red"])
    assert vqa["input_ids"][0].tolist() == [cls, *words, sep, mask, sep]
    assert vqa["token_type_ids"][0].tolist() == [0] * (len(words) + 2) + [1, 1]
    assert vqa["attention_mask"][1].tolist() == [1] * 5 + [0] * (len(words) - 1)


def test_truncation_keeps_the_answer_slot(tiny_vocab):
    processor = _processor(tiny_vocab, answer_slot=True, max_text_length=6)
    with pytest.warns(UserWarning, match="truncated"):
        out = processor(text=["what colour is the cat on the table"])
    tok = processor.tokenizer
    assert out["input_ids"][0].tolist()[-3:] == [tok.sep_token_id, tok.mask_token_id, tok.sep_token_id]
    assert out["input_ids"].shape[1] == 6


def test_save_load_round_trip(tiny_vocab, tmp_path):
    processor = _processor(tiny_vocab, answer_slot=True, min_size=300, max_size=500, max_regions=7)
    processor.save_pretrained(tmp_path)
    loaded = VlBertProcessor.from_pretrained(tmp_path)
    assert loaded.answer_slot and loaded.max_text_length == processor.max_text_length
    assert (loaded.feature_extractor.min_size, loaded.feature_extractor.max_size) == (300, 500)
    assert loaded.feature_extractor.max_regions == 7
    regions = [random_regions(4, 16)]
    a, b = processor(text=["a red cat"], regions=regions), loaded(text=["a red cat"], regions=regions)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_auto_processor_loads_a_vl_bert_folder(tiny_vocab, tmp_path):
    config = vlhub.VlBertConfig(
        vocab_size=30,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        region_feature_dim=16,
        mask_token_id=4,
    )
    config.save_pretrained(tmp_path)
    _processor(tiny_vocab).save_pretrained(tmp_path)
    assert isinstance(AutoProcessor.from_pretrained(tmp_path), VlBertProcessor)


def test_bad_region_inputs(tiny_vocab):
    processor = _processor(tiny_vocab, max_regions=4)
    with pytest.raises(ValueError, match="at most max_regions=4"):
        processor(text=["a cat"], regions=[random_regions(6, 16, scores=False)])
    with pytest.raises(ValueError, match="16-d features"):
        processor(text=["a cat"], regions=[random_regions(3, 8)])
    with pytest.raises(ValueError, match="min_size"):
        VlBertRegionProcessor(min_size=600, max_size=100)


def test_for_task_switches_the_answer_slot_without_touching_the_original(tiny_vocab):
    plain = _processor(tiny_vocab)
    vqa = plain.for_task("vqa")
    assert vqa is not plain and vqa.answer_slot and not plain.answer_slot
    assert vqa.tokenizer is plain.tokenizer and vqa.feature_extractor is plain.feature_extractor
    assert vqa.for_task("vqa") is vqa and not vqa.for_task("retrieval").answer_slot
    tok = plain.tokenizer
    assert vqa(text=["a cat"])["input_ids"][0].tolist()[-2:] == [tok.mask_token_id, tok.sep_token_id]


def test_image_box_feature_replaces_the_mean_for_object_zero(tiny_vocab):
    processor = _processor(tiny_vocab)
    with_feature, without = random_regions(3, 16, seed=1), random_regions(4, 16, seed=2)
    image_box_feature = torch.arange(16, dtype=torch.float32) - 100.0  # far from any mean of features in [0, 1)
    with_feature.metadata["image_box_feature"] = image_box_feature.numpy().reshape(1, 16)  # as a feature file has it
    out = processor(text=["a cat", "a dog"], regions=[with_feature, without])
    torch.testing.assert_close(out["region_features"][0, 0], image_box_feature)
    torch.testing.assert_close(out["region_features"][0, 1:4], with_feature.features)
    torch.testing.assert_close(out["region_features"][1, 0], without.features.mean(0))
    for bad, message in (
        (torch.zeros(15), r"size 16"),
        (torch.zeros(2, 16), r"got shape \(2, 16\)"),
        (torch.full((16,), float("nan")), "NaN"),
    ):
        with_feature.metadata["image_box_feature"] = bad
        with pytest.raises(ValueError, match=message):
            processor(text=["a cat"], regions=[with_feature])


@pytest.fixture
def vcr_processor(tmp_path):
    words = [
        "why",
        "is",
        "smiling",
        "?",
        "because",
        "happy",
        ".",
        "sees",
        "and",
        "dog",
        "casey",
        "riley",
        "jessie",
        "a",
        "b",
        "c",
        "d",
        "e",
        "f",
        "g",
    ]
    vocab = tmp_path / "vcr_vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    return _processor(vocab)


def _ids(processor, words):
    return processor.tokenizer.convert_tokens_to_ids(words)


def test_vcr_question_to_answer_layout(vcr_processor):
    # Spec §5 (VCR): [CLS] Q [SEP] A [SEP]; Q type 0, A and its [SEP] type 1; a word naming object o carries o + 1
    # (object 0 is the whole image), others 0; people are named Casey, Riley, ... in turn.
    p = vcr_processor
    out = p.vcr_text(
        question=["why", "is", [0], "smiling", "?"],
        choices=[[[0, 2], "sees", [1], "."], ["because", "happy", "."]],
        objects=["person", "dog", "person"],
    )
    assert set(out) == {"input_ids", "token_type_ids", "attention_mask", "text_region_ids"}
    row0 = [
        "[CLS]",
        "why",
        "is",
        "casey",
        "smiling",
        "?",
        "[SEP]",
        "casey",
        "and",
        "riley",
        "sees",
        "dog",
        ".",
        "[SEP]",
    ]
    row1 = ["[CLS]", "why", "is", "casey", "smiling", "?", "[SEP]", "because", "happy", ".", "[SEP]"]
    assert out["input_ids"].tolist() == [_ids(p, row0), _ids(p, row1) + [0, 0, 0]]
    assert out["token_type_ids"].tolist() == [[0] * 7 + [1] * 7, [0] * 7 + [1] * 4 + [0] * 3]
    assert out["attention_mask"].tolist() == [[1] * 14, [1] * 11 + [0] * 3]
    assert out["text_region_ids"].tolist() == [[0, 0, 0, 1, 0, 0, 0, 1, 0, 3, 0, 2, 0, 0], [0, 0, 0, 1] + [0] * 10]
    shifted = p.vcr_text(
        question=[[0], "?"], choices=[[[2]]], objects=["person", "dog", "person"], person_name_offset=1
    )
    assert shifted["input_ids"][0].tolist() == _ids(p, ["[CLS]", "riley", "?", "[SEP]", "jessie", "[SEP]"])


def test_vcr_rationale_layout_puts_question_and_answer_in_the_first_segment(vcr_processor):
    p = vcr_processor
    out = p.vcr_text(
        question=["why", "is", [0], "happy", "?"],
        answer=[[0], "sees", [1]],
        choices=[["because", [1], "."]],
        objects=["person", "dog"],
    )
    tokens = [
        "[CLS]",
        "why",
        "is",
        "casey",
        "happy",
        "?",
        "casey",
        "sees",
        "dog",
        "[SEP]",
        "because",
        "dog",
        ".",
        "[SEP]",
    ]
    assert out["input_ids"].tolist() == [_ids(p, tokens)]
    assert out["token_type_ids"].tolist() == [[0] * 10 + [1] * 4]
    assert out["text_region_ids"].tolist() == [[0, 0, 0, 1, 0, 0, 1, 0, 2, 0, 0, 2, 0, 0]]


def test_vcr_truncation_is_the_originals(vcr_processor):
    p = vcr_processor
    # Q→A: the longer of question / answer loses its last piece; the question stays cut for the later choices.
    with pytest.warns(UserWarning, match="10 word pieces was truncated to max_length=6"):
        out = p.vcr_text(
            question=["a", "b", "c", "d"],
            choices=[["a", "b", "c", "d", "e", "f"], ["g", "g"]],
            objects=[],
            max_length=6,
        )
    assert out["input_ids"].tolist() == [
        _ids(p, ["[CLS]", "a", "b", "c", "[SEP]", "a", "b", "c", "[SEP]"]),
        _ids(p, ["[CLS]", "a", "b", "c", "[SEP]", "g", "g", "[SEP]"]) + [0],
    ]
    # QA→R: the rationale while longer than question + answer, else the question down to one piece, else the answer.
    with pytest.warns(UserWarning, match="11 word pieces was truncated to max_length=7"):
        out = p.vcr_text(
            question=["a", "b", "c"],
            answer=["d", "e"],
            choices=[["a", "b", "c", "d", "e", "f"]],
            objects=[],
            max_length=7,
        )
    assert out["input_ids"].tolist() == [_ids(p, ["[CLS]", "a", "d", "e", "[SEP]", "a", "b", "c", "d", "[SEP]"])]


def test_vcr_bad_inputs(vcr_processor):
    p = vcr_processor
    with pytest.raises(ValueError, match=r"question\[0\] refers to object 2; the image has 2 objects"):
        p.vcr_text(question=[[2], "?"], choices=[["a"]], objects=["person", "dog"])
    with pytest.raises(ValueError, match="objects must be a list of class names"):
        p.vcr_text(question=["a"], choices=[["a"]], objects="person")
    with pytest.raises(ValueError, match="question must be a non-empty list"):
        p.vcr_text(question="why?", choices=[["a"]], objects=[])
    with pytest.raises(ValueError, match=r"choices\[1\]\[0\] must be a word or a non-empty list"):
        p.vcr_text(question=["a"], choices=[["a"], [[]]], objects=[])


def test_vcr_text_and_regions_feed_the_multiple_choice_model(vcr_processor):
    p = vcr_processor
    objects = ["person", "dog"]
    regions = random_regions(len(objects), 16, seed=3)  # one region per object, in the objects' order
    text = p.vcr_text(
        question=["why", "is", [0], "happy", "?"],
        objects=objects,
        choices=[[[0], "sees", [1], "."], ["because", "happy", "."], [[1], "."], ["g"]],
    )
    visual = p(regions=[regions])
    config = vlhub.VlBertConfig(
        vocab_size=len(p.tokenizer),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        region_feature_dim=16,
        max_position_embeddings=64,
        mask_token_id=p.tokenizer.mask_token_id,
    )
    model = vlhub.VlBertForMultipleChoice(config).eval()
    torch.nn.init.ones_(model.vl_bert.embeddings.visual_ln_text.weight)  # starts at 0 (no visual term) until trained
    inputs = {**{k: v[None] for k, v in text.items()}, **visual}
    with torch.no_grad():
        logits = model(**inputs).logits
        ungrounded = model(**{**inputs, "text_region_ids": torch.zeros_like(inputs["text_region_ids"])}).logits
    assert logits.shape == (1, 4)
    # Every choice repeats the question's grounded "casey": its visual term is object 1's, not the whole image's.
    assert ((logits - ungrounded).abs() > 0).all()
    assert int(inputs["text_region_ids"].max()) < visual["region_features"].shape[1]
