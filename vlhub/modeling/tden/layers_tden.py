"""TDEN's cross-modal encoder layer: ONE attention over the concatenation [visual | text] (single-stream attention),
then a feed-forward network per modality."""

from typing import TYPE_CHECKING, Any

import torch
from transformers.modeling_layers import GradientCheckpointingLayer as _GradientCheckpointingLayer
from transformers.models.bert.modeling_bert import (
    BertAttention as _BertAttention,
    BertIntermediate as _BertIntermediate,
    BertOutput as _BertOutput,
)

from ...utils.compat import cache_argument

if TYPE_CHECKING:
    from transformers import Cache, PreTrainedConfig

__all__ = ["CrossModalLayer"]


class CrossModalLayer(_GradientCheckpointingLayer):
    """Shared attention over `[visual | text]`, then modality-specific feed-forward networks (TDEN's
    `BertUnderstandingLayer`; not ViLBERT's co-attention).

    1. `biattention` (transformers' `BertAttention`: query/key/value, then dense + residual + LayerNorm) runs over
       the concatenation, visual tokens first, so every token attends to both modalities;
    2. the result is split back; the visual part goes through `v_intermediate`/`v_output` and the text part through
       `t_intermediate`/`t_output` (BERT's feed-forward blocks, one set per modality).

    The attention dispatches through transformers' attention interface (`config._attn_implementation`), so eager /
    sdpa / flash is a config choice. With a key/value `Cache` (`cache`, `layer_idx` given at construction)
    the keys and values of earlier calls are reused: pass the visual tokens on the first call only and a visual
    input of length 0 afterwards, so that the new text tokens attend to everything seen before.

    forward(visual_states `(B, R, H)`, text_states `(B, T, H)`, attention_mask (backend format over the `R + T`
    concatenated keys, e.g. from `extended_attention_mask`), cache=None) →
    `(visual_states (B, R, H), text_states (B, T, H), probabilities (B, heads, R + T, keys) or None)`.
    """

    def __init__(self, config: "PreTrainedConfig", layer_idx: int | None = None) -> None:
        super().__init__()
        self.biattention = _BertAttention(config, is_causal=False, layer_idx=layer_idx)
        self.v_intermediate = _BertIntermediate(config)
        self.v_output = _BertOutput(config)
        self.t_intermediate = _BertIntermediate(config)
        self.t_output = _BertOutput(config)

    def forward(
        self,
        visual_states: torch.Tensor,
        text_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: "Cache | None" = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        num_visual = visual_states.shape[1]
        states = torch.cat([visual_states, text_states], dim=1)
        attended, probabilities = self.biattention(states, attention_mask, **cache_argument(cache), **kwargs)
        visual, text = attended[:, :num_visual], attended[:, num_visual:]
        visual = self.v_output(self.v_intermediate(visual), visual)
        text = self.t_output(self.t_intermediate(text), text)
        return visual, text, probabilities
