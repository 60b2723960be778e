"""PyTorch UNITER: a single-stream transformer over [text tokens | image regions].

Faithful to the released code (ChenRocks/UNITER, ECCV version): BERT blocks with BERT's parameter names, an image
embedder with three LayerNorms and a 7-d location vector, the region token type taken from the *text* type table,
and the original pre-training (MLM, MRFR, MRC, MRC-kl, ITM, WRA) and downstream heads.

Sequence layout: every sequence output is `[text (padded to T) | regions (padded to R)]`, length `T + R`, with the
concatenated attention mask. The original gathers each example to `[text_i | regions_i | junk]`; both layouts give the
same numbers at every real position because regions carry no position ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import BaseModelOutputWithPooling, ModelOutput
from transformers.models.bert.modeling_bert import BertLMPredictionHead
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs
from transformers.utils.generic import can_return_tuple, merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from ..layers import (
    BertEmbeddings,
    BertEncoder,
    BertLayer,
    BertOnlyMLMHead,
    BertPooler,
    BertSelfAttention,
    RegionClassificationHead,
    RegionFeatureRegressionHead,
    classifier_head,
    extended_attention_mask,
    ipot_distance,
)
from .configuration_uniter import UniterConfig

__all__ = [
    "UniterPreTrainedModel",
    "UniterModel",
    "UniterForPreTraining",
    "UniterForQuestionAnswering",
    "UniterForVisualEntailment",
    "UniterForImageTextRetrieval",
    "UniterForVisualReasoning",
    "UniterForReferringExpression",
    "UniterForMultipleChoice",
    "UniterForPreTrainingOutput",
    "UniterClassifierOutput",
    "UniterReferringExpressionOutput",
    "UniterMultipleChoiceOutput",
    "PRETRAINING_OBJECTIVES",
]

PRETRAINING_OBJECTIVES = ("mlm", "mrfr", "mrc", "mrc-kl", "itm", "itm-wra")
# The original fills masked-out region scores with this value (`re.py`).
_MASKED_SCORE = -10000.0


# ---------------------------------------------------------------------------------------------------- outputs
@dataclass
class UniterForPreTrainingOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor` of shape `()`): sum of the objective losses computed (WRA weighted by `wra_weight`).
    mlm_loss, mrfr_loss, mrc_loss, mrc_kl_loss, itm_loss, wra_loss (`torch.FloatTensor` of shape `()`): each
        objective's loss, when its targets were given.
    mlm_logits (`torch.FloatTensor`): `(num_masked_tokens, vocab_size)` at the positions with a label >= 0, row-major
        over (example, position), when `labels` is given; `(batch, text_length, vocab_size)` for `objective="mlm"`
        without labels.
    mrfr_predictions (`torch.FloatTensor` of shape `(num_masked_regions, region_feature_dim)`): regressed features of
        the masked regions (row-major over (example, region)).
    mrc_logits (`torch.FloatTensor` of shape `(num_masked_regions, num_region_labels)`): detector-class logits of the
        masked regions.
    itm_logits (`torch.FloatTensor` of shape `(batch, 2)`): image-text match logits, column 1 = match.
    wra_distance (`torch.FloatTensor` of shape `(batch,)`): optimal-transport distance between words and regions.
    last_hidden_state (`torch.FloatTensor` of shape `(batch, text_length + num_regions, hidden_size)`).
    pooler_output (`torch.FloatTensor` of shape `(batch, hidden_size)`).
    """

    loss: torch.FloatTensor | None = None
    mlm_loss: torch.FloatTensor | None = None
    mrfr_loss: torch.FloatTensor | None = None
    mrc_loss: torch.FloatTensor | None = None
    mrc_kl_loss: torch.FloatTensor | None = None
    itm_loss: torch.FloatTensor | None = None
    wra_loss: torch.FloatTensor | None = None
    mlm_logits: torch.FloatTensor | None = None
    mrfr_predictions: torch.FloatTensor | None = None
    mrc_logits: torch.FloatTensor | None = None
    itm_logits: torch.FloatTensor | None = None
    wra_distance: torch.FloatTensor | None = None
    last_hidden_state: torch.FloatTensor | None = None
    pooler_output: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class UniterClassifierOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor` of shape `()`, when labels are given).
    logits (`torch.FloatTensor` of shape `(batch, num_labels)`): VQA answers / VE labels / NLVR2 classes, or
        `(batch, 1)` retrieval scores.
    pooler_output (`torch.FloatTensor` of shape `(batch, hidden_size)`) and
    last_hidden_state (`torch.FloatTensor` of shape `(batch, text_length + num_regions, hidden_size)`).
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    pooler_output: torch.FloatTensor | None = None
    last_hidden_state: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class UniterReferringExpressionOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor` of shape `()`, when labels are given): cross-entropy over regions.
    logits (`torch.FloatTensor` of shape `(batch, num_regions)`): one score per region; padded regions hold -10000.
    last_hidden_state (`torch.FloatTensor` of shape `(batch, text_length + num_regions, hidden_size)`).
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    last_hidden_state: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class UniterMultipleChoiceOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor` of shape `()`, when labels are given): 2-way cross-entropy per (question, choice) pair.
    logits (`torch.FloatTensor` of shape `(batch, num_choices)`): the "right" logit of each pair (the ranking score).
    pair_logits (`torch.FloatTensor` of shape `(batch, num_choices, 2)`): both logits of each pair.
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    pair_logits: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


# ---------------------------------------------------------------------------------------------------- embeddings
class UniterImageEmbeddings(nn.Module):
    """Embeds regions: `LN(Linear(features)) + LN(Linear(locations)) + type embedding`, then LayerNorm and dropout.

    A masked region (MRM) has its features replaced by the learned row 1 of `mask_embedding`; row 0 is never used
    (the original zeroes it on every masked forward).
    """

    def __init__(self, config: UniterConfig):
        super().__init__()
        self.img_linear = nn.Linear(config.region_feature_dim, config.hidden_size)
        self.img_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.pos_linear = nn.Linear(config.region_location_dim, config.hidden_size)
        self.pos_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mask_embedding = nn.Embedding(2, config.region_feature_dim, padding_idx=0)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        region_features: torch.Tensor,
        region_locations: torch.Tensor,
        type_embeddings: torch.Tensor,
        region_masks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """region_features `(B, R, F)`, region_locations `(B, R, loc)`, type_embeddings `(B, R, H)`,
        region_masks `(B, R)` bool or None. Returns `(B, R, H)`."""
        if region_masks is not None:
            masked = region_masks.bool().unsqueeze(-1)
            region_features = torch.where(masked, self.mask_embedding.weight[1].to(region_features.dtype), region_features)
        embeddings = self.img_layer_norm(self.img_linear(region_features))
        embeddings = embeddings + self.pos_layer_norm(self.pos_linear(region_locations)) + type_embeddings
        return self.dropout(self.LayerNorm(embeddings))


# ---------------------------------------------------------------------------------------------------- base
class UniterPreTrainedModel(PreTrainedModel):
    config: UniterConfig
    config_class = UniterConfig
    base_model_prefix = "uniter"
    main_input_name = "input_ids"
    input_modalities = ("image", "text")
    supports_gradient_checkpointing = True
    _no_split_modules = ["BertEmbeddings", "UniterImageEmbeddings", "BertLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_record_outputs = {"hidden_states": BertLayer, "attentions": BertSelfAttention}

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, BertEmbeddings):
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
            init.zeros_(module.token_type_ids)
        elif isinstance(module, (BertLMPredictionHead, RegionFeatureRegressionHead)):
            init.zeros_(module.bias)
        elif isinstance(module, nn.MultiheadAttention):  # NLVR2 paired-attn: raw in-projection parameters
            init.xavier_uniform_(module.in_proj_weight)
            init.zeros_(module.in_proj_bias)


def _check_inputs(config: UniterConfig, input_ids, inputs_embeds, region_features, region_locations,
                  region_attention_mask):
    if input_ids is not None and inputs_embeds is not None:
        raise ValueError("pass either input_ids or inputs_embeds, not both")
    text = input_ids if input_ids is not None else inputs_embeds
    if text is None and region_features is None:
        raise ValueError("UNITER needs text (input_ids) and/or regions (region_features); got neither")
    if text is not None and text.shape[1] > config.max_position_embeddings:
        raise ValueError(
            f"text of length {text.shape[1]} exceeds the model's {config.max_position_embeddings} position "
            "embeddings; shorten it (the processor truncates to max_text_length)"
        )
    if region_features is not None:
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
        if region_attention_mask is None and region_features.shape[0] > 1:
            padded_rows = (region_features == 0).all(dim=-1)
            if padded_rows.any():
                raise ValueError(
                    "region_features contain all-zero (padded) regions but no region_attention_mask was given: pass "
                    "the processor's full output (region_attention_mask of shape (batch, num_regions))"
                )
        if text is not None and text.shape[0] != region_features.shape[0]:
            raise ValueError(
                f"text batch ({text.shape[0]}) and region batch ({region_features.shape[0]}) differ in size"
            )


class UniterModel(UniterPreTrainedModel):
    """The bare UNITER encoder: text embeddings (BERT's), region embeddings, a BERT encoder and the tanh pooler."""

    def __init__(self, config: UniterConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        self.img_embeddings = UniterImageEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        region_features: torch.FloatTensor | None = None,
        region_locations: torch.FloatTensor | None = None,
        region_attention_mask: torch.Tensor | None = None,
        region_token_type_ids: torch.LongTensor | None = None,
        region_masks: torch.Tensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPooling:
        r"""
        input_ids (`(batch, T)`): word-piece ids, `[CLS] ... [SEP]` then padding.
        attention_mask (`(batch, T)`): 1 for real tokens.
        token_type_ids (`(batch, T)`): text token types (0; VCR uses 2/3 for answers/rationales).
        position_ids (`(batch or 1, T)`): defaults to `0..T-1`.
        region_features (`(batch, R, region_feature_dim)`): region features (zero padded).
        region_locations (`(batch, R, region_location_dim)`): `[x1, y1, x2, y2, w, h, w*h]`, normalised.
        region_attention_mask (`(batch, R)`): 1 for real regions.
        region_token_type_ids (`(batch, R)`): defaults to `config.region_token_type_id` (1); NLVR2 uses 2 for the
            right image.
        region_masks (`(batch, R)` bool): regions whose features are replaced by the mask embedding (MRM).

        Returns `last_hidden_state` `(batch, T + R, hidden)` laid out `[text | regions]` and `pooler_output`
        `(batch, hidden)` (tanh(dense) of position 0, the [CLS] token when text is present).
        """
        _check_inputs(self.config, input_ids, inputs_embeds, region_features, region_locations, region_attention_mask)
        pieces, masks = [], []
        if input_ids is not None or inputs_embeds is not None:
            text = input_ids if input_ids is not None else inputs_embeds
            text_embeddings = self.embeddings(
                input_ids=input_ids, token_type_ids=token_type_ids, position_ids=position_ids, inputs_embeds=inputs_embeds
            )
            pieces.append(text_embeddings)
            masks.append(
                attention_mask if attention_mask is not None else torch.ones(text.shape[:2], device=text.device)
            )
        if region_features is not None:
            batch, num_regions = region_features.shape[:2]
            if region_token_type_ids is None:
                region_token_type_ids = torch.full(
                    (batch, num_regions), self.config.region_token_type_id, dtype=torch.long, device=region_features.device
                )
            # Regions take their type embedding from the *text* type table, as the original does.
            type_embeddings = self.embeddings.token_type_embeddings(region_token_type_ids)
            region_features = region_features.to(self.img_embeddings.img_linear.weight.dtype)
            region_locations = region_locations.to(self.img_embeddings.img_linear.weight.dtype)
            pieces.append(self.img_embeddings(region_features, region_locations, type_embeddings, region_masks))
            masks.append(
                region_attention_mask
                if region_attention_mask is not None
                else torch.ones((batch, num_regions), device=region_features.device)
            )
        embedding_output = torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0]
        mask_2d = torch.cat([m.to(embedding_output.device, torch.long) for m in masks], dim=1)
        encoder_mask = extended_attention_mask(self.config, embedding_output, mask_2d)
        encoder_outputs = self.encoder(embedding_output, attention_mask=encoder_mask, **kwargs)
        sequence_output = encoder_outputs.last_hidden_state
        pooled_output = self.pooler(sequence_output) if self.pooler is not None else None
        return BaseModelOutputWithPooling(last_hidden_state=sequence_output, pooler_output=pooled_output)


_BACKBONE_ARGS = (
    "input_ids", "attention_mask", "token_type_ids", "position_ids", "region_features", "region_locations",
    "region_attention_mask", "region_token_type_ids", "inputs_embeds",
)  # fmt: skip


def _text_length(input_ids, inputs_embeds) -> int:
    text = input_ids if input_ids is not None else inputs_embeds
    return 0 if text is None else text.shape[1]


class _UniterHeadModel(UniterPreTrainedModel):
    """Shared plumbing of the task models: the backbone lives at `self.uniter` (the original's key prefix)."""

    def __init__(self, config: UniterConfig):
        super().__init__(config)
        self.uniter = UniterModel(config)

    def _encode(self, kwargs_in: dict, extra: dict) -> BaseModelOutputWithPooling:
        return self.uniter(**{k: v for k, v in kwargs_in.items() if k in _BACKBONE_ARGS and v is not None}, **extra)


# ---------------------------------------------------------------------------------------------------- pre-training
class UniterForPreTraining(_UniterHeadModel):
    """UNITER with its pre-training heads: MLM (`cls`, decoder tied to the word embeddings), MRFR (`feat_regress`,
    output projection tied to the image embedder's `img_linear`), MRC / MRC-kl (`region_classifier`) and ITM
    (`itm_output`, on the pooled output) with the optional word-region alignment (WRA) distance.

    Losses are computed for whichever targets are given; the original trains one objective per batch
    ("conditional masking"), so a batch normally carries one kind of target.
    """

    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "uniter.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def __init__(self, config: UniterConfig):
        super().__init__(config)
        self.cls = BertOnlyMLMHead(config)
        self.feat_regress = RegionFeatureRegressionHead(
            config.hidden_size, config.region_feature_dim, config.hidden_act, config.layer_norm_eps
        )
        self.region_classifier = RegionClassificationHead(
            config.hidden_size, config.num_region_labels, config.hidden_act, config.layer_norm_eps
        )
        self.itm_output = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def get_output_embeddings(self):
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings):
        self.cls.predictions.decoder = new_embeddings
        self.cls.predictions.bias = new_embeddings.bias

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        region_features: torch.FloatTensor | None = None,
        region_locations: torch.FloatTensor | None = None,
        region_attention_mask: torch.Tensor | None = None,
        region_token_type_ids: torch.LongTensor | None = None,
        region_masks: torch.Tensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        region_feature_targets: torch.FloatTensor | None = None,
        region_class_targets: torch.FloatTensor | None = None,
        itm_labels: torch.LongTensor | None = None,
        objective: str | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> UniterForPreTrainingOutput:
        r"""
        labels (`(batch, T)`): MLM targets; positions with a negative label (-100, or the original's -1) are ignored.
        region_masks (`(batch, R)` bool): masked regions for MRFR/MRC; their features become the mask embedding.
        region_feature_targets (`(num_masked_regions, region_feature_dim)`): MRFR targets (the unmasked features),
            row-major over (example, region).
        region_class_targets (`(num_masked_regions, num_region_labels)`): detector class probabilities of the masked
            regions (background first): MRC-kl targets, or, with `objective="mrc"`, the source of the hard label
            `argmax(probs[:, 1:]) + 1`.
        itm_labels (`(batch,)`): 1 = the text matches the image, 0 = it does not.
        objective (`str`): one of `PRETRAINING_OBJECTIVES`; selects the MLM logits without labels (`"mlm"`), hard MRC
            (`"mrc"`), and adds the WRA loss to ITM (`"itm-wra"`). Without it every objective whose targets are
            given is computed (MRC-kl for region class targets).
        """
        if objective is not None and objective not in PRETRAINING_OBJECTIVES:
            raise ValueError(f"objective must be one of {PRETRAINING_OBJECTIVES}, got {objective!r}")
        local = dict(locals())
        outputs = self._encode(local, kwargs | {"region_masks": region_masks})
        sequence_output, pooled_output = outputs.last_hidden_state, outputs.pooler_output
        text_length = _text_length(input_ids, inputs_embeds)
        losses: dict[str, torch.Tensor] = {}

        mlm_logits = None
        if labels is not None:
            if labels.shape != (sequence_output.shape[0], text_length):
                raise ValueError(f"labels must have shape (batch, text_length) = "
                                 f"{(sequence_output.shape[0], text_length)}, got {tuple(labels.shape)}")
            selected = labels >= 0
            mlm_logits = self.cls(sequence_output[:, :text_length][selected])
            losses["mlm_loss"] = F.cross_entropy(mlm_logits.float(), labels[selected])
        elif objective == "mlm":
            mlm_logits = self.cls(sequence_output[:, :text_length])

        mrfr_predictions = mrc_logits = None
        if region_masks is not None and objective in (None, "mrfr", "mrc", "mrc-kl"):
            masked_regions = sequence_output[:, text_length:][region_masks.bool()]
            if objective in (None, "mrfr"):
                mrfr_predictions = self.feat_regress(masked_regions, self.uniter.img_embeddings.img_linear.weight)
                if region_feature_targets is not None:
                    _check_rows("region_feature_targets", region_feature_targets, mrfr_predictions)
                    losses["mrfr_loss"] = F.mse_loss(mrfr_predictions.float(), region_feature_targets.float())
            if objective in (None, "mrc", "mrc-kl"):
                mrc_logits = self.region_classifier(masked_regions)
                if region_class_targets is not None:
                    _check_rows("region_class_targets", region_class_targets, mrc_logits)
                    if objective == "mrc":
                        hard_labels = region_class_targets[:, 1:].argmax(dim=-1) + 1
                        losses["mrc_loss"] = F.cross_entropy(mrc_logits.float(), hard_labels, ignore_index=0)
                    else:
                        log_probs = F.log_softmax(mrc_logits.float(), dim=-1)
                        losses["mrc_kl_loss"] = F.kl_div(log_probs, region_class_targets.float(), reduction="none").mean()
        elif region_feature_targets is not None or region_class_targets is not None:
            raise ValueError("region_feature_targets / region_class_targets need region_masks (which regions are masked)")

        itm_logits = self.itm_output(pooled_output)
        wra_distance = None
        if objective == "itm-wra":
            if region_features is None or text_length == 0:
                raise ValueError("WRA needs both text and regions")
            text_pad = _padding(attention_mask, sequence_output[:, :text_length])
            region_pad = _padding(region_attention_mask, sequence_output[:, text_length:])
            wra_distance = ipot_distance(
                sequence_output[:, :text_length], sequence_output[:, text_length:], text_pad, region_pad,
                beta=self.config.ot_beta, iterations=self.config.ot_iterations, inner_steps=self.config.ot_inner_steps,
            ).to(sequence_output.dtype)
        if itm_labels is not None:
            losses["itm_loss"] = F.cross_entropy(itm_logits.float(), itm_labels)
            if wra_distance is not None:
                # Pull matched pairs together, push mismatched ones apart (mean over the batch).
                signs = torch.where(itm_labels == 1, 1.0, -1.0).to(wra_distance)
                losses["wra_loss"] = (signs * wra_distance).sum() / wra_distance.shape[0]
        elif objective in ("itm", "itm-wra"):
            pass  # scores only

        loss = None
        if losses:
            loss = sum(v * (self.config.wra_weight if k == "wra_loss" else 1.0) for k, v in losses.items())
        return UniterForPreTrainingOutput(
            loss=loss,
            **losses,
            mlm_logits=mlm_logits,
            mrfr_predictions=mrfr_predictions,
            mrc_logits=mrc_logits,
            itm_logits=itm_logits,
            wra_distance=wra_distance,
            last_hidden_state=sequence_output,
            pooler_output=pooled_output,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


def _check_rows(name: str, targets: torch.Tensor, predictions: torch.Tensor):
    if targets.shape != predictions.shape:
        raise ValueError(
            f"{name} must have one row per masked region: expected shape {tuple(predictions.shape)}, "
            f"got {tuple(targets.shape)}"
        )


def _padding(mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    if mask is None:
        return torch.zeros(like.shape[:2], dtype=torch.bool, device=like.device)
    return mask == 0


# ---------------------------------------------------------------------------------------------------- downstream
class UniterForQuestionAnswering(_UniterHeadModel):
    """VQA: `vqa_output` (Linear(H, 2H), GELU, LayerNorm, Linear(2H, num_answers)) on the pooled output.

    `config.id2label` holds the answers (3129 for the original VQA vocabulary). The loss is the original's:
    binary cross-entropy with logits against soft scores, averaged and multiplied by the number of answers.
    """

    head_name = "vqa_output"

    def __init__(self, config: UniterConfig):
        super().__init__(config)
        self.vqa_output = classifier_head(
            config.hidden_size, 2 * config.hidden_size, config.num_labels, config.classifier_activation,
            config.layer_norm_eps,
        )
        self.post_init()

    def _soft_targets(self, labels: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if labels.shape != logits.shape:
            raise ValueError(
                f"labels must be soft scores of shape (batch, num_labels) = {tuple(logits.shape)}, got {tuple(labels.shape)}"
            )
        return labels.to(logits.dtype)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        region_features: torch.FloatTensor | None = None,
        region_locations: torch.FloatTensor | None = None,
        region_attention_mask: torch.Tensor | None = None,
        region_token_type_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> UniterClassifierOutput:
        r"""
        labels: VQA — `(batch, num_labels)` soft scores in [0, 1]; VE — `(batch,)` class ids or `(batch, 3)` one-hot.
        Returns `logits` `(batch, num_labels)`.
        """
        outputs = self._encode(dict(locals()), kwargs)
        logits = self.vqa_output(outputs.pooler_output)
        loss = None
        if labels is not None:
            targets = self._soft_targets(labels, logits)
            loss = F.binary_cross_entropy_with_logits(logits.float(), targets.float()) * logits.shape[1]
        return UniterClassifierOutput(
            loss=loss,
            logits=logits,
            pooler_output=outputs.pooler_output,
            last_hidden_state=outputs.last_hidden_state,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


class UniterForVisualEntailment(UniterForQuestionAnswering):
    """SNLI-VE: the VQA head with 3 outputs (contradiction=0, entailment=1, neutral=2) and the original's binary
    cross-entropy on one-hot targets. Parameter names stay `vqa_output.*`, as in the original."""

    def __init__(self, config: UniterConfig):
        if config.num_labels != 3:
            config.id2label = {0: "contradiction", 1: "entailment", 2: "neutral"}
            config.label2id = {v: k for k, v in config.id2label.items()}
        super().__init__(config)

    def _soft_targets(self, labels: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if labels.ndim == 1:
            if labels.dtype.is_floating_point:
                raise ValueError("VE labels of shape (batch,) must be integer class ids")
            return F.one_hot(labels, logits.shape[1]).to(logits.dtype)
        return super()._soft_targets(labels, logits)


class UniterForImageTextRetrieval(_UniterHeadModel):
    """Image-text retrieval: `rank_output` (Linear(H, 1)) scores a pair from the pooled output; `itm_output` is kept
    so that a pre-trained checkpoint's ITM head can seed `rank_output` (zero-shot retrieval, the original
    `init_output`)."""

    def __init__(self, config: UniterConfig):
        super().__init__(config)
        self.itm_output = nn.Linear(config.hidden_size, 2)
        self.rank_output = nn.Linear(config.hidden_size, 1)
        self.post_init()

    @torch.no_grad()
    def init_rank_output_from_itm(self):
        """Copy the ITM "match" row into `rank_output` (what the original does for zero-shot retrieval)."""
        self.rank_output.weight.copy_(self.itm_output.weight[1:2])
        self.rank_output.bias.copy_(self.itm_output.bias[1:2])

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        region_features: torch.FloatTensor | None = None,
        region_locations: torch.FloatTensor | None = None,
        region_attention_mask: torch.Tensor | None = None,
        region_token_type_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        num_negatives: int | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> UniterClassifierOutput:
        r"""
        num_negatives (`int`): when given, the batch is read as groups of `1 + num_negatives` pairs, the matched
            pair first, and the loss is the original's hinge `max(0, margin + σ(s_neg) - σ(s_pos))`, averaged.
        Returns `logits` `(batch, 1)`: the ranking score of each pair.
        """
        outputs = self._encode(dict(locals()), kwargs)
        logits = self.rank_output(outputs.pooler_output)
        loss = None
        if num_negatives is not None:
            group = num_negatives + 1
            if num_negatives < 1 or logits.shape[0] % group:
                raise ValueError(
                    f"with num_negatives={num_negatives} the batch ({logits.shape[0]}) must be whole groups of "
                    f"{group} pairs (positive first)"
                )
            scores = torch.sigmoid(logits.float()).view(-1, group)
            loss = torch.clamp(self.config.ranking_margin + scores[:, 1:] - scores[:, :1], min=0).mean()
        return UniterClassifierOutput(
            loss=loss,
            logits=logits,
            pooler_output=outputs.pooler_output,
            last_hidden_state=outputs.last_hidden_state,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


class _AttentionPool(nn.Module):
    """Attention pooling of the NLVR2 paired-attn head: softmax(ReLU(Linear(h))) over unmasked positions."""

    def __init__(self, hidden_size: int, dropout: float):
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(hidden_size, 1), nn.ReLU())
        self.dropout = nn.Dropout(dropout)

    def forward(self, hidden_states: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        """hidden_states `(B, L, H)`, padding `(B, L)` True at pads → `(B, H)`."""
        scores = self.fc(hidden_states).squeeze(-1) + padding.to(hidden_states.dtype) * _MASKED_SCORE
        weights = self.dropout(F.softmax(scores, dim=1))
        return weights.unsqueeze(1).matmul(hidden_states).squeeze(1)


class UniterForVisualReasoning(_UniterHeadModel):
    """NLVR2 (one sentence, two images, true/false), "paired" setting: the sentence is encoded with each image.

    `config.nlvr2_head` picks the head: `"paired"` — `nlvr2_output` Linear(2H, 2) on the two pooled outputs
    concatenated; `"paired-attn"` (the released default) — left↔right cross-attention over the two sequence outputs,
    `fc` on [attended | own], attention pooling, then `nlvr2_output` on the two pooled vectors.

    Inputs: text `(batch, T)` and regions of both images `(batch, 2, R, ...)`; the left image's regions get token
    type 1 and the right's type 2 when the type table has 3 rows (as the released NLVR2 model).
    """

    def __init__(self, config: UniterConfig):
        super().__init__(config)
        hidden = config.hidden_size
        if config.nlvr2_head == "paired-attn":
            self.attn1 = nn.MultiheadAttention(hidden, config.num_attention_heads, dropout=config.hidden_dropout_prob)
            self.attn2 = nn.MultiheadAttention(hidden, config.num_attention_heads, dropout=config.hidden_dropout_prob)
            self.fc = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Dropout(config.hidden_dropout_prob))
            self.attn_pool = _AttentionPool(hidden, config.hidden_dropout_prob)
        self.nlvr2_output = nn.Linear(2 * hidden, 2)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        region_features: torch.FloatTensor | None = None,
        region_locations: torch.FloatTensor | None = None,
        region_attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> UniterClassifierOutput:
        r"""
        region_features `(batch, 2, R, F)`, region_locations `(batch, 2, R, loc)`, region_attention_mask
        `(batch, 2, R)`: the left and right images. labels `(batch,)`: 1 = the statement is true.
        Returns `logits` `(batch, 2)`.
        """
        if region_features is None or region_features.ndim != 4 or region_features.shape[1] != 2:
            shape = None if region_features is None else tuple(region_features.shape)
            raise ValueError(f"NLVR2 needs the regions of two images: region_features of shape (batch, 2, R, F), got {shape}")
        batch, _, num_regions = region_features.shape[:3]

        def pairs(t):  # (batch, ...) text → (2 * batch, ...), each example twice in a row (left, right)
            return None if t is None else t.repeat_interleave(2, dim=0)

        def flat(t):  # (batch, 2, ...) → (2 * batch, ...)
            return None if t is None else t.reshape(batch * 2, *t.shape[2:])

        image_types = torch.tensor([1, 2] if self.config.type_vocab_size >= 3 else [1, 1], device=region_features.device)
        outputs = self.uniter(
            input_ids=pairs(input_ids),
            attention_mask=pairs(attention_mask),
            token_type_ids=pairs(token_type_ids),
            region_features=flat(region_features),
            region_locations=flat(region_locations),
            region_attention_mask=flat(region_attention_mask),
            region_token_type_ids=image_types.repeat(batch).unsqueeze(1).expand(-1, num_regions),
            **kwargs,
        )
        if self.config.nlvr2_head == "paired":
            logits = self.nlvr2_output(outputs.pooler_output.reshape(batch, -1))
        else:
            logits = self._paired_attention(outputs.last_hidden_state, pairs(attention_mask), flat(region_attention_mask))
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return UniterClassifierOutput(
            loss=loss, logits=logits, last_hidden_state=outputs.last_hidden_state,
            hidden_states=outputs.hidden_states, attentions=outputs.attentions,
        )

    def _paired_attention(self, sequence_output, text_mask, region_mask):
        pairs, length, hidden = sequence_output.shape
        if text_mask is None:
            text_mask = torch.ones(pairs, length - region_mask.shape[1], device=sequence_output.device)
        if region_mask is None:
            region_mask = torch.ones(pairs, length - text_mask.shape[1], device=sequence_output.device)
        padding = torch.cat([text_mask, region_mask], dim=1) == 0
        left, right = sequence_output.reshape(pairs // 2, 2, length, hidden).unbind(1)
        left_pad, right_pad = padding.reshape(pairs // 2, 2, length).unbind(1)
        # nn.MultiheadAttention (as in the original) takes (length, batch, hidden).
        left_t, right_t = left.transpose(0, 1), right.transpose(0, 1)
        left_to_right, _ = self.attn1(left_t, right_t, right_t, key_padding_mask=right_pad)
        right_to_left, _ = self.attn2(right_t, left_t, left_t, key_padding_mask=left_pad)
        left = self.fc(torch.cat([left_to_right, left_t], dim=-1)).transpose(0, 1)
        right = self.fc(torch.cat([right_to_left, right_t], dim=-1)).transpose(0, 1)
        pooled = torch.cat([self.attn_pool(left, left_pad), self.attn_pool(right, right_pad)], dim=-1)
        return self.nlvr2_output(pooled)


class UniterForReferringExpression(_UniterHeadModel):
    """Referring expressions: `re_output` scores every region output; the loss is cross-entropy over regions."""

    def __init__(self, config: UniterConfig):
        super().__init__(config)
        hidden = config.hidden_size
        if config.re_head_layers == 1:
            self.re_output = nn.Linear(hidden, 1)
        else:
            self.re_output = classifier_head(hidden, hidden, 1, "gelu", config.layer_norm_eps)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        region_features: torch.FloatTensor | None = None,
        region_locations: torch.FloatTensor | None = None,
        region_attention_mask: torch.Tensor | None = None,
        region_token_type_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> UniterReferringExpressionOutput:
        r"""
        labels (`(batch,)`): index of the referred region. Returns `logits` `(batch, R)`, -10000 at padded regions.
        """
        if region_features is None:
            raise ValueError("referring expressions need regions (region_features)")
        outputs = self._encode(dict(locals()), kwargs)
        text_length = _text_length(input_ids, inputs_embeds)
        logits = self.re_output(outputs.last_hidden_state[:, text_length:]).squeeze(-1)
        if region_attention_mask is not None:
            logits = logits.masked_fill(region_attention_mask == 0, _MASKED_SCORE)
        loss = F.cross_entropy(logits.float(), labels.view(-1)) if labels is not None else None
        return UniterReferringExpressionOutput(
            loss=loss, logits=logits, last_hidden_state=outputs.last_hidden_state,
            hidden_states=outputs.hidden_states, attentions=outputs.attentions,
        )


class UniterForMultipleChoice(_UniterHeadModel):
    """VCR: each (question, choice) pair is encoded with the image; `vcr_output` (Linear(H, 2H), ReLU, LayerNorm,
    Linear(2H, 2)) classifies the pair as right/wrong, and the "right" logit ranks the choices."""

    def __init__(self, config: UniterConfig):
        super().__init__(config)
        self.vcr_output = classifier_head(config.hidden_size, 2 * config.hidden_size, 2, "relu", config.layer_norm_eps)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        region_features: torch.FloatTensor | None = None,
        region_locations: torch.FloatTensor | None = None,
        region_attention_mask: torch.Tensor | None = None,
        region_token_type_ids: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> UniterMultipleChoiceOutput:
        r"""
        input_ids, attention_mask, token_type_ids `(batch, num_choices, T)`; regions `(batch, R, ...)` shared by all
        choices, or `(batch, num_choices, R, ...)`. labels `(batch,)`: index of the right choice.
        Returns `logits` `(batch, num_choices)` and `pair_logits` `(batch, num_choices, 2)`.
        """
        if input_ids is None or input_ids.ndim != 3:
            shape = None if input_ids is None else tuple(input_ids.shape)
            raise ValueError(f"multiple choice needs input_ids of shape (batch, num_choices, T), got {shape}")
        batch, choices = input_ids.shape[:2]

        def flat_text(t):
            return None if t is None else t.reshape(batch * choices, *t.shape[2:])

        def flat_regions(t, per_example_ndim):
            if t is None:
                return None
            if t.ndim == per_example_ndim + 1:  # (batch, ...) shared by every choice
                return t.repeat_interleave(choices, dim=0)
            return t.reshape(batch * choices, *t.shape[2:])

        outputs = self.uniter(
            input_ids=flat_text(input_ids),
            attention_mask=flat_text(attention_mask),
            token_type_ids=flat_text(token_type_ids),
            region_features=flat_regions(region_features, 2),
            region_locations=flat_regions(region_locations, 2),
            region_attention_mask=flat_regions(region_attention_mask, 1),
            region_token_type_ids=flat_regions(region_token_type_ids, 1),
            **kwargs,
        )
        pair_logits = self.vcr_output(outputs.pooler_output).view(batch, choices, 2)
        loss = None
        if labels is not None:
            targets = F.one_hot(labels, choices).view(-1)
            loss = F.cross_entropy(pair_logits.view(-1, 2).float(), targets)
        return UniterMultipleChoiceOutput(
            loss=loss, logits=pair_logits[..., 1], pair_logits=pair_logits,
            hidden_states=outputs.hidden_states, attentions=outputs.attentions,
        )
