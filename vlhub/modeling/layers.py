"""Blocks shared by the vlhub architectures.

Wherever an original model is BERT underneath, vlhub uses transformers' own BERT blocks (re-exported here), so
that every attention backend (`attn_implementation="eager" | "sdpa" | ...`), gradient checkpointing and future
speed-ups come for free and checkpoint keys line up with the originals. Only what the originals add on top of
BERT lives here: classifier heads, the region-feature heads, masks over [text | regions] and optimal transport.
"""

import torch
from torch import nn
from torch.nn import functional as F
from transformers.activations import ACT2FN
from transformers.masking_utils import create_bidirectional_mask
from transformers.models.bert.modeling_bert import (
    BertEmbeddings,
    BertEncoder,
    BertLayer,
    BertOnlyMLMHead,
    BertPooler,
    BertPredictionHeadTransform,
    BertSelfAttention,
)

__all__ = [
    "BertEmbeddings",
    "BertEncoder",
    "BertLayer",
    "BertOnlyMLMHead",
    "BertPooler",
    "BertPredictionHeadTransform",
    "BertSelfAttention",
    "RegionFeatureRegressionHead",
    "RegionClassificationHead",
    "classifier_head",
    "AttentionPooling",
    "extended_attention_mask",
    "gather_masked",
    "ipot_distance",
]


def classifier_head(
    hidden_size: int, inner_size: int, num_labels: int, activation: str = "gelu", layer_norm_eps: float = 1e-12
) -> nn.Sequential:
    """`Linear(hidden, inner) → activation → LayerNorm(inner) → Linear(inner, num_labels)`.

    The answer/label head the original UNITER (VQA, VE, VCR), VL-BERT and ViLBERT heads share; a `Sequential`
    so parameter names are `0.*`, `2.*`, `3.*` exactly as in the released checkpoints.
    """
    return nn.Sequential(
        nn.Linear(hidden_size, inner_size),
        ACT2FN[activation],
        nn.LayerNorm(inner_size, eps=layer_norm_eps),
        nn.Linear(inner_size, num_labels),
    )


class RegionFeatureRegressionHead(nn.Module):
    """Masked region feature regression (MRFR): `hidden → Linear, GELU, LayerNorm → features`.

    The output projection reuses the image embedder's input projection (weight tying, transposed use); the head
    owns only its bias. Input `(N, hidden)`, output `(N, feature_dim)`.
    """

    def __init__(self, hidden_size: int, feature_dim: int, hidden_act: str = "gelu", layer_norm_eps: float = 1e-12):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(hidden_size, hidden_size),
            ACT2FN[hidden_act],
            nn.LayerNorm(hidden_size, eps=layer_norm_eps),
        )
        self.bias = nn.Parameter(torch.zeros(feature_dim))

    def forward(self, hidden_states: torch.Tensor, projection_weight: torch.Tensor) -> torch.Tensor:
        # projection_weight is the embedder's (hidden, feature_dim) Linear weight; x @ W maps hidden → feature.
        return F.linear(self.net(hidden_states), projection_weight.t(), self.bias)


class RegionClassificationHead(nn.Module):
    """Masked region classification (MRC / MRC-kl): `Linear, GELU, LayerNorm, Linear(hidden, num_labels)`."""

    def __init__(self, hidden_size: int, num_labels: int, hidden_act: str = "gelu", layer_norm_eps: float = 1e-12):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(hidden_size, hidden_size),
            ACT2FN[hidden_act],
            nn.LayerNorm(hidden_size, eps=layer_norm_eps),
            nn.Linear(hidden_size, num_labels),
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.net(hidden_states)


class AttentionPooling(nn.Module):
    """Attention pooling over a sequence: `softmax(ReLU(Linear(h)))` over the unmasked positions, then the weighted
    sum (UNITER's NLVR2 paired-attn head). Input `(B, L, H)` and padding `(B, L)` True at pads → `(B, H)`.

    It lives here, not in a modeling file, on purpose: transformers decides whether `set_attn_implementation` may
    switch a model by scanning the model's modeling file for `class *Attention*(nn.Module)` and, if it finds one,
    requiring that file to dispatch through `ALL_ATTENTION_FUNCTIONS`. This pooling is not a self-attention
    backend (the encoder's attention is BERT's, which dispatches per forward), so it must not block the switch.
    """

    def __init__(self, hidden_size: int, dropout: float, masked_score: float = -10000.0):
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(hidden_size, 1), nn.ReLU())
        self.dropout = nn.Dropout(dropout)
        self.masked_score = masked_score

    def forward(self, hidden_states: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        scores = self.fc(hidden_states).squeeze(-1) + padding.to(hidden_states.dtype) * self.masked_score
        weights = self.dropout(F.softmax(scores, dim=1))
        return weights.unsqueeze(1).matmul(hidden_states).squeeze(1)


def extended_attention_mask(config, embeddings: torch.Tensor, attention_mask: torch.Tensor | None):
    """The mask the configured attention backend wants, from a `(batch, seq)` 1/0 mask over all positions."""
    return create_bidirectional_mask(config=config, inputs_embeds=embeddings, attention_mask=attention_mask)


def gather_masked(sequence: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Rows of `sequence` `(batch, length, dim)` where `mask` `(batch, length)` is true, in row-major order:
    `(num_true, dim)`. The order is the one the original collators use for their targets."""
    return sequence[mask.bool()]


@torch.no_grad()
def _ipot_plan(
    cost: torch.Tensor, x_pad: torch.Tensor, y_pad: torch.Tensor, beta: float, iterations: int, inner_steps: int
) -> torch.Tensor:
    """Transport plan of the inexact proximal point method (IPOT) for a batch of cost matrices.

    cost `(batch, m, n)`; x_pad `(batch, m)` and y_pad `(batch, n)` are True at padding. Returns `(batch, n, m)`
    (the plan transposed, as UNITER's `ot.py` computes and uses it). Runs in float32 without gradient.
    """
    batch, m, n = cost.shape
    x_len = (~x_pad).sum(dim=1, keepdim=True).to(cost.dtype)
    y_len = (~y_pad).sum(dim=1, keepdim=True).to(cost.dtype)
    x_mask = (x_pad.to(cost.dtype) * 1e4).unsqueeze(1)
    y_mask = (y_pad.to(cost.dtype) * 1e4).unsqueeze(1)

    sigma = torch.ones(batch, m, dtype=cost.dtype, device=cost.device) / x_len
    plan = torch.ones(batch, n, m, dtype=cost.dtype, device=cost.device)
    kernel = torch.exp(-cost.transpose(1, 2) / beta)
    sigma.masked_fill_(x_pad, 0)
    joint_pad = (x_pad.unsqueeze(1) | y_pad.unsqueeze(2))
    plan.masked_fill_(joint_pad, 0)
    kernel.masked_fill_(joint_pad, 0)
    x_len, y_len = x_len.unsqueeze(1), y_len.unsqueeze(1)
    for _ in range(iterations):
        q = kernel * plan
        sigma = sigma.view(batch, m, 1)
        for _ in range(inner_steps):
            delta = 1 / (y_len * q.matmul(sigma).view(batch, 1, n) + y_mask)
            sigma = 1 / (x_len * delta.matmul(q) + x_mask)
            sigma = sigma.view(batch, m, 1)
        plan = delta.view(batch, n, 1) * q * sigma.view(batch, 1, m)
    plan.masked_fill_(joint_pad, 0)
    return plan


def ipot_distance(
    x: torch.Tensor,
    y: torch.Tensor,
    x_pad: torch.Tensor,
    y_pad: torch.Tensor,
    beta: float = 0.5,
    iterations: int = 50,
    inner_steps: int = 1,
) -> torch.Tensor:
    """Optimal-transport (Wasserstein) distance between two sets of vectors, per example.

    x `(batch, m, dim)`, y `(batch, n, dim)`; pads are True where a position is padding. The cost is
    `1 - cos(x_i, y_j)` (zero at pads); the plan comes from IPOT without gradient in float32, and the distance
    `sum_ij C_ij T_ij` carries gradient through the cost only. Returns `(batch,)`.
    """
    x = F.normalize(x.float(), p=2, dim=-1, eps=1e-5)
    y = F.normalize(y.float(), p=2, dim=-1, eps=1e-5)
    cost = 1 - x.matmul(y.transpose(1, 2))
    cost = cost.masked_fill(x_pad.unsqueeze(-1) | y_pad.unsqueeze(-2), 0)
    plan = _ipot_plan(cost.detach(), x_pad, y_pad, beta, iterations, inner_steps)
    # trace(C @ T) per example, with T of shape (n, m).
    return (cost * plan.transpose(1, 2)).sum(dim=(1, 2))


# ---------------------------------------------------------------------------------------------------- cross-modal
# TDEN's cross-modal encoder layer: ONE attention over the concatenation [visual | text] (single-stream attention),
# then a feed-forward network per modality. Imported here rather than at the top so that this section stays additive.
from transformers.modeling_layers import GradientCheckpointingLayer as _GradientCheckpointingLayer  # noqa: E402
from transformers.models.bert.modeling_bert import (  # noqa: E402
    BertAttention as _BertAttention,
    BertIntermediate as _BertIntermediate,
    BertOutput as _BertOutput,
)

__all__ += ["CrossModalLayer", "check_region_inputs"]


class CrossModalLayer(_GradientCheckpointingLayer):
    """Shared attention over `[visual | text]`, then modality-specific feed-forward networks (TDEN's
    `BertUnderstandingLayer`; not ViLBERT's co-attention).

    1. `biattention` (transformers' `BertAttention`: query/key/value, then dense + residual + LayerNorm) runs over
       the concatenation, visual tokens first, so every token attends to both modalities;
    2. the result is split back; the visual part goes through `v_intermediate`/`v_output` and the text part through
       `t_intermediate`/`t_output` (BERT's feed-forward blocks, one set per modality).

    The attention dispatches through transformers' attention interface (`config._attn_implementation`), so eager /
    sdpa / flash is a config choice. With a key/value `Cache` (`past_key_values`, `layer_idx` given at construction)
    the keys and values of earlier calls are reused: pass the visual tokens on the first call only and a visual
    input of length 0 afterwards, so that the new text tokens attend to everything seen before.

    forward(visual_states `(B, R, H)`, text_states `(B, T, H)`, attention_mask (backend format over the `R + T`
    concatenated keys, e.g. from `extended_attention_mask`), past_key_values=None) →
    `(visual_states (B, R, H), text_states (B, T, H), probabilities (B, heads, R + T, keys) or None)`.
    """

    def __init__(self, config, layer_idx: int | None = None):
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
        past_key_values=None,
        **kwargs,
    ):
        num_visual = visual_states.shape[1]
        states = torch.cat([visual_states, text_states], dim=1)
        attended, probabilities = self.biattention(states, attention_mask, past_key_values=past_key_values, **kwargs)
        visual, text = attended[:, :num_visual], attended[:, num_visual:]
        visual = self.v_output(self.v_intermediate(visual), visual)
        text = self.t_output(self.t_intermediate(text), text)
        return visual, text, probabilities


def check_region_inputs(config, region_features, region_locations, region_attention_mask, *texts) -> None:
    """Name what is wrong with a model's region inputs: locations missing or of the wrong shape, features of another
    size than `config.region_feature_dim`, a padded batch without `region_attention_mask`, or a text batch (any of
    `texts`, `(batch, ...)` tensors or None) of another size. Shape checks only (no host-device sync)."""
    if region_features is None:
        return
    if region_locations is None:
        raise ValueError(
            "region_features were given without region_locations: pass the processor's full output "
            f"(region_locations of shape (batch, num_regions, {config.region_location_dim}))"
        )
    if region_features.ndim != 3 or region_features.shape[-1] != config.region_feature_dim:
        raise ValueError(
            f"region_features must have shape (batch, num_regions, {config.region_feature_dim}), "
            f"got {tuple(region_features.shape)}"
        )
    expected = (*region_features.shape[:2], config.region_location_dim)
    if tuple(region_locations.shape) != expected:
        raise ValueError(f"region_locations must have shape {expected}, got {tuple(region_locations.shape)}")
    # A batch of several images is padded to a common number of regions, so it needs the mask; a single image
    # without a mask means "every region is real".
    if region_attention_mask is None and region_features.shape[0] > 1:
        raise ValueError(
            "region_features of a batch of several images were given with no region_attention_mask: pass the "
            "processor's full output (region_attention_mask of shape (batch, num_regions))"
        )
    for text in texts:
        if text is not None and text.shape[0] != region_features.shape[0]:
            raise ValueError(f"text batch ({text.shape[0]}) and region batch ({region_features.shape[0]}) differ in size")
