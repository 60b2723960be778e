"""PyTorch UNITER: a single-stream transformer over [text tokens | image regions].

Faithful to the released code (ChenRocks/UNITER, ECCV version): BERT blocks with BERT's parameter names, an image
embedder with three LayerNorms and a 7-d location vector, the region token type taken from the *text* type table,
and the original pre-training (MLM, MRFR, MRC, MRC-kl, ITM, WRA) and downstream heads.

Sequence layout: every sequence output is `[text (padded to T) | regions (padded to R)]`, length `T + R`, with the
concatenated attention mask. The original gathers each example to `[text_i | regions_i | junk]`; both layouts give the
same numbers at every real position because regions carry no position ids.

Attention runs in transformers' BERT blocks (`layers.py`), which pick the backend from
`config._attn_implementation` at every forward, so `model.set_attn_implementation("eager" | "sdpa" | ...)` switches
an instantiated model; attention probabilities (`output_attentions`) come from eager attention only. Keep
attention-like modules out of this file (see `layers.AttentionPooling`). The outputs' `hidden_states` and `attentions`
are documented by transformers' `auto_docstring` (their sequence is the `[text | regions]` layout above).
"""

import copy
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import nn
from torch.nn import functional as F
from transformers import initialization as init
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    ModelOutput,
    MultipleChoiceModelOutput,
    SequenceClassifierOutput,
)
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, auto_docstring
from transformers.utils.generic import can_return_tuple, merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from ..layers import (
    MASKED_SCORE,
    AttentionPooling,
    BertEmbeddings,
    BertOnlyMLMHead,
    RegionClassificationHead,
    RegionFeatureRegressionHead,
    check_text_and_region_inputs,
    classifier_head,
    flatten_choices,
    in_batch_contrastive_loss,
    ipot_distance,
    labelled_tokens,
    mask_region_features,
    negative_groups,
    one_hot,
    soft_score_loss,
    text_length,
    text_with_choice_axis,
)
from ..modeling_outputs import layer_records
from ..modeling_utils import BertMLMHeadMixin, SingleStreamPreTrainedModel, with_backbone_outputs
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

PRETRAINING_OBJECTIVES = ("mlm", "mrfr", "mrc", "mrc-kl", "itm", "itm-wra", "itc")
# Per-example dimensions of the region inputs (multiple choice: shared by the choices or given per choice).
_REGION_NDIMS = {"region_features": 2, "region_locations": 2, "region_attention_mask": 1, "region_token_type_ids": 1}


# ---------------------------------------------------------------------------------------------------- outputs
@auto_docstring
@dataclass
@layer_records(BaseModelOutputWithPooling, "hidden_states", "attentions")
class UniterForPreTrainingOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor` of shape `()`, *optional*):
        Sum of the objective losses computed (WRA weighted by `wra_weight`).
    mlm_loss (`torch.FloatTensor` of shape `()`, *optional*):
        Masked language modelling, when `labels` are given.
    mrfr_loss (`torch.FloatTensor` of shape `()`, *optional*):
        Masked region feature regression, when `region_feature_targets` are given.
    mrc_loss (`torch.FloatTensor` of shape `()`, *optional*):
        Masked region classification against the detector's hard label (`objective="mrc"`).
    mrc_kl_loss (`torch.FloatTensor` of shape `()`, *optional*):
        Masked region classification, KL divergence from the detector's class distribution.
    itm_loss (`torch.FloatTensor` of shape `()`, *optional*):
        Image-text matching, when `itm_labels` are given.
    wra_loss (`torch.FloatTensor` of shape `()`, *optional*):
        Word-region alignment (`objective="itm-wra"`).
    itc_loss (`torch.FloatTensor` of shape `()`, *optional*):
        Image-text contrastive loss (`objective="itc"`).
    mlm_logits (`torch.FloatTensor`, *optional*):
        `(num_masked_tokens, vocab_size)` at the positions with a label >= 0, row-major over (example, position),
        when `labels` is given; `(batch, text_length, vocab_size)` for `objective="mlm"` without labels.
    mrfr_predictions (`torch.FloatTensor` of shape `(num_masked_regions, region_feature_dim)`, *optional*):
        Regressed features of the masked regions (row-major over (example, region)).
    mrc_logits (`torch.FloatTensor` of shape `(num_masked_regions, num_region_labels)`, *optional*):
        Detector-class logits of the masked regions.
    itm_logits (`torch.FloatTensor` of shape `(batch, 2)`, *optional*):
        Image-text match logits, column 1 = match.
    wra_distance (`torch.FloatTensor` of shape `(batch,)`, *optional*):
        Optimal-transport distance between words and regions.
    itc_logits (`torch.FloatTensor` of shape `(batch, batch)`, *optional*):
        `objective="itc"`: cosine similarities of every text-only [CLS] with every image-only [CLS] of the batch,
        divided by `config.itc_temperature`.
    last_hidden_state (`torch.FloatTensor` of shape `(batch, text_length + num_regions, hidden_size)`):
        The encoder's output, laid out `[text | regions]`.
    pooler_output (`torch.FloatTensor` of shape `(batch, hidden_size)`):
        tanh(dense) of position 0.
    """

    loss: torch.FloatTensor | None = None
    mlm_loss: torch.FloatTensor | None = None
    mrfr_loss: torch.FloatTensor | None = None
    mrc_loss: torch.FloatTensor | None = None
    mrc_kl_loss: torch.FloatTensor | None = None
    itm_loss: torch.FloatTensor | None = None
    wra_loss: torch.FloatTensor | None = None
    itc_loss: torch.FloatTensor | None = None
    mlm_logits: torch.FloatTensor | None = None
    mrfr_predictions: torch.FloatTensor | None = None
    mrc_logits: torch.FloatTensor | None = None
    itm_logits: torch.FloatTensor | None = None
    wra_distance: torch.FloatTensor | None = None
    itc_logits: torch.FloatTensor | None = None
    last_hidden_state: torch.FloatTensor | None = None
    pooler_output: torch.FloatTensor | None = None


@auto_docstring(
    custom_intro="""
    transformers' `SequenceClassifierOutput` plus the backbone outputs the heads are compared on.
    """
)
@dataclass
class UniterClassifierOutput(SequenceClassifierOutput):
    r"""
    loss (`torch.FloatTensor` of shape `()`, *optional*, returned when labels are given):
        The head's loss.
    logits (`torch.FloatTensor`):
        `(batch, num_labels)` VQA answers / VE labels / NLVR2 classes, `(batch, 1)` retrieval scores, or
        `(batch, num_regions)` referring-expression region scores.
    pooler_output (`torch.FloatTensor` of shape `(batch, hidden_size)`, *optional*):
        The backbone's pooled output (`None` for heads built without the pooler).
    last_hidden_state (`torch.FloatTensor` of shape `(batch, text_length + num_regions, hidden_size)`):
        The backbone's output, laid out `[text | regions]`.
    """

    pooler_output: torch.FloatTensor | None = None
    last_hidden_state: torch.FloatTensor | None = None


# Referring expressions classify over regions: the same output (one logit per region).
UniterReferringExpressionOutput = UniterClassifierOutput


@auto_docstring(
    custom_intro="""
    transformers' `MultipleChoiceModelOutput` plus the two logits of each (question, choice) pair.
    """
)
@dataclass
class UniterMultipleChoiceOutput(MultipleChoiceModelOutput):
    r"""
    loss (`torch.FloatTensor` of shape `()`, *optional*, returned when labels are given):
        2-way cross-entropy per (question, choice) pair.
    logits (`torch.FloatTensor` of shape `(batch, num_choices)`):
        The "right" logit of each pair (the ranking score).
    hidden_states (`tuple(torch.FloatTensor)`, *optional*, returned with `output_hidden_states=True`):
        The embeddings and each layer's output, `(batch * num_choices, text_length + num_regions, hidden_size)`.
    attentions (`tuple(torch.FloatTensor)`, *optional*, returned with `output_attentions=True`):
        Self-attention probabilities per layer, `(batch * num_choices, num_attention_heads, length, length)`
        (eager attention only).
    pair_logits (`torch.FloatTensor` of shape `(batch, num_choices, 2)`):
        Both logits of each pair.
    """

    pair_logits: torch.FloatTensor | None = None


# What auto_docstring does not know of UNITER's inputs (it documents `input_ids`, `attention_mask`, ... itself).
_REGION_ARGS = r"""
region_features (`torch.FloatTensor` of shape `(batch_size, num_regions, region_feature_dim)`, *optional*):
    Region features, zero padded.
region_locations (`torch.FloatTensor` of shape `(batch_size, num_regions, region_location_dim)`, *optional*):
    `[x1, y1, x2, y2, w, h, w*h]` per region, normalised by the image size. Required with `region_features`.
region_attention_mask (`torch.Tensor` of shape `(batch_size, num_regions)`, *optional*):
    1 for real regions, 0 for padding. Required for a batch of more than one example.
region_token_type_ids (`torch.LongTensor` of shape `(batch_size, num_regions)`, *optional*):
    Token type of each region, looked up in the text type table; defaults to `config.region_token_type_id`.
"""
_REGION_MASKS_ARG = r"""
region_masks (`torch.BoolTensor` of shape `(batch_size, num_regions)`, *optional*):
    Regions whose features are replaced by the mask embedding (masked region modelling); needs
    `add_region_mask_embedding=True`.
"""
_PRETRAINING_ARGS = r"""
region_masks (`torch.BoolTensor` of shape `(batch_size, num_regions)`, *optional*):
    Masked regions for MRFR/MRC; their features become the mask embedding.
labels (`torch.LongTensor` of shape `(batch_size, text_length)`, *optional*):
    MLM targets; positions with a negative label (-100, or the original's -1) are ignored.
region_feature_targets (`torch.FloatTensor` of shape `(num_masked_regions, region_feature_dim)`, *optional*):
    MRFR targets (the unmasked features), row-major over (example, region).
region_class_targets (`torch.FloatTensor` of shape `(num_masked_regions, num_region_labels)`, *optional*):
    Detector class probabilities of the masked regions (background first): MRC-kl targets, or, with
    `objective="mrc"`, the source of the hard label `argmax(probs[:, 1:]) + 1`.
itm_labels (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
    1 = the text matches the image, 0 = it does not.
itc_image_ids (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
    `objective="itc"`: pairs sharing an id show the same image and are not each other's negatives.
objective (`str`, *optional*):
    One of `PRETRAINING_OBJECTIVES`; selects the MLM logits without labels (`"mlm"`), hard MRC (`"mrc"`), adds
    the WRA loss to ITM (`"itm-wra"`), or runs the contrastive objective (`"itc"`: every row a matched pair; the
    loss is always computed). Without it every objective whose targets are given is computed (MRC-kl for region
    class targets).
"""
_HEAD_LABELS_ARG = r"""
labels (`torch.Tensor`, *optional*):
    The head's targets. VQA (`UniterForQuestionAnswering`): `(batch_size, num_labels)` soft answer scores in [0, 1];
    VE (`UniterForVisualEntailment`): the same, or `(batch_size,)` class ids; referring expressions
    (`UniterForReferringExpression`): `(batch_size,)` index of the referred region.
"""
_NUM_NEGATIVES_ARG = r"""
num_negatives (`int`, *optional*):
    When given, the batch is read as groups of `1 + num_negatives` pairs, the matched pair first, and the loss is
    the original's hinge `max(0, margin + σ(s_neg) - σ(s_pos))`, averaged.
"""
_TWO_IMAGE_ARGS = r"""
input_ids (`torch.LongTensor` of shape `(batch_size, text_length)`, *optional*):
    The sentence, encoded once with each image.
region_features (`torch.FloatTensor` of shape `(batch_size, 2, num_regions, region_feature_dim)`):
    The left and right images' regions.
region_locations (`torch.FloatTensor` of shape `(batch_size, 2, num_regions, region_location_dim)`):
    `[x1, y1, x2, y2, w, h, w*h]` per region, normalised by the image size.
region_attention_mask (`torch.Tensor` of shape `(batch_size, 2, num_regions)`, *optional*):
    1 for real regions, 0 for padding.
region_token_type_ids (`torch.LongTensor` of shape `(batch_size, 2, num_regions)`, *optional*):
    Defaults to 1 (left) and 2 (right) with a 3-row type table, else 1 for both.
labels (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
    1 = the statement is true.
"""
_CHOICE_ARGS = r"""
input_ids (`torch.LongTensor` of shape `(batch_size, num_choices, text_length)`, *optional*):
    Question + choice word pieces of each pair.
attention_mask (`torch.Tensor` of shape `(batch_size, num_choices, text_length)`, *optional*):
    1 for real tokens, 0 for padding.
token_type_ids (`torch.LongTensor` of shape `(batch_size, num_choices, text_length)`, *optional*):
    Text token types (VCR uses 2/3 for answers/rationales).
position_ids (`torch.LongTensor` of shape `(batch_size, num_choices, text_length)`, *optional*):
    Text positions; defaults to `0..text_length-1`.
inputs_embeds (`torch.FloatTensor` of shape `(batch_size, num_choices, text_length, hidden_size)`, *optional*):
    Word embeddings instead of `input_ids`.
region_features (`torch.FloatTensor` of shape `(batch_size, [num_choices,] num_regions, region_feature_dim)`):
    Shared by every choice, or given per choice (likewise the other region inputs).
region_locations (`torch.FloatTensor` of shape `(batch_size, [num_choices,] num_regions, region_location_dim)`):
    `[x1, y1, x2, y2, w, h, w*h]` per region, normalised by the image size.
region_attention_mask (`torch.Tensor` of shape `(batch_size, [num_choices,] num_regions)`, *optional*):
    1 for real regions, 0 for padding.
region_token_type_ids (`torch.LongTensor` of shape `(batch_size, [num_choices,] num_regions)`, *optional*):
    Token type of each region; defaults to `config.region_token_type_id`.
labels (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
    Index of the right choice.
"""


# ---------------------------------------------------------------------------------------------------- embeddings
# The models that own the learned features of masked regions (`region_masks`).
_MASK_OWNERS = "the pre-training model (UniterForPreTraining, or UniterModel(config, add_region_mask_embedding=True))"


class UniterImageEmbeddings(nn.Module):
    """Embeds regions: `LN(Linear(features)) + LN(Linear(locations)) + type embedding`, then LayerNorm and dropout.

    With `add_mask_embedding=True` (pre-training only) a masked region (MRM) has its features replaced by the
    learned row 1 of `mask_embedding`; row 0 is never used (the original zeroes it on every masked forward).
    """

    def __init__(self, config: UniterConfig, add_mask_embedding: bool = False) -> None:
        super().__init__()
        self.img_linear = nn.Linear(config.region_feature_dim, config.hidden_size)
        self.img_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.pos_linear = nn.Linear(config.region_location_dim, config.hidden_size)
        self.pos_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mask_embedding = nn.Embedding(2, config.region_feature_dim, padding_idx=0) if add_mask_embedding else None
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
            mask_features = self.mask_embedding.weight[1] if self.mask_embedding is not None else None
            region_features = mask_region_features(region_features, region_masks, mask_features, _MASK_OWNERS)
        embeddings = self.img_layer_norm(self.img_linear(region_features))
        embeddings = embeddings + self.pos_layer_norm(self.pos_linear(region_locations)) + type_embeddings
        return self.dropout(self.LayerNorm(embeddings))


# ---------------------------------------------------------------------------------------------------- base
class UniterPreTrainedModel(SingleStreamPreTrainedModel):
    config: UniterConfig
    base_model_prefix = "uniter"
    _region_feature_layers = ("img_embeddings.img_linear",)
    _no_split_modules = ["BertEmbeddings", "UniterImageEmbeddings", "BertLayer"]
    # Pre-training checkpoints carry the region mask embedding; only the pre-training model owns it.
    _keys_to_ignore_on_load_unexpected = [r"img_embeddings\.mask_embedding\.weight"]

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)  # BERT embeddings' buffers, MLM bias
        if isinstance(module, RegionFeatureRegressionHead):
            init.zeros_(module.bias)
        elif isinstance(module, nn.MultiheadAttention):  # NLVR2 paired-attn: raw in-projection parameters
            init.xavier_uniform_(module.in_proj_weight)
            init.zeros_(module.in_proj_bias)


@auto_docstring(
    custom_intro="""
    The bare UNITER encoder: text embeddings (BERT's), region embeddings, a BERT encoder and the tanh pooler.
    """
)
class UniterModel(UniterPreTrainedModel):
    def __init__(
        self, config: UniterConfig, add_pooling_layer: bool = True, add_region_mask_embedding: bool = False
    ) -> None:
        r"""
        add_pooling_layer (`bool`, defaults to `True`):
            Build the pooler (`pooler_output`); heads that never read the pooled output (referring expressions,
            NLVR2 paired-attn) leave it out.
        add_region_mask_embedding (`bool`, defaults to `False`):
            Build `img_embeddings.mask_embedding`, the learned features of masked regions; only masked region
            modelling (pre-training) uses it (`region_masks`).
        """
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        self.img_embeddings = UniterImageEmbeddings(config, add_mask_embedding=add_region_mask_embedding)
        self._build_encoder(config, add_pooling_layer)
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    @auto_docstring(custom_args=_REGION_ARGS + _REGION_MASKS_ARG)
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
        Returns:
            `BaseModelOutputWithPooling`: `last_hidden_state` `(batch_size, text_length + num_regions, hidden_size)`
            laid out `[text | regions]`, and `pooler_output` `(batch_size, hidden_size)` (tanh(dense) of position 0,
            the [CLS] token when text is present; `None` without the pooler).
        """
        check_text_and_region_inputs(
            self.config, input_ids, inputs_embeds, region_features, region_locations, region_attention_mask, "UNITER"
        )
        pieces, masks = [], []
        if input_ids is not None or inputs_embeds is not None:
            text = input_ids if input_ids is not None else inputs_embeds
            text_embeddings = self.embeddings(
                input_ids=input_ids,
                token_type_ids=token_type_ids,
                position_ids=position_ids,
                inputs_embeds=inputs_embeds,
            )
            pieces.append(text_embeddings)
            masks.append(
                attention_mask if attention_mask is not None else torch.ones(text.shape[:2], device=text.device)
            )
        if region_features is not None:
            batch, num_regions = region_features.shape[:2]
            if region_token_type_ids is None:
                region_token_type_ids = torch.full(
                    (batch, num_regions),
                    self.config.region_token_type_id,
                    dtype=torch.long,
                    device=region_features.device,
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
        sequence_output, pooled_output = self._run_encoder(embedding_output, mask_2d, **kwargs)
        return BaseModelOutputWithPooling(last_hidden_state=sequence_output, pooler_output=pooled_output)


def _with_backbone_outputs(output_class: type[ModelOutput], outputs: ModelOutput, **fields) -> ModelOutput:
    """`output_class` with a head's own `fields` and the backbone's `outputs` passed on, the pooled output included
    (UNITER's head outputs carry it)."""
    return with_backbone_outputs(output_class, outputs, pooler_output=outputs.pooler_output, **fields)


def _classifier_output(loss, logits: torch.Tensor, outputs) -> UniterClassifierOutput:
    """A head's `UniterClassifierOutput`: its loss and logits, with the backbone's outputs passed on."""
    return _with_backbone_outputs(UniterClassifierOutput, outputs, loss=loss, logits=logits)


# ---------------------------------------------------------------------------------------------------- pre-training
@dataclass
class _JointPass:
    """The joint text-and-regions pass of `UniterForPreTraining` with the batch's targets: what its heads read."""

    sequence_output: torch.Tensor
    pooled_output: torch.Tensor
    text_length: int
    attention_mask: torch.Tensor | None
    has_regions: bool
    region_attention_mask: torch.Tensor | None
    region_masks: torch.Tensor | None
    labels: torch.Tensor | None
    region_feature_targets: torch.Tensor | None
    region_class_targets: torch.Tensor | None
    itm_labels: torch.Tensor | None

    @property
    def text_output(self) -> torch.Tensor:
        return self.sequence_output[:, : self.text_length]

    @property
    def region_output(self) -> torch.Tensor:
        return self.sequence_output[:, self.text_length :]

    @cached_property
    def masked_regions(self) -> torch.Tensor:
        """`(num_masked_regions, hidden)`, row-major over (example, region): what MRFR and MRC read."""
        return self.region_output[self.region_masks.bool()]


@auto_docstring(
    custom_intro="""
    UNITER with its pre-training heads: MLM (`cls`, decoder tied to the word embeddings), MRFR (`feat_regress`,
    output projection tied to the image embedder's `img_linear`), MRC / MRC-kl (`region_classifier`) and ITM
    (`itm_output`, on the pooled output) with the optional word-region alignment (WRA) distance. The backbone has
    the region mask embedding (`uniter.img_embeddings.mask_embedding`) that masked region modelling needs.

    `objective="itc"` (a vlhub extension, not UNITER's recipe) is an image-text contrastive loss over a batch of
    matched pairs, as ALBEF aligns its two encoders before fusing them: the same encoder runs on each text alone and on
    each image alone (its regions after a lone [CLS]), and the two pooled [CLS] outputs are contrasted against the
    batch's other texts and images (`layers.in_batch_contrastive_loss`, temperature `config.itc_temperature`). Unlike
    ITM with random negatives, whose gradient a model trained from scratch only gets at second order (neither the
    text nor the image alone predicts a match), this loss gives each modality a first-order signal; on the shapes
    world, `itc:1,itm:1` makes retrieval learn within a few hundred steps where the original mix stays at chance
    (README, the demo section).

    Losses are computed for whichever targets are given; the original trains one objective per batch
    ("conditional masking"), so a batch normally carries one kind of target and the heads of the other objectives
    get no gradient in that step (under DDP: `find_unused_parameters=True`, or a batch mixing all objectives).
    """
)
class UniterForPreTraining(BertMLMHeadMixin, UniterPreTrainedModel):
    # MRFR and MRC return one row per masked region: a shape that depends on the data, which fullgraph cannot trace.
    _can_compile_fullgraph = False
    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "uniter.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def __init__(self, config: UniterConfig) -> None:
        super().__init__(config)
        self.uniter = UniterModel(config, add_region_mask_embedding=True)
        self.cls = BertOnlyMLMHead(config)
        self.feat_regress = RegionFeatureRegressionHead(
            config.hidden_size, config.region_feature_dim, config.hidden_act, config.layer_norm_eps
        )
        self.region_classifier = RegionClassificationHead(
            config.hidden_size, config.num_region_labels, config.hidden_act, config.layer_norm_eps
        )
        self.itm_output = nn.Linear(config.hidden_size, 2)
        self.post_init()

    @can_return_tuple
    @auto_docstring(custom_args=_REGION_ARGS + _PRETRAINING_ARGS)
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
        itc_image_ids: torch.LongTensor | None = None,
        objective: str | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> UniterForPreTrainingOutput:
        r"""
        Returns:
            `UniterForPreTrainingOutput`. The MLM logits and the region predictions are gathered at the masked
            positions (data-dependent sizes, as the original computes them).
        """
        _check_objective(objective, itc_image_ids)
        inputs = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "token_type_ids": token_type_ids,
            "position_ids": position_ids,
            "inputs_embeds": inputs_embeds,
            "region_features": region_features,
            "region_locations": region_locations,
            "region_attention_mask": region_attention_mask,
            "region_token_type_ids": region_token_type_ids,
        }
        targets = {
            "labels": labels,
            "region_masks": region_masks,
            "region_feature_targets": region_feature_targets,
            "region_class_targets": region_class_targets,
            "itm_labels": itm_labels,
        }
        if objective == "itc":  # its own two passes, not the joint pass the other objectives' heads read
            _refuse_other_targets(**targets)
            return self._contrastive(image_ids=itc_image_ids, **inputs, **kwargs)
        self._check_region_targets(objective, region_masks, region_feature_targets, region_class_targets)
        outputs = self.uniter(**inputs, region_masks=region_masks, **kwargs)
        joint = _JointPass(
            outputs.last_hidden_state,
            outputs.pooler_output,
            text_length(input_ids, inputs_embeds),
            attention_mask,
            region_features is not None,
            region_attention_mask,
            **targets,
        )
        return self._run_objective_heads(objective, outputs, joint)

    def _run_objective_heads(self, objective, outputs, joint: _JointPass) -> UniterForPreTrainingOutput:
        """The dispatch through `_objective_heads`, apart from `forward`'s argument handling: each head of the
        objective adds its fields; the losses are summed (WRA weighted)."""
        fields = {}
        for head in self._objective_heads[objective]:
            fields.update(head(self, joint))
        losses = [
            v * (self.config.wra_weight if k == "wra_loss" else 1.0) for k, v in fields.items() if k.endswith("_loss")
        ]
        return _with_backbone_outputs(
            UniterForPreTrainingOutput, outputs, loss=sum(losses) if losses else None, **fields
        )

    # -- one head per objective: each reads the joint pass and returns its output fields (its loss when the batch
    # carries its targets)
    def _mlm(self, joint: _JointPass) -> dict:
        """MLM at the labelled positions (labels < 0 are ignored)."""
        if joint.labels is None:
            return {}
        selected = labelled_tokens(joint.labels, joint.text_output)
        logits = self.cls(joint.text_output[selected])
        return {"mlm_logits": logits, "mlm_loss": F.cross_entropy(logits.float(), joint.labels[selected])}

    def _mlm_scores(self, joint: _JointPass) -> dict:
        """`objective="mlm"`: as `_mlm`; without labels, the MLM logits at every text position."""
        if joint.labels is not None:
            return self._mlm(joint)
        return {"mlm_logits": self.cls(joint.text_output)}

    def _mrfr(self, joint: _JointPass) -> dict:
        """MRFR: the masked regions' features regressed (output projection tied to `img_linear`), MSE loss."""
        if joint.region_masks is None:
            return {}
        predictions = self.feat_regress(joint.masked_regions, self.uniter.img_embeddings.img_linear.weight)
        if joint.region_feature_targets is None:
            return {"mrfr_predictions": predictions}
        _check_rows("region_feature_targets", joint.region_feature_targets, predictions)
        loss = F.mse_loss(predictions.float(), joint.region_feature_targets.float())
        return {"mrfr_predictions": predictions, "mrfr_loss": loss}

    def _mrc(self, joint: _JointPass) -> dict:
        """MRC: the masked regions' detector class, cross-entropy against the hard label `argmax(probs[:, 1:]) + 1`
        (background never a target)."""
        return self._region_classes(joint, "mrc_loss", _hard_class_loss)

    def _mrc_kl(self, joint: _JointPass) -> dict:
        """MRC-kl: the masked regions' class distribution, KL divergence from the detector's probabilities."""
        return self._region_classes(joint, "mrc_kl_loss", _soft_class_loss)

    def _region_classes(self, joint: _JointPass, loss_name: str, loss_function) -> dict:
        if joint.region_masks is None:
            return {}
        logits = self.region_classifier(joint.masked_regions)
        if joint.region_class_targets is None:
            return {"mrc_logits": logits}
        _check_rows("region_class_targets", joint.region_class_targets, logits)
        return {"mrc_logits": logits, loss_name: loss_function(logits, joint.region_class_targets)}

    def _itm(self, joint: _JointPass) -> dict:
        """ITM on the pooled output (column 1 = match); always scored, its loss with `itm_labels`."""
        logits = self.itm_output(joint.pooled_output)
        if joint.itm_labels is None:
            return {"itm_logits": logits}
        return {"itm_logits": logits, "itm_loss": F.cross_entropy(logits.float(), joint.itm_labels)}

    def _wra(self, joint: _JointPass) -> dict:
        """WRA: the IPOT distance between words and regions; with `itm_labels`, matched pairs pulled together and
        mismatched ones pushed apart (mean over the batch)."""
        if not joint.has_regions or joint.text_length == 0:
            raise ValueError("WRA needs both text and regions")
        text, regions = joint.text_output, joint.region_output
        distance = ipot_distance(
            text,
            regions,
            _padding(joint.attention_mask, text),
            _padding(joint.region_attention_mask, regions),
            beta=self.config.ot_beta,
            iterations=self.config.ot_iterations,
            inner_steps=self.config.ot_inner_steps,
        ).to(joint.sequence_output.dtype)
        if joint.itm_labels is None:
            return {"wra_distance": distance}
        signs = torch.where(joint.itm_labels == 1, 1.0, -1.0).to(distance)
        return {"wra_distance": distance, "wra_loss": (signs * distance).sum() / distance.shape[0]}

    # The heads each objective of the joint pass runs, in this order (the loss sums them in it). Without an
    # objective every head whose targets are given computes its loss, MRC as MRC-kl; MLM runs whenever labels are
    # given. WRA adds its distance to ITM.
    _objective_heads = {
        None: (_mlm, _mrfr, _mrc_kl, _itm),
        "mlm": (_mlm_scores, _itm),
        "mrfr": (_mlm, _mrfr, _itm),
        "mrc": (_mlm, _mrc, _itm),
        "mrc-kl": (_mlm, _mrc_kl, _itm),
        "itm": (_mlm, _itm),
        "itm-wra": (_mlm, _itm, _wra),
    }
    _region_heads = (_mrfr, _mrc, _mrc_kl)

    def _check_region_targets(self, objective, region_masks, region_feature_targets, region_class_targets):
        if region_feature_targets is None and region_class_targets is None:
            return
        if region_masks is None:
            raise ValueError(
                "region_feature_targets / region_class_targets need region_masks (which regions are masked)"
            )
        if not any(head in self._region_heads for head in self._objective_heads[objective]):
            raise ValueError(
                "region_feature_targets / region_class_targets belong to the region objectives (mrfr, "
                f"mrc, mrc-kl), not objective={objective!r}"
            )

    def _contrastive(
        self,
        input_ids,
        attention_mask,
        token_type_ids,
        position_ids,
        inputs_embeds,
        region_features,
        region_locations,
        region_attention_mask,
        region_token_type_ids,
        image_ids,
        **kwargs,
    ):
        """`objective="itc"`: the text-only and the image-only pass, their pooled [CLS] contrasted in the batch."""
        if region_features is None or (input_ids is None and inputs_embeds is None):
            raise ValueError('objective="itc" needs both text (input_ids or inputs_embeds) and regions')
        text = self.uniter(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            **kwargs,
        )

        def first_token(tensor):  # the [CLS] column of a text input (`None` stays `None`)
            return None if tensor is None else tensor[:, :1]

        image = self.uniter(
            input_ids=first_token(input_ids),
            attention_mask=first_token(attention_mask),
            token_type_ids=first_token(token_type_ids),
            position_ids=first_token(position_ids),
            inputs_embeds=first_token(inputs_embeds),
            region_features=region_features,
            region_locations=region_locations,
            region_attention_mask=region_attention_mask,
            region_token_type_ids=region_token_type_ids,
            **kwargs,
        )
        loss, logits = in_batch_contrastive_loss(
            text.pooler_output, image.pooler_output, self.config.itc_temperature, image_ids
        )
        return _with_backbone_outputs(UniterForPreTrainingOutput, image, loss=loss, itc_loss=loss, itc_logits=logits)


def _check_objective(objective, itc_image_ids):
    """Refuses an unknown objective, and ITC's image ids given to another objective, before any pass runs."""
    if objective is not None and objective not in PRETRAINING_OBJECTIVES:
        raise ValueError(f"objective must be one of {PRETRAINING_OBJECTIVES}, got {objective!r}")
    if objective != "itc" and itc_image_ids is not None:
        raise ValueError('itc_image_ids belong to objective="itc"')


def _refuse_other_targets(**targets):
    """`objective="itc"` takes matched pairs: any other objective's target is an error."""
    given = [name for name, value in targets.items() if value is not None]
    if given:
        raise ValueError(f'objective="itc" takes matched pairs only; {", ".join(given)} belong to other objectives')


def _hard_class_loss(logits: torch.Tensor, class_probabilities: torch.Tensor) -> torch.Tensor:
    hard_labels = class_probabilities[:, 1:].argmax(dim=-1) + 1
    return F.cross_entropy(logits.float(), hard_labels, ignore_index=0)


def _soft_class_loss(logits: torch.Tensor, class_probabilities: torch.Tensor) -> torch.Tensor:
    log_probs = F.log_softmax(logits.float(), dim=-1)
    return F.kl_div(log_probs, class_probabilities.float(), reduction="none").mean()


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
class _UniterHead(UniterPreTrainedModel):
    """A UNITER backbone plus a task head on single (text, image) pairs labelled per example (VQA/VE, referring
    expressions). The forward is shared, as transformers' generic heads share theirs: the inputs go through the
    backbone (`self.uniter`, built by the head), then `_head` computes the task's loss and logits from its outputs."""

    def _check_inputs(self, inputs: dict) -> None:
        """Refuse inputs the head cannot score, before the backbone runs (every input is optional by default)."""

    def _head(self, outputs: BaseModelOutputWithPooling, labels: torch.Tensor | None, inputs: dict) -> tuple:
        """The head's `(loss, logits)`; `inputs` are the backbone's inputs by name."""
        raise NotImplementedError

    @can_return_tuple
    @auto_docstring(custom_args=_REGION_ARGS + _HEAD_LABELS_ARG)
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
        Returns:
            `UniterClassifierOutput` with `logits` `(batch_size, num_labels)` (VQA, VE) or `(batch_size,
            num_regions)` with -10000 at padded regions (referring expressions).
        """
        inputs = dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            region_features=region_features,
            region_locations=region_locations,
            region_attention_mask=region_attention_mask,
            region_token_type_ids=region_token_type_ids,
            inputs_embeds=inputs_embeds,
        )
        self._check_inputs(inputs)
        outputs = self.uniter(**inputs, **kwargs)
        loss, logits = self._head(outputs, labels, inputs)
        return _classifier_output(loss, logits, outputs)


@auto_docstring(
    custom_intro="""
    VQA: `vqa_output` (Linear(H, 2H), GELU, LayerNorm, Linear(2H, num_answers)) on the pooled output.

    `config.id2label` holds the answers (3129 for the original VQA vocabulary). The loss is the original's:
    binary cross-entropy with logits against soft scores, averaged and multiplied by the number of answers.
    """
)
class UniterForQuestionAnswering(_UniterHead):
    def __init__(self, config: UniterConfig) -> None:
        super().__init__(config)
        self.uniter = UniterModel(config)
        self.vqa_output = classifier_head(
            config.hidden_size,
            2 * config.hidden_size,
            config.num_labels,
            config.classifier_activation,
            config.layer_norm_eps,
        )
        self.post_init()

    def _soft_targets(self, labels: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The soft answer scores the loss compares `logits` with (VE turns class ids into one-hot rows)."""
        return labels.to(logits.dtype)

    def _head(self, outputs: BaseModelOutputWithPooling, labels: torch.Tensor | None, inputs: dict) -> tuple:
        logits = self.vqa_output(outputs.pooler_output)
        loss = soft_score_loss(logits, self._soft_targets(labels, logits)) if labels is not None else None
        return loss, logits


@auto_docstring(
    custom_intro="""
    SNLI-VE: the VQA head with 3 outputs (contradiction=0, entailment=1, neutral=2) and the original's binary
    cross-entropy on one-hot targets. Parameter names stay `vqa_output.*`, as in the original.

    A config without 3 labels is copied and given the SNLI-VE labels; the caller's config object is not changed.
    """
)
class UniterForVisualEntailment(UniterForQuestionAnswering):
    def __init__(self, config: UniterConfig) -> None:
        if config.num_labels != 3:
            config = copy.deepcopy(config)
            config.id2label = {0: "contradiction", 1: "entailment", 2: "neutral"}
            config.label2id = {v: k for k, v in config.id2label.items()}
        super().__init__(config)

    def _soft_targets(self, labels: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if labels.ndim == 1:
            if labels.dtype.is_floating_point:
                raise ValueError("VE labels of shape (batch,) must be integer class ids")
            return one_hot(labels, logits.shape[1]).to(logits.dtype)
        return super()._soft_targets(labels, logits)


@auto_docstring(
    custom_intro="""
    Image-text retrieval: `rank_output` (Linear(H, 1)) scores a pair from the pooled output.

    For zero-shot retrieval (the original `init_output`), seed `rank_output` from a pre-trained ITM head with
    `init_rank_output_from_itm(itm_weight, itm_bias)`; the head itself does not keep the ITM layer.
    """
)
class UniterForImageTextRetrieval(UniterPreTrainedModel):
    def __init__(self, config: UniterConfig) -> None:
        super().__init__(config)
        self.uniter = UniterModel(config)
        self.rank_output = nn.Linear(config.hidden_size, 1)
        self.post_init()

    @staticmethod
    def rank_output_from_itm(itm_weight: torch.Tensor, itm_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The ITM "match" row (row 1) of a pre-training `itm_output` (weight `(2, H)`, bias `(2,)`), as the
        `(1, H)` weight and `(1,)` bias of `rank_output`."""
        if itm_weight.ndim != 2 or itm_weight.shape[0] != 2 or tuple(itm_bias.shape) != (2,):
            raise ValueError(
                f"expected an ITM head of weight (2, hidden) and bias (2,), got {tuple(itm_weight.shape)} and "
                f"{tuple(itm_bias.shape)}"
            )
        return itm_weight[1:2].clone(), itm_bias[1:2].clone()

    @torch.no_grad()
    def init_rank_output_from_itm(self, itm_weight: torch.Tensor, itm_bias: torch.Tensor) -> None:
        """Copy the ITM "match" row (row 1 of a pre-training checkpoint's `itm_output.weight` / `itm_output.bias`)
        into `rank_output`: what the original does for zero-shot retrieval."""
        weight, bias = self.rank_output_from_itm(itm_weight, itm_bias)
        if weight.shape != self.rank_output.weight.shape:
            raise ValueError(f"the ITM head has hidden size {weight.shape[1]}, this model {self.config.hidden_size}")
        self.rank_output.weight.copy_(weight)
        self.rank_output.bias.copy_(bias)

    def initialize_from_pretraining(self, pretraining_state_dict: dict[str, torch.Tensor]) -> list[str]:
        """Start from a pre-training checkpoint's heads (fine-tuning calls this with that checkpoint's weights):
        `rank_output` takes the ITM "match" row, the original's `init_output`. Returns the names it set."""
        self.init_rank_output_from_itm(
            pretraining_state_dict["itm_output.weight"], pretraining_state_dict["itm_output.bias"]
        )
        return ["rank_output.weight", "rank_output.bias"]

    @can_return_tuple
    @auto_docstring(custom_args=_REGION_ARGS + _NUM_NEGATIVES_ARG)
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
        Returns:
            `UniterClassifierOutput` with `logits` `(batch_size, 1)`: the ranking score of each pair.
        """
        outputs = self.uniter(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            region_features=region_features,
            region_locations=region_locations,
            region_attention_mask=region_attention_mask,
            region_token_type_ids=region_token_type_ids,
            inputs_embeds=inputs_embeds,
            **kwargs,
        )
        logits = self.rank_output(outputs.pooler_output)
        loss = None
        if num_negatives is not None:
            scores = torch.sigmoid(negative_groups(logits, num_negatives))
            loss = torch.clamp(self.config.ranking_margin + scores[:, 1:] - scores[:, :1], min=0).mean()
        return _classifier_output(loss, logits, outputs)


@auto_docstring(
    custom_intro="""
    NLVR2 (one sentence, two images, true/false), "paired" setting: the sentence is encoded with each image.

    `config.nlvr2_head` picks the head: `"paired"` — `nlvr2_output` Linear(2H, 2) on the two pooled outputs
    concatenated; `"paired-attn"` (the released default) — left↔right cross-attention over the two sequence outputs,
    `fc` on [attended | own], attention pooling, then `nlvr2_output` on the two pooled vectors (no backbone pooler).

    The left image's regions get token type 1 and the right's type 2 when the type table has 3 rows (as the released
    NLVR2 model), unless `region_token_type_ids` is given.
    """
)
class UniterForVisualReasoning(UniterPreTrainedModel):
    _keys_to_ignore_on_load_unexpected = [r"img_embeddings\.mask_embedding\.weight", r"^(uniter\.)?pooler\."]

    def __init__(self, config: UniterConfig) -> None:
        super().__init__(config)
        hidden = config.hidden_size
        paired_attention = config.nlvr2_head == "paired-attn"
        self.uniter = UniterModel(config, add_pooling_layer=not paired_attention)
        if paired_attention:
            self.attn1 = nn.MultiheadAttention(hidden, config.num_attention_heads, dropout=config.hidden_dropout_prob)
            self.attn2 = nn.MultiheadAttention(hidden, config.num_attention_heads, dropout=config.hidden_dropout_prob)
            self.fc = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Dropout(config.hidden_dropout_prob))
            self.attn_pool = AttentionPooling(hidden, config.hidden_dropout_prob, MASKED_SCORE)
        self.nlvr2_output = nn.Linear(2 * hidden, 2)
        self.post_init()

    @can_return_tuple
    @auto_docstring(custom_args=_TWO_IMAGE_ARGS)
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
    ) -> UniterClassifierOutput:
        r"""
        Returns:
            `UniterClassifierOutput` with `logits` `(batch_size, 2)`; `last_hidden_state` and `hidden_states` cover
            the `2 * batch_size` (sentence, image) sequences, left then right for each example.
        """
        if region_features is None or region_features.ndim != 4 or region_features.shape[1] != 2:
            shape = None if region_features is None else tuple(region_features.shape)
            raise ValueError(
                f"NLVR2 needs the regions of two images: region_features of shape (batch, 2, R, F), got {shape}"
            )
        batch, _, num_regions = region_features.shape[:3]

        def pairs(t):  # (batch, ...) text → (2 * batch, ...), each example twice in a row (left, right)
            return None if t is None else t.repeat_interleave(2, dim=0)

        def flat(t):  # (batch, 2, ...) → (2 * batch, ...)
            return None if t is None else t.reshape(batch * 2, *t.shape[2:])

        if region_token_type_ids is None:
            right_type = 2 if self.config.type_vocab_size >= 3 else 1
            region_token_type_ids = torch.ones(batch, 2, num_regions, dtype=torch.long, device=region_features.device)
            region_token_type_ids[:, 1] = right_type
        outputs = self.uniter(
            input_ids=pairs(input_ids),
            attention_mask=pairs(attention_mask),
            token_type_ids=pairs(token_type_ids),
            position_ids=position_ids
            if position_ids is not None and position_ids.shape[0] == 1
            else pairs(position_ids),
            region_features=flat(region_features),
            region_locations=flat(region_locations),
            region_attention_mask=flat(region_attention_mask),
            region_token_type_ids=flat(region_token_type_ids),
            inputs_embeds=pairs(inputs_embeds),
            **kwargs,
        )
        if self.config.nlvr2_head == "paired":
            logits = self.nlvr2_output(outputs.pooler_output.reshape(batch, -1))
        else:
            logits = self._paired_attention(
                outputs.last_hidden_state,
                text_length(input_ids, inputs_embeds),
                pairs(attention_mask),
                flat(region_attention_mask),
            )
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return _classifier_output(loss, logits, outputs)

    def _paired_attention(self, sequence_output, text_length, text_mask, region_mask):
        pairs, length, hidden = sequence_output.shape
        if text_mask is None:
            text_mask = torch.ones(pairs, text_length, device=sequence_output.device)
        if region_mask is None:
            region_mask = torch.ones(pairs, length - text_length, device=sequence_output.device)
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


@auto_docstring(
    custom_intro="""
    Referring expressions: `re_output` scores every region output; the loss is cross-entropy over regions.
    The head reads no pooled output, so the backbone has no pooler.
    """
)
class UniterForReferringExpression(_UniterHead):
    _keys_to_ignore_on_load_unexpected = [r"img_embeddings\.mask_embedding\.weight", r"^(uniter\.)?pooler\."]

    def __init__(self, config: UniterConfig) -> None:
        super().__init__(config)
        hidden = config.hidden_size
        self.uniter = UniterModel(config, add_pooling_layer=False)
        if config.re_head_layers == 1:
            self.re_output = nn.Linear(hidden, 1)
        else:
            self.re_output = classifier_head(hidden, hidden, 1, "gelu", config.layer_norm_eps)
        self.post_init()

    def _check_inputs(self, inputs: dict) -> None:
        if inputs["region_features"] is None:
            raise ValueError("referring expressions need regions (region_features)")

    def _head(self, outputs: BaseModelOutputWithPooling, labels: torch.Tensor | None, inputs: dict) -> tuple:
        num_text = text_length(inputs["input_ids"], inputs["inputs_embeds"])
        logits = self.re_output(outputs.last_hidden_state[:, num_text:]).squeeze(-1)
        if inputs["region_attention_mask"] is not None:
            logits = logits.masked_fill(inputs["region_attention_mask"] == 0, MASKED_SCORE)
        loss = F.cross_entropy(logits.float(), labels.view(-1)) if labels is not None else None
        return loss, logits  # no pooler: pooler_output is None


@auto_docstring(
    custom_intro="""
    VCR: each (question, choice) pair is encoded with the image; `vcr_output` (Linear(H, 2H), ReLU, LayerNorm,
    Linear(2H, 2)) classifies the pair as right/wrong, and the "right" logit ranks the choices.
    """
)
class UniterForMultipleChoice(UniterPreTrainedModel):
    def __init__(self, config: UniterConfig) -> None:
        super().__init__(config)
        self.uniter = UniterModel(config)
        self.vcr_output = classifier_head(config.hidden_size, 2 * config.hidden_size, 2, "relu", config.layer_norm_eps)
        self.post_init()

    @can_return_tuple
    @auto_docstring(custom_args=_CHOICE_ARGS)
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
    ) -> UniterMultipleChoiceOutput:
        r"""
        Returns:
            `UniterMultipleChoiceOutput` with `logits` `(batch_size, num_choices)` and `pair_logits`
            `(batch_size, num_choices, 2)`; `hidden_states` cover the `batch_size * num_choices` pairs.
        """
        batch, choices = text_with_choice_axis(input_ids, inputs_embeds).shape[:2]

        inputs = flatten_choices(
            dict(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
                position_ids=position_ids,
                region_features=region_features,
                region_locations=region_locations,
                region_attention_mask=region_attention_mask,
                region_token_type_ids=region_token_type_ids,
                inputs_embeds=inputs_embeds,
            ),
            batch,
            choices,
            _REGION_NDIMS,
        )
        outputs = self.uniter(**inputs, **kwargs)
        pair_logits = self.vcr_output(outputs.pooler_output).view(batch, choices, 2)
        loss = None
        if labels is not None:
            targets = one_hot(labels, choices).view(-1)
            loss = F.cross_entropy(pair_logits.view(-1, 2).float(), targets)
        return UniterMultipleChoiceOutput(
            loss=loss,
            logits=pair_logits[..., 1],
            pair_logits=pair_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
