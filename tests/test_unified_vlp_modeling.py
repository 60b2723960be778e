"""Unified VLP on tiny random models: the two attention patterns, generation with a cache (what is fed, what is
cached, equal to no cache and to one image at a time), the processor's layouts, and clear errors for bad input."""

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor, BertTokenizer, GenerationMixin

import vlhub
from vlhub import (
    UnifiedVlpConfig,
    UnifiedVlpForConditionalGeneration,
    UnifiedVlpForPreTraining,
    UnifiedVlpForQuestionAnswering,
    UnifiedVlpModel,
    UnifiedVlpProcessor,
    UnifiedVlpRegionProcessor,
)
from vlhub.modeling.modeling_utils import SharedPrefillMixin
from vlhub.modeling.unified_vlp import vlp_beam_search
from vlhub.utils.compat import CACHE_NAME
from .helpers import end_captions_at

REGIONS, FEATURES, CLASSES = 4, 16, 5
# The tiny vocabulary of conftest.tiny_vocab: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4, then words.
SPECIAL = dict(pad_token_id=0, region_token_id=1, bos_token_id=2, eos_token_id=3, mask_token_id=4)


def tiny_config(**overrides) -> UnifiedVlpConfig:
    settings = dict(
        vocab_size=19,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=24,
        num_regions=REGIONS,
        region_feature_dim=FEATURES,
        region_embed_dim=24,
        region_location_dim=6 + CLASSES,
        num_labels=7,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        **SPECIAL,
    )
    return UnifiedVlpConfig(**{**settings, **overrides})


def make_regions(count, seed=0, scores=True):
    g = torch.Generator().manual_seed(seed)
    x1, y1 = torch.rand(count, generator=g) * 50, torch.rand(count, generator=g) * 40
    boxes = torch.stack(
        [x1, y1, x1 + 10 + torch.rand(count, generator=g) * 40, y1 + 5 + torch.rand(count, generator=g) * 30], 1
    )
    return vlhub.RegionFeatures(
        features=torch.rand(count, FEATURES, generator=g),
        boxes=boxes,
        image_size=(80, 120),
        class_probs=torch.softmax(torch.randn(count, CLASSES, generator=g), -1),
        scores=torch.rand(count, generator=g) * 0.7 + 0.25 if scores else None,
    )


@pytest.fixture
def processor(tiny_vocab):
    tokenizer = BertTokenizer(vocab=str(tiny_vocab), do_lower_case=False)
    region_processor = UnifiedVlpRegionProcessor(region_feature_dim=FEATURES, num_classes=CLASSES, max_regions=REGIONS)
    return UnifiedVlpProcessor(feature_extractor=region_processor, tokenizer=tokenizer)


def model_of(cls, **overrides):
    torch.manual_seed(0)
    return cls(tiny_config(**overrides)).eval()


# ---------------------------------------------------------------------------------------------------- masks
def expected_pattern(real, text_start, seq2seq):
    """The original's 0/1 matrix, written out position by position."""
    length = len(real)
    visible = torch.zeros(length, length, dtype=torch.bool)
    for q in range(length):
        for k in range(length):
            if not real[k]:
                continue
            if not seq2seq or k < text_start:
                visible[q, k] = True
            elif real[q] and k <= q:
                visible[q, k] = True
    return visible


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_attention_patterns_are_the_originals(attn_implementation):
    model = model_of(UnifiedVlpModel, attn_implementation=attn_implementation)
    length, start = 10, REGIONS + 2
    attention_mask = torch.tensor([[1] * 10, [1] * 8 + [0] * 2])
    embeddings = torch.zeros(2, length, 32)
    for seq2seq in (True, False):
        mask = model.build_attention_mask(embeddings, attention_mask, seq2seq)
        visible = mask[:, 0] if mask.dtype == torch.bool else mask[:, 0] == 0
        for b in range(2):
            assert torch.equal(visible[b], expected_pattern(attention_mask[b].tolist(), start, seq2seq))
    # per example: the first seq2seq, the second bidirectional
    mask = model.build_attention_mask(embeddings, attention_mask, torch.tensor([True, False]))
    visible = mask[:, 0] if mask.dtype == torch.bool else mask[:, 0] == 0
    assert torch.equal(visible[0], expected_pattern(attention_mask[0].tolist(), start, True))
    assert torch.equal(visible[1], expected_pattern(attention_mask[1].tolist(), start, False))


def test_region_padding_is_invisible(processor):
    model = model_of(UnifiedVlpForConditionalGeneration)
    inputs = processor(text=["a red cat"], regions=[make_regions(2)])
    assert inputs["region_attention_mask"].tolist() == [[1, 1, 0, 0]]
    base = model(**inputs).logits
    changed = dict(inputs)
    changed["region_features"] = inputs["region_features"].clone()
    changed["region_features"][:, 2:] = 5.0
    changed["region_locations"] = inputs["region_locations"].clone()
    changed["region_locations"][:, 2:] = -3.0
    logits = model(**changed).logits
    keep = [0, 1, 2, *range(REGIONS + 1, logits.shape[1])]  # the padded slots' own outputs may change
    torch.testing.assert_close(logits[:, keep], base[:, keep])


def test_per_example_patterns_match_separate_runs(processor):
    model = model_of(UnifiedVlpForPreTraining)
    inputs = processor(text=["a red cat", "the blue dog on a table"], regions=[make_regions(4), make_regions(4, 1)])
    mixed = model(**inputs, seq2seq=torch.tensor([True, False])).logits
    seq2seq = model(**inputs, seq2seq=True).logits
    bidirectional = model(**inputs, seq2seq=False).logits
    torch.testing.assert_close(mixed[0], seq2seq[0])
    torch.testing.assert_close(mixed[1], bidirectional[1])


def test_losses_and_vqa_prediction():
    model = model_of(UnifiedVlpForQuestionAnswering, unknown_answer_id=0)  # as converted checkpoints
    g = torch.Generator().manual_seed(0)
    inputs = dict(
        input_ids=torch.randint(5, 19, (2, 9), generator=g),
        region_features=torch.rand(2, REGIONS, FEATURES),
        region_locations=torch.randn(2, REGIONS, 6 + CLASSES),
    )
    labels = torch.rand(2, 7)
    out = model(**inputs, labels=labels)
    expected = torch.nn.functional.binary_cross_entropy_with_logits(out.logits, labels, reduction="sum") / 2
    torch.testing.assert_close(out.loss, expected)
    # answer 0 is never predicted, even when its logit is the largest
    with torch.no_grad():
        model.ans_classifier[2].bias[0] = 1e4
    out = model(**inputs)
    assert out.logits.argmax(-1).tolist() == [0, 0]
    assert (out.predicted_answer_ids == out.logits[:, 1:].argmax(-1) + 1).all()
    # A vocabulary without an unknown answer (the shapes world's answer 0 is "red"): the plain argmax.
    model.config.unknown_answer_id = None
    assert model(**inputs).predicted_answer_ids.tolist() == [0, 0]
    model.config.unknown_answer_id = 7
    with pytest.raises(ValueError, match="unknown_answer_id=7 is not one of the 7 answers"):
        model(**inputs)


# ---------------------------------------------------------------------------------------------------- generation
class BatchSizes:
    """Records the batch size of every forward (the input of layer 0)."""

    def __init__(self, model):
        self.sizes = []
        model.vlp.embeddings.register_forward_hook(lambda m, i, o: self.sizes.append(o.shape[0]))


class FedLengths:
    """Records how many positions each forward embeds (the input of layer 0)."""

    def __init__(self, model):
        self.lengths = []
        self.handle = model.vlp.embeddings.register_forward_hook(lambda m, i, o: self.lengths.append(o.shape[1]))


def test_generate_caches_real_tokens_only_and_never_recomputes(processor):
    model = model_of(UnifiedVlpForConditionalGeneration)
    prompt = processor(regions=[make_regions(4), make_regions(3, 1)])
    assert prompt["input_ids"].tolist()[0] == [2, 1, 1, 1, 1, 3]
    assert prompt["token_type_ids"].tolist()[0] == [4] * 6
    fed = FedLengths(model)
    out = model.generate(**prompt, max_new_tokens=5, do_sample=False, eos_token_id=None, return_dict_in_generate=True)
    # step 1: the prompt + [MASK]; every later step: [previous word, MASK]
    assert fed.lengths == [REGIONS + 3] + [2] * 4
    # the cache holds every real token (prompt + generated words except the last) and no [MASK]
    assert getattr(out, CACHE_NAME).get_seq_length() == prompt["input_ids"].shape[1] + 4


def test_cached_generation_equals_recomputing_everything(processor):
    model = model_of(UnifiedVlpForConditionalGeneration)
    prompt = processor(regions=[make_regions(4), make_regions(3, 1)])
    kwargs = dict(max_new_tokens=6, do_sample=False, output_logits=True, return_dict_in_generate=True)
    cached = model.generate(**prompt, **kwargs)
    fed = FedLengths(model)
    uncached = model.generate(**prompt, use_cache=False, **kwargs)
    assert fed.lengths[1] == REGIONS + 4  # without a cache the whole sequence (and the [MASK]) is fed each step
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(torch.stack(cached.logits), torch.stack(uncached.logits), atol=1e-5, rtol=1e-5)
    # and a plain forward over prompt + words + [MASK] gives the same step logits
    words = cached.sequences[:, prompt["input_ids"].shape[1] :]
    for step in range(3):
        ids = torch.cat([prompt["input_ids"], words[:, :step]], 1)
        out = model(
            input_ids=ids,
            region_features=prompt["region_features"],
            region_locations=prompt["region_locations"],
            region_attention_mask=prompt["region_attention_mask"],
            predict_next=True,
        )
        torch.testing.assert_close(out.logits[:, -1], cached.logits[step], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "search, copies",
    [
        (dict(num_beams=3), 3),
        (dict(num_beams=3, num_return_sequences=2), 3),
        (dict(do_sample=True, num_return_sequences=2), 2),
    ],
)
def test_generate_encodes_each_prompt_once_for_its_beams(processor, monkeypatch, search, copies):
    model = model_of(UnifiedVlpForConditionalGeneration)
    prompt = processor(regions=[make_regions(4), make_regions(3, 1)])
    kwargs = dict(max_new_tokens=4, eos_token_id=None, return_dict_in_generate=True, output_scores=True, **search)
    torch.manual_seed(0)
    fed = BatchSizes(model)
    shared = model.generate(**prompt, **kwargs)
    assert fed.sizes == [2] + [2 * copies] * 3  # the prompt once per image, then one row per beam
    # the same as transformers' own first step, which encodes every copy of the prompt
    monkeypatch.setattr(SharedPrefillMixin, "_prefill", GenerationMixin._prefill)
    torch.manual_seed(0)
    fed.sizes.clear()
    plain = model.generate(**prompt, **kwargs)
    assert fed.sizes[0] == 2 * copies
    assert torch.equal(shared.sequences, plain.sequences)
    torch.testing.assert_close(torch.stack(shared.scores), torch.stack(plain.scores), atol=1e-6, rtol=0)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_batched_generation_equals_one_image_at_a_time(processor, num_beams):
    model = model_of(UnifiedVlpForConditionalGeneration)
    images = [make_regions(4), make_regions(2, 1), make_regions(3, 2)]
    kwargs = dict(max_new_tokens=5, num_beams=num_beams, eos_token_id=None, do_sample=False)
    batched = model.generate(**processor(regions=images), **kwargs)
    for i, image in enumerate(images):
        single = model.generate(**processor(regions=[image]), **kwargs)
        assert torch.equal(batched[i], single[0])
    original = model.generate(
        **processor(regions=images), max_new_tokens=5, num_beams=num_beams, custom_generate=vlp_beam_search
    )
    for i, image in enumerate(images):
        single = model.generate(
            **processor(regions=[image]), max_new_tokens=5, num_beams=num_beams, custom_generate=vlp_beam_search
        )
        assert torch.equal(original[i], single[0])


def test_original_beam_search_drops_images_whose_caption_is_settled(processor):
    """Every beam of image 0 emits [SEP] at step 2 and of image 1 at step 4 (a hook steers the logits, telling the
    images' rows apart by their region masks). The back-tracking never looks past those steps, so image 0 leaves the
    batch after step 2 and the search stops after step 4, with the captions of the full run (every image, all steps:
    what it still does when asked for the beams' traces)."""
    model = model_of(UnifiedVlpForConditionalGeneration)
    eos, beams = SPECIAL["eos_token_id"], 3
    prompt = processor(regions=[make_regions(4), make_regions(3, 1)])
    rows_fed = end_captions_at(model, eos, prompt["region_attention_mask"], steps=(2, 4))
    settings = dict(max_new_tokens=8, num_beams=beams, custom_generate=vlp_beam_search)
    full = model.generate(**prompt, return_dict_in_generate=True, **settings)
    assert rows_fed == [(1, 1)] + [(beams, beams)] * 7  # both images, every step
    assert (full.beam_token_ids[0, 2] == eos).all() and (full.beam_token_ids[1, 4] == eos).all()
    rows_fed.clear()
    stopped = model.generate(**prompt, **settings)
    assert rows_fed == [(1, 1), (beams, beams), (beams, beams), (0, beams), (0, beams)]  # image 0 gone after step 2
    assert torch.equal(stopped, full.sequences)
    assert stopped.shape[1] == prompt["input_ids"].shape[1] + 8  # padded to max_new_tokens, as the full run
    for i, image in enumerate((make_regions(4), make_regions(3, 1))):  # and as each image decoded alone
        rows_fed.clear()
        assert torch.equal(model.generate(**processor(regions=[image]), **settings)[0], stopped[i])


def test_original_beam_search_with_one_beam_is_greedy_until_sep(processor):
    model = model_of(UnifiedVlpForConditionalGeneration)
    prompt = processor(regions=[make_regions(4), make_regions(2, 1)])
    greedy = model.generate(**prompt, max_new_tokens=6, do_sample=False, eos_token_id=None)
    beam = model.generate(**prompt, max_new_tokens=6, num_beams=1, custom_generate=vlp_beam_search)
    for g, b in zip(greedy.tolist(), beam.tolist()):
        end = g.index(3) + 1 if 3 in g[REGIONS + 2 :] else len(g)
        assert b[:end] == g[:end] and all(t == 0 for t in b[end:])


def test_generate_through_auto_classes_and_decode(processor, tmp_path):
    model = model_of(UnifiedVlpForConditionalGeneration)
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    loaded = AutoModelForImageTextToText.from_pretrained(tmp_path)
    loaded_processor = AutoProcessor.from_pretrained(tmp_path)
    assert type(loaded) is UnifiedVlpForConditionalGeneration and loaded_processor.mode == "seq2seq"
    prompt = loaded_processor(regions=[make_regions(4)])
    ids = loaded.generate(**prompt, max_new_tokens=4, num_beams=2)
    assert isinstance(loaded_processor.batch_decode(ids)[0], str)


def test_batch_decode_cuts_at_sep_and_merges_word_pieces(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "A", "dog", "run", "##ning", "."]) + "\n")
    processor = UnifiedVlpProcessor(
        feature_extractor=UnifiedVlpRegionProcessor(region_feature_dim=FEATURES, num_classes=CLASSES, max_regions=2),
        tokenizer=BertTokenizer(vocab=str(vocab), do_lower_case=False),
    )
    prompt = [2, 1, 1, 3]
    assert processor.batch_decode([prompt + [5, 6, 7, 8, 9, 3, 6, 6], [5, 0, 6], [3, 6]]) == [
        "A dog running .",
        "A",
        "",
    ]
    assert processor.decode([5, 6]) == "A dog"


# ---------------------------------------------------------------------------------------------------- processor
def test_processor_layouts(processor):
    regions = [make_regions(4), make_regions(2, 1)]
    inputs = processor(text=["a red cat", "dog"], regions=regions)
    cat, dog = [processor.tokenizer.convert_tokens_to_ids(w) for w in ("cat", "dog")]
    assert inputs["input_ids"].tolist() == [[2, 1, 1, 1, 1, 3, 11, 12, cat, 3], [2, 1, 1, 1, 1, 3, dog, 3, 0, 0]]
    assert inputs["token_type_ids"].tolist()[1] == [4] * 6 + [5, 5, 0, 0]
    assert inputs["attention_mask"].tolist()[1] == [1] * 8 + [0, 0]
    assert inputs["region_locations"].shape == (2, REGIONS, 6 + CLASSES)
    processor.mode = "bidirectional"
    assert processor(text=["dog"], regions=regions[:1])["token_type_ids"].tolist() == [[0] * 6 + [1, 1]]


def test_processor_keeps_the_most_confident_regions():
    region_processor = UnifiedVlpRegionProcessor(region_feature_dim=FEATURES, num_classes=CLASSES, max_regions=REGIONS)
    many = make_regions(7)
    out = region_processor([many])
    assert out["region_features"].shape == (1, REGIONS, FEATURES)
    top = torch.sort(many.scores, descending=True, stable=True).indices[:REGIONS]
    torch.testing.assert_close(out["region_features"][0], many.features[top])
    with pytest.raises(ValueError, match="at most max_regions=4"):
        region_processor([make_regions(7, scores=False)])


def test_processor_truncates_long_texts_with_a_warning(processor):
    with pytest.warns(UserWarning, match="truncated"):
        inputs = processor(token_ids=[[5] * 30], regions=[make_regions(4)])
    assert inputs["input_ids"].shape[1] == REGIONS + 23  # 20 word pieces, as the original
    assert inputs["input_ids"][0, -1].item() == 3


def test_region_vector_needs_confidences_and_class_probabilities():
    region_processor = UnifiedVlpRegionProcessor(region_feature_dim=FEATURES, num_classes=CLASSES, max_regions=REGIONS)
    regions = make_regions(3)
    with pytest.raises(ValueError, match="class probabilities"):
        region_processor(
            [
                vlhub.RegionFeatures(
                    features=regions.features, boxes=regions.boxes, image_size=(80, 120), scores=regions.scores
                )
            ]
        )
    with pytest.raises(ValueError, match="detector confidences"):
        region_processor(
            [
                vlhub.RegionFeatures(
                    features=regions.features,
                    boxes=regions.boxes,
                    image_size=(80, 120),
                    class_probs=regions.class_probs,
                )
            ]
        )


def test_generate_builds_the_prompt_from_the_regions(processor):
    model = model_of(UnifiedVlpForConditionalGeneration)
    prompt = processor(regions=[make_regions(4), make_regions(3, seed=1)])
    regions_only = {k: v for k, v in prompt.items() if k.startswith("region_")}
    expected = model.generate(**prompt, max_new_tokens=5)
    assert torch.equal(model.generate(**regions_only, max_new_tokens=5), expected)
    assert processor.batch_decode(expected) == processor.batch_decode(model.generate(**regions_only, max_new_tokens=5))
    with pytest.raises(ValueError, match="needs the image's regions"):
        model.generate(max_new_tokens=5)
    with pytest.raises(ValueError, match="attention_mask without input_ids"):
        model.generate(**regions_only, attention_mask=prompt["attention_mask"], max_new_tokens=5)


# ---------------------------------------------------------------------------------------------------- bad input
def test_bad_inputs_give_clear_errors(processor, tmp_path):
    model = model_of(UnifiedVlpForConditionalGeneration)
    prompt = processor(regions=[make_regions(4)])
    with pytest.raises(ValueError, match="at most 18 new tokens"):
        model.generate(**prompt, max_new_tokens=19)
    with pytest.raises(ValueError, match="empty batch"):
        model.generate(**{k: v[:0] for k, v in prompt.items()}, max_new_tokens=3)
    with pytest.raises(ValueError, match="no regions given"):
        processor(regions=[])
    too_many = dict(
        prompt,
        region_features=torch.rand(1, REGIONS + 1, FEATURES),
        region_locations=torch.rand(1, REGIONS + 1, 6 + CLASSES),
    )
    with pytest.raises(ValueError, match="only 4 region slots"):
        model(**too_many)
    with pytest.raises(ValueError, match="needs region_features"):
        model(input_ids=prompt["input_ids"])
    with pytest.raises(ValueError, match="does not cover"):
        model(
            input_ids=prompt["input_ids"][:, :3],
            region_features=prompt["region_features"],
            region_locations=prompt["region_locations"],
        )
    # a VQA checkpoint has no masked-LM head: loading it as a captioner and generating is refused
    vqa = model_of(UnifiedVlpForQuestionAnswering)
    vqa.save_pretrained(tmp_path)
    captioner = AutoModelForImageTextToText.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="cannot generate captions"):
        captioner.generate(**prompt, max_new_tokens=3)
    with pytest.raises(ValueError, match="soft scores"):
        vqa(**processor(text=["dog"], regions=[make_regions(4)]), labels=torch.ones(1, 3))


@pytest.mark.parametrize("expected_length", [None, 11])
def test_the_beam_cache_holds_what_a_dynamic_cache_holds_after_every_operation(expected_length):
    from transformers.cache_utils import DynamicCache

    from vlhub.modeling.unified_vlp import VlpBeamCache

    config = tiny_config()
    generator = torch.Generator().manual_seed(0)
    ours, plain = VlpBeamCache(config=config, expected_length=expected_length), DynamicCache(config=config)

    def update(rows, positions):
        for layer in range(config.num_hidden_layers):
            keys, values = (torch.randn(rows, 4, positions, 8, generator=generator) for _ in range(2))
            got, expected = ours.update(keys, values, layer), plain.update(keys, values, layer)
            assert all(torch.equal(a, b) for a, b in zip(got, expected))

    def same():
        assert ours.get_seq_length() == plain.get_seq_length()
        for a, b in zip(ours.layers, plain.layers):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)

    update(2, 6)  # two prompts
    ours.crop(-1), plain.crop(-1)  # the [MASK] slot dropped, as predict_next does
    same()
    for cache in (ours, plain):
        cache.batch_repeat_interleave(3)  # each prompt to its 3 beams
    assert (ours.copies, ours.shared_length) == (3, 5)
    if expected_length:  # sized as told: the 4 steps below fit without a move
        assert ours.layers[0]._key_buffer.shape[-2] == expected_length
    for step, parents in enumerate([[2, 2, 0, 4, 3, 3], [1, 0, 0, 5, 5, 3], [0, 1, 2, 3, 4, 5], [2, 1, 1, 4, 4, 4]]):
        update(6, 2)  # [word, MASK]
        for cache in (ours, plain):
            cache.crop(-1)
            cache.reorder_cache(torch.tensor(parents))  # within each image's beams: positions after the prompt
        same()
        assert ours.copies == 3  # still in groups: the prompt rows were left as they are
    for cache in (ours, plain):
        cache.reorder_cache(torch.tensor([3, 3, 3, 0, 0, 0]))  # across images: everything moves, groups forgotten
    same()
    assert (ours.copies, ours.shared_length) == (1, 0)
    update(6, 40)  # more positions than the buffer had room for
    same()
    for cache in (ours, plain):
        cache.batch_select_indices(torch.tensor([1, 4]))
    update(2, 1)
    same()
    ours.reset(), plain.reset()
    update(3, 2)
    same()
    for cache in (ours, plain):
        cache.crop(-1)
        cache.batch_repeat_interleave(2)  # three prompts of one position, two beams each
    update(6, 2)
    for cache in (ours, plain):
        cache.crop(-1)
        cache.reorder_cache(torch.tensor([1, 0, 3, 3, 4, 5]))
        cache.batch_select_indices(torch.tensor([2, 3, 4, 5]))  # image 0 leaves: the other two stay groups
    same()
    assert (ours.copies, ours.shared_length) == (2, 1)
    update(4, 2)
    for cache in (ours, plain):
        cache.crop(-1)
        cache.reorder_cache(torch.tensor([1, 1, 2, 3]))  # within the groups again: positions after the prompt
    same()
    assert ours.copies == 2
    for cache in (ours, plain):
        cache.batch_select_indices(torch.tensor([1, 2]))  # one beam of each image: no longer groups
    same()
    assert (ours.copies, ours.shared_length) == (1, 0)
    with pytest.raises(ValueError, match="starts empty"):
        VlpBeamCache([(torch.zeros(1, 4, 2, 8), torch.zeros(1, 4, 2, 8))])
    with pytest.raises(ValueError, match="expected_length"):
        VlpBeamCache(config=config, expected_length=0)


@pytest.mark.parametrize("search", [dict(num_beams=3), dict(num_beams=1), dict(do_sample=True, num_return_sequences=2)])
def test_generate_decodes_on_the_beam_cache_as_on_a_dynamic_cache(processor, search):
    from transformers.cache_utils import DynamicCache

    from vlhub.modeling.unified_vlp import VlpBeamCache

    model = model_of(UnifiedVlpForConditionalGeneration)
    prompt = processor(regions=[make_regions(4), make_regions(2, 1), make_regions(3, 2)])
    kwargs = dict(max_new_tokens=6, eos_token_id=None, return_dict_in_generate=True, output_scores=True, **search)
    torch.manual_seed(0)
    plain = model.generate(**prompt, **{CACHE_NAME: DynamicCache(config=model.config)}, **kwargs)
    torch.manual_seed(0)
    ours = model.generate(**prompt, **kwargs)
    assert isinstance(getattr(ours, CACHE_NAME), VlpBeamCache)  # the default
    assert torch.equal(ours.sequences, plain.sequences)
    torch.testing.assert_close(torch.stack(ours.scores), torch.stack(plain.scores), atol=1e-6, rtol=0)
    assert model.generate(**prompt, max_new_tokens=3, use_cache=False).shape == (3, prompt["input_ids"].shape[1] + 3)
