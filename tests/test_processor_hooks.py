"""The processor's hooks serve a layout other than UNITER's: a toy processor written only with the hooks (VL-BERT's
VQA text layout `[CLS] q [SEP] [MASK] [SEP]` with the answer slot as type 1; ViLBERT's global image row with
location `[0, 0, 1, 1, 1]`) gets truncation, padding and masks from the shared plumbing."""

from __future__ import annotations

import pytest
import torch
from transformers import BertTokenizer

import vlhub
from vlhub.processing.processor_base import RegionProcessor, VisionLanguageProcessor

from .helpers import random_regions


class ToyRegionProcessor(RegionProcessor):
    location_dim = 5

    def encode_locations(self, regions):
        height, width = regions.image_size
        boxes = regions.boxes / torch.tensor([width, height, width, height])
        area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        return torch.cat([boxes, area[:, None]], dim=1)

    def add_global_rows(self, features, locations, regions):
        global_location = torch.tensor([[0.0, 0.0, 1.0, 1.0, 1.0]])
        return torch.cat([features.mean(0, keepdim=True), features]), torch.cat([global_location, locations])


class ToyProcessor(VisionLanguageProcessor):
    def build_text_inputs(self, word_piece_ids):
        tok = self.tokenizer
        question = [tok.cls_token_id, *word_piece_ids, tok.sep_token_id]
        answer = [tok.mask_token_id, tok.sep_token_id]
        return question + answer, [0] * len(question) + [1] * len(answer)


@pytest.fixture
def toy(tiny_vocab):
    tokenizer = BertTokenizer(vocab=str(tiny_vocab), do_lower_case=True)
    regions = ToyRegionProcessor(region_feature_dim=16, min_regions=2, max_regions=10)
    return ToyProcessor(feature_extractor=regions, tokenizer=tokenizer, max_text_length=10)


def test_text_layout_padding_and_masks(toy):
    tok = toy.tokenizer
    out = toy(text=["what colour is the cat ?", "a dog"], return_tensors="pt")
    assert set(out) == {"input_ids", "attention_mask", "token_type_ids"}
    cls, sep, mask, pad = tok.cls_token_id, tok.sep_token_id, tok.mask_token_id, tok.pad_token_id
    dog = tok.convert_tokens_to_ids(["a", "dog"])
    assert out["input_ids"][1].tolist() == [cls, *dog, sep, mask, sep] + [pad] * 4
    assert out["token_type_ids"][1].tolist() == [0, 0, 0, 0, 1, 1] + [0] * 4
    assert out["attention_mask"].tolist() == [[1] * 10, [1] * 6 + [0] * 4]
    assert out["attention_mask"].dim() == 2  # 4-D masks are the models' business
    # token_ids (word pieces without special tokens) take the same layout
    same = toy(token_ids=[dog])
    assert same["input_ids"].tolist() == [out["input_ids"][1, :6].tolist()]


def test_truncation_keeps_the_layout_and_warns(toy):
    tok = toy.tokenizer
    with pytest.warns(UserWarning, match=r"text 1 has 13 tokens .*truncated to max_text_length=10"):
        out = toy(text=["a dog", "what colour is the cat on the table ?"])
    row = tok.convert_ids_to_tokens(out["input_ids"][1].tolist())
    assert row == ["[CLS]", "what", "colour", "is", "the", "cat", "on", "[SEP]", "[MASK]", "[SEP]"]
    assert out["token_type_ids"][1].tolist() == [0] * 8 + [1, 1]
    assert out["attention_mask"][1].tolist() == [1] * 10
    toy.max_text_length = 4  # the layout alone needs 4 tokens: no room for a word
    with pytest.raises(ValueError, match="leaves no room"):
        toy(text="a dog")


def test_a_layout_must_add_a_fixed_number_of_tokens(toy):
    class Growing(ToyProcessor):
        def build_text_inputs(self, word_piece_ids):
            ids = [self.tokenizer.cls_token_id] + word_piece_ids * 2 + [self.tokenizer.sep_token_id]
            return ids, [0] * len(ids)

    growing = Growing(feature_extractor=toy.feature_extractor, tokenizer=toy.tokenizer, max_text_length=10)
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="same number of tokens"):
        growing(text="what colour is the cat ?")


def test_global_row_is_region_zero_and_masked_in(toy):
    regions = [random_regions(3, 16, seed=1, scores=False), random_regions(6, 16, seed=2, scores=False)]
    out = toy(text=["a dog", "a cat"], regions=regions)
    assert out["region_features"].shape == (2, 7, 16) and out["region_locations"].shape == (2, 7, 5)
    assert out["region_attention_mask"].tolist() == [[1] * 4 + [0] * 3, [1] * 7]
    for i, r in enumerate(regions):
        assert torch.allclose(out["region_features"][i, 0], r.features.mean(0))
        assert out["region_locations"][i, 0].tolist() == [0.0, 0.0, 1.0, 1.0, 1.0]
        assert torch.equal(out["region_features"][i, 1 : len(r) + 1], r.features)
    assert out["region_features"][0, 4:].abs().sum() == 0 and out["region_locations"][0, 4:].abs().sum() == 0


def test_rows_out_of_step_are_an_error(toy):
    class Broken(ToyRegionProcessor):
        def add_global_rows(self, features, locations, regions):
            return torch.cat([features.mean(0, keepdim=True), features]), locations

    with pytest.raises(ValueError, match="4 feature rows but 3 location rows"):
        Broken(region_feature_dim=16, min_regions=2)(random_regions(3, 16, scores=False))


def test_a_call_with_regions_only_gives_the_processors_prompt(toy, tiny_vocab):
    """`regions_only_text_inputs`: none by default; a captioning processor's prompt (Unified VLP's image block,
    TDEN's [CLS] in its generation stream) after the region inputs, one row per image."""
    regions = [random_regions(3, 16), random_regions(2, 16)]
    assert set(toy(regions=regions)) == {"region_features", "region_locations", "region_attention_mask"}

    class Prompting(ToyProcessor):
        def regions_only_text_inputs(self, batch_size):
            return {"input_ids": torch.full((batch_size, 1), self.tokenizer.cls_token_id)}

    prompting = Prompting(feature_extractor=toy.feature_extractor, tokenizer=toy.tokenizer)
    out = prompting(regions=regions)
    assert list(out)[-1] == "input_ids" and out["input_ids"].tolist() == [[toy.tokenizer.cls_token_id]] * 2
    assert prompting(text=["a dog", "a cat"], regions=regions)["input_ids"].shape[1] > 1  # text given: no prompt

    tokenizer = BertTokenizer(vocab=str(tiny_vocab), do_lower_case=True)
    cls, sep, unk = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.unk_token_id
    vlp = vlhub.get_architecture("unified_vlp").build_processor(tokenizer, 16, max_regions=3, num_classes=4)
    detections = [
        vlhub.RegionFeatures(
            features=r.features,
            boxes=r.boxes,
            image_size=r.image_size,
            scores=r.scores,
            class_probs=torch.full((len(r), 4), 0.25),
        )
        for r in regions
    ]
    prompt = vlp(regions=detections)
    assert prompt["input_ids"].tolist() == [[cls, unk, unk, unk, sep]] * 2
    assert prompt["attention_mask"].tolist() == [[1] * 5] * 2 and prompt["token_type_ids"].unique().numel() == 1
    tden = vlhub.get_architecture("tden").build_processor(tokenizer, 16)
    assert "input_ids" not in tden(regions=regions)
    generation = tden(regions=regions, stream="generation")
    assert generation["input_ids"].tolist() == [[cls]] * 2 and generation["attention_mask"].tolist() == [[1]] * 2
    assert "token_type_ids" not in generation


def test_uniter_keeps_the_default_layout(tiny_uniter_config, tiny_vocab):
    from .helpers import tiny_processor

    processor = tiny_processor(tiny_vocab, tiny_uniter_config)
    out = processor(text="a red cat", regions=[random_regions(3, 16)])
    tok = processor.tokenizer
    assert out["input_ids"][0].tolist() == [
        tok.cls_token_id,
        *tok("a red cat", add_special_tokens=False)["input_ids"],
        tok.sep_token_id,
    ]
    assert isinstance(processor, vlhub.UniterProcessor) and out["token_type_ids"].abs().sum() == 0


def test_text_padding_equals_the_tokenizers_own_for_every_architecture(tiny_vocab):
    """`encode_text` pads without the tokenizer's per-row `pad` (a fast path): the tensors are the tokenizer's, for
    each architecture's text layout, either padding side and a non-zero pad token type; a tokenizer with its own
    `_pad` is still asked to pad."""
    from vlhub.processing.processor_base import pad_text_rows
    from vlhub.registry import architectures

    texts = ["what colour is the cat ?", "a dog", "the red table is on the blue table ? yes", "no"]
    for name, architecture in architectures().items():
        for side in ("right", "left"):
            tokenizer = BertTokenizer(vocab=str(tiny_vocab), do_lower_case=True, padding_side=side)
            tokenizer._pad_token_type_id = 1  # (no public setter)
            processor = architecture.build_processor(tokenizer, 16)
            rows = [processor.build_text_inputs(pieces) for pieces in processor.word_pieces(texts)]
            got = processor.encode_text(texts)
            expected = tokenizer.pad(
                {"input_ids": [ids for ids, _ in rows], "token_type_ids": [t for _, t in rows]},
                padding=True,
                return_attention_mask=True,
                return_tensors="pt",
            )
            assert type(got) is type(expected) and list(got) == list(expected), name
            for key in expected:
                assert got[key].dtype == expected[key].dtype and torch.equal(got[key], expected[key]), (name, side, key)

    class OwnPadding(BertTokenizer):
        def _pad(self, encoded_inputs, *args, **kwargs):
            encoded = super()._pad(encoded_inputs, *args, **kwargs)
            encoded["attention_mask"] = [2 * value for value in encoded["attention_mask"]]
            return encoded

    own = OwnPadding(vocab=str(tiny_vocab), do_lower_case=True)
    assert pad_text_rows(own, [[2, 5, 3], [2, 3]], [[0, 0, 0], [0, 0]])["attention_mask"].tolist() == [
        [2, 2, 2],
        [2, 2, 0],
    ]


def test_an_architectures_own_option_reaches_encode_call(toy):
    """An option is a typed field of the processor's `valid_processor_kwargs`; `encode_call` receives it merged by
    transformers' `_merge_kwargs` (a processor attribute of the field's name is its default), with the inputs."""
    from vlhub.processing.processor_base import VisionLanguageProcessorKwargs

    class ShoutingKwargs(VisionLanguageProcessorKwargs, total=False):
        shout: bool

    class Shouting(ToyProcessor):
        valid_processor_kwargs = ShoutingKwargs
        shout = False
        seen = []

        def encode_call(self, call, options):
            self.seen.append((call.text, call.return_tensors, options))
            return super().encode_call(call, options)

    shouting = Shouting(feature_extractor=toy.feature_extractor, tokenizer=toy.tokenizer)
    shouting(text="a dog", shout=True)
    shouting(text="a cat", return_tensors="np")
    assert shouting.seen == [("a dog", "pt", {"shout": True}), ("a cat", "np", {"shout": False})]
    with pytest.raises(TypeError, match=r"unexpected argument\(s\) \['whisper'\].*'return_tensors', 'shout'"):
        shouting(text="a dog", whisper=True)


def test_call_options_of_every_architecture(tiny_vocab):
    """Each processor takes `return_tensors` flat or in a `ProcessingKwargs` group (one value a call) and refuses,
    by name, every keyword it does not honour: an unknown one, another architecture's option, transformers' text
    and image options (which `_merge_kwargs` alone would log and drop)."""
    import numpy as np

    from vlhub.registry import architectures

    options = {"tden": {"stream": "understanding"}, "vilbert": {"task_id": None}, "vl_bert": {"boxes": None}}
    for name, architecture in architectures().items():
        tokenizer = BertTokenizer(vocab=str(tiny_vocab), do_lower_case=True)
        processor = architecture.build_processor(tokenizer, 16)
        own = options.get(name, {})
        assert processor(text="a dog", **own)["input_ids"].dtype == torch.long, name
        for grouped in ({"return_tensors": "np"}, {"common_kwargs": {"return_tensors": "np"}}):
            assert isinstance(processor(text="a dog", **grouped)["input_ids"], np.ndarray), (name, grouped)
        both = {"text_kwargs": {"return_tensors": "np"}, "images_kwargs": {"return_tensors": "np"}}
        assert isinstance(processor(text="a dog", **both)["input_ids"], np.ndarray), name
        with pytest.raises(ValueError, match="different return_tensors"):
            processor(text="a dog", text_kwargs={"return_tensors": "np"}, images_kwargs={"return_tensors": "pt"})
        with pytest.raises(ValueError, match="tf is not a valid TensorType"):
            processor(text="a dog", return_tensors="tf")
        foreign = {"stream": "generation"} if name != "tden" else {"task_id": 1}
        for bad, named in (
            ({"colour": 3}, "colour"),
            (foreign, next(iter(foreign))),
            ({"padding": "max_length"}, "padding"),
            ({"text_kwargs": {"truncation": True}}, "text_kwargs\\['truncation'\\]"),
            ({"images_kwargs": {"do_resize": True}}, "images_kwargs\\['do_resize'\\]"),
            ({"return_mm_token_type_ids": True}, "return_mm_token_type_ids"),
        ):
            with pytest.raises(TypeError, match=f"unexpected argument.*{named}"):
                processor(text="a dog", **bad)
        with pytest.raises(TypeError, match="text_kwargs must be a dict"):
            processor(text="a dog", text_kwargs="np")
