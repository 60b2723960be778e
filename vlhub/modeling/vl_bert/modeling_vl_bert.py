"""PyTorch VL-BERT: a single-stream BERT over [text tokens | objects | [END]].

Faithful to the released code (jackroos/VL-BERT, `common/visual_linguistic_bert.py`, `common/fast_rcnn.py`): every
text token carries a visual term (the whole-image object's visual embedding through its own LayerNorm), objects are
a dedicated [IMG] embedding plus their visual embedding, the visual embedding of an object is
`ReLU(Linear(Dropout([sinusoidal geometry (2048) | appearance (2048)])))`, all objects share one position id (the
number of real text tokens) and [END] takes the next one; objects and [END] have token type 2.

Sequence layout: every sequence output is `[text (padded to T) | objects (padded to K) | [END]]`, length `T + K + 1`,
with the concatenated attention mask. The original packs each example as `[text_i | objects_i | END | junk]`; both
layouts give the same numbers at every real position because the position ids are computed from the real lengths.

Attention runs in transformers' BERT blocks (`layers.py`), so `attn_implementation` is a config choice; attention
probabilities (`output_attentions`) come from eager attention only. The outputs' `hidden_states` and `attentions` are
documented by transformers' `auto_docstring` (their sequence is the `[text | objects | [END]]` layout above).
"""

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_outputs import BaseModelOutputWithPooling, ModelOutput, MultipleChoiceModelOutput
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, auto_docstring
from transformers.utils.generic import can_return_tuple, merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from ..layers import (
    MASKED_SCORE,
    BertEmbeddings,
    BertOnlyMLMHead,
    BertPredictionHeadTransform,
    TransformedLinearHead,
    check_region_layout,
    flatten_choices,
    labelled_tokens,
    mask_region_features,
    one_hot,
    soft_score_loss,
    text_length,
    text_with_choice_axis,
)
from ..modeling_outputs import layer_records
from ..modeling_utils import BertMLMHeadMixin, SingleStreamPreTrainedModel, with_backbone_outputs
from .configuration_vl_bert import VlBertConfig

__all__ = [
    "VlBertPreTrainedModel",
    "VlBertModel",
    "VlBertForPreTraining",
    "VlBertForQuestionAnswering",
    "VlBertForReferringExpression",
    "VlBertForMultipleChoice",
    "VlBertModelOutput",
    "VlBertForPreTrainingOutput",
    "VlBertClassifierOutput",
    "VlBertMultipleChoiceOutput",
    "geometry_embedding",
]

# Per-example dimensions of the multiple-choice inputs as one input shared by every choice (`flatten_choices`).
_CHOICE_NDIMS = {
    "input_ids": 1,
    "attention_mask": 1,
    "token_type_ids": 1,
    "text_region_ids": 1,
    "inputs_embeds": 2,
    "region_features": 2,
    "region_locations": 2,
    "region_attention_mask": 1,
    "pixel_values": 3,
    "region_boxes": 2,
}


# ---------------------------------------------------------------------------------------------------- outputs
@auto_docstring
@dataclass
class VlBertModelOutput(BaseModelOutputWithPooling):
    r"""
    last_hidden_state (`torch.FloatTensor` of shape `(batch, text_length + num_regions + 1, hidden_size)`):
        The encoder's output, laid out `[text | objects | [END]]`.
    pooler_output (`torch.FloatTensor` of shape `(batch, hidden_size)`, *optional*):
        tanh(dense) of position 0; `None` without the pooler (the released pre-training, VQA and RefCOCO+ models
        have none).
    region_embeddings (`torch.FloatTensor` of shape `(batch, num_regions, hidden_size)`, *optional*):
        The visual feature embedding of every object (the original's `obj_reps`), before the visual LayerNorms;
        `None` without regions.
    """

    region_embeddings: torch.FloatTensor | None = None


@auto_docstring
@dataclass
@layer_records(VlBertModelOutput, "hidden_states", "attentions")
class VlBertForPreTrainingOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor` of shape `()`, *optional*):
        `mlm_loss + text_only_mlm_loss + mvrc_loss` (those computed).
    mlm_loss (`torch.FloatTensor` of shape `()`, *optional*):
        MLM with visual clues, cross-entropy over the labelled tokens of the rows that have regions.
    text_only_mlm_loss (`torch.FloatTensor` of shape `()`, *optional*):
        MLM over the labelled tokens of the text-only rows (the original's BooksCorpus/Wikipedia half of the batch).
    mvrc_loss (`torch.FloatTensor` of shape `()`, *optional*):
        Masked RoI classification with linguistic clues, soft cross-entropy against the detector's class
        distribution, averaged over the labelled objects.
    mlm_logits (`torch.FloatTensor`):
        `(num_labelled_tokens, vocab_size)` at the positions with a label >= 0, row-major over (example, position),
        when `labels` is given; `(batch, text_length, vocab_size)` otherwise.
    mvrc_logits (`torch.FloatTensor` of shape `(batch, num_regions, num_region_labels)`, *optional*):
        Detector-class logits of every object; `None` without regions.
    last_hidden_state (`torch.FloatTensor` of shape `(batch, text_length + num_regions + 1, hidden_size)`):
        The encoder's output, laid out `[text | objects | [END]]`.
    """

    loss: torch.FloatTensor | None = None
    mlm_loss: torch.FloatTensor | None = None
    text_only_mlm_loss: torch.FloatTensor | None = None
    mvrc_loss: torch.FloatTensor | None = None
    mlm_logits: torch.FloatTensor | None = None
    mvrc_logits: torch.FloatTensor | None = None
    last_hidden_state: torch.FloatTensor | None = None


@auto_docstring
@dataclass
@layer_records(VlBertModelOutput, "hidden_states", "attentions")
class VlBertClassifierOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor` of shape `()`, *optional*, returned when labels are given):
        The head's loss.
    logits (`torch.FloatTensor`):
        `(batch, num_labels)` VQA answer scores, or `(batch, num_regions)` referring expression scores (-10000 at
        padded objects).
    last_hidden_state (`torch.FloatTensor` of shape `(batch, text_length + num_regions + 1, hidden_size)`):
        The backbone's output, laid out `[text | objects | [END]]`.
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    last_hidden_state: torch.FloatTensor | None = None


@auto_docstring(
    custom_intro="""
    transformers' `MultipleChoiceModelOutput` plus the optional object classification of VCR.
    """
)
@dataclass
class VlBertMultipleChoiceOutput(MultipleChoiceModelOutput):
    r"""
    loss (`torch.FloatTensor` of shape `()`, *optional*, returned when labels are given):
        Binary cross-entropy of the choices against the one-hot answer, plus `region_loss` when its labels are
        given.
    logits (`torch.FloatTensor` of shape `(batch, num_choices)`):
        The score of each choice.
    hidden_states (`tuple(torch.FloatTensor)`, *optional*, returned with `output_hidden_states=True`):
        The embedding output and each layer's output, `(batch * num_choices, text_length + num_regions + 1,
        hidden_size)`.
    attentions (`tuple(torch.FloatTensor)`, *optional*, returned with `output_attentions=True`):
        Self-attention probabilities per layer, `(batch * num_choices, num_attention_heads, length, length)` (eager
        attention only).
    region_logits (`torch.FloatTensor` of shape `(batch, num_choices, num_regions, num_vcr_region_labels)`, *optional*):
        The COCO-class logits of every object (the original's `CNN_LOSS_TOP` head); `None` without that head.
    region_loss (`torch.FloatTensor` of shape `()`, *optional*):
        Cross-entropy of those logits over the real objects.
    """

    region_logits: torch.FloatTensor | None = None
    region_loss: torch.FloatTensor | None = None


# What auto_docstring does not know of VL-BERT's inputs, and VL-BERT's own reading of the text inputs.
_TEXT_ARGS = r"""
input_ids (`torch.LongTensor` of shape `(batch_size, text_length)`, *optional*):
    Word-piece ids laid out by the processor (`[CLS] q [SEP] [MASK] [SEP]` for VQA, `[CLS] text [SEP]` otherwise),
    right-padded.
attention_mask (`torch.Tensor` of shape `(batch_size, text_length)`, *optional*):
    1 for real tokens, 0 for padding. Defaults to all ones. Its row sums are the real text lengths that the object
    and [END] position ids are computed from.
token_type_ids (`torch.LongTensor` of shape `(batch_size, text_length)`, *optional*):
    0 for sentence A, 1 for sentence B (VQA's answer slot). Objects and [END] always take type 2.
inputs_embeds (`torch.FloatTensor` of shape `(batch_size, text_length, hidden_size)`, *optional*):
    Word embeddings to use instead of `input_ids` (the visual term, positions and types are still added).
"""
_REGION_ARGS = r"""
region_features (`torch.FloatTensor` of shape `(batch_size, num_regions, region_feature_dim)`, *optional*):
    Appearance features of the objects, object 0 being the whole image (the processor adds it); zero padded.
region_locations (`torch.FloatTensor` of shape `(batch_size, num_regions, 4)`, *optional*):
    `(x_center / W, y_center / H, width / W, height / H)` of every object box in the resized image (what the
    original's geometry embedding normalises). Required with `region_features`.
region_attention_mask (`torch.Tensor` of shape `(batch_size, num_regions)`, *optional*):
    1 for real objects, 0 for padding. A row without any real object is a text-only example (pre-training's text
    corpus), whose tokens take the learned text-only visual term.
text_region_ids (`torch.LongTensor` of shape `(batch_size, text_length)`, *optional*):
    Which object's visual embedding each token carries (VCR's grounded words); defaults to 0, the whole image.
pixel_values (`torch.FloatTensor` of shape `(batch_size, 3, height, width)`, *optional*):
    "e2e" models only (instead of `region_features`): the resized image, BGR, 0-255 minus the Caffe means, zero
    padded at the bottom/right.
region_boxes (`torch.FloatTensor` of shape `(batch_size, num_regions, 4)`, *optional*):
    "e2e" models only: every object's box `(x1, y1, x2, y2)` in `pixel_values`' pixels (object 0 = the whole
    image), for the RoIAlign.
"""
_INPUT_ARGS = _TEXT_ARGS + _REGION_ARGS
_REGION_MASKS_ARG = r"""
region_masks (`torch.BoolTensor` of shape `(batch_size, num_regions)`, *optional*):
    Objects masked for MVRC: their appearance feature and [IMG] embedding become the learned mask embeddings
    (needs `add_pretraining_embeddings=True`).
"""
_PRETRAINING_ARGS = r"""
region_masks (`torch.BoolTensor` of shape `(batch_size, num_regions)`, *optional*):
    Objects masked for MVRC (the original's `mvrc_ops == 1`).
labels (`torch.LongTensor` of shape `(batch_size, text_length)`, *optional*):
    MLM targets; negative labels (-100, or the original's -1) are ignored.
region_class_targets (`torch.FloatTensor` of shape `(batch_size, num_regions, num_region_labels)`, *optional*):
    MVRC targets: the detector's class distribution of every object chosen for MVRC, zeros elsewhere. As in the
    original, the labelled objects are the rows summing to 1 (± 0.1).
"""
_HEAD_LABELS_ARG = r"""
labels (`torch.FloatTensor`, *optional*):
    The head's targets. VQA (`VlBertForQuestionAnswering`): `(batch_size, num_labels)` soft answer scores in [0, 1];
    referring expressions (`VlBertForReferringExpression`): `(batch_size, num_regions)`, 1 for objects matching the
    expression, 0 otherwise (padded objects are ignored).
"""
_CHOICE_ARGS = r"""
input_ids (`torch.LongTensor` of shape `(batch_size, num_choices, text_length)`, *optional*):
    `[CLS] question [SEP] choice [SEP]` of each choice (question type 0, choice and its [SEP] type 1).
attention_mask (`torch.Tensor` of shape `(batch_size, num_choices, text_length)`, *optional*):
    1 for real tokens, 0 for padding.
token_type_ids (`torch.LongTensor` of shape `(batch_size, num_choices, text_length)`, *optional*):
    0 for the question, 1 for the choice and its [SEP].
text_region_ids (`torch.LongTensor` of shape `(batch_size, num_choices, text_length)`, *optional*):
    Which object's visual embedding each token carries (VCR's grounded words); defaults to 0, the whole image.
inputs_embeds (`torch.FloatTensor` of shape `(batch_size, num_choices, text_length, hidden_size)`, *optional*):
    Word embeddings to use instead of `input_ids`.
region_features (`torch.FloatTensor` of shape `(batch_size, [num_choices,] num_regions, region_feature_dim)`):
    Shared by every choice, or given per choice (likewise the other region inputs).
region_locations (`torch.FloatTensor` of shape `(batch_size, [num_choices,] num_regions, 4)`, *optional*):
    `(x_center / W, y_center / H, width / W, height / H)` of every object box.
region_attention_mask (`torch.Tensor` of shape `(batch_size, [num_choices,] num_regions)`, *optional*):
    1 for real objects, 0 for padding.
pixel_values (`torch.FloatTensor` of shape `(batch_size, [num_choices,] 3, height, width)`, *optional*):
    "e2e" models only: the resized image (see `VlBertModel`).
region_boxes (`torch.FloatTensor` of shape `(batch_size, [num_choices,] num_regions, 4)`, *optional*):
    "e2e" models only: every object's box in `pixel_values`' pixels.
labels (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
    Index of the right choice.
region_labels (`torch.LongTensor` of shape `(batch_size, [num_choices,] num_regions)`, *optional*):
    COCO class of every object (the whole image is class 0), for the object head; padded objects are ignored.
"""


# ---------------------------------------------------------------------------------------------------- embeddings
# The models that own the learned features of masked objects (`region_masks`).
_MASK_OWNERS = "the pre-training model (VlBertForPreTraining, or VlBertModel(config, add_pretraining_embeddings=True))"


def geometry_embedding(
    region_locations: torch.Tensor, dim: int = 256, scale: float = 100.0, wavelength: float = 1000.0
) -> torch.Tensor:
    """VL-BERT's box geometry embedding (`common/utils/bbox.py:coordinate_embeddings`), computed in float32.

    `region_locations` `(..., 4)` = `(xc/W, yc/H, w/W, h/H)` → `(..., 8 * dim)`: for each of the four values in turn,
    `dim` sines then `dim` cosines of `scale * value / wavelength ** (i / dim)`.
    """
    positions = region_locations.float() * scale
    frequencies = wavelength ** (torch.arange(dim, dtype=torch.float32, device=positions.device) / dim)
    angles = positions.unsqueeze(-1) / frequencies
    return torch.cat([angles.sin(), angles.cos()], dim=-1).flatten(-2)


def mask_box_pixels(pixel_values: torch.Tensor, region_boxes: torch.Tensor, region_masks: torch.Tensor) -> torch.Tensor:
    """The e2e release's MVRC masking: the pixels of every masked box (`[y1, y2] x [x1, x2]`, int-truncated, ends
    included) are set to 0 in the normalised image (the mean colour), before the CNN. Returns a new tensor."""
    masked = pixel_values.clone()
    for row, column in region_masks.nonzero().tolist():
        x1, y1, x2, y2 = (int(v) for v in region_boxes[row, column].tolist())
        masked[row, :, y1 : y2 + 1, x1 : x2 + 1] = 0
    return masked


class VlBertImageEncoder(nn.Module):
    """The e2e release's visual encoder: a Caffe-style ResNet (stride in the 1x1 convs, frozen BatchNorm, torchvision
    max-pool) up to res4 on the whole image, 14x14 RoIAlign of every box on res4 (stride 16, not pixel-aligned,
    one sample per bin), the dilated res5 (stride 1, dilation 2) and a 14x14 average pool: one appearance feature of
    `8 * backbone_res2_channels` (2048) values per box.

    The ResNet blocks are those of vlhub's bottom-up-attention detector (`vlhub.processing.detector.backbone`).
    """

    def __init__(self, config: VlBertConfig) -> None:
        super().__init__()
        from ...processing.detector.backbone import ResNetBackbone, make_stage
        from ...processing.detector.configuration import DetectorConfig

        backbone_config = DetectorConfig(
            depth=config.backbone_depth,
            width_per_group=config.backbone_width_per_group,
            stem_out_channels=config.backbone_stem_channels,
            res2_out_channels=config.backbone_res2_channels,
            stride_in_1x1=True,
            caffe_maxpool=False,
            res5_dilation=2,
        )
        self.resolution = config.roi_resolution
        self.sampling_ratio = config.roi_sampling_ratio
        self.backbone = ResNetBackbone(backbone_config)
        self.res5 = make_stage(
            3,
            backbone_config.res4_channels,
            backbone_config.width_per_group * 8,
            backbone_config.feature_dim,
            first_stride=1,
            config=backbone_config,
            dilation=2,
        )

    def forward(self, pixel_values: torch.Tensor, region_boxes: torch.Tensor) -> torch.Tensor:
        """pixel_values `(B, 3, H, W)` (BGR, mean-subtracted), region_boxes `(B, K, 4)` in its pixels → `(B, K, F)`."""
        from torchvision.ops import roi_align

        res4 = self.backbone(pixel_values)
        batch, num_regions = region_boxes.shape[:2]
        owners = torch.arange(batch, device=region_boxes.device).repeat_interleave(num_regions)
        rois = torch.cat([owners[:, None].to(res4.dtype), region_boxes.reshape(-1, 4).to(res4.dtype)], dim=1)
        pooled = roi_align(
            res4, rois, self.resolution, spatial_scale=1.0 / 16, sampling_ratio=self.sampling_ratio, aligned=False
        )
        return self.res5(pooled).mean(dim=(2, 3)).view(batch, num_regions, -1)


class VlBertVisualFeatureEmbedding(nn.Module):
    """The visual feature embedding of each object: `obj_downsample = Dropout, Linear(geometry + appearance → H), ReLU`
    on `[geometry embedding | appearance feature]` (geometry first, as the original concatenates them).

    With `add_mask_embedding=True` (pre-training) the appearance feature of a masked object (MVRC) is replaced by the
    learned `object_mask_visual_embedding`.
    """

    def __init__(self, config: VlBertConfig, add_mask_embedding: bool = False) -> None:
        super().__init__()
        self.config = config
        self.obj_downsample = nn.Sequential(
            nn.Dropout(config.image_feature_dropout), nn.Linear(config.region_input_dim, config.hidden_size), nn.ReLU()
        )
        # A parameter of this module (not an nn.Embedding child) so that `_init_weights` sees it and zeroes it.
        # Only "prec" models replace a masked object's feature; "e2e" ones mask its pixels instead.
        self.object_mask_visual_embedding = (
            nn.Parameter(torch.zeros(1, config.region_feature_dim))
            if add_mask_embedding and config.image_feature_precomputed
            else None
        )
        self.image_encoder = None if config.image_feature_precomputed else VlBertImageEncoder(config)

    def forward(
        self,
        region_features: torch.Tensor | None,
        region_locations: torch.Tensor,
        region_masks: torch.Tensor | None = None,
        pixel_values: torch.Tensor | None = None,
        region_boxes: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """region_features `(B, K, F)` (prec) or pixel_values `(B, 3, H, W)` with region_boxes `(B, K, 4)` (e2e),
        region_locations `(B, K, 4)`, region_masks `(B, K)` or None → `(B, K, H)`."""
        dtype = self.obj_downsample[1].weight.dtype
        if self.image_encoder is not None:
            pixels = pixel_values.to(dtype)
            if region_masks is not None:
                pixels = mask_box_pixels(pixels, region_boxes, region_masks.bool())
            region_features = self.image_encoder(pixels, region_boxes)
        region_features = region_features.to(dtype)
        if region_masks is not None and self.image_encoder is None:
            mask_features = (
                self.object_mask_visual_embedding[0] if self.object_mask_visual_embedding is not None else None
            )
            region_features = mask_region_features(region_features, region_masks, mask_features, _MASK_OWNERS)
        geometry = geometry_embedding(
            region_locations,
            self.config.geometry_embedding_dim,
            self.config.geometry_scale,
            self.config.geometry_wavelength,
        ).to(dtype)
        return self.obj_downsample(torch.cat([geometry, region_features], dim=-1))


class VlBertEmbeddings(BertEmbeddings):
    """BERT's word/position/type embeddings and LayerNorm, plus VL-BERT's: the [END] embedding, the [IMG] object
    embedding (`object_linguistic_embeddings`, one class-agnostic row), and the LayerNorms of the visual terms of text
    tokens (`visual_ln_text`) and objects (`visual_ln_object`).

    With `add_pretraining_embeddings=True`: the text-only visual term (`aux_text_visual_embedding`) and the linguistic
    embedding of masked objects (`object_mask_word_embedding`).
    """

    def __init__(self, config: VlBertConfig, add_pretraining_embeddings: bool = False) -> None:
        super().__init__(config)
        hidden = config.hidden_size
        self.end_embedding = nn.Embedding(1, hidden)
        self.object_linguistic_embeddings = nn.Embedding(1, hidden)
        self.visual_ln_text = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.visual_ln_object = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.aux_text_visual_embedding = nn.Embedding(1, hidden) if add_pretraining_embeddings else None
        self.object_mask_word_embedding = nn.Embedding(1, hidden) if add_pretraining_embeddings else None
        self.object_token_type_id = config.object_token_type_id

    def forward(
        self,
        word_embeddings: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor,
        text_visual: torch.Tensor | None,
        region_embeddings: torch.Tensor | None,
        region_attention_mask: torch.Tensor | None,
        region_masks: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeds `[text | objects | [END]]`.

        word_embeddings `(B, T, H)`; attention_mask, token_type_ids `(B, T)`; text_visual `(B, T, H)`, the visual term
        of every token (None: every row is text-only); region_embeddings `(B, K, H)` and region_attention_mask
        `(B, K)` (None without regions); region_masks `(B, K)` MVRC-masked objects. Returns the embeddings
        `(B, T + K + 1, H)` and the 2-D attention mask `(B, T + K + 1)`.
        """
        batch, text_length = word_embeddings.shape[:2]
        device = word_embeddings.device
        if region_attention_mask is not None:
            has_image = region_attention_mask.bool().any(dim=1)
        else:
            has_image = torch.zeros(batch, dtype=torch.bool, device=device)
        if self.aux_text_visual_embedding is not None:
            # Text-only rows (no real object) take the learned text-only visual term, as the original's text corpus.
            aux = self.aux_text_visual_embedding.weight[0].to(word_embeddings.dtype)
            text_visual = (
                aux.expand_as(word_embeddings)
                if text_visual is None
                else torch.where(has_image[:, None, None], text_visual, aux)
            )
        elif text_visual is None:
            raise ValueError(
                "VL-BERT needs regions: text-only input uses the text-only visual embedding, which only the "
                "pre-training model has (VlBertForPreTraining)"
            )
        pieces = [word_embeddings + self.visual_ln_text(text_visual)]
        masks = [attention_mask]
        types = [token_type_ids]
        text_lengths = attention_mask.sum(dim=1, keepdim=True)
        # Real text tokens are numbered 0..n-1 in order, whatever the padding side.
        positions = [(attention_mask.cumsum(dim=1) - 1).clamp(min=0)]
        if region_embeddings is not None:
            num_regions = region_embeddings.shape[1]
            linguistic = (
                self.object_linguistic_embeddings.weight[0].to(region_embeddings.dtype).expand_as(region_embeddings)
            )
            if region_masks is not None:
                if self.object_mask_word_embedding is None:
                    raise ValueError("region_masks need the pre-training model (VlBertForPreTraining)")
                mask_word = self.object_mask_word_embedding.weight[0].to(region_embeddings.dtype)
                linguistic = torch.where(region_masks.bool().unsqueeze(-1), mask_word, linguistic)
            pieces.append(linguistic + self.visual_ln_object(region_embeddings))
            masks.append(region_attention_mask)
            types.append(torch.full((batch, num_regions), self.object_token_type_id, dtype=torch.long, device=device))
            # Every object sits at the position right after the real text.
            positions.append(text_lengths.expand(batch, num_regions))
        pieces.append(self.end_embedding.weight[0].to(word_embeddings.dtype).expand(batch, 1, -1))
        masks.append(torch.ones(batch, 1, dtype=attention_mask.dtype, device=device))
        types.append(torch.full((batch, 1), self.object_token_type_id, dtype=torch.long, device=device))
        positions.append(text_lengths + 1)
        embeddings = super().forward(
            inputs_embeds=torch.cat(pieces, dim=1),
            token_type_ids=torch.cat(types, dim=1),
            position_ids=torch.cat(positions, dim=1).long(),
        )
        return embeddings, torch.cat([m.to(torch.long) for m in masks], dim=1)


class VlBertHeadTransform(nn.Module):
    """`dense` (H → H) then the activation, without LayerNorm: the original's `MVRCHeadTransform`, shared by the MVRC,
    RefCOCO+ and VCR object heads."""

    def __init__(self, config: VlBertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACT2FN[config.hidden_act]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(hidden_states))


class VlBertRegionClassificationHead(TransformedLinearHead):
    """MVRC: `transform` (dense + GELU, no LayerNorm) then `decoder` Linear(H, num_region_labels)."""

    def __init__(self, config: VlBertConfig) -> None:
        super().__init__(VlBertHeadTransform(config), config.hidden_size, config.num_region_labels)


# ---------------------------------------------------------------------------------------------------- base
class VlBertPreTrainedModel(SingleStreamPreTrainedModel):
    config: VlBertConfig
    base_model_prefix = "vl_bert"
    _region_feature_layers = ("visual_embeddings.obj_downsample.1",)
    _no_split_modules = ["VlBertEmbeddings", "VlBertVisualFeatureEmbedding", "BertLayer"]
    # Pre-training checkpoints carry embeddings only the pre-training model owns.
    _keys_to_ignore_on_load_unexpected = [
        r"embeddings\.aux_text_visual_embedding\.weight",
        r"embeddings\.object_mask_word_embedding\.weight",
        r"visual_embeddings\.object_mask_visual_embedding$",
    ]

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)  # BERT embeddings' buffers, MLM bias
        if isinstance(module, VlBertEmbeddings):
            # The visual terms start switched off (`visual_scale_*_init`), as in the original.
            init.constant_(module.visual_ln_text.weight, self.config.visual_scale_text_init)
            init.constant_(module.visual_ln_object.weight, self.config.visual_scale_object_init)
        elif isinstance(module, VlBertVisualFeatureEmbedding) and module.object_mask_visual_embedding is not None:
            init.zeros_(module.object_mask_visual_embedding)  # the original starts it at zero


def _check_image_inputs(config: VlBertConfig, region_features, pixel_values, region_boxes):
    """The image inputs a 'prec' VL-BERT (region_features) or an 'e2e' one (pixel_values and region_boxes)
    takes; apart from `_check_inputs` so that each stays one screen."""
    if config.image_feature_precomputed:
        if pixel_values is not None or region_boxes is not None:
            raise ValueError(
                "this is a 'prec' VL-BERT (precomputed region features): it takes region_features, not pixel_values "
                "/ region_boxes; extract regions first (a processor with a region extractor does) or use an 'e2e' model"
            )
    else:
        if region_features is not None:
            raise ValueError(
                "this is an 'e2e' VL-BERT: it computes every object's feature from pixel_values with its own ResNet, "
                "so it takes pixel_values and region_boxes, not precomputed region_features"
            )
        if (pixel_values is None) != (region_boxes is None):
            raise ValueError("an 'e2e' VL-BERT needs both pixel_values (batch, 3, H, W) and region_boxes (batch, K, 4)")
        if pixel_values is not None:
            if pixel_values.ndim != 4 or pixel_values.shape[1] != 3:
                raise ValueError(f"pixel_values must have shape (batch, 3, H, W), got {tuple(pixel_values.shape)}")
            if region_boxes.ndim != 3 or region_boxes.shape[-1] != 4 or region_boxes.shape[0] != pixel_values.shape[0]:
                raise ValueError(
                    f"region_boxes must have shape ({pixel_values.shape[0]}, num_regions, 4), "
                    f"got {tuple(region_boxes.shape)}"
                )


def _check_inputs(
    config: VlBertConfig,
    input_ids,
    inputs_embeds,
    region_features,
    region_locations,
    region_attention_mask,
    text_region_ids,
    pixel_values=None,
    region_boxes=None,
):
    if input_ids is not None and inputs_embeds is not None:
        raise ValueError("pass either input_ids or inputs_embeds, not both")
    text = input_ids if input_ids is not None else inputs_embeds
    if text is None:
        raise ValueError("VL-BERT needs text (input_ids or inputs_embeds); the objects are read alongside the text")
    # The objects take position n_text and [END] n_text + 1, so the text must leave two positions free.
    if text.shape[1] + 2 > config.max_position_embeddings:
        raise ValueError(
            f"text of length {text.shape[1]} leaves no position for the objects and [END] within the model's "
            f"{config.max_position_embeddings} position embeddings (at most {config.max_position_embeddings - 2} "
            "tokens); shorten it (the processor truncates to max_text_length)"
        )
    _check_image_inputs(config, region_features, pixel_values, region_boxes)
    regions = _regions(region_features, region_boxes)
    if regions is None:
        if region_locations is not None or region_attention_mask is not None:
            raise ValueError("region_locations / region_attention_mask were given without regions")
        return
    if region_features is not None and (
        region_features.ndim != 3 or region_features.shape[-1] != config.region_feature_dim
    ):
        hint = ""
        if region_features.ndim == 4 and region_features.shape[1] == 3:
            hint = (
                " — this looks like pixels; this model is a 'prec' VL-BERT and takes precomputed region features "
                "(run the images through the processor's region extractor)"
            )
        raise ValueError(
            f"region_features must have shape (batch, num_regions, {config.region_feature_dim}), "
            f"got {tuple(region_features.shape)}{hint}"
        )
    check_region_layout(regions, region_locations, region_attention_mask, location_dim=4)
    if text.shape[0] != regions.shape[0]:
        raise ValueError(f"text batch ({text.shape[0]}) and region batch ({regions.shape[0]}) differ in size")
    if text_region_ids is not None and tuple(text_region_ids.shape) != tuple(text.shape[:2]):
        raise ValueError(f"text_region_ids must have shape {tuple(text.shape[:2])}, got {tuple(text_region_ids.shape)}")


@auto_docstring(
    custom_intro="""
    The bare VL-BERT: embeddings of `[text | objects | [END]]`, a BERT encoder and (optionally) BERT's pooler.
    """
)
class VlBertModel(VlBertPreTrainedModel):
    def __init__(
        self, config: VlBertConfig, add_pooling_layer: bool | None = None, add_pretraining_embeddings: bool = False
    ) -> None:
        r"""
        add_pooling_layer (`bool`, *optional*):
            Build the pooler; defaults to `config.with_pooler` (false for the released pre-training, VQA and
            RefCOCO+ models).
        add_pretraining_embeddings (`bool`, defaults to `False`):
            Build the embeddings only pre-training uses: the text-only visual term and the masked-object embeddings
            (MVRC).
        """
        super().__init__(config)
        self.embeddings = VlBertEmbeddings(config, add_pretraining_embeddings=add_pretraining_embeddings)
        self.visual_embeddings = VlBertVisualFeatureEmbedding(config, add_mask_embedding=add_pretraining_embeddings)
        self._build_encoder(config, config.with_pooler if add_pooling_layer is None else add_pooling_layer)
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    @auto_docstring(custom_args=_INPUT_ARGS + _REGION_MASKS_ARG)
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        region_features: torch.FloatTensor | None = None,
        region_locations: torch.FloatTensor | None = None,
        region_attention_mask: torch.Tensor | None = None,
        region_masks: torch.Tensor | None = None,
        text_region_ids: torch.LongTensor | None = None,
        pixel_values: torch.FloatTensor | None = None,
        region_boxes: torch.FloatTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> VlBertModelOutput:
        r"""
        Returns:
            `VlBertModelOutput`: `last_hidden_state` `(batch_size, text_length + num_regions + 1, hidden_size)` laid
            out `[text | objects | [END]]`, `pooler_output` (or `None`) and the objects' `region_embeddings`.
        """
        _check_inputs(
            self.config,
            input_ids,
            inputs_embeds,
            region_features,
            region_locations,
            region_attention_mask,
            text_region_ids,
            pixel_values,
            region_boxes,
        )
        if inputs_embeds is None:
            inputs_embeds = self.embeddings.word_embeddings(input_ids)
        batch, text_length = inputs_embeds.shape[:2]
        device = inputs_embeds.device
        if attention_mask is None:
            attention_mask = torch.ones(batch, text_length, dtype=torch.long, device=device)
        if token_type_ids is None:
            token_type_ids = torch.zeros(batch, text_length, dtype=torch.long, device=device)
        region_embeddings = text_visual = None
        regions = _regions(region_features, region_boxes)
        if regions is not None:
            if region_attention_mask is None:
                region_attention_mask = torch.ones(regions.shape[:2], dtype=torch.long, device=device)
            region_embeddings = self.visual_embeddings(
                region_features, region_locations, region_masks, pixel_values=pixel_values, region_boxes=region_boxes
            )
            if text_region_ids is None:
                # Every token carries the whole image's visual embedding (object 0).
                text_visual = region_embeddings[:, :1].expand(-1, text_length, -1)
            else:
                index = text_region_ids.unsqueeze(-1).expand(-1, -1, region_embeddings.shape[-1])
                text_visual = region_embeddings.gather(1, index)
        elif region_masks is not None:
            raise ValueError("region_masks were given without regions")
        embedding_output, mask_2d = self.embeddings(
            inputs_embeds,
            attention_mask,
            token_type_ids,
            text_visual,
            region_embeddings,
            region_attention_mask,
            region_masks,
        )
        sequence_output, pooled_output = self._run_encoder(embedding_output, mask_2d, **kwargs)
        return VlBertModelOutput(
            last_hidden_state=sequence_output, pooler_output=pooled_output, region_embeddings=region_embeddings
        )


def _regions(region_features, region_boxes):
    """What says how many objects there are: the features (prec) or the boxes (e2e)."""
    return region_features if region_features is not None else region_boxes


def _require_regions(task: str, region_features, region_boxes) -> None:
    """A head that reads the objects refuses text-only input, naming the task (`"VQA needs"`, ...)."""
    if _regions(region_features, region_boxes) is None:
        raise ValueError(f"{task} the image's regions (region_features, or pixel_values and region_boxes)")


# ---------------------------------------------------------------------------------------------------- pre-training
@auto_docstring(
    custom_intro="""
    VL-BERT with its pre-training heads: masked language modelling with visual clues (`cls`, BERT's MLM head with
    the decoder tied to the word embeddings) and masked RoI classification with linguistic clues (`mvrc_head`, over
    the detector's 1601 classes). The backbone owns the text-only visual term and the masked-object embeddings.

    One batch may mix image-text rows and text-only rows (no real object): the original pre-trains on both, 1:1, and
    reports the MLM losses of the two kinds separately.
    """
)
class VlBertForPreTraining(BertMLMHeadMixin, VlBertPreTrainedModel):
    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "vl_bert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }
    _keys_to_ignore_on_load_unexpected = None

    def __init__(self, config: VlBertConfig) -> None:
        super().__init__(config)
        self.vl_bert = VlBertModel(config, add_pooling_layer=False, add_pretraining_embeddings=True)
        self.cls = BertOnlyMLMHead(config)
        self.mvrc_head = VlBertRegionClassificationHead(config)
        self.post_init()

    @can_return_tuple
    @auto_docstring(custom_args=_INPUT_ARGS + _PRETRAINING_ARGS)
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        region_features: torch.FloatTensor | None = None,
        region_locations: torch.FloatTensor | None = None,
        region_attention_mask: torch.Tensor | None = None,
        region_masks: torch.Tensor | None = None,
        text_region_ids: torch.LongTensor | None = None,
        pixel_values: torch.FloatTensor | None = None,
        region_boxes: torch.FloatTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        region_class_targets: torch.FloatTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> VlBertForPreTrainingOutput:
        r"""
        Returns:
            `VlBertForPreTrainingOutput` with `mlm_logits` (at the labelled tokens when `labels` is given, else
            `(batch_size, text_length, vocab_size)`) and `mvrc_logits` `(batch_size, num_regions, num_region_labels)`.
        """
        outputs = self.vl_bert(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            region_features=region_features,
            region_locations=region_locations,
            region_attention_mask=region_attention_mask,
            text_region_ids=text_region_ids,
            pixel_values=pixel_values,
            region_boxes=region_boxes,
            inputs_embeds=inputs_embeds,
            region_masks=region_masks,
            **kwargs,
        )
        sequence_output = outputs.last_hidden_state
        num_text = text_length(input_ids, inputs_embeds)
        has_regions = _regions(region_features, region_boxes) is not None
        mvrc_logits = self.mvrc_head(sequence_output[:, num_text:-1]) if has_regions else None
        if labels is not None:
            mlm_logits, losses = self._masked_language_modelling(
                sequence_output[:, :num_text], labels, region_attention_mask, has_regions
            )
        else:
            mlm_logits, losses = self.cls(sequence_output[:, :num_text]), {}
        if region_class_targets is not None:
            losses["mvrc_loss"] = _masked_region_classification_loss(mvrc_logits, region_class_targets)
        loss = sum(losses.values()) if losses else None
        return with_backbone_outputs(
            VlBertForPreTrainingOutput, outputs, loss=loss, **losses, mlm_logits=mlm_logits, mvrc_logits=mvrc_logits
        )

    def _masked_language_modelling(
        self, text_output, labels, region_attention_mask, has_regions: bool
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The MLM logits at the labelled tokens (row-major over (example, position)) and the losses of the
        image-text rows (`mlm_loss`) and of the text-only rows (`text_only_mlm_loss`)."""
        selected = labelled_tokens(labels, text_output)
        # Only the labelled tokens go through the vocabulary projection.
        mlm_logits = self.cls(text_output[selected])
        if region_attention_mask is not None:
            has_image = region_attention_mask.bool().any(dim=1)
        else:
            has_image = torch.full((labels.shape[0],), has_regions, device=labels.device)
        token_has_image = has_image.unsqueeze(1).expand_as(labels)[selected]
        per_token = F.cross_entropy(mlm_logits.float(), labels[selected], reduction="none")
        losses = {}
        for name, rows in (("mlm_loss", token_has_image), ("text_only_mlm_loss", ~token_has_image)):
            # Sum / count (not a mean over an empty set) so that a half without labels gives 0, not NaN.
            rows = rows.to(per_token.dtype)
            losses[name] = (per_token * rows).sum() / rows.sum().clamp(min=1)
        return mlm_logits, losses


def _load_pretrained_part(
    pretraining_state_dict: dict[str, torch.Tensor], prefix: str, module: nn.Module, module_prefix: str
) -> list[str]:
    """Loads the pre-training weights under `prefix` into `module` (strictly: every one of its parameters), the
    original's `PARTIAL_PRETRAIN_PREFIX_CHANGES`; returns their names in the head, under `module_prefix`."""
    state = {name[len(prefix) :]: value for name, value in pretraining_state_dict.items() if name.startswith(prefix)}
    module.load_state_dict(state)
    return [module_prefix + name for name in state]


def _masked_region_classification_loss(mvrc_logits, region_class_targets) -> torch.Tensor:
    """MVRC: cross-entropy against the detector's class distribution, over the labelled objects (the rows summing
    to 1 ± 0.1)."""
    if mvrc_logits is None:
        raise ValueError("region_class_targets need regions (region_features, or pixel_values and region_boxes)")
    if region_class_targets.shape != mvrc_logits.shape:
        raise ValueError(
            f"region_class_targets must have shape {tuple(mvrc_logits.shape)}, got {tuple(region_class_targets.shape)}"
        )
    targets = region_class_targets.float()
    labelled = ((targets.sum(-1) - 1).abs() < 0.1).float()
    per_object = -(F.log_softmax(mvrc_logits.float(), dim=-1) * targets).sum(-1)
    return (per_object * labelled).sum() / labelled.sum().clamp(min=1)


# ---------------------------------------------------------------------------------------------------- downstream
class _VlBertHead(VlBertPreTrainedModel):
    """A VL-BERT backbone plus a task head on single (text, image) examples (VQA, referring expressions). The forward
    is shared, as transformers' generic heads share theirs: the inputs go through the backbone (`self.vl_bert`,
    built by the head), then `_head` computes the task's loss and logits from its outputs."""

    # How the error for missing regions names the task ("VQA needs" regions).
    _task: str

    def _head(self, outputs: VlBertModelOutput, labels: torch.Tensor | None, inputs: dict) -> tuple:
        """The head's `(loss, logits)`; `inputs` are the backbone's inputs by name."""
        raise NotImplementedError

    @can_return_tuple
    @auto_docstring(custom_args=_INPUT_ARGS + _HEAD_LABELS_ARG)
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        region_features: torch.FloatTensor | None = None,
        region_locations: torch.FloatTensor | None = None,
        region_attention_mask: torch.Tensor | None = None,
        text_region_ids: torch.LongTensor | None = None,
        pixel_values: torch.FloatTensor | None = None,
        region_boxes: torch.FloatTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> VlBertClassifierOutput:
        r"""
        Returns:
            `VlBertClassifierOutput` with `logits` `(batch_size, num_labels)` (VQA) or `(batch_size, num_regions)`
            with -10000 at padded objects (referring expressions).
        """
        inputs = dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            region_features=region_features,
            region_locations=region_locations,
            region_attention_mask=region_attention_mask,
            text_region_ids=text_region_ids,
            pixel_values=pixel_values,
            region_boxes=region_boxes,
            inputs_embeds=inputs_embeds,
        )
        _require_regions(self._task, region_features, region_boxes)
        outputs = self.vl_bert(**inputs, **kwargs)
        loss, logits = self._head(outputs, labels, inputs)
        return with_backbone_outputs(VlBertClassifierOutput, outputs, loss=loss, logits=logits)


@auto_docstring(
    custom_intro="""
    VQA: the answer is read from the output of the [MASK] token of `[CLS] q [SEP] [MASK] [SEP]` through `vqa_head`
    (BERT's prediction-head transform — dense, GELU, LayerNorm — then dropout and Linear(H, num_answers)).

    `config.id2label` holds the answers (3129 in the original vocabulary). The loss is the original's: binary
    cross-entropy with logits against soft scores, averaged and multiplied by the number of answers.
    """
)
class VlBertForQuestionAnswering(_VlBertHead):
    _task = "VQA needs"

    def __init__(self, config: VlBertConfig) -> None:
        super().__init__(config)
        self.vl_bert = VlBertModel(config, add_pooling_layer=False)
        self.vqa_head = nn.Sequential(
            BertPredictionHeadTransform(config),
            nn.Dropout(config.classifier_dropout),
            nn.Linear(config.hidden_size, config.num_labels),
        )
        self.post_init()

    def initialize_from_pretraining(self, pretraining_state_dict: dict[str, torch.Tensor]) -> list[str]:
        """Start `vqa_head.0` from the pre-trained MLM transform, as the original's `PARTIAL_PRETRAIN_PREFIX_CHANGES`
        (`vlbert.mlm_head.predictions.transform -> final_mlp.0`). Returns the names it set."""
        return _load_pretrained_part(
            pretraining_state_dict, "cls.predictions.transform.", self.vqa_head[0], "vqa_head.0."
        )

    def answer_positions(
        self,
        input_ids: torch.LongTensor | None,
        attention_mask: torch.Tensor | None,
        inputs_embeds: torch.FloatTensor | None,
    ) -> torch.Tensor:
        """`(batch,)` position of the answer slot: the last `config.mask_token_id` ([MASK]) of each row; with
        `inputs_embeds`, the token before the last real one (the layout `... [MASK] [SEP]`, right-padded). A row of
        `input_ids` without [MASK] raises a `RuntimeError` naming the problem."""
        if input_ids is None:
            if attention_mask is None:
                return torch.full((inputs_embeds.shape[0],), inputs_embeds.shape[1] - 2, device=inputs_embeds.device)
            return attention_mask.sum(dim=1) - 2
        is_answer = input_ids == self.config.mask_token_id
        # Checked on the device (no host sync): a row without the slot would silently read another token.
        torch._assert_async(
            is_answer.any(dim=1).all(),
            f"every VQA input needs the answer slot [MASK] (id {self.config.mask_token_id}): lay the text out as "
            "[CLS] question [SEP] [MASK] [SEP] (VlBertProcessor(answer_slot=True) does)",
        )
        columns = torch.arange(input_ids.shape[1], device=input_ids.device)
        return torch.where(is_answer, columns, -1).argmax(dim=1)

    def _head(self, outputs: VlBertModelOutput, labels: torch.Tensor | None, inputs: dict) -> tuple:
        sequence_output = outputs.last_hidden_state
        positions = self.answer_positions(inputs["input_ids"], inputs["attention_mask"], inputs["inputs_embeds"])
        answer_states = sequence_output[torch.arange(sequence_output.shape[0], device=positions.device), positions]
        logits = self.vqa_head(answer_states)
        loss = soft_score_loss(logits, labels) if labels is not None else None
        return loss, logits


@auto_docstring(
    custom_intro="""
    RefCOCO+: `re_head` (dense + GELU, dropout, Linear(H, 1)) scores every object output, the whole image (object 0)
    included; the loss is binary cross-entropy over the real objects (target: IoU with the referred box > 0.5).
    """
)
class VlBertForReferringExpression(_VlBertHead):
    _task = "referring expressions need"

    def __init__(self, config: VlBertConfig) -> None:
        super().__init__(config)
        self.vl_bert = VlBertModel(config, add_pooling_layer=False)
        self.re_head = nn.Sequential(
            VlBertHeadTransform(config), nn.Dropout(config.classifier_dropout), nn.Linear(config.hidden_size, 1)
        )
        self.post_init()

    def initialize_from_pretraining(self, pretraining_state_dict: dict[str, torch.Tensor]) -> list[str]:
        """Start `re_head.0` from the pre-trained MVRC transform (the original's `mvrc_head.transform -> final_mlp.0`).
        Returns the names it set."""
        return _load_pretrained_part(pretraining_state_dict, "mvrc_head.transform.", self.re_head[0], "re_head.0.")

    def _head(self, outputs: VlBertModelOutput, labels: torch.Tensor | None, inputs: dict) -> tuple:
        num_text = text_length(inputs["input_ids"], inputs["inputs_embeds"])
        scores = self.re_head(outputs.last_hidden_state[:, num_text:-1]).squeeze(-1)
        region_attention_mask = inputs["region_attention_mask"]
        real = (
            region_attention_mask.bool()
            if region_attention_mask is not None
            else torch.ones_like(scores, dtype=torch.bool)
        )
        logits = scores.masked_fill(~real, MASKED_SCORE)
        loss = None
        if labels is not None:
            if labels.shape != scores.shape:
                raise ValueError(
                    f"labels must have shape (batch, num_regions) = {tuple(scores.shape)}, got {tuple(labels.shape)}"
                )
            loss = F.binary_cross_entropy_with_logits(scores.float()[real], labels.float()[real])
        return loss, logits


@auto_docstring(
    custom_intro="""
    VCR: each (question, choice) text is encoded with the image; `vcr_head` (dropout, Linear(H, 1)) scores the
    pooled [CLS] output and the loss is binary cross-entropy against the one-hot answer (the original's
    `CLASSIFIER_SIGMOID`). With `config.num_vcr_region_labels > 0`, `vcr_region_head` (dense + GELU, dropout,
    Linear(H, num_vcr_region_labels)) classifies every object (the original's `CNN_LOSS_TOP` auxiliary loss).
    The backbone always has the pooler (the original takes it from BERT; pre-training never trained one).
    """
)
class VlBertForMultipleChoice(VlBertPreTrainedModel):
    def __init__(self, config: VlBertConfig) -> None:
        super().__init__(config)
        self.vl_bert = VlBertModel(config, add_pooling_layer=True)
        self.vcr_head = nn.Sequential(nn.Dropout(config.classifier_dropout), nn.Linear(config.hidden_size, 1))
        self.vcr_region_head = (
            nn.Sequential(
                VlBertHeadTransform(config),
                nn.Dropout(0.0),
                nn.Linear(config.hidden_size, config.num_vcr_region_labels),
            )
            if config.num_vcr_region_labels > 0
            else None
        )
        self.post_init()

    @can_return_tuple
    @auto_docstring(custom_args=_CHOICE_ARGS)
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        region_features: torch.FloatTensor | None = None,
        region_locations: torch.FloatTensor | None = None,
        region_attention_mask: torch.Tensor | None = None,
        text_region_ids: torch.LongTensor | None = None,
        pixel_values: torch.FloatTensor | None = None,
        region_boxes: torch.FloatTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        region_labels: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> VlBertMultipleChoiceOutput:
        r"""
        Returns:
            `VlBertMultipleChoiceOutput` with `logits` `(batch_size, num_choices)`; `hidden_states` cover the
            `batch_size * num_choices` sequences.
        """
        text = text_with_choice_axis(input_ids, inputs_embeds)
        _require_regions("VCR needs", region_features, region_boxes)
        batch, choices = text.shape[:2]
        flat = flatten_choices(
            dict(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
                region_features=region_features,
                region_locations=region_locations,
                region_attention_mask=region_attention_mask,
                text_region_ids=text_region_ids,
                inputs_embeds=inputs_embeds,
                pixel_values=pixel_values,
                region_boxes=region_boxes,
            ),
            batch,
            choices,
            _CHOICE_NDIMS,
        )
        outputs = self.vl_bert(**flat, **kwargs)
        logits = self.vcr_head(outputs.pooler_output).view(batch, choices)
        losses = []
        if labels is not None:
            targets = one_hot(labels, choices).float()
            losses.append(F.binary_cross_entropy_with_logits(logits.float(), targets))
        region_logits = region_loss = None
        if self.vcr_region_head is not None:
            region_logits, region_loss = self._classify_objects(
                outputs.last_hidden_state[:, text.shape[2] : -1],
                batch,
                choices,
                region_labels,
                flat["region_attention_mask"],
            )
            if region_loss is not None:
                losses.append(region_loss)
        return VlBertMultipleChoiceOutput(
            loss=sum(losses) if losses else None,
            logits=logits,
            region_logits=region_logits,
            region_loss=region_loss,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )

    def _classify_objects(self, object_states, batch: int, choices: int, region_labels, region_attention_mask):
        """The object head (the original's `CNN_LOSS_TOP`): class logits `(batch, choices, num_regions,
        num_vcr_region_labels)` and, with `region_labels`, their cross-entropy over the real objects."""
        region_logits = self.vcr_region_head(object_states)
        region_logits = region_logits.view(batch, choices, *region_logits.shape[1:])
        if region_labels is None:
            return region_logits, None
        region_labels = flatten_choices({"region_labels": region_labels}, batch, choices, {"region_labels": 1})
        region_labels = region_labels["region_labels"].view(batch, choices, -1)
        if region_attention_mask is None:
            real = torch.ones_like(region_labels, dtype=torch.bool)
        else:
            real = region_attention_mask.view_as(region_labels).bool()
        return region_logits, F.cross_entropy(region_logits.float()[real], region_labels[real])
