"""What transformers' `GenerationTesterMixin` checks (tests/generation_checks.py), for
`UnifiedVlpForConditionalGeneration`, the one Unified VLP head that generates.

The captioner predicts each word from a [MASK] slot appended after the words so far; what `generate()` returns must
still be what a decoder returns: per-step attentions and hidden states of the fed tokens only, one verified logit row
per candidate token in assisted decoding, and the same captions for a left-padded prompt.
"""

import pytest
import torch

from vlhub import UnifiedVlpForConditionalGeneration
from vlhub.utils.compat import CACHE_NAME

from ...generation_checks import BATCH, GenerationChecks, generate, left_padded
from ...test_unified_vlp_transformers_checks import CLASSES, FEATURES, REGIONS, tiny_config

WORDS = 2
PROMPT = REGIONS + 2 + WORDS  # [CLS] r r r r [SEP] w w
VOCAB = tiny_config().vocab_size


def build(seed=0, **overrides) -> UnifiedVlpForConditionalGeneration:
    torch.manual_seed(seed)
    return UnifiedVlpForConditionalGeneration(tiny_config(**overrides)).eval()


def prompt(batch=BATCH, seed=0) -> dict:
    """`[CLS] r r r r [SEP] w w` with random regions (the last example's last region slot padded)."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, VOCAB, (batch, PROMPT), generator=g)
    input_ids[:, 0], input_ids[:, 1 : REGIONS + 1], input_ids[:, REGIONS + 1] = 2, 1, 3
    region_attention_mask = torch.ones(batch, REGIONS, dtype=torch.long)
    region_attention_mask[-1, -1] = 0
    return dict(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        region_features=torch.rand(batch, REGIONS, FEATURES, generator=g),
        region_locations=torch.randn(batch, REGIONS, 6 + CLASSES, generator=g),
        region_attention_mask=region_attention_mask,
    )


class TestUnifiedVlpGeneration(GenerationChecks):
    """Static cache: transformers builds a causal 4-D mask for the prompt of a static (compileable) cache, but the
    image block `[CLS] r_1 .. r_N [SEP]` attends both ways (the seq2seq pattern), so `generate()` refuses one."""

    prompt_length = PROMPT
    build = staticmethod(build)
    prompt = staticmethod(prompt)


def test_step_hidden_states_are_the_fed_tokens_states():
    """The cached step's hidden states and attentions are those of the token fed at that step: the no-cache run's
    last row (the [MASK] slot that predicts the next word is in neither)."""
    model = build(_attn_implementation="eager")
    kwargs = dict(output_hidden_states=True, output_attentions=True)
    cached = generate(model, prompt(), "greedy", **kwargs)
    uncached = generate(model, prompt(), "greedy", use_cache=False, **kwargs)
    assert torch.equal(cached.sequences, uncached.sequences)
    for step in range(1, len(cached.hidden_states)):
        for with_cache, without in zip(cached.hidden_states[step], uncached.hidden_states[step]):
            torch.testing.assert_close(with_cache[:, 0], without[:, -1], atol=1e-5, rtol=1e-5)
        for with_cache, without in zip(cached.attentions[step], uncached.attentions[step]):
            torch.testing.assert_close(with_cache[:, :, 0], without[:, :, -1], atol=1e-5, rtol=1e-5)


def test_forward_use_cache_makes_a_cache_under_the_seq2seq_pattern_only():
    model = build()
    inputs = prompt()
    out = model(**inputs, use_cache=True)
    assert getattr(out, CACHE_NAME).get_seq_length() == PROMPT
    assert getattr(model(**inputs, use_cache=False), CACHE_NAME) is None
    # predict_next with a new cache: the [MASK] is not kept
    assert getattr(model(**inputs, use_cache=True, predict_next=True), CACHE_NAME).get_seq_length() == PROMPT
    # the bare model is bidirectional by default: nothing to reuse, no cache; seq2seq makes one
    assert getattr(model.vlp(**inputs, use_cache=True), CACHE_NAME) is None
    assert getattr(model.vlp(**inputs, use_cache=True, seq2seq=True), CACHE_NAME).get_seq_length() == PROMPT


def test_several_prediction_slots_equal_one_step_at_a_time():
    """`predict_next` with `logits_to_keep=k`: the logits after each of the last k tokens are those of k separate
    steps, and the cache keeps only the real tokens."""
    model = build()
    inputs = prompt()
    words = torch.randint(5, VOCAB, (BATCH, 3), generator=torch.Generator().manual_seed(3))
    prefix = model(**inputs, use_cache=True, predict_next=True)
    cache = getattr(prefix, CACHE_NAME)
    together = model(
        input_ids=words,
        region_attention_mask=inputs["region_attention_mask"],  # as generate() passes it at every step
        cache=cache,
        use_cache=True,
        predict_next=True,
        logits_to_keep=0,
    )
    assert together.logits.shape == (BATCH, 3, model.config.vocab_size)
    assert cache.get_seq_length() == PROMPT + 3
    for step in range(3):
        ids = torch.cat([inputs["input_ids"], words[:, : step + 1]], 1)
        alone = model(**{**inputs, "input_ids": ids, "attention_mask": torch.ones_like(ids)}, predict_next=True)
        torch.testing.assert_close(together.logits[:, step], alone.logits[:, 0], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="logits_to_keep must be between 0"):
        model(input_ids=words, cache=cache, predict_next=True, logits_to_keep=4)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_left_padding_without_position_ids(attn_implementation):
    """Beyond the mixin: the default positions, the [MASK] slot and the VQA reading of a left-padded input follow
    each row's padding too."""
    model = build(_attn_implementation=attn_implementation)
    inputs = prompt()
    padded = left_padded(inputs, list(inputs["input_ids"]), extra=5)
    torch.testing.assert_close(model(**padded).logits[:, -1], model(**inputs).logits[:, -1])
    torch.testing.assert_close(model(**padded, predict_next=True).logits, model(**inputs, predict_next=True).logits)
