"""What transformers' `GenerationTesterMixin` checks, for vlhub's captioners (transformers' source distribution lacks
tests/generation/test_utils.py, so these are vlhub's own checks of the same behaviours).

Use: subclass `GenerationChecks` in a test module and give it the architecture's tiny model and prompt:

    class TestMyCaptionerGeneration(GenerationChecks):
        prompt_length = 4
        build = staticmethod(build)      # build(seed=0, **config_overrides) -> model in eval mode
        prompt = staticmethod(prompt)    # prompt(batch=BATCH) -> generate()'s inputs, `prompt_length` tokens
"""

import pytest
import torch

from vlhub.utils.compat import CACHE_NAME

__all__ = ["BATCH", "NEW", "SETTINGS", "SEARCHES", "GenerationChecks", "generate", "left_padded", "rows"]

BATCH, NEW = 2, 4
ATTENTION_IMPLEMENTATIONS = ["eager", "sdpa"]
# No end token: every step runs (length-based checks), as GenerationTesterMixin does.
SETTINGS = dict(max_new_tokens=NEW, eos_token_id=None, pad_token_id=0, return_dict_in_generate=True)
SEARCHES = {
    "greedy": dict(do_sample=False),
    "sample": dict(do_sample=True, num_return_sequences=2, top_k=10, temperature=0.7),
    "beam": dict(do_sample=False, num_beams=2, num_return_sequences=2, length_penalty=2.0, early_stopping=False),
}


def rows(inputs: dict, index) -> dict:
    return {name: value[index] for name, value in inputs.items()}


def generate(model, inputs, search: str, seed=0, **kwargs):
    torch.manual_seed(seed)
    return model.generate(**inputs, **SETTINGS, **SEARCHES[search], **kwargs)


def internal_rows(search: str) -> int:
    """Rows per step: beams or returned sequences per input."""
    settings = SEARCHES[search]
    return BATCH * max(settings.get("num_beams", 1), settings.get("num_return_sequences", 1))


def left_padded(inputs: dict, sequences: list[torch.Tensor], extra: int = 0) -> dict:
    """`inputs` with `sequences` as its prompts, left-padded to the longest plus `extra` (attention mask 0 there)."""
    width = max(len(sequence) for sequence in sequences) + extra
    input_ids = torch.zeros(len(sequences), width, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, sequence in enumerate(sequences):
        input_ids[i, width - len(sequence) :] = sequence
        attention_mask[i, width - len(sequence) :] = 1
    return {**inputs, "input_ids": input_ids, "attention_mask": attention_mask}


class GenerationChecks:
    """The checks; a subclass gives `build`, `prompt` and `prompt_length` (see the module docstring)."""

    prompt_length: int
    shorter_prompt_by = 1  # the left-padding batch's second prompt drops this many words

    @staticmethod
    def self_attention_layers(cache):
        """The layers of the cache whose keys grow with the sequence."""
        return cache.layers

    @pytest.mark.parametrize("use_cache", [True, False])
    @pytest.mark.parametrize("search", sorted(SEARCHES))
    def test_return_dict_has_a_decoders_per_step_shapes(self, search, use_cache):
        """GenerationTesterMixin._check_outputs, under eager attention: scores/logits per new token; attentions and
        hidden states per step of the fed tokens: the prompt `(L, L)`, then `(1, L + t)` with a cache or
        `(L + t, L + t)` without; the cache holds every token but the last."""
        model = self.build(_attn_implementation="eager")
        config = model.config
        out = generate(
            model,
            self.prompt(),
            search,
            use_cache=use_cache,
            output_scores=True,
            output_logits=True,
            output_attentions=True,
            output_hidden_states=True,
        )
        batch = internal_rows(search)
        returned = BATCH * SEARCHES[search].get("num_return_sequences", 1)
        assert out.sequences.shape == (returned, self.prompt_length + NEW)
        assert [s.shape for s in out.scores] == [(batch, config.vocab_size)] * NEW
        assert [s.shape for s in out.logits] == [(batch, config.vocab_size)] * NEW
        assert len(out.attentions) == len(out.hidden_states) == NEW
        for step, (attentions, hidden_states) in enumerate(zip(out.attentions, out.hidden_states)):
            keys = self.prompt_length + step
            queries = keys if step == 0 or not use_cache else 1
            assert len(attentions) == config.num_hidden_layers
            assert len(hidden_states) == config.num_hidden_layers + 1
            assert all(a.shape == (batch, config.num_attention_heads, queries, keys) for a in attentions)
            assert all(h.shape == (batch, queries, config.hidden_size) for h in hidden_states)
            # Each row is a probability distribution over the keys it may see (nothing lost to a dropped column).
            torch.testing.assert_close(attentions[-1].sum(-1), torch.ones(batch, config.num_attention_heads, queries))
        cache = getattr(out, CACHE_NAME)
        if use_cache:
            assert cache.get_seq_length() == self.prompt_length + NEW - 1
            assert self.self_attention_layers(cache)[0].keys.shape[0] == batch
        else:
            assert cache is None

    @pytest.mark.parametrize("search", ["greedy", "beam"])
    @pytest.mark.parametrize("attn_implementation", ATTENTION_IMPLEMENTATIONS)
    def test_generate_with_and_without_cache_agree(self, search, attn_implementation):
        model = self.build(_attn_implementation=attn_implementation)
        cached = generate(model, self.prompt(), search, output_scores=True)
        uncached = generate(model, self.prompt(), search, output_scores=True, use_cache=False)
        assert torch.equal(cached.sequences, uncached.sequences)
        torch.testing.assert_close(torch.stack(cached.scores), torch.stack(uncached.scores), atol=1e-5, rtol=1e-5)

    def test_generate_continues_from_a_returned_cache(self):
        """GenerationTesterMixin.test_generate_continue_from_past_key_values: 3 tokens, then 1 more from the
        returned cache, give the 4 tokens (and the cache) of one call."""
        model = self.build()
        inputs = self.prompt()
        whole = generate(model, inputs, "greedy")
        first = model.generate(**inputs, **{**SETTINGS, "max_new_tokens": NEW - 1}, do_sample=False)
        more = {
            **inputs,
            "input_ids": first.sequences,
            "attention_mask": torch.ones_like(first.sequences),
            CACHE_NAME: getattr(first, CACHE_NAME),
        }
        second = model.generate(**more, **{**SETTINGS, "max_new_tokens": 1}, do_sample=False)
        assert torch.equal(second.sequences, whole.sequences)
        layers = zip(
            self.self_attention_layers(getattr(whole, CACHE_NAME)),
            self.self_attention_layers(getattr(second, CACHE_NAME)),
        )
        for layer_whole, layer_second in layers:
            torch.testing.assert_close(layer_whole.keys, layer_second.keys, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(layer_whole.values, layer_second.values, atol=1e-5, rtol=1e-5)

    @pytest.mark.parametrize("assistant_seed, attn_implementation", [(0, "sdpa"), (1, "eager")])
    def test_assisted_decoding_matches_greedy_search(self, assistant_seed, attn_implementation):
        """GenerationTesterMixin.test_assisted_decoding_matches_greedy_search: the model verifies several candidate
        tokens in one forward; the captions are greedy search's whatever the assistant proposes (seed 0: the model
        itself, every candidate accepted; seed 1: other weights, candidates rejected and the cache cropped); and
        prompt-lookup decoding likewise."""
        model = self.build(_attn_implementation=attn_implementation)
        assistant = self.build(seed=assistant_seed, _attn_implementation=attn_implementation)
        assistant.generation_config.num_assistant_tokens = 3
        inputs = rows(self.prompt(), slice(0, 1))  # transformers' assisted decoding takes one input at a time
        settings = {**SETTINGS, "output_scores": True, "max_new_tokens": 6, "do_sample": False}
        greedy = model.generate(**inputs, **settings)
        assisted = model.generate(**inputs, **settings, assistant_model=assistant)
        assert torch.equal(assisted.sequences, greedy.sequences)
        torch.testing.assert_close(torch.stack(assisted.scores), torch.stack(greedy.scores), atol=1e-5, rtol=1e-5)
        looked_up = model.generate(**inputs, **settings, prompt_lookup_num_tokens=2)
        assert torch.equal(looked_up.sequences, greedy.sequences)

    @pytest.mark.parametrize("attn_implementation", ATTENTION_IMPLEMENTATIONS)
    def test_left_padding_compatibility(self, attn_implementation):
        """GenerationTesterMixin.test_left_padding_compatibility: with position ids from the mask (what the mixin
        and `generate()` pass), the last position's logits of a left-padded input are the unpadded input's."""
        model = self.build(_attn_implementation=attn_implementation)
        inputs = self.prompt()
        unpadded = model(**inputs, use_cache=False).logits[:, -1]
        padded = left_padded(inputs, list(inputs["input_ids"]), extra=5)
        position_ids = (padded["attention_mask"].cumsum(-1) - 1).masked_fill(padded["attention_mask"] == 0, 1)
        logits = model(**padded, position_ids=position_ids, use_cache=False).logits[:, -1]
        torch.testing.assert_close(logits, unpadded, atol=1e-5, rtol=1e-5)

    @pytest.mark.parametrize("use_cache", [True, False])
    @pytest.mark.parametrize("search", ["greedy", "beam"])
    def test_left_padded_batch_generates_what_each_prompt_generates_alone(self, search, use_cache):
        model = self.build()
        inputs = self.prompt()
        cut = self.prompt_length - self.shorter_prompt_by
        short = {
            **inputs,
            "input_ids": inputs["input_ids"][:, :cut],
            "attention_mask": inputs["attention_mask"][:, :cut],
        }
        padded = left_padded(inputs, [inputs["input_ids"][0], short["input_ids"][1]])
        batch = generate(model, padded, search, output_scores=True, use_cache=use_cache)
        rows_per_input = internal_rows(search) // BATCH
        for i, alone_inputs in enumerate([rows(inputs, slice(0, 1)), rows(short, slice(1, 2))]):
            alone = generate(model, alone_inputs, search, output_scores=True, use_cache=use_cache)
            returned = alone.sequences.shape[0]
            assert torch.equal(batch.sequences[i * returned : (i + 1) * returned, -NEW:], alone.sequences[:, -NEW:])
            if search == "greedy":
                mine = torch.stack(batch.scores)[:, i * rows_per_input : (i + 1) * rows_per_input]
                torch.testing.assert_close(mine, torch.stack(alone.scores), atol=1e-5, rtol=1e-5)

    def test_eager_and_sdpa_generate_the_same(self):
        """GenerationTesterMixin.test_eager_matches_sdpa_generate (float32 here: the CPU check of the same weights)."""
        eager = self.build(_attn_implementation="eager")
        sdpa = self.build(_attn_implementation="sdpa")
        sdpa.load_state_dict(eager.state_dict())
        for search in ("greedy", "beam"):
            a = generate(eager, self.prompt(), search, output_scores=True)
            b = generate(sdpa, self.prompt(), search, output_scores=True)
            assert torch.equal(a.sequences, b.sequences)
            torch.testing.assert_close(torch.stack(a.scores), torch.stack(b.scores), atol=1e-5, rtol=1e-5)

    def test_static_cache_is_refused_with_the_reason(self):
        """The compile / static-cache checks, replaced by this one (reason in each model's error and test module):
        `generate(cache_implementation="static")`, which compiled decoding needs, is refused with the reason
        rather than decoded wrongly or silently on a dynamic cache."""
        with pytest.raises(ValueError, match="static"):
            self.build().generate(**self.prompt(), **SETTINGS, cache_implementation="static")
