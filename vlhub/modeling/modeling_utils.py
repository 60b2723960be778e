"""What every vlhub `PreTrainedModel` shares (in the spirit of transformers' per-model `XPreTrainedModel`, written once).

An architecture's base class subclasses `VisionLanguagePreTrainedModel` (a single-stream one, whose trunk is one BERT
encoder over [text | regions], `SingleStreamPreTrainedModel`) and sets only what is its own: `config` (transformers
derives `config_class` from its annotation), `base_model_prefix`, `_no_split_modules`, and `_can_record_outputs`
where its encoder is not a single BERT one; its `_init_weights` calls `super()._init_weights(module)` and adds its
own modules.
"""

import math
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import ModelOutput
from transformers.models.bert.modeling_bert import BertLMPredictionHead

from ..utils.compat import CACHE_NAME
from .layers import BertEmbeddings, BertEncoder, BertLayer, BertPooler, BertSelfAttention, extended_attention_mask

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

__all__ = [
    "BERT_RECORDED_OUTPUTS",
    "BertMLMHeadMixin",
    "SharedPrefillMixin",
    "SingleStreamPreTrainedModel",
    "VisionLanguagePreTrainedModel",
    "check_region_feature_magnitude",
    "recording_flags",
    "region_feature_limit",
    "with_backbone_outputs",
]

# `output_hidden_states` / `output_attentions` of a model whose encoder is transformers' `BertEncoder`.
BERT_RECORDED_OUTPUTS = {"hidden_states": BertLayer, "attentions": BertSelfAttention}


def recording_flags(config: "PreTrainedConfig", kwargs: dict, recorded: Mapping[str, object]) -> dict:
    """`kwargs` with an `output_<field>` flag for every field of `recorded` (a `_can_record_outputs`), for models
    whose per-layer outputs span several fields (each stream's, the co-attention's, the decoder's): hidden states
    are recorded with `output_hidden_states`, maps with `output_attentions` (the argument, else the config), as
    transformers' `capture_outputs` only reads `output_hidden_states` for `hidden_states`."""
    hidden = kwargs.get("output_hidden_states", config.output_hidden_states)
    attentions = bool(kwargs.get("output_attentions", config.output_attentions))
    flags = {f"output_{name}": attentions if name.endswith("attentions") else bool(hidden) for name in recorded}
    return {**kwargs, **flags, "output_hidden_states": hidden}


OutputT = TypeVar("OutputT", bound=ModelOutput)


def with_backbone_outputs(output_class: type[OutputT], outputs: ModelOutput, **fields: Any) -> OutputT:
    """A head's `output_class` with its own `fields` and the single-stream backbone's `last_hidden_state`,
    `hidden_states` and `attentions` passed on (a head whose output also carries the pooled output passes
    `pooler_output=outputs.pooler_output` among its `fields`)."""
    return output_class(
        **fields,
        last_hidden_state=outputs.last_hidden_state,
        hidden_states=outputs.hidden_states,
        attentions=outputs.attentions,
    )


class VisionLanguagePreTrainedModel(PreTrainedModel):
    """A text + region-feature model on transformers' BERT blocks: every attention backend, gradient checkpointing,
    and the text word embeddings at `embeddings.word_embeddings` of the bare model (transformers' default
    `get_input_embeddings` / `set_input_embeddings` find them there, and heads reach them through `base_model`)."""

    main_input_name = "input_ids"
    input_modalities = ("image", "text")
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    # Traces with `torch.compile(fullgraph=True)` (tests/test_model_conformance.py; a class that cannot says so).
    _can_compile_fullgraph = True
    _input_embed_layer = "word_embeddings"
    # The linear layers (paths in the bare model, in order, ReLUs allowed between them) that region features pass
    # through before their first normalisation: `region_feature_limit` bounds the features from their weights.
    _region_feature_layers: tuple[str, ...] = ()

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, BertEmbeddings):
            # Buffers: transformers' generic init does not know them (meta-device loading leaves them empty).
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
            init.zeros_(module.token_type_ids)
        elif isinstance(module, BertLMPredictionHead):
            init.zeros_(module.bias)


class SingleStreamPreTrainedModel(VisionLanguagePreTrainedModel):
    """A single-stream model (UNITER, VL-BERT, Unified VLP): transformers' `BertEncoder` over one sequence of text and
    regions, whose per-layer outputs `output_hidden_states` / `output_attentions` record (`BERT_RECORDED_OUTPUTS`).
    The bare model builds that encoder (and BERT's pooler) with `_build_encoder` and, where it runs it without a cache,
    runs it with `_run_encoder`."""

    _can_record_outputs = BERT_RECORDED_OUTPUTS

    def _build_encoder(self, config: "PreTrainedConfig", add_pooling_layer: bool) -> None:
        """The modules: `encoder`, and BERT's tanh pooler of position 0 (`pooler`, `None` unless asked)."""
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None

    def _run_encoder(
        self, embedding_output: torch.Tensor, mask_2d: torch.Tensor, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`(last hidden state, pooled output or None)` of the encoder over `embedding_output` `(batch, length,
        hidden)` with the padding mask `mask_2d` `(batch, length)` (1 = attend)."""
        encoder_mask = extended_attention_mask(self.config, embedding_output, mask_2d)
        sequence_output = self.encoder(embedding_output, attention_mask=encoder_mask, **kwargs).last_hidden_state
        return sequence_output, self.pooler(sequence_output) if self.pooler is not None else None


class BertMLMHeadMixin:
    """Output embeddings of a model whose MLM head is BERT's at `self.cls` (`BertOnlyMLMHead` or a head with the same
    `predictions`): the decoder, whose bias is the head's `bias` (tied, as in BERT). List it before the
    `PreTrainedModel` base: `class XForPreTraining(BertMLMHeadMixin, XPreTrainedModel)`."""

    def get_output_embeddings(self) -> torch.nn.Linear:
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings: torch.nn.Linear) -> None:
        self.cls.predictions.decoder = new_embeddings
        self.cls.predictions.bias = new_embeddings.bias


def reorders_within_groups(indices: torch.Tensor, copies: int) -> bool:
    """Whether a cache's new row order `indices` `(rows,)` takes every row from its own group of `copies` consecutive
    rows (the beams of one image after `batch_repeat_interleave(copies)`): rows that are identical over the prompt
    then stay so, and a decoding cache can leave the prompt's positions where they are."""
    groups = torch.arange(indices.shape[0], device=indices.device) // copies
    return copies > 1 and torch.equal(indices.to(groups.device) // copies, groups)


def selects_whole_groups(indices: torch.Tensor, copies: int) -> bool:
    """Whether a selection of cache rows `indices` `(rows,)` keeps whole groups of `copies` consecutive rows, each
    group's rows in their order (images leaving a batch with all their beams): the kept rows are still groups."""
    if copies < 2 or indices.shape[0] % copies:
        return False
    groups = indices.reshape(-1, copies)
    in_order = groups == groups[:, :1] + torch.arange(copies, device=indices.device)
    return bool((groups[:, 0] % copies == 0).all() and in_order.all())


def rows_of_groups(kept: torch.Tensor, copies: int) -> torch.Tensor:
    """The row indices `(kept.sum() * copies,)` of the groups of `copies` consecutive rows that `kept` `(groups,)`
    (bool) keeps, each group's rows in order: the selection `selects_whole_groups` recognises."""
    first_rows = kept.nonzero()[:, :1] * copies
    return (first_rows + torch.arange(copies, device=kept.device)).reshape(-1)


class SharedPrefillMixin:
    """Encodes each distinct prompt once in `generate()` (captioners with a key/value cache; list it before
    `GenerationMixin`).

    For beam search (and `num_return_sequences > 1`) transformers repeats every input `k` times before the first
    forward, which then encodes the same prompt `k` times: for a captioner the regions and the prompt, most of the
    work of a short caption. Here the first forward runs on one copy of each input and its key/value cache and logits
    are repeated `k` times (`Cache.batch_repeat_interleave`), which is what the `k` identical forwards would have
    given. Only with a cache that is still empty, when the copies are really identical, and when no per-step
    hidden states or attentions are asked for; anything else runs transformers' own first forward.

    Why a private method: transformers has no public hook around the first forward of `generate()`
    (`prepare_inputs_for_generation` shapes one forward's inputs, its outputs must already have a row per beam).
    tests/test_tden_modeling.py::test_beam_search_runs_the_object_encoder_once_per_image and
    tests/test_unified_vlp_modeling.py::test_generate_encodes_each_prompt_once_for_its_beams run `generate()` with
    transformers' own `_prefill` too: it encodes every prompt `num_beams` times, to the same tokens and scores.
    """

    def _prefill(self, input_ids, generation_config, model_kwargs, *args, **kwargs):
        copies = max(generation_config.num_beams or 1, generation_config.num_return_sequences or 1)
        cache = model_kwargs.get(CACHE_NAME)
        rows = input_ids.shape[0]
        plain = (
            copies == 1
            or rows % copies
            or cache is None
            or cache.get_seq_length() > 0
            or not model_kwargs.get("use_cache", True)
            or getattr(generation_config, "prefill_chunk_size", None)
            or generation_config.output_hidden_states
            or generation_config.output_attentions
        )
        batch_first = {
            name: value
            for name, value in model_kwargs.items()
            if isinstance(value, torch.Tensor) and value.ndim and value.shape[0] == rows
        }
        if not plain:
            plain = not all(
                torch.equal(value, value[::copies].repeat_interleave(copies, dim=0))
                for value in (input_ids, *batch_first.values())
            )
        if plain:
            return super()._prefill(input_ids, generation_config, model_kwargs, *args, **kwargs)
        unique = {**model_kwargs, **{name: value[::copies] for name, value in batch_first.items()}}
        outputs = super()._prefill(input_ids[::copies], generation_config, unique, *args, **kwargs)
        filled = getattr(outputs, CACHE_NAME, None)
        (filled if filled is not None else cache).batch_repeat_interleave(copies)
        outputs.logits = outputs.logits.repeat_interleave(copies, dim=0)
        return outputs


def region_feature_limit(model: VisionLanguagePreTrainedModel) -> float:
    """The largest region-feature magnitude `model` takes without overflowing its arithmetic, from its weights and
    dtype (a bound that holds for every input, not an estimate).

    Region features go through the linear layers the architecture declares (`_region_feature_layers`), then a
    LayerNorm. For inputs with |x| <= m, each layer's outputs are at most `m * max_row_sum|W| + max|b|` (a ReLU
    between layers only shrinks them). The LayerNorm sums the squares of its `H` inputs' deviations from their mean
    (each at most twice the largest input) in float32 (float64 for float64 models): its inputs must stay below
    `sqrt(finfo(float32).max / H) / 2`. Every layer's output must also stay within the model dtype's range. Half of
    each bound is kept as room for the terms added to the features before the LayerNorm (locations, token types).
    float32: about 1.6e17 at the LayerNorm (so features up to ~1e15 for BERT-sized weights); float16: 32752. The
    features themselves must fit the dtype (65504 for float16).

    Computed once per model and remembered until one of those layers' parameters changes (replaced, changed in
    place, another dtype): reading their weights took ~60 ms, ~10-25% of a batch-1 VQA pipeline call on a CPU."""
    layers = [model.base_model.get_submodule(path) for path in model.base_model._region_feature_layers]
    if not layers:
        return math.inf
    state = _parameters_state(layers)
    remembered = _REGION_FEATURE_LIMITS.get(model)
    if state is not None and remembered is not None and _same_parameters(remembered[0], state):
        return remembered[1]
    limit = _region_feature_limit(layers)
    if state is not None:
        _REGION_FEATURE_LIMITS[model] = (state, limit)
    return limit


# model -> (its region-feature layers' `_parameters_state`, their limit): `region_feature_limit` reads them once.
_REGION_FEATURE_LIMITS: "weakref.WeakKeyDictionary[torch.nn.Module, tuple[list, float]]" = weakref.WeakKeyDictionary()


def _parameters_state(layers: list[torch.nn.Module]) -> list[tuple] | None:
    """Each parameter of `layers` (a weak reference: a replaced one never matches) with what its data is (`.to()` and
    `.data =` swap the data of the same parameter) and its in-place change count; None when one is an inference-mode
    tensor (changed in place inside `torch.inference_mode` without a count)."""
    parameters = [parameter for layer in layers for parameter in layer.parameters()]
    if any(parameter.is_inference() for parameter in parameters):
        return None
    return [
        (weakref.ref(parameter), (parameter.data_ptr(), parameter.dtype, parameter.device, parameter._version))
        for parameter in parameters
    ]


def _same_parameters(before: list[tuple], now: list[tuple]) -> bool:
    return len(before) == len(now) and all(
        old() is not None and old() is new() and old_data == new_data
        for (old, old_data), (new, new_data) in zip(before, now)
    )


def _region_feature_limit(layers: list[torch.nn.Module]) -> float:
    """`region_feature_limit` computed from the region-feature layers' weights."""
    dtype = layers[0].weight.dtype
    accumulate = torch.float64 if dtype == torch.float64 else torch.float32
    dtype_cap = torch.finfo(dtype).max / 2
    norm_cap = min(dtype_cap, math.sqrt(torch.finfo(accumulate).max / layers[-1].out_features) / 4)
    limit, gain, offset = torch.finfo(dtype).max, 1.0, 0.0  # the features themselves are cast to the dtype
    for i, layer in enumerate(layers):
        weight = layer.weight.detach().double()
        row_sum = float(weight.abs().sum(dim=1).max())
        bias = float(layer.bias.detach().abs().max()) if layer.bias is not None else 0.0
        gain, offset = gain * row_sum, offset * row_sum + bias
        cap = norm_cap if i == len(layers) - 1 else dtype_cap
        if gain > 0:
            limit = min(limit, (cap - offset) / gain)
    return limit


def check_region_feature_magnitude(features: torch.Tensor, model: VisionLanguagePreTrainedModel, what: str) -> None:
    """Refuse `features` beyond `region_feature_limit(model)` before the forward: a `ValueError` naming `what`, the
    value, the bound and the model's dtype (whatever the dtype: float32 overflows too, only later than float16)."""
    if features.numel() == 0:
        return
    low, high = torch.aminmax(features.detach())
    largest = max(-float(low), float(high))
    limit = region_feature_limit(model)
    if largest <= limit:
        return
    index = (features.detach().abs() == largest).nonzero()[0].tolist()
    raise ValueError(
        f"{what} hold {largest:g} at index {index}: {type(model).__name__} in {model.dtype} takes region features up "
        f"to {limit:.6g} (from its first region layers' weights and the range of {model.dtype}); a larger value "
        "overflows its arithmetic and its outputs would be NaN. Rescale the features"
    )
