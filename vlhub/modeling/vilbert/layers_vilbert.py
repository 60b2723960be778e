"""ViLBERT's two-stream blocks: each stream is a stack of BERT layers of its own size, and co-attention layers let
each stream's queries attend over the other stream's keys and values."""

from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.bert.modeling_bert import BertIntermediate, BertLayer, BertOutput, eager_attention_forward
from transformers.pytorch_utils import apply_chunking_to_forward

from ..packed_linear import dense_plus_residual

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask
    from transformers import PreTrainedConfig

__all__ = ["StreamConfig", "StreamLayer", "cross_stream_mask", "CoAttention", "CoAttentionOutput", "CoAttentionLayer"]


class StreamConfig:
    """One stream's view of a model config: `overrides` replace some fields (`hidden_size`, `num_attention_heads`,
    `intermediate_size`, ...); every other attribute is read from the model's config *when accessed*, notably
    `_attn_implementation`, so `model.set_attn_implementation(...)` switches the layers of every stream.

    BERT's blocks take it where they take a config: `BertLayer(StreamConfig(config, hidden_size=1024, ...))`.
    """

    def __init__(self, base: "PreTrainedConfig", **overrides: Any) -> None:
        object.__setattr__(self, "_base", base)
        object.__setattr__(self, "_overrides", dict(overrides))

    def __getattr__(self, name):
        if name in ("_base", "_overrides"):  # during copy/unpickling, before __init__ ran
            raise AttributeError(name)
        overrides = self._overrides
        return overrides[name] if name in overrides else getattr(self._base, name)

    def __setattr__(self, name, value):
        # A stream's own field is set on the view; anything else (e.g. the attention backend) on the model's config.
        if name in self._overrides:
            self._overrides[name] = value
        else:
            setattr(self._base, name, value)

    def __repr__(self):
        return f"StreamConfig({type(self._base).__name__}, {self._overrides})"


class StreamLayer(BertLayer):
    """transformers' `BertLayer` (same parameters, same math) that also returns its attention probabilities: a
    two-stream encoder runs its layers itself and records each stream's maps separately.

    forward(hidden_states `(B, L, H)`, attention_mask (backend format) or None) → `(hidden_states, probabilities)`;
    probabilities `(B, heads, L, L)` from the eager backend, None from the others.
    """

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attention_output, probabilities = self.attention(hidden_states, attention_mask, **kwargs)
        layer_output = apply_chunking_to_forward(
            self.feed_forward_chunk, self.chunk_size_feed_forward, self.seq_len_dim, attention_output
        )
        return layer_output, probabilities


def cross_stream_mask(
    config: "PreTrainedConfig", queries: torch.Tensor, keys: torch.Tensor, key_mask: torch.Tensor | None
) -> "torch.Tensor | BlockMask | None":
    """The mask the configured attention backend wants for `queries` `(B, Lq, ·)` attending over `keys`
    `(B, Lk, ·)` whose padding is `key_mask` `(B, Lk)` (1 = real). None when nothing is masked and the backend
    needs no mask."""
    return create_bidirectional_mask(
        config=config, inputs_embeds=queries, attention_mask=key_mask, encoder_hidden_states=keys
    )


class CoAttention(nn.Module):
    """Co-attention between two streams (ViLBERT's `BertBiAttention`): stream 1's queries attend over stream 2's
    keys and values and stream 2's over stream 1's, each in an `inner_size`-wide space of `num_heads` heads.

    Projections `query1/key1/value1` read stream 1 (`hidden_size1` wide), `query2/key2/value2` stream 2. The
    attention runs through transformers' attention interface, so `config._attn_implementation` ("eager", "sdpa",
    ...) picks the kernel at every forward. `attention_dropout1` drops probabilities over stream 1's keys,
    `attention_dropout2` over stream 2's.

    With `update_stream2=False` only stream 1's queries attend (over stream 2's keys and values): `query2`, `key1`
    and `value1` are not built (None) and the forward returns None for stream 2's context and probabilities.
    """

    # each stream's three projections read the same states: `pack_linear_weights` runs them as one product
    packed_projection_groups = (("query1", "key1", "value1"), ("query2", "key2", "value2"))

    def __init__(
        self,
        config: "PreTrainedConfig | StreamConfig",
        hidden_size1: int,
        hidden_size2: int,
        inner_size: int,
        num_heads: int,
        attention_dropout1: float,
        attention_dropout2: float,
        update_stream2: bool = True,
    ) -> None:
        super().__init__()
        if inner_size % num_heads != 0:
            raise ValueError(f"the co-attention size ({inner_size}) must be a multiple of its heads ({num_heads})")
        self.config = config  # read for the attention backend at every forward
        self.head_size = inner_size // num_heads
        self.scaling = self.head_size**-0.5
        self.is_causal = False
        self.query1 = nn.Linear(hidden_size1, inner_size)
        self.key1 = nn.Linear(hidden_size1, inner_size) if update_stream2 else None
        self.value1 = nn.Linear(hidden_size1, inner_size) if update_stream2 else None
        self.query2 = nn.Linear(hidden_size2, inner_size) if update_stream2 else None
        self.key2 = nn.Linear(hidden_size2, inner_size)
        self.value2 = nn.Linear(hidden_size2, inner_size)
        self.dropout1 = nn.Dropout(attention_dropout1)
        self.dropout2 = nn.Dropout(attention_dropout2)

    def _heads(self, projection: nn.Linear, hidden_states: torch.Tensor) -> torch.Tensor:
        return projection(hidden_states).view(*hidden_states.shape[:-1], -1, self.head_size).transpose(1, 2)

    def forward(
        self,
        hidden_states1: torch.Tensor,
        hidden_states2: torch.Tensor,
        mask_over1: torch.Tensor | None = None,
        mask_over2: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """hidden_states1 `(B, L1, hidden_size1)`, hidden_states2 `(B, L2, hidden_size2)`; `mask_over1` masks stream
        1's keys for stream 2's queries and `mask_over2` stream 2's keys for stream 1's (`cross_stream_mask`).

        Returns `(context1 (B, L1, inner), context2 (B, L2, inner), probabilities1 (B, heads, L1, L2),
        probabilities2 (B, heads, L2, L1))`: context*i* is what stream *i*'s queries gathered from the other stream;
        the probabilities come from the eager backend (None from the others)."""
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        query1 = self._heads(self.query1, hidden_states1)
        key2, value2 = self._heads(self.key2, hidden_states2), self._heads(self.value2, hidden_states2)
        context1, probabilities1 = attention(
            self,
            query1,
            key2,
            value2,
            mask_over2,
            scaling=self.scaling,
            dropout=self.dropout2.p if self.training else 0.0,
            **kwargs,
        )
        context1 = context1.reshape(*hidden_states1.shape[:-1], -1).contiguous()
        if self.query2 is None:
            return context1, None, probabilities1, None
        query2 = self._heads(self.query2, hidden_states2)
        key1, value1 = self._heads(self.key1, hidden_states1), self._heads(self.value1, hidden_states1)
        context2, probabilities2 = attention(
            self,
            query2,
            key1,
            value1,
            mask_over1,
            scaling=self.scaling,
            dropout=self.dropout1.p if self.training else 0.0,
            **kwargs,
        )
        context2 = context2.reshape(*hidden_states2.shape[:-1], -1).contiguous()
        return context1, context2, probabilities1, probabilities2


class CoAttentionOutput(nn.Module):
    """Back from the co-attention space into each stream (ViLBERT's `BertBiOutput`):
    `LayerNorm1(dropout1(dense1(context1)) + hidden_states1)` and the same with `dense2`/`LayerNorm2` for stream 2
    (not built with `update_stream2=False`; stream 2's result is then None)."""

    def __init__(
        self,
        inner_size: int,
        hidden_size1: int,
        hidden_size2: int,
        dropout1: float,
        dropout2: float,
        layer_norm_eps: float = 1e-12,
        update_stream2: bool = True,
    ) -> None:
        super().__init__()
        self.dense1 = nn.Linear(inner_size, hidden_size1)
        self.LayerNorm1 = nn.LayerNorm(hidden_size1, eps=layer_norm_eps)
        self.dropout1 = nn.Dropout(dropout1)
        self.dense2 = nn.Linear(inner_size, hidden_size2) if update_stream2 else None
        self.LayerNorm2 = nn.LayerNorm(hidden_size2, eps=layer_norm_eps) if update_stream2 else None
        self.dropout2 = nn.Dropout(dropout2)

    def forward(
        self, context1: torch.Tensor, hidden_states1: torch.Tensor, context2: torch.Tensor, hidden_states2: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden_states1 = self.LayerNorm1(dense_plus_residual(self.dense1, self.dropout1, context1, hidden_states1))
        if self.dense2 is None:
            return hidden_states1, None
        hidden_states2 = self.LayerNorm2(dense_plus_residual(self.dense2, self.dropout2, context2, hidden_states2))
        return hidden_states1, hidden_states2


class CoAttentionLayer(GradientCheckpointingLayer):
    """A co-attention transformer block (ViLBERT's Co-TRM, `BertConnectionLayer`): co-attention instead of
    self-attention, then each stream's own BERT feed-forward (`BertIntermediate` + `BertOutput`).

    Stream 1 and stream 2 are described by their `StreamConfig`s (hidden size, intermediate size, activation,
    dropout). Parameter names are ViLBERT's: `biattention`, `biOutput`, `v_intermediate`/`v_output` (stream 1) and
    `t_intermediate`/`t_output` (stream 2).

    forward(hidden_states1, hidden_states2, mask_over1, mask_over2) → `(hidden_states1, hidden_states2,
    probabilities1, probabilities2)`, shapes as `CoAttention`.

    `update_stream2=False` builds a one-sided layer: only stream 1 is updated (its queries over stream 2, its output
    and feed-forward); stream 2's side (`query2`/`key1`/`value1`, `dense2`/`LayerNorm2`, `t_intermediate`/`t_output`)
    is not built and the forward returns None for `hidden_states2` and `probabilities2`. For a model whose last
    co-attention layer feeds only stream 1's output.
    """

    def __init__(
        self,
        config1: "PreTrainedConfig | StreamConfig",
        config2: "PreTrainedConfig | StreamConfig",
        inner_size: int,
        num_heads: int,
        update_stream2: bool = True,
    ) -> None:
        super().__init__()
        self.biattention = CoAttention(
            config1,
            config1.hidden_size,
            config2.hidden_size,
            inner_size,
            num_heads,
            config1.attention_probs_dropout_prob,
            config2.attention_probs_dropout_prob,
            update_stream2,
        )
        self.biOutput = CoAttentionOutput(
            inner_size,
            config1.hidden_size,
            config2.hidden_size,
            config1.hidden_dropout_prob,
            config2.hidden_dropout_prob,
            config1.layer_norm_eps,
            update_stream2,
        )
        self.v_intermediate = BertIntermediate(config1)
        self.v_output = BertOutput(config1)
        self.t_intermediate = BertIntermediate(config2) if update_stream2 else None
        self.t_output = BertOutput(config2) if update_stream2 else None

    def forward(
        self,
        hidden_states1: torch.Tensor,
        hidden_states2: torch.Tensor,
        mask_over1: "torch.Tensor | BlockMask | None" = None,
        mask_over2: "torch.Tensor | BlockMask | None" = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        context1, context2, probabilities1, probabilities2 = self.biattention(
            hidden_states1, hidden_states2, mask_over1, mask_over2, **kwargs
        )
        hidden_states1, hidden_states2 = self.biOutput(context1, hidden_states1, context2, hidden_states2)
        hidden_states1 = self.v_output(self.v_intermediate(hidden_states1), hidden_states1)
        if hidden_states2 is not None:
            hidden_states2 = self.t_output(self.t_intermediate(hidden_states2), hidden_states2)
        return hidden_states1, hidden_states2, probabilities1, probabilities2
