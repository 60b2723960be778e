"""What transformers' `GenerationTesterMixin` checks (tests/generation_checks.py), for `TdenForConditionalGeneration`,
the one TDEN head that generates.

The captioner is a causal decoder over the generation stream: the per-step attentions and hidden states are the
sentence encoder's (the stream's self-attention layers), the cache one `TdenBeamCache` over the sentence encoder and
the decoder, with the decoder's cross-attention keys over the regions computed once.
"""

import torch

from vlhub import TdenForConditionalGeneration
from vlhub.utils.compat import CACHE_NAME

from ...generation_checks import BATCH, GenerationChecks
from ...test_tden_transformers_checks import FEATURES, REGIONS, tiny_config

WORDS = 3
PROMPT = 1 + WORDS  # [CLS] w w w
VOCAB = tiny_config().vocab_size


def build(seed=0, **overrides) -> TdenForConditionalGeneration:
    torch.manual_seed(seed)
    return TdenForConditionalGeneration(tiny_config(**overrides)).eval()


def prompt(batch=BATCH, seed=0) -> dict:
    """`[CLS] w w w` and random regions (the last example's last region padded)."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, VOCAB, (batch, PROMPT), generator=g)
    input_ids[:, 0] = 2
    region_attention_mask = torch.ones(batch, REGIONS, dtype=torch.long)
    region_attention_mask[-1, -1] = 0
    return dict(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        region_features=torch.rand(batch, REGIONS, FEATURES, generator=g),
        region_locations=torch.rand(batch, REGIONS, 5, generator=g),
        region_attention_mask=region_attention_mask,
    )


class TestTdenGeneration(GenerationChecks):
    """Static cache: TDEN decodes on its own `TdenBeamCache` (one `EncoderDecoderCache` over the sentence encoder and
    the decoder, whose cross-attention keys over the regions are computed once), so `generate()` refuses a static
    one rather than silently decoding on the dynamic cache. Eager attention's cached steps (the shapes check) used to
    fail on the cross-attention mask."""

    prompt_length = PROMPT
    shorter_prompt_by = 2
    build = staticmethod(build)
    prompt = staticmethod(prompt)

    @staticmethod
    def self_attention_layers(cache):
        return cache.self_attention_cache.layers


def test_forward_follows_config_use_cache():
    model = build()
    inputs = prompt()
    assert getattr(model(**inputs), CACHE_NAME).get_seq_length() == PROMPT  # config.use_cache is True
    assert getattr(model(**inputs, use_cache=False), CACHE_NAME) is None
    model.config.use_cache = False
    assert getattr(model(**inputs), CACHE_NAME) is None
    assert getattr(model(**inputs, use_cache=True), CACHE_NAME).get_seq_length() == PROMPT
