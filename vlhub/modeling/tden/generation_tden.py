"""X-modaler's beam search for TDEN, as a decoding option of transformers' `generate()`.

```python
from vlhub.modeling.tden import xmodaler_beam_search
ids = model.generate(**inputs, custom_generate=xmodaler_beam_search, num_beams=2, max_new_tokens=20)
captions = processor.batch_decode(ids, skip_special_tokens=True)
```

What it does (X-modaler's `BeamSearcher`, from meshed-memory-transformer, which the released numbers used):
- at every step all `beam × vocabulary` candidates compete by the plain sum of log-probs (no length normalisation);
- a beam that emitted [SEP] (`eos_token_id`) stays in its slot and offers one candidate (word 0) at its frozen score;
- all `max_new_tokens` steps run (no early stop); at the end the beams are sorted by score. Once every beam of an
  image has emitted [SEP], each later step only appends word 0 (token score 0) to its beams and keeps them in score
  order, so here the image leaves the batch at that step (its rows leave the cache) and those steps' words and scores
  are written directly: the same result, and the search stops when no image is left.
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

from ..modeling_utils import rows_of_groups

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


# The score X-modaler gives every word but word 0 of a beam that has ended (word 0 keeps the beam's score).
_ENDED_BEAM_OTHER_WORDS = -999.0


def beam_search(
    model: "PreTrainedModel", prompt: torch.LongTensor, inputs: dict, beams: int, steps: int, eos: int
) -> dict:
    """The search itself, from `prompt` `(batch, P)` and the first step's other inputs (regions, masks): every beam
    sorted by score, `{"words": (batch, beams, steps), "scores": (batch, beams), "token_scores": (batch, beams,
    steps)}`. An image whose beams have all ended leaves the batch (the module docstring)."""
    from .modeling_tden import TdenBeamCache  # modeling_tden imports this module

    found = _EndedImages(prompt.shape[0], beams, steps, prompt.device)
    active = torch.arange(prompt.shape[0], device=prompt.device)  # the images still decoded, in row order
    cache = TdenBeamCache()
    tokens, seq_logprob = prompt, torch.zeros(prompt.shape[0], 1, 1, device=prompt.device)
    seq_mask = torch.ones(prompt.shape[0], beams, 1, device=prompt.device)
    words, word_logprobs, selected_words = [], [], None
    attention_mask = inputs.pop("attention_mask", None)
    for step in range(steps):
        images, rows = active.shape[0], 1 if step == 0 else beams
        if attention_mask is not None:
            inputs["attention_mask"] = attention_mask
        logits = model(input_ids=tokens, cache=cache, use_cache=True, **inputs).logits[:, -1]
        word_logprob = F.log_softmax(logits.float(), dim=-1).view(images, rows, -1)
        vocab = word_logprob.shape[-1]
        candidates = seq_logprob + word_logprob
        if step > 0:
            # A finished beam keeps its score and offers only word 0.
            seq_mask = seq_mask * (selected_words.view(images, rows) != eos).float().unsqueeze(-1)
            word_logprob = word_logprob * seq_mask
            frozen = seq_logprob.expand_as(candidates).clone()
            frozen[:, :, 1:] = _ENDED_BEAM_OTHER_WORDS
            candidates = seq_mask * candidates + frozen * (1 - seq_mask)
        selected_logprob, selected = best_candidates(candidates.view(images, -1), beams)
        selected_beam = torch.div(selected, vocab, rounding_mode="floor")
        selected_words = selected - selected_beam * vocab
        if step == 0:  # one row per image so far: every beam continues it
            cache.batch_repeat_interleave(beams)
            inputs = _later_step_inputs(inputs, beams)
            if attention_mask is not None:
                attention_mask = attention_mask.repeat_interleave(beams, dim=0)
        else:  # rows of the flat (images * beams) caches that the selected beams continue
            cache.reorder_cache(
                (torch.arange(images, device=active.device).unsqueeze(1) * rows + selected_beam).view(-1)
            )
        if attention_mask is not None:
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(attention_mask.shape[0], 1)], dim=1)
        seq_logprob = selected_logprob.unsqueeze(-1)
        seq_mask = torch.gather(seq_mask, 1, selected_beam.unsqueeze(-1))
        words = [torch.gather(w, 1, selected_beam.unsqueeze(-1)) for w in words] + [selected_words.unsqueeze(-1)]
        chosen = torch.gather(word_logprob, 1, selected_beam.unsqueeze(-1).expand(images, beams, vocab))
        word_logprobs = [torch.gather(w, 1, selected_beam.unsqueeze(-1)) for w in word_logprobs]
        word_logprobs.append(torch.gather(chosen, 2, selected_words.unsqueeze(-1)))
        tokens = selected_words.view(-1, 1)
        going = _images_going(seq_mask, selected_words, seq_logprob, eos)
        if step + 1 < steps and not bool(going.all()):
            found.record(active[~going], ~going, words, word_logprobs, seq_logprob)
            if not bool(going.any()):
                return found.sorted()
            kept = rows_of_groups(going, beams)
            cache.batch_select_indices(kept)
            inputs = {name: value[kept] for name, value in inputs.items()}
            attention_mask = attention_mask[kept] if attention_mask is not None else None
            active, tokens, selected_words = active[going], tokens[kept], selected_words[going]
            seq_logprob, seq_mask = seq_logprob[going], seq_mask[going]
            words, word_logprobs = [w[going] for w in words], [w[going] for w in word_logprobs]
    found.record(active, slice(None), words, word_logprobs, seq_logprob)
    return found.sorted()


def _images_going(seq_mask: torch.Tensor, words: torch.Tensor, scores: torch.Tensor, eos: int) -> torch.Tensor:
    """`(images,)` bool: the images with a beam still going after a step (`seq_mask` `(images, beams, 1)` before the
    step's `words` `(images, beams)`), or with an ended beam whose score `(images, beams, 1)` is not above the other
    words' (X-modaler would then let those words compete): every other image can leave the batch."""
    return (seq_mask[..., 0] * (words != eos)).any(1) | (scores[..., 0] <= _ENDED_BEAM_OTHER_WORDS).any(1)


class _EndedImages:
    """The search's results, image by image as each leaves the batch: once every beam of an image has ended (and
    keeps a score above the ended beams' other words), each later step of X-modaler's search only appends word 0 with
    token score -0.0 (a log-prob times a zero mask) to every beam and keeps the beams in score order, so those steps
    are written here directly and the beams sorted once at the end."""

    def __init__(self, batch: int, beams: int, steps: int, device: torch.device) -> None:
        self.words = torch.zeros(batch, beams, steps, dtype=torch.long, device=device)
        self.token_scores = torch.full((batch, beams, steps), -0.0, device=device)
        self.scores = torch.zeros(batch, beams, 1, device=device)

    def record(
        self,
        images: torch.Tensor,
        rows: torch.Tensor | slice,
        words: list[torch.Tensor],
        word_logprobs: list[torch.Tensor],
        scores: torch.Tensor,
    ) -> None:
        """The beams of `images` (their `rows` of the running search's `(images, beams, ...)` state)."""
        taken = len(words)
        self.words[images, :, :taken] = torch.cat(words, -1)[rows]
        self.token_scores[images, :, :taken] = torch.cat(word_logprobs, -1)[rows]
        self.scores[images] = scores[rows]

    def sorted(self) -> dict:
        scores, order = torch.sort(self.scores, dim=1, descending=True, stable=True)
        by_score = order.expand_as(self.words)
        return {
            "words": torch.gather(self.words, 1, by_score),
            "scores": scores[..., 0],
            "token_scores": torch.gather(self.token_scores, 1, by_score),
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
