"""X-modaler's beam search for TDEN, as a decoding option of transformers' `generate()`.

```python
from vlhub.modeling.tden import xmodaler_beam_search
ids = model.generate(**inputs, custom_generate=xmodaler_beam_search, num_beams=2, max_new_tokens=20)
captions = processor.batch_decode(ids, skip_special_tokens=True)
```

What it does (X-modaler's `BeamSearcher`, from meshed-memory-transformer, which the released numbers used):
- at every step all `beam × vocabulary` candidates compete by the plain sum of log-probs (no length normalisation);
- a beam that emitted [SEP] (`eos_token_id`) stays in its slot and offers one candidate (word 0) at its frozen score;
- all `max_new_tokens` steps run (no early stop); at the end the beams are sorted by score. Once every beam of every
  image has emitted [SEP], each later step only appends word 0 (token score 0) to every beam and keeps the beams in
  score order, so the loop here stops there and writes those steps' words and scores directly: the same result.
- candidates that tie keep their order (the lower beam, then the lower word, first): X-modaler sorts with an unstable
  sort, whose order among equal scores is not defined.

transformers' own beam search (`generate(num_beams=k)` without `custom_generate`) keeps finished hypotheses apart
and stops early, so its captions can differ from the original's. Logits processors and stopping criteria are not
applied here (the original had none). The sentence encoder and the decoder reuse their key/value cache (reordered
with the beams); the object encoder runs once per image.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.nn import functional as F
from transformers.modeling_outputs import ModelOutput

if TYPE_CHECKING:
    from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList

__all__ = ["xmodaler_beam_search", "XmodalerBeamSearchOutput"]


@dataclass
class XmodalerBeamSearchOutput(ModelOutput):
    r"""
    sequences (`torch.LongTensor` of shape `(batch * num_return_sequences, prompt_length + max_new_tokens)`):
        the prompt, then the generated words, best beam of each image first; 0 after [SEP], as X-modaler writes them.
    sequences_scores (`torch.FloatTensor` of shape `(batch * num_return_sequences,)`):
        each beam's summed log-probs.
    token_scores (`torch.FloatTensor` of shape `(batch * num_return_sequences, max_new_tokens)`):
        the log-prob of each generated word (0 after [SEP]); a row sums to its `sequences_scores`.
    """

    sequences: torch.LongTensor | None = None
    sequences_scores: torch.FloatTensor | None = None
    token_scores: torch.FloatTensor | None = None


def _first_step_inputs(model_kwargs: dict, rows: torch.Tensor) -> dict:
    names = ("attention_mask", "token_type_ids", "region_features", "region_locations", "region_attention_mask")
    return {name: model_kwargs[name][rows] for name in names if model_kwargs.get(name) is not None}


@torch.no_grad()
def xmodaler_beam_search(
    model: "PreTrainedModel",
    input_ids: torch.LongTensor,
    logits_processor: "LogitsProcessorList | None" = None,
    stopping_criteria: "StoppingCriteriaList | None" = None,
    generation_config: "GenerationConfig | None" = None,
    **model_kwargs: Any,
) -> "torch.LongTensor | XmodalerBeamSearchOutput":
    """X-modaler's beam search as a `generate(custom_generate=...)` decoding loop (see the module docstring).

    `generate()` has already repeated every input `max(num_beams, num_return_sequences)` times; each image is
    encoded once. Returns `sequences` `(batch * num_return_sequences, prompt_length + max_new_tokens)`, or a
    `XmodalerBeamSearchOutput` with `return_dict_in_generate=True`.
    """
    beams, returned = generation_config.num_beams, generation_config.num_return_sequences or 1
    max_new_tokens = generation_config.max_new_tokens
    if max_new_tokens is None:
        max_new_tokens = generation_config.max_length - input_ids.shape[1]
    if max_new_tokens < 1:
        raise ValueError(f"xmodaler_beam_search needs max_new_tokens >= 1, got {max_new_tokens}")
    if not 1 <= returned <= beams:
        raise ValueError(f"num_return_sequences must be between 1 and num_beams={beams}, got {returned}")
    eos = generation_config.eos_token_id
    eos = model.config.eos_token_id if eos is None else eos
    eos = eos[0] if isinstance(eos, (list, tuple)) else int(eos)
    copies = max(beams, returned)
    if input_ids.shape[0] % copies:
        raise ValueError(f"{input_ids.shape[0]} inputs are not a multiple of num_beams={beams}")
    firsts = torch.arange(input_ids.shape[0] // copies, device=input_ids.device) * copies
    prompt = input_ids[firsts]
    found = beam_search(model, prompt, _first_step_inputs(model_kwargs, firsts), beams, max_new_tokens, eos)
    kept = {name: value[:, :returned].flatten(0, 1) for name, value in found.items()}
    sequences = torch.cat([prompt.repeat_interleave(returned, dim=0), kept["words"]], dim=1)
    if generation_config.return_dict_in_generate:
        return XmodalerBeamSearchOutput(
            sequences=sequences, sequences_scores=kept["scores"], token_scores=kept["token_scores"]
        )
    return sequences


def beam_search(
    model: "PreTrainedModel", prompt: torch.LongTensor, inputs: dict, beams: int, steps: int, eos: int
) -> dict:
    """The search itself, from `prompt` `(batch, P)` and the first step's other inputs (regions, masks): every beam
    sorted by score, `{"words": (batch, beams, steps), "scores": (batch, beams), "token_scores": (batch, beams,
    steps)}`."""
    from .modeling_tden import TdenBeamCache  # modeling_tden imports this module

    batch, device = prompt.shape[0], prompt.device
    cache = TdenBeamCache()
    tokens, seq_logprob = prompt, torch.zeros(batch, 1, 1, device=device)
    seq_mask = torch.ones(batch, beams, 1, device=device)
    words, word_logprobs, selected_words = [], [], None
    attention_mask = inputs.pop("attention_mask", None)
    for step in range(steps):
        rows = 1 if step == 0 else beams
        if attention_mask is not None:
            inputs["attention_mask"] = attention_mask
        logits = model(input_ids=tokens, cache=cache, use_cache=True, **inputs).logits[:, -1]
        word_logprob = F.log_softmax(logits.float(), dim=-1).view(batch, rows, -1)
        vocab = word_logprob.shape[-1]
        candidates = seq_logprob + word_logprob
        if step > 0:
            # A finished beam keeps its score and offers only word 0.
            seq_mask = seq_mask * (selected_words.view(batch, rows) != eos).float().unsqueeze(-1)
            word_logprob = word_logprob * seq_mask
            frozen = seq_logprob.expand_as(candidates).clone()
            frozen[:, :, 1:] = -999
            candidates = seq_mask * candidates + frozen * (1 - seq_mask)
        selected_logprob, selected = best_candidates(candidates.view(batch, -1), beams)
        selected_beam = torch.div(selected, vocab, rounding_mode="floor")
        selected_words = selected - selected_beam * vocab
        if step == 0:  # one row per image so far: every beam continues it
            cache.batch_repeat_interleave(beams)
            inputs = _later_step_inputs(inputs, beams)
            if attention_mask is not None:
                attention_mask = attention_mask.repeat_interleave(beams, dim=0)
        else:  # rows of the flat (batch * beams) caches that the selected beams continue
            cache.reorder_cache((torch.arange(batch, device=device).unsqueeze(1) * rows + selected_beam).view(-1))
        if attention_mask is not None:
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(attention_mask.shape[0], 1)], dim=1)
        seq_logprob = selected_logprob.unsqueeze(-1)
        seq_mask = torch.gather(seq_mask, 1, selected_beam.unsqueeze(-1))
        words = [torch.gather(w, 1, selected_beam.unsqueeze(-1)) for w in words] + [selected_words.unsqueeze(-1)]
        chosen = torch.gather(word_logprob, 1, selected_beam.unsqueeze(-1).expand(batch, beams, vocab))
        word_logprobs = [torch.gather(w, 1, selected_beam.unsqueeze(-1)) for w in word_logprobs]
        word_logprobs.append(torch.gather(chosen, 2, selected_words.unsqueeze(-1)))
        tokens = selected_words.view(-1, 1)
        if step + 1 < steps and not bool((seq_mask[..., 0] * (selected_words != eos)).any()):
            # every beam has ended: the remaining steps would append word 0 with token score 0 (the docstring), a
            # log-prob times a zero mask: -0.0
            words.append(selected_words.new_zeros(batch, beams, steps - step - 1))
            word_logprobs.append(word_logprobs[-1].new_full((batch, beams, steps - step - 1), -0.0))
            break
    scores, order = torch.sort(seq_logprob, dim=1, descending=True, stable=True)
    return {
        "words": torch.gather(torch.cat(words, -1), 1, order.expand(batch, beams, steps)),
        "scores": scores[..., 0],
        "token_scores": torch.gather(torch.cat(word_logprobs, -1), 1, order.expand(batch, beams, steps)),
    }


def best_candidates(candidates: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(values, indices)` `(rows, count)`: the first `count` of a stable descending sort of each row of `candidates`
    `(rows, n)`, found with `topk` (one pass over the row) instead of sorting it whole (3 beams × 30522 words a step:
    sorting them took 10% of a TDEN-base beam-3 decoding at batch 1). Where the `count`-th value ties with one left
    out, which `topk` would pick arbitrarily, the rows are sorted whole."""
    values, indices = torch.topk(candidates, count, dim=-1)
    if bool(((candidates >= values[:, -1:]).sum(-1) == count).all()):  # the set is right: order it as the sort would
        by_index = torch.argsort(indices, dim=-1)
        values, indices = values.gather(-1, by_index), indices.gather(-1, by_index)
        order = torch.sort(values, dim=-1, descending=True, stable=True).indices
        return values.gather(-1, order), indices.gather(-1, order)
    values, indices = torch.sort(candidates, dim=-1, descending=True, stable=True)
    return values[:, :count], indices[:, :count]


def _later_step_inputs(first: dict, beams: int) -> dict:
    """After the first step the regions come from the cache: only their padding mask is needed, one row per beam."""
    mask = first.get("region_attention_mask")
    if mask is None:
        features = first["region_features"]
        mask = torch.ones(features.shape[:2], dtype=torch.long, device=features.device)
    return {"region_attention_mask": mask.repeat_interleave(beams, dim=0)}
