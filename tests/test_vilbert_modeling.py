"""ViLBERT modelling beyond the transformers checks: the shared co-attention block, task tokens, the heads' own
behaviour and clear errors for bad input."""

import pytest
import torch
from safetensors.torch import save_file
from torch.nn import functional as F

from vlhub import (
    VilbertConfig,
    VilbertForImageTextRetrieval,
    VilbertForPreTraining,
    VilbertForQuestionAnswering,
    VilbertForReferringExpression,
    VilbertModel,
)
from vlhub.modeling.vilbert.layers_vilbert import CoAttention, CoAttentionLayer, StreamConfig

from .test_vilbert_transformers_checks import BATCH, REGIONS, TEXT, text_and_regions, tiny_config


def test_co_attention_matches_a_direct_computation_in_both_backends():
    """Each stream's queries over the other stream's keys, masked at the other stream's padding, for eager and sdpa;
    probabilities only from eager."""
    torch.manual_seed(0)
    config = tiny_config(_attn_implementation="eager")
    block = CoAttention(config, 12, 20, 16, 4, 0.0, 0.0).eval()
    a, b = torch.randn(2, 3, 12), torch.randn(2, 5, 20)
    mask_b = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    additive = ((1 - mask_b) * -10000.0)[:, None, None, :]

    def heads(x):
        return x.view(*x.shape[:2], 4, 4).transpose(1, 2)

    scores = heads(block.query1(a)) @ heads(block.key2(b)).transpose(-1, -2) / 2 + additive
    expected1 = (scores.softmax(-1) @ heads(block.value2(b))).transpose(1, 2).reshape(2, 3, 16)
    expected2 = (heads(block.query2(b)) @ heads(block.key1(a)).transpose(-1, -2) / 2).softmax(-1)
    from vlhub.modeling.vilbert.layers_vilbert import cross_stream_mask

    for implementation in ("eager", "sdpa"):
        config._attn_implementation = implementation
        with torch.no_grad():
            context1, context2, p1, p2 = block(a, b, None, cross_stream_mask(config, a, b, mask_b))
        torch.testing.assert_close(context1, expected1, atol=1e-5, rtol=1e-5)
        assert context2.shape == (2, 5, 16)
        if implementation == "eager":
            torch.testing.assert_close(p1, scores.softmax(-1), atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(p2, expected2, atol=1e-6, rtol=1e-5)
            assert p1[1, :, :, 3:].max() == 0
        else:
            assert p1 is None and p2 is None


def test_stream_config_reads_the_model_config_live():
    config = tiny_config()
    visual = StreamConfig(config, hidden_size=24)
    assert visual.hidden_size == 24 and visual.intermediate_size == config.intermediate_size
    config._attn_implementation = "eager"
    assert visual._attn_implementation == "eager"
    layer = CoAttentionLayer(visual, StreamConfig(config), 16, 2)
    assert layer.biattention.config._attn_implementation == "eager"
    import copy

    copied = copy.deepcopy(layer)
    assert copied.biattention.config.hidden_size == 24


def test_task_token_is_inserted_after_cls_without_position_embedding():
    torch.manual_seed(0)
    model = VilbertModel(tiny_config(num_task_tokens=4)).eval()
    inputs = text_and_regions(model.config)
    with torch.no_grad():
        embeddings = model.embeddings(input_ids=inputs["input_ids"], task_ids=inputs["task_ids"])
        words = model.embeddings.word_embeddings(inputs["input_ids"])
        positions = model.embeddings.position_embeddings.weight[:TEXT]
        types = model.embeddings.token_type_embeddings.weight[0]
        task = model.embeddings.task_embeddings(inputs["task_ids"][:, 0])
        summed = torch.cat([(words + positions + types)[:, :1], task[:, None], (words + positions + types)[:, 1:]], 1)
        expected = model.embeddings.LayerNorm(summed)
        torch.testing.assert_close(embeddings, expected)
        outputs = model(**inputs)
    assert outputs.last_hidden_state.shape[1] == TEXT + 1


def test_output_attentions_under_sdpa_warns_and_returns_no_maps_as_bert():
    """As transformers' BERT: sdpa warns that it has no maps and the attention fields are empty; eager has them."""
    from transformers.integrations import sdpa_attention
    from transformers.testing_utils import CaptureLogger

    model = VilbertModel(tiny_config(_attn_implementation="sdpa")).eval()
    inputs = text_and_regions(model.config)
    sdpa_attention.logger.warning_once.cache_clear()
    with CaptureLogger(sdpa_attention.logger) as captured, torch.no_grad():
        outputs = model(**inputs, output_attentions=True)
    assert "does not support `output_attentions=True`" in captured.out
    fields = ("attentions", "vision_attentions", "text_to_vision_attentions", "vision_to_text_attentions")
    assert all(outputs[name] == () for name in fields)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        eager = model(**inputs, output_attentions=True)
    assert len(eager.attentions) == model.config.num_hidden_layers
    assert len(eager.text_to_vision_attentions) == model.config.num_co_attention_layers
    torch.testing.assert_close(outputs.last_hidden_state, eager.last_hidden_state)


def test_vqa_head_computes_no_pretraining_head():
    model = VilbertForQuestionAnswering(tiny_config())
    assert not hasattr(model, "cls")
    assert set(name.split(".")[0] for name, _ in model.named_parameters()) == {"vilbert", "vil_prediction"}


def test_alignment_class_0_means_aligned_and_retrieval_from_alignment():
    torch.manual_seed(0)
    pretraining = VilbertForPreTraining(tiny_config()).eval()
    inputs = text_and_regions(pretraining.config)
    retrieval = VilbertForImageTextRetrieval(tiny_config()).eval()
    retrieval.vilbert.load_state_dict(pretraining.vilbert.state_dict())
    retrieval.initialize_from_pretraining(pretraining.state_dict())
    with torch.no_grad():
        alignment = pretraining(**inputs).alignment_logits
        score = torch.sigmoid(retrieval(**inputs).logits[:, 0])
        loss = pretraining(**inputs, alignment_labels=torch.tensor([0, 0])).alignment_loss
    torch.testing.assert_close(score, alignment.softmax(-1)[:, 0])
    torch.testing.assert_close(loss, F.cross_entropy(alignment, torch.tensor([0, 0])))


def test_region_kl_loss_ignores_the_global_token_and_unmasked_regions():
    torch.manual_seed(0)
    model = VilbertForPreTraining(tiny_config()).eval()
    inputs = text_and_regions(model.config)
    labels = torch.zeros(BATCH, REGIONS, dtype=torch.long)
    labels[:, 0] = 1  # the global token never counts
    labels[0, 2] = 1
    targets = torch.softmax(torch.randn(BATCH, REGIONS, model.config.num_region_labels), -1)
    with torch.no_grad():
        out = model(**inputs, region_labels=labels, region_class_targets=targets)
    log_probs = F.log_softmax(out.region_logits[0, 2], -1)
    expected = (targets[0, 2] * (targets[0, 2].log() - log_probs)).sum()
    torch.testing.assert_close(out.region_kl_loss, expected)


def test_referring_expression_scores_padding_like_the_original():
    model = VilbertForReferringExpression(tiny_config()).eval()
    inputs = text_and_regions(model.config)
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (BATCH, REGIONS) and (logits[1, -2:] < -9000).all()


def test_referring_expression_scores_the_full_models_visual_output(tmp_path):
    """The head's trunk (one-sided last co-attention layer, no text tail, no poolers) gives the full model's visual
    output; a folder that still has the weights it lacks (an older save, the full model's) loads with them
    ignored."""
    torch.manual_seed(0)
    config = tiny_config()
    full = VilbertModel(config).eval()
    state = {f"vilbert.{key}": value for key, value in full.state_dict().items()}
    state |= {"vision_logit.weight": torch.randn(1, 24), "vision_logit.bias": torch.randn(1)}
    state |= {"linguisic_logit.weight": torch.randn(1, 32), "linguisic_logit.bias": torch.randn(1)}
    config.save_pretrained(tmp_path)
    save_file({key: value.contiguous() for key, value in state.items()}, tmp_path / "model.safetensors")
    head, info = VilbertForReferringExpression.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"]
    own = head.state_dict()
    assert len(state) - len(own) == 38 and all(torch.equal(state[key], own[key]) for key in own)
    assert head.vilbert.t_pooler is None and head.vilbert.encoder.c_layer[-1].biattention.query2 is None
    inputs = text_and_regions(config)
    with torch.no_grad():
        vision = full(**inputs).vision_last_hidden_state
        logits = head.eval()(**inputs).logits
    expected = F.linear(vision, state["vision_logit.weight"], state["vision_logit.bias"]).squeeze(-1)
    expected = expected + (1 - inputs["region_attention_mask"]) * -10000.0
    torch.testing.assert_close(logits, expected)
    with pytest.raises(ValueError, match="needs add_pooling_layer=False"):
        VilbertModel(config, add_text_output=False)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda i: i.pop("region_features"), "needs both text"),
        (lambda i: i.pop("input_ids"), "needs both text"),
        (lambda i: i.pop("region_locations"), "without region_locations"),
        (lambda i: i.update(region_locations=torch.rand(BATCH, REGIONS, 7)), "region_locations must have shape"),
        (lambda i: i.pop("region_attention_mask"), "no region_attention_mask"),
        (lambda i: i.update(task_ids=torch.ones(BATCH, 1, dtype=torch.long)), "no task tokens"),
        (lambda i: i.update(region_features=torch.rand(BATCH, REGIONS, 3)), "region_features must have shape"),
    ],
)
def test_bad_inputs_are_named(change, message):
    model = VilbertModel(tiny_config()).eval()
    inputs = text_and_regions(model.config)
    change(inputs)
    with pytest.raises(ValueError, match=message):
        model(**inputs)


def test_multi_task_model_needs_a_known_task_id():
    model = VilbertModel(tiny_config(num_task_tokens=4)).eval()
    inputs = text_and_regions(model.config)
    inputs.pop("task_ids")
    with pytest.raises(ValueError, match="pass task_ids"):
        model(**inputs)
    with pytest.raises(ValueError, match=r"task_ids \[7\] out of range.*0\.\.3"):
        model(**inputs, task_ids=torch.tensor([[7], [7]]))


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(visual_co_attention_layers=[0]), "same length"),
        (dict(text_co_attention_layers=[1, 3]), "must index"),
        (dict(visual_co_attention_layers=[1, 0]), "strictly increasing"),
        (dict(bi_hidden_size=15), "multiple of"),
        (dict(fusion_method="max"), "fusion_method"),
    ],
)
def test_bad_configs_are_named(fields, message):
    with pytest.raises(Exception, match=message):
        tiny_config(**fields)


def test_original_config_switches_vlhub_does_not_implement_are_refused():
    original = dict(
        hidden_size=32,
        num_attention_heads=4,
        v_hidden_size=24,
        v_num_attention_heads=2,
        bi_hidden_size=16,
        bi_num_attention_heads=2,
        v_intermediate_size=24,
        v_biattention_id=[0],
        t_biattention_id=[1],
        num_hidden_layers=2,
        v_num_hidden_layers=1,
    )
    assert VilbertConfig.from_original_config({**original, "task_specific_tokens": True}).num_task_tokens == 20
    with pytest.raises(ValueError, match="dynamic_attention"):
        VilbertConfig.from_original_config({**original, "dynamic_attention": True})
    with pytest.raises(ValueError, match="unexpected field"):
        VilbertConfig.from_original_config({**original, "surprise": 1})


def _repeat_rows(inputs: dict, texts: int, images: int) -> dict:
    """Every text with every image, row i * images + j = (text i, image j), built by repeating the inputs."""
    text_rows = torch.arange(texts).repeat_interleave(images)
    image_rows = torch.arange(images).repeat(texts)
    out = {}
    for name, value in inputs.items():
        out[name] = value[image_rows] if name.startswith("region_") else value[text_rows]
    return out


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("texts, task_tokens", [(2, False), (1, False), (2, True)])
def test_in_batch_pairs_equal_the_repeated_pairs(attn, texts, task_tokens):
    """`in_batch_pairs` (and `fast_mode`: one text, many images) computes what repeating every (text, image) pair
    computes, layer by layer; padded texts and regions included."""
    torch.manual_seed(0)
    config = tiny_config(_attn_implementation=attn, **({"num_task_tokens": 4} if task_tokens else {}))
    model = VilbertForPreTraining(config).eval()
    inputs = text_and_regions(config, batch=3)
    text_inputs = {k: v[:texts] for k, v in inputs.items() if not k.startswith("region_")}
    region_inputs = {k: v for k, v in inputs.items() if k.startswith("region_")}
    with torch.no_grad():
        paired = model(**text_inputs, **region_inputs, in_batch_pairs=True, output_hidden_states=True)
        repeated = model(**_repeat_rows({**text_inputs, **region_inputs}, texts, 3), output_hidden_states=True)
    assert paired.alignment_logits.shape == (texts * 3, 2)
    for name in ("alignment_logits", "prediction_logits", "region_logits", "pooler_output"):
        torch.testing.assert_close(paired[name], repeated[name], atol=1e-5, rtol=1e-5)
    for name in ("hidden_states", "vision_hidden_states"):
        assert len(paired[name]) == len(repeated[name])
        for a, b in zip(paired[name], repeated[name]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_retrieval_scores_one_caption_against_many_images():
    torch.manual_seed(0)
    model = VilbertForImageTextRetrieval(tiny_config()).eval()
    inputs = text_and_regions(model.config, batch=3)
    caption = {k: v[1:2] for k, v in inputs.items() if not k.startswith("region_")}
    regions = {k: v for k, v in inputs.items() if k.startswith("region_")}
    with torch.no_grad():
        scores = model(**caption, **regions, in_batch_pairs=True).logits
        one_by_one = [model(**caption, **{k: v[j : j + 1] for k, v in regions.items()}).logits for j in range(3)]
    torch.testing.assert_close(scores.view(1, 3), torch.cat(one_by_one).view(1, 3), atol=1e-5, rtol=1e-5)


def test_in_batch_pairs_refused_where_outputs_are_not_per_pair():
    model = VilbertForReferringExpression(tiny_config()).eval()
    inputs = text_and_regions(model.config)
    with pytest.raises(ValueError, match="does not take in_batch_pairs"):
        model(**inputs, in_batch_pairs=True)
    retrieval = VilbertForImageTextRetrieval(tiny_config()).eval()
    with pytest.raises(ValueError, match="no training targets"):
        retrieval(**inputs, in_batch_pairs=True, num_negatives=1)
    with pytest.raises(ValueError, match="has none"):
        VilbertModel(tiny_config(visual_co_attention_layers=[], text_co_attention_layers=[]))(
            **inputs, in_batch_pairs=True
        )


def test_pointing_scores_the_candidate_rows_with_the_original_loss():
    """12-in-1 V-logit-mc: scores of the candidate rows, BCE on soft targets averaged and times the number of
    choices (`loss.mean() * target.size(1)`), or cross-entropy on a choice index."""
    torch.manual_seed(0)
    model = VilbertForReferringExpression(tiny_config()).eval()
    inputs = text_and_regions(model.config)
    choices = torch.tensor([[3, 1, 2], [0, 2, 3]])
    targets = torch.tensor([[0.0, 0.7, 0.0], [0.0, 0.0, 0.55]])
    with torch.no_grad():
        regions = model(**inputs).logits
        out = model(**inputs, choice_region_ids=choices, labels=targets)
        by_index = model(**inputs, choice_region_ids=choices, labels=torch.tensor([1, 2]))
    expected = torch.stack([regions[0, [3, 1, 2]], regions[1, [0, 2, 3]]])
    torch.testing.assert_close(out.logits, expected)
    bce = -(targets * F.logsigmoid(expected) + (1 - targets) * F.logsigmoid(-expected))
    torch.testing.assert_close(out.loss, bce.mean() * 3)
    torch.testing.assert_close(by_index.loss, F.cross_entropy(expected, torch.tensor([1, 2])))
    with pytest.raises(ValueError, match="region rows 0..4"):
        model(**inputs, choice_region_ids=torch.tensor([[0, 6], [1, 2]]))
    with pytest.raises(ValueError, match=r"shape \(batch, num_choices\)"):
        model(**inputs, choice_region_ids=torch.tensor([0, 1]))
