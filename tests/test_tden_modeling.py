"""TDEN models on tiny random configs: registration, the two text streams, the decoder's visual memory, the
generation cache, the heads' arithmetic and the errors on bad input."""

import pytest
import torch
from huggingface_hub.errors import StrictDataclassClassValidationError
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForImageTextToText,
    AutoModelForMultipleChoice,
    AutoModelForPreTraining,
    AutoModelForVisualQuestionAnswering,
    GenerationMixin,
)

import vlhub
from vlhub import (
    TdenConfig,
    TdenForConditionalGeneration,
    TdenForImageTextRetrieval,
    TdenForMultipleChoice,
    TdenForPreTraining,
    TdenForQuestionAnswering,
    TdenModel,
)
from vlhub.modeling.modeling_utils import SharedPrefillMixin
from vlhub.modeling.tden import XmodalerBeamSearchOutput, xmodaler_beam_search
from vlhub.modeling.tden.modeling_tden import batch_hardest_triplet_loss
from .helpers import end_captions_at

B, T, R, F = 2, 6, 5, 16


def tiny_config(**overrides) -> TdenConfig:
    settings = dict(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_visual_layers=2,
        num_cross_encoder_layers=1,
        num_decoder_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=24,
        region_feature_dim=F,
        num_region_labels=9,
        similarity_pooler_size=12,
        classifier_pooler_size=10,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return TdenConfig(**{**settings, **overrides})


def inputs(seed=0) -> dict:
    g = torch.Generator().manual_seed(seed)
    attention_mask = torch.ones(B, T, dtype=torch.long)
    region_attention_mask = torch.ones(B, R, dtype=torch.long)
    attention_mask[1, -2:] = 0
    region_attention_mask[1, -2:] = 0
    return dict(
        input_ids=torch.randint(3, 60, (B, T), generator=g),
        attention_mask=attention_mask,
        region_features=torch.rand(B, R, F, generator=g) * region_attention_mask[..., None],
        region_locations=torch.rand(B, R, 5, generator=g),
        region_attention_mask=region_attention_mask,
    )


def regions(batch: dict) -> dict:
    return {k: v for k, v in batch.items() if k.startswith("region_")}


def test_tden_registration_and_auto_classes(tmp_path):
    arch = vlhub.get_architecture("tden")
    assert arch.lowercase and arch.model_class("captioning") is TdenForConditionalGeneration
    assert set(arch.task_models) == {"pretraining", "captioning", "vqa", "retrieval", "vcr"}
    config = tiny_config()
    assert isinstance(AutoConfig.for_model("tden"), TdenConfig)
    for auto, cls in (
        (AutoModel, TdenModel),
        (AutoModelForPreTraining, TdenForPreTraining),
        (AutoModelForImageTextToText, TdenForConditionalGeneration),
    ):
        assert type(auto.from_config(config)) is cls
    qa = tiny_config(bidirectional_decoder=True)
    assert type(AutoModelForVisualQuestionAnswering.from_config(qa)) is TdenForQuestionAnswering
    vcr = tiny_config(num_decoder_layers=0, num_labels=1)
    assert type(AutoModelForMultipleChoice.from_config(vcr)) is TdenForMultipleChoice


def test_config_defaults_are_tden_base():
    config = TdenConfig()
    assert (
        config.num_hidden_layers,
        config.num_visual_layers,
        config.num_cross_encoder_layers,
        config.num_decoder_layers,
    ) == (12, 6, 6, 6)
    assert config.type_vocab_size == 3 and config.layer_norm_eps == 1e-12 and config.embedding_layer_norm_eps == 1e-5
    assert config.tie_word_embeddings is False and (config.bos_token_id, config.eos_token_id) == (101, 102)
    with pytest.raises((ValueError, StrictDataclassClassValidationError), match="generation_token_type_id"):
        TdenConfig(type_vocab_size=1)


def test_embeddings_use_the_original_layer_norm_eps():
    model = TdenModel(tiny_config())
    assert model.embeddings.LayerNorm.eps == 1e-5 and model.region_embeddings.LayerNorm.eps == 1e-5
    assert model.encoder.layer[0].output.LayerNorm.eps == 1e-12


def test_the_decoder_attends_to_the_fused_visual_output_when_the_understanding_stream_runs():
    torch.manual_seed(0)
    model = TdenModel(tiny_config()).eval()
    batch = inputs()
    generation = dict(decoder_input_ids=batch["input_ids"], decoder_attention_mask=batch["attention_mask"])
    with torch.no_grad():
        both = model(**batch, **generation)
        alone = model(**regions(batch), **generation)  # no understanding stream: the object encoder's output
        model.config.decoder_attends_fused_visual = False
        paper = model(**batch, **generation)
    assert not torch.allclose(both.decoder_output, alone.decoder_output)
    torch.testing.assert_close(paper.decoder_output, alone.decoder_output)
    torch.testing.assert_close(both.vision_output, both.cross_encoder_vision_layers[-1])


def test_the_generation_stream_is_causal_and_typed_for_generation():
    torch.manual_seed(0)
    model = TdenModel(tiny_config(num_cross_encoder_layers=0)).eval()
    batch = inputs()
    ids = batch["input_ids"]
    with torch.no_grad():
        full = model(**regions(batch), decoder_input_ids=ids).decoder_output
        changed = ids.clone()
        changed[:, -1] = 5
        prefix = model(**regions(batch), decoder_input_ids=changed).decoder_output
        typed = model(
            **regions(batch), decoder_input_ids=ids, decoder_token_type_ids=torch.zeros_like(ids)
        ).decoder_output
    torch.testing.assert_close(full[:, :-1], prefix[:, :-1])  # earlier positions never see later tokens
    assert not torch.allclose(full, typed)  # the default type is the generation type (1), not 0


def test_cached_decoding_matches_the_full_forward_and_runs_the_object_encoder_once():
    torch.manual_seed(0)
    model = TdenForConditionalGeneration(tiny_config(num_cross_encoder_layers=0)).eval()
    batch = inputs()
    calls = []
    model.tden.visual_encoder.layer[0].register_forward_hook(lambda *args: calls.append(1))
    with torch.no_grad():
        generated = model.generate(
            **regions(batch),
            max_new_tokens=6,
            do_sample=False,
            num_beams=1,
            min_new_tokens=6,
            return_dict_in_generate=True,
            output_logits=True,
        )
        assert len(calls) == 1
        full = model(input_ids=generated.sequences[:, :-1], **regions(batch)).logits
    torch.testing.assert_close(torch.stack(generated.logits, 1), full, atol=1e-5, rtol=0)
    assert (generated.sequences[:, 0] == 1).all()


def test_beam_search_runs_with_the_cache():
    torch.manual_seed(0)
    model = TdenForConditionalGeneration(tiny_config(num_cross_encoder_layers=0)).eval()
    batch = inputs()
    with torch.no_grad():
        out = model.generate(**regions(batch), max_new_tokens=5, num_beams=3, length_penalty=0.0, do_sample=False)
        no_cache = model.generate(
            **regions(batch), max_new_tokens=5, num_beams=3, length_penalty=0.0, do_sample=False, use_cache=False
        )
    assert out.shape[0] == B and torch.equal(out, no_cache)


def test_beam_search_runs_the_object_encoder_once_per_image(monkeypatch):
    torch.manual_seed(0)
    model = TdenForConditionalGeneration(tiny_config(num_cross_encoder_layers=0)).eval()
    batch = inputs()
    sizes = []
    model.tden.visual_encoder.layer[0].register_forward_hook(lambda m, i, o: sizes.append(i[0].shape[0]))
    kwargs = dict(
        max_new_tokens=5,
        num_beams=3,
        length_penalty=0.0,
        do_sample=False,
        return_dict_in_generate=True,
        output_scores=True,
    )
    with torch.no_grad():
        shared = model.generate(**regions(batch), **kwargs)
        assert sizes == [B]  # not once per beam
        monkeypatch.setattr(SharedPrefillMixin, "_prefill", GenerationMixin._prefill)  # transformers' own first step
        plain = model.generate(**regions(batch), **kwargs)
    assert sizes == [B, 3 * B]
    assert torch.equal(shared.sequences, plain.sequences)
    torch.testing.assert_close(torch.stack(shared.scores), torch.stack(plain.scores), atol=1e-6, rtol=0)


def test_beam_cache_leaves_the_copies_of_the_regions_alone_within_an_image():
    cache = vlhub.TdenBeamCache()
    text, regions = torch.arange(2.0).view(2, 1, 1, 1), torch.arange(2.0).view(2, 1, 1, 1).expand(2, 1, 3, 1)
    cache.self_attention_cache.update(text, text, 0)
    cache.cross_attention_cache.update(regions, regions, 0)
    cache.batch_repeat_interleave(2)  # two beams per image
    cross = cache.cross_attention_cache.layers[0].keys
    cache.reorder_cache(torch.tensor([1, 1, 2, 3]))  # beams stay within their image
    assert cache.cross_attention_cache.layers[0].keys is cross  # not copied
    assert cache.self_attention_cache.layers[0].keys.flatten().tolist() == [0, 0, 1, 1]
    cache.reorder_cache(torch.tensor([2, 3, 0, 1]))  # across images: both move, the groups are forgotten
    assert cache.cross_attention_cache.layers[0].keys[:, 0, 0, 0].tolist() == [1, 1, 0, 0]
    assert cache.self_attention_cache.layers[0].keys.flatten().tolist() == [1, 1, 0, 0]
    assert cache.cross_attention_copies == 1


def test_beam_cache_keeps_its_groups_when_whole_images_leave():
    cache = vlhub.TdenBeamCache()
    text, regions = torch.arange(3.0).view(3, 1, 1, 1), torch.arange(3.0).view(3, 1, 1, 1).expand(3, 1, 3, 1)
    cache.self_attention_cache.update(text, text, 0)
    cache.cross_attention_cache.update(regions, regions, 0)
    cache.batch_repeat_interleave(2)  # three images, two beams each
    cache.batch_select_indices(torch.tensor([2, 3, 4, 5]))  # image 0 leaves with both its beams
    assert cache.cross_attention_copies == 2
    cross = cache.cross_attention_cache.layers[0].keys
    cache.reorder_cache(torch.tensor([1, 1, 2, 3]))  # within the images left: the regions stay where they are
    assert cache.cross_attention_cache.layers[0].keys is cross
    assert cache.self_attention_cache.layers[0].keys.flatten().tolist() == [1, 1, 2, 2]
    cache.batch_select_indices(torch.tensor([1, 2]))  # one beam of each: no longer groups
    assert cache.cross_attention_copies == 1
    assert cache.cross_attention_cache.layers[0].keys[:, 0, 0, 0].tolist() == [1, 2]


def test_vqa_scores_are_the_summed_softmaxes_of_both_branches():
    torch.manual_seed(0)
    model = TdenForQuestionAnswering(tiny_config(bidirectional_decoder=True, num_labels=7)).eval()
    labels = torch.rand(B, 7)
    with torch.no_grad():
        out = model(**inputs(), labels=labels)
    expected = out.understanding_logits.softmax(-1) + out.generation_logits.softmax(-1)
    torch.testing.assert_close(out.logits, expected)
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    torch.testing.assert_close(
        out.loss, (bce(out.understanding_logits, labels) + bce(out.generation_logits, labels)) * 7
    )


def test_retrieval_scores_every_sentence_against_every_image_and_the_triplet_loss():
    torch.manual_seed(0)
    model = TdenForImageTextRetrieval(tiny_config(num_cross_encoder_layers=0, num_decoder_layers=0)).eval()
    with torch.no_grad():
        out = model(**inputs())
    torch.testing.assert_close(out.logits_per_text, out.text_embeds @ out.image_embeds.t())
    torch.testing.assert_close(out.logits[:, 0], out.logits_per_text.diagonal())
    torch.testing.assert_close(out.text_embeds.norm(dim=-1), torch.ones(B))
    assert out.loss is None and model.train()(**inputs()).loss is not None
    scores = torch.tensor([[0.9, 0.8, 0.1], [0.2, 0.5, 0.4], [0.3, 0.1, 0.7]])
    # sentence 0: hardest image 1 → 0.2+0.8-0.9; sentence 1: image 2 → 0.2+0.4-0.5; sentence 2: image 0 → 0.2+0.3-0.7 <0
    # image 0: hardest sentence 2 → 0.2+0.3-0.9 <0; image 1: sentence 0 → 0.2+0.8-0.5; image 2: sentence 1 → 0.2+0.4-0.7
    expected = ((0.1 + 0.1 + 0.0) + (0.0 + 0.5 + 0.0)) / 3
    torch.testing.assert_close(batch_hardest_triplet_loss(scores, 0.2), torch.tensor(expected))
    same_image = torch.tensor([0, 0, 1])  # sentences 0 and 1 describe the same image: not negatives
    # sentence 1 keeps only image 2 (0.2+0.4-0.5); everything else is below the margin
    expected_grouped = 0.1 / 3
    torch.testing.assert_close(batch_hardest_triplet_loss(scores, 0.2, same_image), torch.tensor(expected_grouped))


def test_multiple_choice_scores_each_choice():
    torch.manual_seed(0)
    model = TdenForMultipleChoice(tiny_config(num_decoder_layers=0, num_labels=1, bidirectional_decoder=True)).eval()
    batch = inputs()
    choices = {
        **batch,
        "input_ids": torch.stack([batch["input_ids"]] * 3, 1),
        "attention_mask": torch.stack([batch["attention_mask"]] * 3, 1),
    }
    with torch.no_grad():
        out = model(**choices, labels=torch.tensor([0, 2]))
    assert out.logits.shape == (B, 3)
    torch.testing.assert_close(out.logits[:, 0], out.logits[:, 1])  # identical choices score identically
    per_choice = {**choices, **{name: torch.stack([value] * 3, 1) for name, value in regions(batch).items()}}
    with torch.no_grad():
        torch.testing.assert_close(model(**per_choice).logits, out.logits)  # the regions given once per choice
    with pytest.raises(ValueError, match="num_choices"):
        model(**batch)


def test_pretraining_losses_follow_the_original():
    torch.manual_seed(0)
    model = TdenForPreTraining(tiny_config()).eval()
    batch = inputs()
    labels = torch.full((B, T), -1)
    labels[0, 2], labels[1, 1] = 7, 9
    masked = torch.zeros(B, R, dtype=torch.bool)
    masked[0, 1] = masked[1, 2] = True
    targets = torch.softmax(torch.rand(2, 9), -1)
    with torch.no_grad():
        out = model(
            **batch,
            decoder_input_ids=batch["input_ids"],
            labels=labels,
            decoder_labels=labels,
            masked_regions=masked,
            region_class_targets=targets,
            image_ids=torch.tensor([0, 1]),
        )
    log_probs = out.moc_logits[masked].log_softmax(-1)
    torch.testing.assert_close(out.moc_loss, (targets * (targets.log() - log_probs)).sum() / 2)
    torch.testing.assert_close(
        out.mlm_loss, torch.nn.functional.cross_entropy(out.mlm_logits[labels >= 0], labels[labels >= 0])
    )
    torch.testing.assert_close(out.loss, out.mlm_loss + out.msg_loss + out.moc_loss + out.ism_loss)
    with pytest.raises(ValueError, match="one row per masked region"):
        model(**batch, masked_regions=masked, region_class_targets=targets[:1])


def test_bad_inputs_are_named():
    model = TdenModel(tiny_config()).eval()
    batch = inputs()
    with pytest.raises(ValueError, match="needs text"):
        model(**regions(batch))
    with pytest.raises(ValueError, match="needs regions"):
        model(input_ids=batch["input_ids"])
    with pytest.raises(ValueError, match="region_locations"):
        model(input_ids=batch["input_ids"], region_features=batch["region_features"])
    with pytest.raises(ValueError, match="region_features must have shape"):
        model(
            input_ids=batch["input_ids"],
            region_features=batch["region_features"][..., :3],
            region_locations=batch["region_locations"],
            region_attention_mask=batch["region_attention_mask"],
        )
    with pytest.raises(ValueError, match="position embeddings"):
        model(input_ids=torch.ones(B, 30, dtype=torch.long), **regions(batch))
    with pytest.raises(ValueError, match="no region_attention_mask"):
        model(
            input_ids=batch["input_ids"],
            region_features=batch["region_features"],
            region_locations=batch["region_locations"],
        )
    with pytest.raises(ValueError, match="no decoder"):
        TdenForConditionalGeneration(tiny_config(num_decoder_layers=0))
    with pytest.raises(ValueError, match="cross-modal encoder"):
        TdenForQuestionAnswering(tiny_config(num_cross_encoder_layers=0, bidirectional_decoder=True))


def test_xmodaler_beam_search_with_one_beam_is_greedy_decoding():
    torch.manual_seed(0)
    model = TdenForConditionalGeneration(tiny_config(num_cross_encoder_layers=0)).eval()
    batch = inputs()
    with torch.no_grad():
        greedy = model.generate(**regions(batch), max_new_tokens=6, min_new_tokens=6, do_sample=False, num_beams=1)
    beam = model.generate(**regions(batch), max_new_tokens=6, num_beams=1, custom_generate=xmodaler_beam_search)
    assert beam.shape == (B, 7) and (beam[:, 0] == 1).all()
    finished = (beam[:, 1:] == 2).cumsum(-1) > 0
    # Up to the first [SEP] (eos id 2 here) both decode the argmax; afterwards X-modaler writes 0.
    assert torch.equal(beam[:, 1:][~finished], greedy[:, 1:][~finished])
    with pytest.raises(ValueError, match="num_return_sequences"):
        model.generate(**regions(batch), num_beams=2, num_return_sequences=3, custom_generate=xmodaler_beam_search)


def test_xmodaler_beam_search_drops_images_whose_beams_have_all_ended(monkeypatch):
    """Image 0's beams all emit [SEP] at step 2, image 1's at step 4 (a hook steers the logits, telling the images'
    rows apart by their region masks). Image 0 leaves the batch after step 2 and the search stops after step 4, with
    the words and scores of X-modaler's run of every image for all 8 steps (forced here by keeping every image)."""
    from vlhub.modeling.tden import generation_tden

    torch.manual_seed(0)
    model = TdenForConditionalGeneration(tiny_config(num_cross_encoder_layers=0)).eval()
    eos, batch = model.config.eos_token_id, inputs()
    rows_fed = end_captions_at(model, eos, batch["region_attention_mask"], steps=(2, 4))
    settings = dict(max_new_tokens=8, num_beams=3, num_return_sequences=3, custom_generate=xmodaler_beam_search)
    found = model.generate(**regions(batch), return_dict_in_generate=True, **settings)
    assert rows_fed == [(1, 1), (3, 3), (3, 3), (0, 3), (0, 3)]  # image 0 gone after step 2, image 1 after step 4
    assert (found.sequences[:3, 3] == eos).all() and (found.sequences[3:, 5] == eos).all()
    rows_fed.clear()
    monkeypatch.setattr(
        generation_tden,
        "_images_going",
        lambda mask, words, scores, eos: torch.ones_like(words[:, 0], dtype=torch.bool),
    )
    full = model.generate(**regions(batch), return_dict_in_generate=True, **settings)
    assert rows_fed == [(1, 1)] + [(3, 3)] * 7  # every image, every step
    assert torch.equal(found.sequences, full.sequences)
    assert torch.equal(found.sequences_scores[:3], full.sequences_scores[:3])  # image 0: the same computation
    assert torch.equal(found.token_scores[:3], full.token_scores[:3])
    # image 1's later steps ran beside image 0's rows in the full run: float rounding apart, the same
    torch.testing.assert_close(found.sequences_scores[3:], full.sequences_scores[3:], atol=1e-6, rtol=0)
    torch.testing.assert_close(found.token_scores[3:], full.token_scores[3:], atol=1e-6, rtol=0)
    assert (full.sequences[:3, 4:] == 0).all() and (full.token_scores[:3, 3:] == 0).all()  # X-modaler's tail


@pytest.mark.parametrize("returned", [1, 3])
def test_xmodaler_beam_search_method_is_a_deprecated_alias_of_the_custom_generate_route(returned):
    torch.manual_seed(0)
    model = TdenForConditionalGeneration(tiny_config(num_cross_encoder_layers=0)).eval()
    batch = inputs()
    found = model.generate(
        **regions(batch),
        max_new_tokens=5,
        num_beams=3,
        num_return_sequences=returned,
        custom_generate=xmodaler_beam_search,
        return_dict_in_generate=True,
    )
    assert isinstance(found, XmodalerBeamSearchOutput) and found.sequences.shape == (B * returned, 6)
    torch.testing.assert_close(found.sequences_scores, found.token_scores.sum(-1))
    with pytest.warns(FutureWarning, match="custom_generate"):
        old = model.xmodaler_beam_search(**regions(batch), num_beams=3, max_new_tokens=5, num_return_sequences=returned)
    assert torch.equal(old.sequences.flatten(0, 1), found.sequences[:, 1:])
    assert torch.equal(old.sequences_scores.flatten(), found.sequences_scores)
    assert torch.equal(old.token_scores.flatten(0, 1), found.token_scores)


def test_best_candidates_are_the_head_of_a_stable_descending_sort():
    from vlhub.modeling.tden.generation_tden import best_candidates

    generator = torch.Generator().manual_seed(0)
    distinct = torch.randn(4, 3 * 997, generator=generator)
    tied = torch.randint(0, 6, (4, 3 * 997), generator=generator).float()  # ties everywhere, at the boundary too
    tied[1, :] = -999.0
    tied[1, 5] = 0.0  # one clear best, then every other value tied
    inside = distinct.clone()
    inside[:, [40, 7, 900]] = 50.0  # ties among the best only: topk's set is right, its order among them is not defined
    for candidates in (distinct, tied, inside):
        for count in (1, 3, 5):
            values, indices = best_candidates(candidates, count)
            expected = torch.sort(candidates, dim=-1, descending=True, stable=True)
            assert torch.equal(values, expected.values[:, :count])
            assert torch.equal(indices, expected.indices[:, :count])
