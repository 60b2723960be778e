"""Blocks shared by the vlhub architectures (two or more users; a block only one architecture uses lives in its
folder, e.g. ViLBERT's co-attention in `vilbert/layers_vilbert.py`).

Wherever an original model is BERT underneath, vlhub uses transformers' own BERT blocks (re-exported here), so
that every attention backend (`attn_implementation="eager" | "sdpa" | ...`), gradient checkpointing and future
speed-ups come for free and checkpoint keys line up with the originals. Only what the originals add on top of
BERT lives here: classifier heads, the region-feature heads, masks over [text | regions] and optimal transport.
"""

from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F
from transformers import PreTrainedConfig
from transformers.activations import ACT2FN
from transformers.masking_utils import create_bidirectional_mask
from transformers.models.bert.modeling_bert import (
    BertEmbeddings,
    BertEncoder,
    BertIntermediate,
    BertLayer,
    BertOnlyMLMHead,
    BertOutput,
    BertPooler,
    BertPredictionHeadTransform,
    BertSelfAttention,
    BertSelfOutput,
)
from transformers.activations import GELUActivation

from ..utils.deprecation import moved_attribute
from .packed_linear import PackedLinear, dense_plus_residual, register_packed_class, register_projection_groups

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask
    from transformers import PreTrainedConfig

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
    "TransformedLinearHead",
    "classifier_head",
    "AttentionPooling",
    "LocatedRegionEmbeddings",
    "extended_attention_mask",
    "gather_masked",
    "mask_region_features",
    "labelled_tokens",
    "one_hot",
    "text_length",
    "soft_score_loss",
    "same_pair_mask",
    "in_batch_contrastive_loss",
    "negative_groups",
    "ipot_distance",
    "check_region_layout",
    "check_region_inputs",
    "check_text_and_region_inputs",
    "text_with_choice_axis",
    "flatten_choices",
    "MASKED_SCORE",
]

# The score every original gives a masked-out position (a padded region's score, a padded key in an attention
# pooler): added to a score, or filled in, it keeps the position out of a softmax or a ranking.
MASKED_SCORE = -10000.0


# Blocks with a single user live in that architecture's folder; their old import path here still works, with a
# FutureWarning naming the new one.
_MOVED = {
    **dict.fromkeys(
        ("StreamConfig", "StreamLayer", "cross_stream_mask", "CoAttention", "CoAttentionOutput", "CoAttentionLayer"),
        "vlhub.modeling.vilbert.layers_vilbert",
    ),
    "CrossModalLayer": "vlhub.modeling.tden.layers_tden",
}


def __getattr__(name: str):
    return moved_attribute(__name__, name, _MOVED)


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

    def __init__(
        self, hidden_size: int, feature_dim: int, hidden_act: str = "gelu", layer_norm_eps: float = 1e-12
    ) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(hidden_size, hidden_size), ACT2FN[hidden_act], nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        )
        self.bias = nn.Parameter(torch.zeros(feature_dim))

    def forward(self, hidden_states: torch.Tensor, projection_weight: torch.Tensor) -> torch.Tensor:
        # projection_weight is the embedder's (hidden, feature_dim) Linear weight; x @ W maps hidden → feature.
        return F.linear(self.net(hidden_states), projection_weight.t(), self.bias)


class TransformedLinearHead(nn.Module):
    """A prediction head: `transform` (the architecture's dense-activation block, e.g. BERT's
    `BertPredictionHeadTransform`) then `decoder`, a Linear with its bias from `hidden_size` to `out_features`
    (X-modaler's LM head, VL-BERT's MVRC head, ViLBERT's masked-region head: the checkpoint keys `transform.*`,
    `decoder.*` they all have)."""

    def __init__(self, transform: nn.Module, hidden_size: int, out_features: int) -> None:
        super().__init__()
        self.transform = transform
        self.decoder = nn.Linear(hidden_size, out_features)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden_states))


class RegionClassificationHead(nn.Module):
    """Masked region classification (MRC / MRC-kl): `Linear, GELU, LayerNorm, Linear(hidden, num_labels)`."""

    def __init__(
        self, hidden_size: int, num_labels: int, hidden_act: str = "gelu", layer_norm_eps: float = 1e-12
    ) -> None:
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

    def __init__(self, hidden_size: int, dropout: float, masked_score: float = MASKED_SCORE) -> None:
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(hidden_size, 1), nn.ReLU())
        self.dropout = nn.Dropout(dropout)
        self.masked_score = masked_score

    def forward(self, hidden_states: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        scores = self.fc(hidden_states).squeeze(-1) + padding.to(hidden_states.dtype) * self.masked_score
        weights = self.dropout(F.softmax(scores, dim=1))
        return weights.unsqueeze(1).matmul(hidden_states).squeeze(1)


class LocatedRegionEmbeddings(nn.Module):
    """`LayerNorm(Linear(features) + Linear(locations))`, then dropout: the region embeddings of the two-stream
    models (ViLBERT, TDEN), with no position or type embedding. Input `(B, R, F)` and `(B, R, loc)`, output
    `(B, R, H)`.

    The releases name the two linear layers differently (ViLBERT `image_embeddings` / `image_location_embeddings`,
    TDEN `feature_embeddings` / `location_embeddings`): an architecture's subclass sets `feature_layer_name` and
    `location_layer_name`, so each checkpoint loads under its own parameter names.
    """

    feature_layer_name = "feature_embeddings"
    location_layer_name = "location_embeddings"

    def __init__(
        self, feature_dim: int, location_dim: int, hidden_size: int, layer_norm_eps: float, dropout_prob: float
    ) -> None:
        super().__init__()
        self.add_module(self.feature_layer_name, nn.Linear(feature_dim, hidden_size))
        self.add_module(self.location_layer_name, nn.Linear(location_dim, hidden_size))
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout_prob)

    def forward(self, region_features: torch.Tensor, region_locations: torch.Tensor) -> torch.Tensor:
        features = self.get_submodule(self.feature_layer_name)(region_features)
        locations = self.get_submodule(self.location_layer_name)(region_locations)
        return self.dropout(self.LayerNorm(features + locations))


def extended_attention_mask(
    config: "PreTrainedConfig", embeddings: torch.Tensor, attention_mask: torch.Tensor | None
) -> "torch.Tensor | BlockMask | None":
    """The mask the configured attention backend wants, from a `(batch, seq)` 1/0 mask over all positions."""
    return create_bidirectional_mask(config=config, inputs_embeds=embeddings, attention_mask=attention_mask)


def gather_masked(sequence: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Rows of `sequence` `(batch, length, dim)` where `mask` `(batch, length)` is true, in row-major order:
    `(num_true, dim)`. The order is the one the original collators use for their targets."""
    return sequence[mask.bool()]


def mask_region_features(
    region_features: torch.Tensor, region_masks: torch.Tensor, mask_features: torch.Tensor | None, owners: str
) -> torch.Tensor:
    """`region_features` `(B, R, F)` with the regions that `region_masks` `(B, R)` marks replaced by the learned
    `mask_features` `(F,)` (masked region modelling: UNITER, VL-BERT). `mask_features` is None in a model built
    without them: a `ValueError` names `owners`, the models that have them."""
    if mask_features is None:
        raise ValueError(
            "region_masks need the region mask embedding (the learned features of masked regions), which only "
            f"{owners} has"
        )
    masked = region_masks.bool().unsqueeze(-1)
    return torch.where(masked, mask_features.to(region_features.dtype), region_features)


def labelled_tokens(labels: torch.Tensor, text_output: torch.Tensor) -> torch.Tensor:
    """The text positions masked language modelling scores: MLM `labels` `(batch, text_length)`, checked against
    the text part of the sequence output `(batch, text_length, hidden)`, as a bool mask of the labels >= 0 (a
    negative label, -100 or the originals' -1, is ignored)."""
    if labels.shape != text_output.shape[:2]:
        raise ValueError(
            f"labels must have shape (batch, text_length) = {tuple(text_output.shape[:2])}, got {tuple(labels.shape)}"
        )
    return labels >= 0


def one_hot(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """`F.one_hot` without its value check (a host-device sync): `(batch,)` ids → `(batch, num_classes)` long."""
    return (labels.unsqueeze(-1) == torch.arange(num_classes, device=labels.device)).long()


def soft_score_loss(logits: torch.Tensor, labels: torch.Tensor, name: str = "labels") -> torch.Tensor:
    """The originals' VQA loss: binary cross-entropy with logits against soft scores in [0, 1] of `logits`' shape
    (`(batch, num_labels)` answers, or `(batch, num_regions)`), averaged over every entry and multiplied by the last
    size (that is, summed over the answers and averaged over the examples), in float32. `labels` of another shape is
    a `ValueError` naming `name`."""
    if labels.shape != logits.shape:
        raise ValueError(
            f"{name} must be soft scores of the logits' shape {tuple(logits.shape)}, got {tuple(labels.shape)}"
        )
    return F.binary_cross_entropy_with_logits(logits.float(), labels.float()) * logits.shape[-1]


def same_pair_mask(batch: int, group_ids: torch.Tensor | None, device: torch.device | str) -> torch.Tensor:
    """`(batch, batch)` bool, True where `[text i, image j]` must not count as a negative pair: the diagonal (the
    matched pairs) and, with `group_ids` `(batch,)`, every two rows sharing an id (two captions of one image)."""
    mask = torch.eye(batch, dtype=torch.bool, device=device)
    if group_ids is not None:
        if group_ids.shape != (batch,):
            raise ValueError(f"group ids must have shape ({batch},), got {tuple(group_ids.shape)}")
        mask = mask | (group_ids.view(-1, 1) == group_ids.view(1, -1)).to(device)
    return mask


def in_batch_contrastive_loss(
    text_embeds: torch.Tensor, image_embeds: torch.Tensor, temperature: float, group_ids: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric InfoNCE over a batch of matched pairs (CLIP / ALBEF's image-text contrastive loss).

    text_embeds, image_embeds `(batch, dim)`: row i of each comes from pair i; they are L2-normalised here.
    Returns `(loss, logits)`: the mean of the text→image and image→text cross-entropies over the cosine
    similarities divided by `temperature`, and those logits `(batch, batch)` (`[text i, image j]`). Pairs sharing a
    `group_ids` entry (the same image) are left out of each other's negatives. Computed in float32.
    """
    if text_embeds.shape != image_embeds.shape or text_embeds.ndim != 2:
        raise ValueError(
            f"text and image embeddings must both be (batch, dim), got {tuple(text_embeds.shape)} and "
            f"{tuple(image_embeds.shape)}"
        )
    if not temperature > 0:
        raise ValueError(f"the contrastive temperature must be positive, got {temperature}")
    batch = text_embeds.shape[0]
    logits = F.normalize(text_embeds.float(), dim=-1) @ F.normalize(image_embeds.float(), dim=-1).t() / temperature
    negatives_only = same_pair_mask(batch, group_ids, logits.device) & ~torch.eye(
        batch, dtype=torch.bool, device=logits.device
    )
    masked = logits.masked_fill(negatives_only, float("-inf"))
    targets = torch.arange(batch, device=logits.device)
    loss = (F.cross_entropy(masked, targets) + F.cross_entropy(masked.t(), targets)) / 2
    return loss, logits


def negative_groups(logits: torch.Tensor, num_negatives: int) -> torch.Tensor:
    """Retrieval scores `(batch, 1)` of a batch laid out as groups of a matched pair followed by `num_negatives`
    mismatched pairs, as float32 `(batch // (num_negatives + 1), num_negatives + 1)`, the matched pair in column 0.
    A batch that is not whole groups is a `ValueError`."""
    group = num_negatives + 1
    if num_negatives < 1 or logits.shape[0] % group:
        raise ValueError(
            f"with num_negatives={num_negatives} the batch ({logits.shape[0]}) must be whole groups of {group} pairs "
            "(matched pair first)"
        )
    return logits.float().view(-1, group)


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
    joint_pad = x_pad.unsqueeze(1) | y_pad.unsqueeze(2)
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


def check_region_layout(
    regions: torch.Tensor,
    region_locations: torch.Tensor | None,
    region_attention_mask: torch.Tensor | None,
    location_dim: int,
) -> None:
    """Name what is wrong with the inputs that go with `regions` (`(batch, num_regions, ...)`: features, or boxes):
    `region_locations` missing or not `(batch, num_regions, location_dim)`, `region_attention_mask` not
    `(batch, num_regions)`, or missing for a padded batch of several images. Shape checks only (no host-device sync)."""
    if region_locations is None:
        raise ValueError(
            "region_features were given without region_locations: pass the processor's full output "
            f"(region_locations of shape (batch, num_regions, {location_dim}))"
        )
    expected = (*regions.shape[:2], location_dim)
    if tuple(region_locations.shape) != expected:
        raise ValueError(f"region_locations must have shape {expected}, got {tuple(region_locations.shape)}")
    if region_attention_mask is None:
        # A batch of several images is padded to a common number of regions, so it needs the mask; a single image
        # without a mask means "every region is real".
        if regions.shape[0] > 1:
            raise ValueError(
                "region_features of a batch of several images were given with no region_attention_mask: pass the "
                "processor's full output (region_attention_mask of shape (batch, num_regions))"
            )
    elif tuple(region_attention_mask.shape) != tuple(regions.shape[:2]):
        raise ValueError(
            f"region_attention_mask must have shape {tuple(regions.shape[:2])}, "
            f"got {tuple(region_attention_mask.shape)}"
        )


def check_region_inputs(
    config: PreTrainedConfig,
    region_features: torch.Tensor | None,
    region_locations: torch.Tensor | None,
    region_attention_mask: torch.Tensor | None,
    *texts: torch.Tensor | None,
) -> None:
    """Name what is wrong with a model's region inputs: features of another size than `config.region_feature_dim`,
    what `check_region_layout` checks, or a text batch (any of `texts`, `(batch, ...)` tensors or None) of another
    size. Shape checks only (no host-device sync)."""
    if region_features is None:
        return
    if region_features.ndim != 3 or region_features.shape[-1] != config.region_feature_dim:
        raise ValueError(
            f"region_features must have shape (batch, num_regions, {config.region_feature_dim}), "
            f"got {tuple(region_features.shape)}"
        )
    check_region_layout(region_features, region_locations, region_attention_mask, config.region_location_dim)
    for text in texts:
        if text is not None and text.shape[0] != region_features.shape[0]:
            raise ValueError(
                f"text batch ({text.shape[0]}) and region batch ({region_features.shape[0]}) differ in size"
            )


# ---------------------------------------------------------------------------------------------------- inputs
def check_text_and_region_inputs(
    config: PreTrainedConfig,
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    region_features: torch.Tensor | None,
    region_locations: torch.Tensor | None,
    region_attention_mask: torch.Tensor | None,
    model_name: str,
    require_both: bool = False,
) -> None:
    """The input checks every region-feature model shares, with messages naming the problem (shapes only: no
    host-device sync). `config` names `max_position_embeddings`, `region_feature_dim` and `region_location_dim`."""
    if input_ids is not None and inputs_embeds is not None:
        raise ValueError("pass either input_ids or inputs_embeds, not both")
    text = input_ids if input_ids is not None else inputs_embeds
    if require_both and (text is None or region_features is None):
        raise ValueError(
            f"{model_name} runs a text stream and a visual stream: it needs both text (input_ids or inputs_embeds) "
            "and regions (region_features, region_locations)"
        )
    if text is None and region_features is None:
        raise ValueError(f"{model_name} needs text (input_ids) and/or regions (region_features); got neither")
    if text is not None and text.shape[1] > config.max_position_embeddings:
        raise ValueError(
            f"text of length {text.shape[1]} exceeds the model's {config.max_position_embeddings} position "
            "embeddings; shorten it (the processor truncates to max_text_length)"
        )
    check_region_inputs(config, region_features, region_locations, region_attention_mask, text)


def text_with_choice_axis(
    input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, what: str = "multiple choice"
) -> torch.Tensor:
    """The text of a multiple-choice batch, checked to have the choice axis: `input_ids` `(batch, num_choices,
    text_length)` or `inputs_embeds` `(batch, num_choices, text_length, hidden)`; its `.shape[:2]` is
    `(batch, num_choices)`. `what` names the task in the error."""
    text = input_ids if input_ids is not None else inputs_embeds
    if text is None or text.ndim != (3 if input_ids is not None else 4):
        raise ValueError(
            f"{what} needs input_ids of shape (batch, num_choices, text_length) (or inputs_embeds of shape "
            f"(batch, num_choices, text_length, hidden)), got {None if text is None else tuple(text.shape)}"
        )
    return text


def text_length(input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None) -> int:
    """How many text positions a `(batch, text_length[, hidden])` text input has (0 without text)."""
    text = input_ids if input_ids is not None else inputs_embeds
    return 0 if text is None else text.shape[1]


def flatten_choices(inputs: dict, batch: int, choices: int, region_ndims: dict) -> dict:
    """Multiple-choice inputs → one row per (example, choice). Text inputs are `(batch, choices, ...)`; a region
    input named in `region_ndims` (name → its per-example number of dimensions) is either shared by the choices,
    `(batch, ...)`, and repeated, or given per choice, `(batch, choices, ...)`. None stays None."""
    flat = {}
    for name, value in inputs.items():
        if value is None:
            flat[name] = None
        elif name in region_ndims and value.ndim == region_ndims[name] + 1:  # shared by every choice
            flat[name] = value.repeat_interleave(choices, dim=0)
        else:
            flat[name] = value.reshape(batch * choices, *value.shape[2:])
    return flat


# ---------------------------------------------------------------------------------------------------- packed inference
# What `vlhub.pack_linear_weights` fuses into oneDNN's packed products in transformers' BERT blocks, which every
# architecture's layers are made of (see `vlhub.modeling.packed_linear`).
class PackedBertIntermediate(BertIntermediate):
    """`BertIntermediate` whose exact (erf) GELU runs inside its packed product."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        dense, activation = self.dense, self.intermediate_act_fn
        if (
            type(dense) is PackedLinear
            and type(activation) is GELUActivation
            and activation.act is F.gelu
            and dense._packed_path(hidden_states)
        ):
            return dense.packed_forward(hidden_states, "gelu", "none")
        return super().forward(hidden_states)


def _residual_output_forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
    return self.LayerNorm(dense_plus_residual(self.dense, self.dropout, hidden_states, input_tensor))


class PackedBertSelfOutput(BertSelfOutput):
    """`BertSelfOutput` whose residual add runs inside its packed product (when its dropout does nothing)."""

    forward = _residual_output_forward


class PackedBertOutput(BertOutput):
    """`BertOutput` whose residual add runs inside its packed product (when its dropout does nothing)."""

    forward = _residual_output_forward


register_packed_class(BertIntermediate, PackedBertIntermediate)
register_packed_class(BertSelfOutput, PackedBertSelfOutput)
register_packed_class(BertOutput, PackedBertOutput)
register_projection_groups(BertSelfAttention, (("query", "key", "value"),))
