"""PyTorch Unified VLP: one BERT for captioning (seq2seq attention) and VQA (bidirectional attention).

Faithful to the released code (LuoweiZhou/VLP): BERT blocks with BERT's parameter names and every LayerNorm at
eps 1e-5; the sequence `[CLS] r_1 .. r_N [SEP] w_1 .. w_T [SEP]` where the region slots carry a placeholder token
whose word embedding is replaced by `vis_embed(region_features)` and whose position embedding is replaced by
`vis_pe_embed(region_locations)` (the 1607-d geometry + class vector); token types are still added, then the shared
embedding LayerNorm. Text positions continue the plain count (the first word sits at position `N + 2`).

The two attention patterns are 4-D masks from transformers' `masking_utils` (no special attention code):
- bidirectional: every position sees every non-padding position;
- seq2seq: the image block (positions `< N + 2`) sees only the image block; a text position sees the image block and
  the text up to and including itself; padding rows see only the image block (as the original's 0/1 matrix).

Captioning predicts each word from a trailing [MASK] slot placed after the words so far, not from the last word.
`UnifiedVlpForConditionalGeneration` does this inside `forward(predict_next=True)` (what `generate()` calls): the
[MASK] is appended, its logits returned, and its keys/values removed from the cache again, so the cache holds only
real tokens and no position is ever computed twice.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from transformers import GenerationConfig, GenerationMixin
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation.utils import GenerateOutput
from transformers.masking_utils import BlockMask, and_masks, create_bidirectional_mask, create_causal_mask
from transformers.modeling_outputs import (
    BaseModelOutputWithPoolingAndCrossAttentions,
    CausalLMOutputWithPast,
    ModelOutput,
    SequenceClassifierOutput,
)
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, auto_docstring
from transformers.utils.generic import can_return_tuple, merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from ..layers import BertEmbeddings, BertOnlyMLMHead, soft_score_loss
from ...evaluation.vqa import predictable_answer_logits
from ..modeling_outputs import layer_records
from ..modeling_utils import BertMLMHeadMixin, SharedPrefillMixin, SingleStreamPreTrainedModel, with_backbone_outputs
from ...utils.compat import CACHE_NAME, accepts_past_key_values, cache_argument
from .configuration_unified_vlp import UnifiedVlpConfig
from .generation_unified_vlp import VlpBeamCache

__all__ = [
    "UnifiedVlpPreTrainedModel",
    "UnifiedVlpModel",
    "UnifiedVlpForPreTraining",
    "UnifiedVlpForConditionalGeneration",
    "UnifiedVlpForQuestionAnswering",
    "UnifiedVlpForPreTrainingOutput",
    "UnifiedVlpQuestionAnsweringOutput",
    "seq2seq_mask_function",
]


# ---------------------------------------------------------------------------------------------------- outputs
@auto_docstring
@dataclass
@layer_records(BaseModelOutputWithPoolingAndCrossAttentions, "hidden_states", "attentions", after="last_hidden_state")
class UnifiedVlpForPreTrainingOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor` of shape `()`, *optional*, returned when `labels` are given):
        Masked language modelling loss (mean cross-entropy over the labelled slots).
    logits (`torch.FloatTensor` of shape `(batch, sequence_length, vocab_size)` or `(batch, num_masked, vocab_size)`):
        MLM logits of every position, or of `masked_positions` only when those are given.
    last_hidden_state (`torch.FloatTensor` of shape `(batch, sequence_length, hidden_size)`):
        The encoder's output.
    s2s_loss (`torch.FloatTensor` of shape `()`, *optional*):
        `loss` again, named for training logs: set when `seq2seq` is True for the batch.
    bi_loss (`torch.FloatTensor` of shape `()`, *optional*):
        `loss` again, set when `seq2seq` is False for the batch (bidirectional).
    mlm_loss (`torch.FloatTensor` of shape `()`, *optional*):
        `loss` again, set when the pattern is chosen per example (`seq2seq` a `(batch,)` tensor, the original's mix).
    mlm_logits (`torch.FloatTensor` of shape `(num_labelled, vocab_size)`, *optional*, returned when `labels` are given):
        The rows of `logits` whose label is >= 0, row-major (what vlhub's pre-training evaluation scores).
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    last_hidden_state: torch.FloatTensor | None = None
    s2s_loss: torch.FloatTensor | None = None
    bi_loss: torch.FloatTensor | None = None
    mlm_loss: torch.FloatTensor | None = None
    mlm_logits: torch.FloatTensor | None = None


@auto_docstring(
    custom_intro="""
    transformers' `SequenceClassifierOutput` plus the original's prediction and the backbone outputs.
    """
)
@dataclass
class UnifiedVlpQuestionAnsweringOutput(SequenceClassifierOutput):
    r"""
    loss (`torch.FloatTensor` of shape `()`, *optional*, returned when `labels` are given):
        Binary cross-entropy on soft answer scores, summed over answers and averaged over the batch (the original's
        `BCEWithLogitsLoss() * num_answers`).
    logits (`torch.FloatTensor` of shape `(batch, num_labels)`):
        Answer logits.
    predicted_answer_ids (`torch.LongTensor` of shape `(batch,)`):
        The best answer other than `config.unknown_answer_id` — for converted checkpoints answer 0 (the answer
        vocabulary's `<unk>`), which the original evaluation never predicts (`argmax(logits[:, 1:]) + 1`); the plain
        argmax when none is set.
    last_hidden_state (`torch.FloatTensor` of shape `(batch, sequence_length, hidden_size)`):
        The encoder's output.
    """

    predicted_answer_ids: torch.LongTensor | None = None
    last_hidden_state: torch.FloatTensor | None = None


# What auto_docstring does not know of Unified VLP's inputs, or knows only in general terms.
_INPUT_ARGS = r"""
input_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`):
    `[CLS] r_1 .. r_N [SEP] w_1 .. w_T [SEP]` then padding: the processor's `input_ids`, region slots holding the
    placeholder `config.region_token_id`. With a cache, only the new tokens.
attention_mask (`torch.Tensor`, *optional*):
    `(batch_size, past_length + sequence_length)` 1/0 over every position so far (1 = real token), or a
    `(batch_size, sequence_length, sequence_length)` 0/1 matrix `[query, key]` as the original loaders built it
    (used as given, no cache). Defaults to all ones.
token_type_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
    Segments. Default: the image/text types of the attention pattern (4/5 for seq2seq, 0/1 bidirectional).
position_ids (`torch.LongTensor` of shape `(batch_size or 1, sequence_length)`, *optional*):
    Defaults to `past_length .. past_length + sequence_length - 1` (the original's plain count).
region_features (`torch.FloatTensor` of shape `(batch_size, num_regions, region_feature_dim)`):
    Region features for slots `1..num_regions`; `num_regions` must be `config.num_regions` (the processor pads).
    Needed when the input covers the region slots (no cache yet); ignored afterwards.
region_locations (`torch.FloatTensor` of shape `(batch_size, num_regions, region_location_dim)`):
    The 1607-d `vis_pe` vector of each region (the processor's `region_locations`).
region_attention_mask (`torch.Tensor` of shape `(batch_size, num_regions)`, *optional*):
    1 for real regions, 0 for padded slots (masked out of every row's view).
inputs_embeds (`torch.FloatTensor` of shape `(batch_size, sequence_length, hidden_size)`, *optional*):
    Word embeddings instead of `input_ids` (region slots are still replaced).
"""
_SEQ2SEQ_ARG = r"""
seq2seq (`bool` or `torch.BoolTensor` of shape `(batch_size,)`, *optional*):
    Attention pattern, per batch or per example: True = seq2seq (captioning), False = bidirectional. Defaults to
    the model's own pattern (bidirectional for `UnifiedVlpModel`, seq2seq for `UnifiedVlpForPreTraining`).
"""
_CACHE_ARGS = r"""
cache (`Cache`, *optional*):
    Keys and values of earlier positions (generation); also accepted as `past_key_values`, its name before
    transformers 5.24.
use_cache (`bool`, *optional*, defaults to `config.use_cache`):
    Whether to update and return the cache (a `DynamicCache` is made when none is given). Under the seq2seq pattern
    only: under the bidirectional one, earlier positions would see later ones, so there is nothing to reuse.
"""
_PREDICTION_SLOTS_ARG = r"""
prediction_slots (`int`, defaults to 0):
    The last `prediction_slots` input positions are [MASK] prediction slots, the `j`-th standing right after input
    `length - 2 * prediction_slots + j`: each sees what that input sees, and itself (not the inputs after it, nor
    the other slots). `UnifiedVlpForConditionalGeneration(predict_next=True)` appends them.
"""
_MASKED_LM_ARGS = r"""
masked_positions (`torch.LongTensor` of shape `(batch_size, num_masked)`, *optional*):
    Positions to predict (the original's `masked_pos`, padded with any position and label -100); the logits are
    computed there only.
labels (`torch.LongTensor`, *optional*):
    Targets, -100 where there is none: `(batch_size, num_masked)` with `masked_positions`, else
    `(batch_size, sequence_length)`.
"""
_PREDICT_NEXT_ARG = r"""
predict_next (`bool`, defaults to `False`):
    Predict the word after input tokens from [MASK] slots appended after the input (the original's decoding): the
    slot after a token sits at that token's position + 1 (text token type) and sees what the token sees, and itself.
    Only the slots' logits are returned, `(batch_size, slots, vocab_size)`; their keys/values are dropped from the
    cache again, so the cache holds exactly the input tokens, and `hidden_states` / `attentions` are the input
    tokens' (those of a decoder fed the same tokens). `generate()` sets it.
logits_to_keep (`int`, *optional*):
    With `predict_next`: predict after the last `logits_to_keep` input tokens (one slot each; 0: after every input
    token; default 1, the next word, what `generate()` asks for). Without: the logits of the last `logits_to_keep`
    positions only (0 or None: every position).
"""
_ANSWER_LABELS_ARG = r"""
labels (`torch.FloatTensor` of shape `(batch_size, num_labels)`, *optional*):
    Soft answer scores in [0, 1].
"""


# ---------------------------------------------------------------------------------------------------- masks
def seq2seq_mask_function(
    text_start: int | torch.Tensor, real_tokens: torch.Tensor, seq2seq: torch.Tensor | None = None
) -> Callable[[int, int, int, int], torch.Tensor]:
    """The seq2seq pattern as a `masking_utils` mask function (to AND with the padding mask).

    A key is visible when it lies in the image block (`kv < text_start`), or when it is at or before the query and
    the query is a real token (padding rows see only the image block, as in the original). `text_start` is an int,
    or a `(batch,)` tensor when left padding moves each row's image block; `real_tokens` `(batch, kv_length)` bool
    marks real positions; `seq2seq` `(batch,)` bool, when given, applies the pattern only to those examples (the
    others stay bidirectional). Indices are absolute positions (cache offsets included).
    """

    def inner(batch_idx, head_idx, q_idx, kv_idx):
        start = text_start[batch_idx] if isinstance(text_start, torch.Tensor) else text_start
        allowed = (kv_idx < start) | ((kv_idx <= q_idx) & real_tokens[batch_idx, q_idx])
        if seq2seq is not None:
            allowed = allowed | ~seq2seq[batch_idx]
        return allowed

    return inner


def _prediction_slots_mask_function(visible_until: torch.Tensor) -> Callable[[int, int, int, int], torch.Tensor]:
    """The [MASK] prediction slots' restriction as a `masking_utils` mask function: the query at absolute index `q`
    sees no key after `visible_until[q]` except itself (the last index for every other row: no restriction)."""

    def inner(batch_idx, head_idx, q_idx, kv_idx):
        return (kv_idx <= visible_until[q_idx]) | (kv_idx == q_idx)

    return inner


def left_padding(attention_mask: torch.Tensor | None, length: int, text_start: int) -> torch.Tensor | None:
    """Each row's number of leading padding positions `(batch,)` in a 2-D `attention_mask` (None for no mask or a 3-D
    one). A row's `[CLS] r_1 .. r_N [SEP]` starts right after them; the count is capped so that the block fits in
    `length` (an all-padding row then keeps its block at the end, with nothing real to read it). No host sync."""
    if attention_mask is None or attention_mask.ndim != 2:
        return None
    leading = (attention_mask.cumsum(-1) == 0).sum(-1)
    return leading.clamp(max=max(length - text_start, 0))


def _region_slots(offsets: torch.Tensor | None, batch: int, num_regions: int, device) -> torch.Tensor:
    """Indices `(batch, num_regions)` of the region slots: `1..N` after each row's left padding."""
    slots = torch.arange(1, num_regions + 1, device=device)[None].expand(batch, -1)
    return slots if offsets is None else slots + offsets.to(device)[:, None]


def _default_position_ids(offsets: torch.Tensor | None, past_length: int, length: int, device) -> torch.LongTensor:
    """The original's plain count from `[CLS]`: `past .. past + length - 1`, less each row's left padding (padding
    positions clamped to 0). `(1 or batch, length)`."""
    positions = torch.arange(past_length, past_length + length, device=device)[None]
    return positions if offsets is None else (positions - offsets.to(device)[:, None]).clamp(min=0)


# ---------------------------------------------------------------------------------------------------- embeddings
class UnifiedVlpEmbeddings(BertEmbeddings):
    """BERT's embeddings, with the region slots `1..N` replaced as the original does.

    `vis_embed` = Linear(F, region_embed_dim), ReLU, Linear(region_embed_dim, H), ReLU, Dropout replaces the word
    embeddings of the slots; `vis_pe_embed` = Linear(1607, H), ReLU, Dropout replaces their position embeddings.
    Token types are added everywhere, then LayerNorm and dropout.
    """

    def __init__(self, config: UnifiedVlpConfig) -> None:
        super().__init__(config)
        self.vis_embed = nn.Sequential(
            nn.Linear(config.region_feature_dim, config.region_embed_dim),
            nn.ReLU(),
            nn.Linear(config.region_embed_dim, config.hidden_size),
            nn.ReLU(),
            nn.Dropout(config.hidden_dropout_prob),
        )
        self.vis_pe_embed = nn.Sequential(
            nn.Linear(config.region_location_dim, config.hidden_size), nn.ReLU(), nn.Dropout(config.hidden_dropout_prob)
        )

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        region_features: torch.Tensor | None = None,
        region_locations: torch.Tensor | None = None,
        region_offsets: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids `(B, L)` (or inputs_embeds `(B, L, H)`), token_type_ids `(B, L)`, position_ids `(B or 1, L)`;
        region_features `(B, N, F)` and region_locations `(B, N, 1607)` replace slots `1..N`, shifted by
        `region_offsets` `(B,)` (each row's left padding) when given. Returns `(B, L, H)`."""
        words = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        positions = self.position_embeddings(position_ids).expand(words.shape[0], -1, -1)
        if region_features is not None:
            num_regions = region_features.shape[1]
            dtype = self.vis_embed[0].weight.dtype
            regions = self.vis_embed(region_features.to(dtype))
            region_positions = self.vis_pe_embed(region_locations.to(dtype))
            if region_offsets is None:
                words = torch.cat([words[:, :1], regions, words[:, num_regions + 1 :]], dim=1)
                positions = torch.cat([positions[:, :1], region_positions, positions[:, num_regions + 1 :]], dim=1)
            else:
                slots = _region_slots(region_offsets, words.shape[0], num_regions, words.device)
                index = slots[..., None].expand(-1, -1, words.shape[-1])
                words = words.scatter(1, index, regions.to(words.dtype))
                positions = positions.scatter(1, index, region_positions.to(positions.dtype))
        embeddings = words + positions + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(embeddings))


# ---------------------------------------------------------------------------------------------------- base
class UnifiedVlpPreTrainedModel(SingleStreamPreTrainedModel):
    config: UnifiedVlpConfig
    base_model_prefix = "vlp"
    _region_feature_layers = ("embeddings.vis_embed.0", "embeddings.vis_embed.2")
    _no_split_modules = ["UnifiedVlpEmbeddings", "BertLayer"]
    _supports_flash_attn = False  # flash attention cannot take the seq2seq pattern (an arbitrary 4-D mask)


def _as_batch_flags(seq2seq, batch_size: int, device) -> torch.Tensor | bool:
    """`seq2seq` as a Python bool (the same for the batch) or a `(batch,)` bool tensor."""
    if isinstance(seq2seq, torch.Tensor):
        if seq2seq.ndim == 0:
            return bool(seq2seq)
        if tuple(seq2seq.shape) != (batch_size,):
            raise ValueError(
                f"seq2seq must be a bool or a (batch,) = ({batch_size},) tensor, got {tuple(seq2seq.shape)}"
            )
        return seq2seq.to(device=device, dtype=torch.bool)
    return bool(seq2seq)


@auto_docstring(
    custom_intro="""
    The bare Unified VLP encoder: region-replacing embeddings, a BERT encoder (eager/sdpa/flex through
    transformers' attention interface) and the tanh pooler.
    """,
    custom_args=r"""
    add_pooling_layer (`bool`, *optional*, defaults to `True`):
        Build the tanh pooler (`pooler_output`); no head reads the pooled output (the original's pre-training
        computes it and no loss reads it).
    """,
)
class UnifiedVlpModel(UnifiedVlpPreTrainedModel):
    default_seq2seq = False

    def __init__(self, config: UnifiedVlpConfig, add_pooling_layer: bool = True) -> None:
        super().__init__(config)
        self.embeddings = UnifiedVlpEmbeddings(config)
        self._build_encoder(config, add_pooling_layer)
        self.post_init()

    def _check_inputs(
        self,
        input_ids,
        inputs_embeds,
        region_features,
        region_locations,
        region_attention_mask,
        past_length,
        position_ids=None,
    ):
        config = self.config
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        text = input_ids if input_ids is not None else inputs_embeds
        batch, length = text.shape[:2]
        if batch == 0:
            raise ValueError("empty batch: Unified VLP needs at least one example")
        # Explicit position_ids (e.g. caption_scoring_inputs, whose [MASK] slots repeat the words' positions) are
        # not read here: that would synchronise with the device on every forward.
        last_position = past_length + length - 1
        if position_ids is None and last_position >= config.max_position_embeddings:
            raise ValueError(
                f"positions up to {last_position} are needed but the model has "
                f"{config.max_position_embeddings} position embeddings (text starts at {config.text_start})"
            )
        if past_length > 0:
            return  # the region slots are in the cache
        if region_features is None or region_locations is None:
            raise ValueError(
                "Unified VLP needs region_features and region_locations for its region slots: pass the processor's "
                "full output"
            )
        expected = (batch, config.num_regions, config.region_feature_dim)
        if region_features.ndim == 3 and region_features.shape[1] > config.num_regions:
            raise ValueError(
                f"got {region_features.shape[1]} regions but the model has only {config.num_regions} region slots "
                f"(the original takes the {config.num_regions} most confident detections)"
            )
        if tuple(region_features.shape) != expected:
            raise ValueError(
                f"region_features must have shape {expected} (the processor pads to {config.num_regions} region "
                f"slots), got {tuple(region_features.shape)}"
            )
        expected = (batch, config.num_regions, config.region_location_dim)
        if tuple(region_locations.shape) != expected:
            raise ValueError(f"region_locations must have shape {expected}, got {tuple(region_locations.shape)}")
        if region_attention_mask is not None and tuple(region_attention_mask.shape) != expected[:2]:
            raise ValueError(
                f"region_attention_mask must have shape {expected[:2]}, got {tuple(region_attention_mask.shape)}"
            )
        if length < config.text_start:
            raise ValueError(
                f"input of length {length} does not cover [CLS], the {config.num_regions} region slots and [SEP] "
                f"({config.text_start} tokens); build it with the processor"
            )

    def build_attention_mask(
        self,
        embeddings: torch.Tensor,
        attention_mask: torch.Tensor | None,
        seq2seq: bool | torch.Tensor,
        region_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        visible_until: torch.Tensor | None = None,
    ) -> torch.Tensor | BlockMask | None:
        """The 4-D mask the configured attention backend wants (see the module docstring for the two patterns).

        embeddings `(B, L, H)` (the new positions); attention_mask `(B, past + L)` 1/0 (leading zeros: left
        padding, which moves each row's image block), `(B, L, L)` 0/1 (used as given), or None; seq2seq bool or
        `(B,)` bool; region_attention_mask `(B, N)` zeroes padded region slots; visible_until `(past + L,)`, the
        prediction slots' restriction (`_prediction_slots_mask_function`).
        """
        batch, length = embeddings.shape[:2]
        past_length = cache.get_seq_length() if cache is not None else 0
        if attention_mask is not None and attention_mask.ndim == 3:
            if past_length or tuple(attention_mask.shape) != (batch, length, length):
                raise ValueError(
                    f"a 3-D attention_mask must be (batch, length, length) = {(batch, length, length)} without a "
                    f"cache, got {tuple(attention_mask.shape)}"
                )
            visible = attention_mask.to(embeddings.device).bool()[:, None]
            if region_attention_mask is not None:
                regions = self.config.num_regions
                keep = torch.ones(batch, length, dtype=torch.bool, device=embeddings.device)
                keep[:, 1 : regions + 1] = region_attention_mask.bool()
                visible = visible & keep[:, None, None, :]
            if self.config._attn_implementation == "eager":
                return torch.zeros(visible.shape, dtype=embeddings.dtype, device=embeddings.device).masked_fill(
                    ~visible, torch.finfo(embeddings.dtype).min
                )
            return visible
        if attention_mask is None:
            attention_mask = torch.ones(batch, past_length + length, dtype=torch.long, device=embeddings.device)
        if attention_mask.ndim != 2 or tuple(attention_mask.shape) != (batch, past_length + length):
            raise ValueError(
                f"attention_mask must be (batch, past + length) = {(batch, past_length + length)}, got "
                f"{tuple(attention_mask.shape)}"
            )
        real = attention_mask.to(embeddings.device).bool()
        offsets = left_padding(real, real.shape[1], self.config.text_start)
        if region_attention_mask is not None:
            slots = _region_slots(offsets, batch, self.config.num_regions, real.device)
            real = real.scatter(1, slots, real.gather(1, slots) & region_attention_mask.to(real.device).bool())
        slots_mask = None if visible_until is None else _prediction_slots_mask_function(visible_until)
        if seq2seq is True and past_length >= self.config.text_start:
            # Decoding past the image block: every new row is text, for which the seq2seq pattern is the causal one
            # (the image block lies before it). transformers builds that without the per-element mask function.
            return create_causal_mask(
                config=self.config,
                inputs_embeds=embeddings,
                attention_mask=real,
                **cache_argument(cache),
                and_mask_function=slots_mask,
            )
        text_start = self.config.text_start + offsets
        and_mask = None
        if seq2seq is True:
            and_mask = seq2seq_mask_function(text_start, real)
        elif isinstance(seq2seq, torch.Tensor):
            and_mask = seq2seq_mask_function(text_start, real, seq2seq)
        if slots_mask is not None:
            and_mask = slots_mask if and_mask is None else and_masks(and_mask, slots_mask)
        return create_bidirectional_mask(
            config=self.config,
            inputs_embeds=embeddings,
            attention_mask=real,
            **cache_argument(cache),
            and_mask_function=and_mask,
        )

    def default_token_type_ids(
        self, position_ids: torch.Tensor, seq2seq: bool | torch.Tensor, batch: int
    ) -> torch.LongTensor:
        """Token types from positions: image type before `text_start`, text type after, per attention pattern."""
        config = self.config
        is_text = (position_ids >= config.text_start).expand(batch, -1)
        flags = seq2seq if isinstance(seq2seq, torch.Tensor) else torch.full((batch,), seq2seq, device=is_text.device)
        flags = flags[:, None]
        image_type = torch.where(flags, config.s2s_image_token_type_id, config.bi_image_token_type_id)
        text_type = torch.where(flags, config.s2s_text_token_type_id, config.bi_text_token_type_id)
        return torch.where(is_text, text_type, image_type).long()

    @accepts_past_key_values
    @merge_with_config_defaults
    @capture_outputs
    @auto_docstring(custom_args=_INPUT_ARGS + _SEQ2SEQ_ARG + _CACHE_ARGS + _PREDICTION_SLOTS_ARG)
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        region_features: torch.FloatTensor | None = None,
        region_locations: torch.FloatTensor | None = None,
        region_attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        seq2seq: bool | torch.Tensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        prediction_slots: int = 0,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPoolingAndCrossAttentions:
        r"""
        Returns:
            `BaseModelOutputWithPoolingAndCrossAttentions`: `last_hidden_state` `(batch_size, sequence_length,
            hidden_size)`, `pooler_output` `(batch_size, hidden_size)` (tanh(dense) of position 0; `None` with a
            cache past [CLS] or without the pooler), the cache when `use_cache` (field `cache`; `past_key_values`
            before transformers 5.24).
        """
        if not use_cache:
            cache = None
        past_length = cache.get_seq_length() if cache is not None else 0
        self._check_inputs(
            input_ids,
            inputs_embeds,
            region_features,
            region_locations,
            region_attention_mask,
            past_length,
            position_ids,
        )
        text = input_ids if input_ids is not None else inputs_embeds
        batch, length = text.shape[:2]
        seq2seq = _as_batch_flags(self.default_seq2seq if seq2seq is None else seq2seq, batch, text.device)
        if use_cache and cache is None and seq2seq is True:  # a new cache: past_length stays 0
            cache = DynamicCache(config=self.config)
        offsets = left_padding(attention_mask, past_length + length, self.config.text_start)
        if position_ids is None:
            position_ids = _default_position_ids(offsets, past_length, length, text.device)
        if token_type_ids is None:
            token_type_ids = self.default_token_type_ids(position_ids, seq2seq, batch)
        use_regions = past_length == 0
        embedding_output = self.embeddings(
            input_ids=input_ids,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            region_features=region_features if use_regions else None,
            region_locations=region_locations if use_regions else None,
            region_offsets=offsets,
        )
        visible_until = None
        # Slot j follows input `inputs - prediction_slots + j`; other rows: no restriction. A single slot under the
        # seq2seq pattern needs none: as a text row it may see every key before it, which is all the slot may see.
        if prediction_slots > 1 or (prediction_slots and seq2seq is not True):
            total = past_length + length
            visible_until = torch.full((total,), total - 1, device=text.device)
            visible_until[total - prediction_slots :] = torch.arange(
                total - 2 * prediction_slots, total - prediction_slots, device=text.device
            )
        mask = self.build_attention_mask(
            embedding_output, attention_mask, seq2seq, region_attention_mask, cache, visible_until
        )
        encoder_outputs = self.encoder(
            embedding_output, attention_mask=mask, **cache_argument(cache), use_cache=use_cache, **kwargs
        )
        sequence_output = encoder_outputs.last_hidden_state
        pooled_output = self.pooler(sequence_output) if self.pooler is not None and past_length == 0 else None
        return BaseModelOutputWithPoolingAndCrossAttentions(
            last_hidden_state=sequence_output, pooler_output=pooled_output, **cache_argument(cache)
        )


def _masked_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels must have shape {tuple(logits.shape[:-1])} (one per logit row), got {tuple(labels.shape)}"
        )
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


def _gather_positions(sequence: torch.Tensor, positions: torch.LongTensor) -> torch.Tensor:
    """`sequence` `(B, L, H)` at `positions` `(B, P)` → `(B, P, H)`."""
    if positions.ndim != 2 or positions.shape[0] != sequence.shape[0]:
        raise ValueError(f"masked_positions must be (batch, num_masked), got {tuple(positions.shape)}")
    index = positions.to(sequence.device).unsqueeze(-1).expand(-1, -1, sequence.shape[-1])
    return torch.gather(sequence, 1, index)


class _MaskedLanguageModelMixin(BertMLMHeadMixin):
    """The backbone without its pooler (no loss reads it) and the tied MLM head (`cls`, decoder tied to the word
    embeddings) that the pre-training model and the captioner share: the modules and their tie, declared together.
    List it before the `UnifiedVlpPreTrainedModel` base."""

    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "vlp.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def __init__(self, config: UnifiedVlpConfig) -> None:
        super().__init__(config)
        self.vlp = UnifiedVlpModel(config, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(config)
        self.post_init()


# ---------------------------------------------------------------------------------------------------- pre-training
@auto_docstring(
    custom_intro="""
    Unified VLP with its one pre-training head: masked language modelling (`cls`, the BERT LM head with the decoder
    tied to the word embeddings), under the seq2seq or the bidirectional pattern. The original mixes the two per
    example (`seq2seq` as a `(batch,)` tensor; 75% seq2seq for Conceptual Captions); there is no NSP/ITM or masked
    region loss.
    """
)
class UnifiedVlpForPreTraining(_MaskedLanguageModelMixin, UnifiedVlpPreTrainedModel):
    default_seq2seq = True
    # The original computes the tanh pooler and no loss reads it: left out (`UnifiedVlpModel` has it).
    _keys_to_ignore_on_load_unexpected = [r"^(vlp\.)?pooler\."]

    @can_return_tuple
    @auto_docstring(custom_args=_INPUT_ARGS + _SEQ2SEQ_ARG + _MASKED_LM_ARGS)
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        region_features: torch.FloatTensor | None = None,
        region_locations: torch.FloatTensor | None = None,
        region_attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        seq2seq: bool | torch.Tensor | None = None,
        masked_positions: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> UnifiedVlpForPreTrainingOutput:
        r"""
        Returns:
            `UnifiedVlpForPreTrainingOutput`: MLM `logits` `(batch_size, sequence_length | num_masked, vocab_size)`
            and, with `labels`, the loss.
        """
        pattern = self.default_seq2seq if seq2seq is None else seq2seq
        outputs = self.vlp(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            region_features=region_features,
            region_locations=region_locations,
            region_attention_mask=region_attention_mask,
            inputs_embeds=inputs_embeds,
            seq2seq=pattern,
            use_cache=False,
            **kwargs,
        )
        sequence_output = outputs.last_hidden_state
        selected = sequence_output if masked_positions is None else _gather_positions(sequence_output, masked_positions)
        logits = self.cls(selected)
        loss = mlm_logits = None
        losses = {}
        if labels is not None:
            loss = _masked_lm_loss(logits, labels)
            mlm_logits = logits[labels.to(logits.device) >= 0]
            name = (
                "mlm_loss"
                if isinstance(pattern, torch.Tensor) and pattern.ndim
                else ("s2s_loss" if bool(pattern) else "bi_loss")
            )
            losses[name] = loss
        return with_backbone_outputs(
            UnifiedVlpForPreTrainingOutput, outputs, loss=loss, logits=logits, mlm_logits=mlm_logits, **losses
        )


# ---------------------------------------------------------------------------------------------------- captioning
@auto_docstring(
    custom_intro="""
    Unified VLP captioner: the MLM head under the seq2seq pattern, with `generate()`.

    Training (`labels`) is the original's masked seq2seq objective: some caption tokens (and the final [SEP]) are
    replaced by [MASK] and predicted. Generation predicts every next word from a trailing [MASK]:
    `model.generate(**processor(images=...), max_new_tokens=20, num_beams=5)` runs transformers' greedy / sampling
    / beam search with a `DynamicCache` that holds only real tokens (see `forward(predict_next=True)`); the original's
    beam search is `custom_generate=vlhub.modeling.unified_vlp.vlp_beam_search` (see `generation_unified_vlp`).
    """
)
class UnifiedVlpForConditionalGeneration(
    _MaskedLanguageModelMixin, SharedPrefillMixin, UnifiedVlpPreTrainedModel, GenerationMixin
):
    default_seq2seq = True
    _generating_architectures = ("UnifiedVlpForConditionalGeneration", "UnifiedVlpForPreTraining")
    _keys_to_ignore_on_load_unexpected = [r"^(vlp\.)?pooler\."]  # the captioner reads no pooled output

    @accepts_past_key_values
    @can_return_tuple
    @auto_docstring(custom_args=_INPUT_ARGS + _MASKED_LM_ARGS + _CACHE_ARGS + _PREDICT_NEXT_ARG)
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        region_features: torch.FloatTensor | None = None,
        region_locations: torch.FloatTensor | None = None,
        region_attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        masked_positions: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        predict_next: bool = False,
        logits_to_keep: int | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> CausalLMOutputWithPast:
        r"""
        Returns:
            `CausalLMOutputWithPast`: `logits` `(batch_size, sequence_length | num_masked | slots, vocab_size)`.
        """
        # Sequence/context-parallel training passes the targets already aligned with the logits as `shift_labels`,
        # which then replace `labels` (as in transformers' causal LMs); this head's `labels` are aligned already.
        shift_labels = kwargs.pop("shift_labels", None)
        slots = 0
        if predict_next:
            if labels is not None or masked_positions is not None:
                raise ValueError("predict_next is a decoding step; it takes no labels or masked_positions")
            input_ids, inputs_embeds, attention_mask, token_type_ids, position_ids, slots = self._append_mask_slots(
                input_ids,
                inputs_embeds,
                attention_mask,
                token_type_ids,
                position_ids,
                cache if use_cache is not False else None,
                1 if logits_to_keep is None else logits_to_keep,
            )
        outputs = self.vlp(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            region_features=region_features,
            region_locations=region_locations,
            region_attention_mask=region_attention_mask,
            inputs_embeds=inputs_embeds,
            seq2seq=True,
            cache=cache,
            use_cache=use_cache,
            prediction_slots=slots,
            **kwargs,
        )
        sequence_output = outputs.last_hidden_state
        cache = getattr(outputs, CACHE_NAME)  # None unless the cache was used
        hidden_states, attentions = outputs.hidden_states, outputs.attentions
        if predict_next:
            sequence_output = sequence_output[:, -slots:]
            if cache is not None:
                cache.crop(-slots)  # forget the [MASK]s: the next step feeds the real tokens there
            # What a decoder fed the input tokens returns: their rows, over the keys up to them (no slot is visible
            # to an input token, so the dropped columns hold no probability).
            if hidden_states is not None:
                hidden_states = tuple(states[:, :-slots] for states in hidden_states)
            if attentions is not None:
                attentions = tuple(probabilities[:, :, :-slots, :-slots] for probabilities in attentions)
        elif masked_positions is not None:
            sequence_output = _gather_positions(sequence_output, masked_positions)
        elif logits_to_keep:
            sequence_output = sequence_output[:, -logits_to_keep:]
        logits = self.cls(sequence_output)
        loss = None
        if labels is not None:
            loss = _masked_lm_loss(logits, labels if shift_labels is None else shift_labels)
        return CausalLMOutputWithPast(
            loss=loss, logits=logits, **cache_argument(cache), hidden_states=hidden_states, attentions=attentions
        )

    def _append_mask_slots(
        self, input_ids, inputs_embeds, attention_mask, token_type_ids, position_ids, cache, logits_to_keep: int
    ):
        """The inputs with a [MASK] slot after each of the last `logits_to_keep` tokens (0: every token), and the
        number of slots (see `predict_next`)."""
        text = input_ids if input_ids is not None else inputs_embeds
        if text is None:
            raise ValueError("predict_next needs input_ids (or inputs_embeds)")
        batch, length = text.shape[:2]
        slots = length if logits_to_keep == 0 else logits_to_keep
        if not 0 < slots <= length:
            raise ValueError(
                f"predict_next predicts after input tokens: logits_to_keep must be between 0 (every token) and the "
                f"{length} input tokens, got {logits_to_keep}"
            )
        device = text.device
        past_length = cache.get_seq_length() if cache is not None else 0
        if attention_mask is not None and attention_mask.ndim != 2:
            raise ValueError("predict_next takes a 2-D attention_mask (batch, past + length)")
        if position_ids is None:
            offsets = left_padding(attention_mask, past_length + length, self.config.text_start)
            position_ids = _default_position_ids(offsets, past_length, length, device)
        position_ids = position_ids.expand(batch, -1)
        position_ids = torch.cat([position_ids, position_ids[:, -slots:] + 1], dim=1)
        mask_ids = torch.full((batch, slots), self.config.mask_token_id, dtype=torch.long, device=device)
        if input_ids is not None:
            input_ids = torch.cat([input_ids, mask_ids], dim=1)
        else:
            inputs_embeds = torch.cat([inputs_embeds, self.vlp.embeddings.word_embeddings(mask_ids)], dim=1)
        if token_type_ids is not None:
            text_type = torch.full_like(token_type_ids[:, :1], self.config.s2s_text_token_type_id)
            token_type_ids = torch.cat([token_type_ids, text_type.expand(-1, slots)], dim=1)
        if attention_mask is not None:
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(batch, slots)], dim=1)
        return input_ids, inputs_embeds, attention_mask, token_type_ids, position_ids, slots

    def caption_scoring_inputs(
        self, prompt: dict, caption_ids: torch.LongTensor, caption_mask: torch.Tensor | None = None
    ) -> dict:
        """Inputs of one teacher-forced `forward` that scores given captions word by word as decoding would
        (vlhub's captioning hook, used by self-critical training for the log-probabilities of sampled captions).

        The sequence is `[CLS] r_1 .. r_N [SEP] | w_1 .. w_T | [MASK]_1 .. [MASK]_T`: the words under the seq2seq
        pattern (each sees the image block and the words up to itself, text token type), and `[MASK]_t` at `w_t`'s
        position and type, seeing the image block, `w_<t` and itself — what decoding step `t` computes from the cached
        words and its trailing [MASK] (segment ids and masks are the decoder's, not the training batch's).

        Args:
            prompt: the processor's captioning inputs (`input_ids` `(B, N + 2)` and the region fields).
            caption_ids (`torch.LongTensor` of shape `(B, T)`): the captions, without the prompt.
            caption_mask (`torch.Tensor` of shape `(B, T)`, *optional*): 1 for the words to score (a prefix: the
                caption up to and including its end token); the rest is hidden from every row.
        Returns:
            keyword arguments for `forward`, whose `logits` `(B, T, vocab_size)` predict `caption_ids[:, t]` in row t.
        """
        config = self.config
        input_ids = prompt["input_ids"]
        batch, length = input_ids.shape
        if length != config.text_start:
            raise ValueError(
                f"the captioning prompt must be [CLS], the {config.num_regions} region slots and [SEP] "
                f"({config.text_start} tokens, the processor's regions-only output), got {length} tokens"
            )
        if caption_ids.ndim != 2 or caption_ids.shape[0] != batch or caption_ids.shape[1] == 0:
            raise ValueError(f"caption_ids must be (batch, length) = ({batch}, >= 1), got {tuple(caption_ids.shape)}")
        words = caption_ids.shape[1]
        if length + words > config.max_position_embeddings:
            raise ValueError(
                f"captions of {words} tokens need {length + words} positions; the model has "
                f"{config.max_position_embeddings}"
            )
        device = input_ids.device
        real = (
            torch.ones_like(caption_ids, dtype=torch.bool)
            if caption_mask is None
            else caption_mask.to(device=device, dtype=torch.bool)
        )
        prompt_mask = prompt.get("attention_mask")
        prompt_real = (
            torch.ones_like(input_ids, dtype=torch.bool) if prompt_mask is None else prompt_mask.to(device).bool()
        )
        prompt_types = prompt.get("token_type_ids")
        if prompt_types is None:
            prompt_types = torch.full_like(input_ids, config.s2s_image_token_type_id)
        text_positions = torch.arange(length, length + words, device=device)
        total = length + 2 * words
        visible = torch.zeros(batch, total, total, dtype=torch.bool, device=device)
        visible[:, :, :length] = prompt_real[:, None, :]  # every row sees the image block (the image block only it)
        ones = torch.ones(words, words, dtype=torch.bool, device=device)
        visible[:, length : length + words, length : length + words] = ones.tril() & real[:, None, :]
        visible[:, length + words :, length : length + words] = ones.tril(-1) & real[:, None, :]
        visible[:, length + words :, length + words :] = torch.eye(words, dtype=torch.bool, device=device)
        return {
            "input_ids": torch.cat([input_ids, caption_ids, torch.full_like(caption_ids, config.mask_token_id)], 1),
            "attention_mask": visible.long(),
            "token_type_ids": torch.cat(
                [
                    prompt_types,
                    torch.full(
                        (batch, 2 * words), config.s2s_text_token_type_id, dtype=prompt_types.dtype, device=device
                    ),
                ],
                1,
            ),
            "position_ids": torch.cat([torch.arange(length, device=device), text_positions, text_positions])[
                None
            ].expand(batch, -1),
            "masked_positions": torch.arange(length + words, total, device=device)[None].expand(batch, -1),
            **{k: prompt[k] for k in ("region_features", "region_locations", "region_attention_mask") if k in prompt},
            "use_cache": False,
        }

    # -- generation -------------------------------------------------------------------------------------------
    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, **kwargs: Any) -> dict[str, Any]:
        model_inputs = super().prepare_inputs_for_generation(input_ids, **kwargs)
        model_inputs["predict_next"] = True
        return model_inputs

    def _update_model_kwargs_for_generation(self, outputs, model_kwargs, is_encoder_decoder=False, num_new_tokens=1):
        model_kwargs = super()._update_model_kwargs_for_generation(
            outputs, model_kwargs, is_encoder_decoder=is_encoder_decoder, num_new_tokens=num_new_tokens
        )
        token_type_ids = model_kwargs.get("token_type_ids")
        if token_type_ids is not None:  # generated words are text (transformers repeats the last type: the [SEP]'s)
            token_type_ids[:, -num_new_tokens:] = self.config.s2s_text_token_type_id
        return model_kwargs

    def check_generation_inputs(self, input_ids: torch.Tensor | None, max_new_tokens: int | None) -> None:
        """Clear errors for what `generate()` cannot do (called by `generate`)."""
        architectures = self.config.architectures or []
        if architectures and not any(name in self._generating_architectures for name in architectures):
            raise ValueError(
                f"this checkpoint was saved as {architectures} (e.g. a VQA model), whose masked-LM head was not kept: "
                "it cannot generate captions. Use a captioning or pre-training checkpoint (vlhub convert unified_vlp "
                "... --task captioning)"
            )
        if input_ids is not None:
            if input_ids.shape[0] == 0:
                raise ValueError("empty batch: generate() needs at least one image")
            if max_new_tokens is not None:
                # Each step needs one position beyond the words so far for its trailing [MASK].
                needed = input_ids.shape[1] + max_new_tokens
                if needed > self.config.max_position_embeddings:
                    raise ValueError(
                        f"max_new_tokens={max_new_tokens} after a prompt of {input_ids.shape[1]} tokens needs "
                        f"{needed} positions (the last word's [MASK] included) but the model has "
                        f"{self.config.max_position_embeddings}; at most "
                        f"{self.config.max_position_embeddings - input_ids.shape[1]} new tokens"
                    )

    def _caption_prompt(self, kwargs: dict) -> dict:
        """`kwargs` with the captioning prompt `[CLS] r_1 .. r_N [SEP]` (input_ids, attention_mask, token_type_ids)
        built for its `region_features` — what the processor's regions-only call gives."""
        features = kwargs.get("region_features")
        if kwargs.get("inputs_embeds") is not None or features is None or kwargs.get("region_locations") is None:
            raise ValueError(
                "generate() needs the image's regions: pass the processor's output (processor(regions=...) or "
                "processor(images=...)), or region_features and region_locations (the prompt is then built)"
            )
        config = self.config
        missing = [name for name in ("bos_token_id", "eos_token_id") if getattr(config, name) is None]
        if missing:
            raise ValueError(
                f"the config has no {' or '.join(missing)} ([CLS] / [SEP]) to build the captioning prompt "
                "from; pass the processor's input_ids"
            )
        batch, device = features.shape[0], features.device
        prompt = torch.tensor(
            [config.bos_token_id, *[config.region_token_id] * config.num_regions, config.eos_token_id], device=device
        ).expand(batch, -1)
        given = [name for name in ("attention_mask", "token_type_ids") if kwargs.get(name) is not None]
        if given:
            raise ValueError(
                f"generate() got {' and '.join(given)} without input_ids: pass the prompt's input_ids "
                "with them, or only the regions"
            )
        return {
            **kwargs,
            "input_ids": prompt,
            "attention_mask": torch.ones_like(prompt),
            "token_type_ids": torch.full_like(prompt, config.s2s_image_token_type_id),
        }

    def generate(
        self, inputs: torch.Tensor | None = None, generation_config: GenerationConfig | None = None, **kwargs: Any
    ) -> GenerateOutput | torch.LongTensor:
        """`GenerationMixin.generate` after `check_generation_inputs` (clear errors for a VQA checkpoint, an empty
        batch, or more new tokens than the model has positions). The caption prompt is the processor's captioning
        layout `[CLS] r_1 .. r_N [SEP]` with its regions; see the class docstring for the decoding options.
        Without `input_ids` (only `region_features` and `region_locations`), that prompt is built here."""
        if inputs is None and kwargs.get("input_ids") is None:
            kwargs = self._caption_prompt(kwargs)
        input_ids = inputs if inputs is not None else kwargs.get("input_ids")
        config = generation_config if generation_config is not None else self.generation_config
        implementation = kwargs.get("cache_implementation", config.cache_implementation)
        given_cache = kwargs.get(CACHE_NAME, kwargs.get("past_key_values"))
        if "static" in str(implementation) or (isinstance(given_cache, Cache) and given_cache.is_compileable):
            raise ValueError(
                "Unified VLP cannot decode with a static (compileable) cache: transformers then builds a causal 4-D "
                "mask for the prompt, but the image block [CLS] r_1 .. r_N [SEP] attends both ways (the seq2seq "
                "pattern). Use the default dynamic cache"
            )
        max_new_tokens = kwargs.get("max_new_tokens")
        if max_new_tokens is None:
            max_new_tokens = config.max_new_tokens
            if max_new_tokens is None and config.max_length is not None and input_ids is not None:
                max_new_tokens = config.max_length - input_ids.shape[1]
        self.check_generation_inputs(input_ids, max_new_tokens)
        if given_cache is None and implementation is None and kwargs.get("use_cache", config.use_cache) is not False:
            # The default cache's keys and values, kept faster: in place, and beams reordered after the prompt only.
            prompt_length = None if input_ids is None else input_ids.shape[1]
            kwargs[CACHE_NAME] = VlpBeamCache.for_decoding(
                self.config.get_text_config(decoder=True), prompt_length, max_new_tokens
            )
        return super().generate(inputs, generation_config=generation_config, **kwargs)


# ---------------------------------------------------------------------------------------------------- VQA
@auto_docstring(
    custom_intro="""
    Unified VLP for VQA: bidirectional attention, `ans_classifier` (Linear(H, 2H), ReLU, Linear(2H, num_labels))
    on the product of the final [CLS] state and the final state of the first [SEP] (position `num_regions + 1`).
    Trained with binary cross-entropy on soft answer scores; the prediction never picks `config.unknown_answer_id`
    (answer 0, `<unk>`, in converted checkpoints).
    """
)
class UnifiedVlpForQuestionAnswering(UnifiedVlpPreTrainedModel):
    default_seq2seq = False
    _keys_to_ignore_on_load_unexpected = [r"^(vlp\.)?pooler\.", r"^cls\."]  # the head reads neither

    def __init__(self, config: UnifiedVlpConfig) -> None:
        super().__init__(config)
        self.vlp = UnifiedVlpModel(config, add_pooling_layer=False)
        inner = config.classifier_hidden_size or 2 * config.hidden_size
        self.ans_classifier = nn.Sequential(
            nn.Linear(config.hidden_size, inner), nn.ReLU(), nn.Linear(inner, config.num_labels)
        )
        self.post_init()

    @can_return_tuple
    @auto_docstring(custom_args=_INPUT_ARGS + _ANSWER_LABELS_ARG)
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        region_features: torch.FloatTensor | None = None,
        region_locations: torch.FloatTensor | None = None,
        region_attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.FloatTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> UnifiedVlpQuestionAnsweringOutput:
        r"""
        Returns:
            `UnifiedVlpQuestionAnsweringOutput` with `logits` `(batch_size, num_labels)` and `predicted_answer_ids`.
        """
        outputs = self.vlp(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            region_features=region_features,
            region_locations=region_locations,
            region_attention_mask=region_attention_mask,
            inputs_embeds=inputs_embeds,
            seq2seq=False,
            use_cache=False,
            **kwargs,
        )
        sequence_output = outputs.last_hidden_state
        offsets = left_padding(attention_mask, sequence_output.shape[1], self.config.text_start)
        if offsets is None:
            joint = sequence_output[:, 0] * sequence_output[:, self.config.num_regions + 1]
        else:  # [CLS] and the first [SEP] after each row's left padding
            rows = torch.arange(sequence_output.shape[0], device=sequence_output.device)
            offsets = offsets.to(sequence_output.device)
            joint = sequence_output[rows, offsets] * sequence_output[rows, offsets + self.config.num_regions + 1]
        logits = self.ans_classifier(joint)
        loss = None
        if labels is not None:
            loss = soft_score_loss(logits, labels)
        predicted = predictable_answer_logits(logits.detach(), self.config).argmax(dim=-1)
        return with_backbone_outputs(
            UnifiedVlpQuestionAnsweringOutput, outputs, loss=loss, logits=logits, predicted_answer_ids=predicted
        )
