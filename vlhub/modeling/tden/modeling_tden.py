"""PyTorch TDEN: a two-stream decoupled encoder-decoder over region features and text (X-modaler's release).

Faithful to X-modaler (`meta_arch/tden.py`, `encoder/two_stream_bert_encoder.py`, `decoder/decouple_bert_decoder.py`):

- embeddings: `LayerNorm(word + position + type)` (eps 1e-5, three token types) for the text and
  `LayerNorm(Linear(features) + Linear(5-d location))` (eps 1e-5) for the regions, [IMG] (mean feature, location
  `[0, 0, 1, 1, 1]`) being the processor's row 0;
- the *object encoder* (`visual_encoder`, BERT layers over the regions) and the *sentence encoder* (`encoder`, BERT
  layers over the text). The sentence encoder is shared by two text streams: the *understanding* stream
  (`input_ids`, bidirectional, token type 0) and the *generation* stream (`decoder_input_ids`, causal, token type 1);
- the *cross-modal encoder* (`cross_encoder`, `layers_tden.CrossModalLayer`: one attention over [visual | text], one
  feed-forward per modality) on the understanding stream;
- the *decoder* (`decoder`, causal self-attention + cross-attention to the visual tokens + feed-forward) on the
  generation stream. It cross-attends to the cross-modal encoder's last visual output when that encoder runs
  (pre-training, VQA; `config.decoder_attends_fused_visual`) and to the object encoder's output otherwise
  (captioning).

Attention runs in transformers' BERT attention modules (`BertAttention`, through the attention interface), so
`attn_implementation` ("eager" | "sdpa" | ...) is a config choice and `set_attn_implementation` switches an
instantiated model. The generation stream keeps a key/value `Cache` (`EncoderDecoderCache`) over both the sentence
encoder and the decoder, so incremental decoding recomputes nothing. Keep attention-like classes out of this file
(transformers scans it to decide whether the backend may be switched; see `layers.AttentionPooling`).
"""

import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple, Self

# Import transformers' Auto-model module before BERT's: its import registers every vlhub architecture, which imports
# their modeling files, which import BERT; BERT must not be half-imported at that moment.
import transformers.models.auto.modeling_auto  # noqa: F401  isort: skip
import torch
from torch import nn
from torch.nn import functional as F
from transformers import GenerationMixin
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import CausalLMOutputWithPast, ModelOutput
from transformers.models.bert.modeling_bert import (
    BertAttention,
    BertIntermediate,
    BertOutput,
    BertPredictionHeadTransform,
    BertSelfAttention,
)
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, auto_docstring
from transformers.utils.generic import can_return_tuple, merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from ..layers import (
    MASKED_SCORE,
    BertEmbeddings,
    BertLayer,
    LocatedRegionEmbeddings,
    RegionClassificationHead,
    TransformedLinearHead,
    check_region_inputs,
    extended_attention_mask,
    flatten_choices,
    gather_masked,
    same_pair_mask,
    soft_score_loss,
    text_with_choice_axis,
)
from ..modeling_outputs import layer_records, passed_records
from ..modeling_utils import (
    SharedPrefillMixin,
    VisionLanguagePreTrainedModel,
    recording_flags,
    reorders_within_groups,
    selects_whole_groups,
)
from ...utils.compat import CACHE_NAME, accepts_past_key_values, cache_argument
from .configuration_tden import TdenConfig
from .generation_tden import beam_search
from .layers_tden import CrossModalLayer

__all__ = [
    "TdenPreTrainedModel",
    "TdenModel",
    "TdenForPreTraining",
    "TdenForConditionalGeneration",
    "TdenForQuestionAnswering",
    "TdenForImageTextRetrieval",
    "TdenForMultipleChoice",
    "TdenModelOutput",
    "TdenForPreTrainingOutput",
    "TdenCaptioningOutput",
    "TdenBeamSearchOutput",
    "TdenBeamCache",
    "TdenQuestionAnsweringOutput",
    "TdenRetrievalOutput",
    "TdenMultipleChoiceOutput",
    "batch_hardest_triplet_loss",
]


# ---------------------------------------------------------------------------------------------------- outputs
@auto_docstring
@dataclass
class TdenModelOutput(ModelOutput):
    r"""
    language_output (`torch.FloatTensor` of shape `(batch, text_length, hidden_size)`, *optional*):
        The understanding stream's final states: the cross-modal encoder's text output, or the sentence encoder's
        when there is no cross-modal encoder. `None` without `input_ids`.
    vision_output (`torch.FloatTensor` of shape `(batch, num_regions, hidden_size)`):
        The final visual states: the cross-modal encoder's visual output when it ran, else the object encoder's last
        layer.
    decoder_output (`torch.FloatTensor` of shape `(batch, generation_length, hidden_size)`, *optional*):
        The decoder's last layer (`None` when the decoder did not run).
    sentence_encoder_output (`torch.FloatTensor` of shape `(batch, text_length, hidden_size)`):
        The last sentence-encoder layer over the understanding stream (what image-sentence matching pools).
    object_encoder_layers (`tuple(torch.FloatTensor)`):
        Every object-encoder layer's output, each `(batch, num_regions, hidden_size)` (image-sentence matching pools
        all of them).
    cross_encoder_vision_layers (`tuple(torch.FloatTensor)`):
        Every cross-modal layer's visual output, each `(batch, num_regions, hidden_size)` (the VQA head pools all of
        them).
    cache (`Cache`, *optional*, returned with `use_cache=True`):
        The generation stream's keys and values (sentence encoder and decoder), named as transformers 5.24 names it,
        on every supported transformers version.
    hidden_states (`tuple(torch.FloatTensor)`, *optional*, returned with `output_hidden_states=True`):
        The sentence encoder over the understanding stream (or over the generation stream when there is no
        understanding stream): the embeddings and one entry per layer, each `(batch, length, hidden_size)`.
    attentions (`tuple(torch.FloatTensor)`, *optional*, returned with `output_attentions=True`):
        The sentence encoder's self-attention per layer, `(batch, num_attention_heads, length, length)`.
    generation_hidden_states (`tuple(torch.FloatTensor)`, *optional*, returned with `output_hidden_states=True`):
        As `hidden_states`, over the generation stream when both streams ran (pre-training).
    generation_attentions (`tuple(torch.FloatTensor)`, *optional*, returned with `output_attentions=True`):
        As `attentions`, over the generation stream when both streams ran (pre-training).
    vision_hidden_states (`tuple(torch.FloatTensor)`, *optional*, returned with `output_hidden_states=True`):
        The region embeddings and each object-encoder layer's output, `(batch, num_regions, hidden_size)`.
    vision_attentions (`tuple(torch.FloatTensor)`, *optional*, returned with `output_attentions=True`):
        The object encoder's self-attention per layer, `(batch, num_attention_heads, num_regions, num_regions)`.
    cross_encoder_hidden_states (`tuple(torch.FloatTensor)`, *optional*, returned with `output_hidden_states=True`):
        Per cross-modal layer, `[visual | text]` `(batch, num_regions + text_length, hidden_size)`.
    cross_encoder_attentions (`tuple(torch.FloatTensor)`, *optional*, returned with `output_attentions=True`):
        Per cross-modal layer, the attention over the same concatenation, `(batch, num_attention_heads,
        num_regions + text_length, num_regions + text_length)`.
    decoder_hidden_states (`tuple(torch.FloatTensor)`, *optional*, returned with `output_hidden_states=True`):
        The decoder's input and one entry per decoder layer, each `(batch, generation_length, hidden_size)`.
    decoder_attentions (`tuple(torch.FloatTensor)`, *optional*, returned with `output_attentions=True`):
        The decoder's self-attention per layer, `(batch, num_attention_heads, generation_length, past + length)`.
    decoder_cross_attentions (`tuple(torch.FloatTensor)`, *optional*, returned with `output_attentions=True`):
        The decoder's attention over the visual tokens per layer, `(batch, num_attention_heads, generation_length,
        num_regions)`.
    """

    language_output: torch.FloatTensor | None = None
    vision_output: torch.FloatTensor | None = None
    decoder_output: torch.FloatTensor | None = None
    sentence_encoder_output: torch.FloatTensor | None = None
    object_encoder_layers: tuple[torch.FloatTensor, ...] | None = None
    cross_encoder_vision_layers: tuple[torch.FloatTensor, ...] | None = None
    cache: Cache | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    generation_hidden_states: tuple[torch.FloatTensor, ...] | None = None
    generation_attentions: tuple[torch.FloatTensor, ...] | None = None
    vision_hidden_states: tuple[torch.FloatTensor, ...] | None = None
    vision_attentions: tuple[torch.FloatTensor, ...] | None = None
    cross_encoder_hidden_states: tuple[torch.FloatTensor, ...] | None = None
    cross_encoder_attentions: tuple[torch.FloatTensor, ...] | None = None
    decoder_hidden_states: tuple[torch.FloatTensor, ...] | None = None
    decoder_attentions: tuple[torch.FloatTensor, ...] | None = None
    decoder_cross_attentions: tuple[torch.FloatTensor, ...] | None = None


# The per-layer records of each stream (`TdenModelOutput` documents them): a head passes on those of the streams it
# runs.
_SENTENCE_RECORDS = ("hidden_states", "attentions")
_GENERATION_RECORDS = ("generation_hidden_states", "generation_attentions")
_OBJECT_RECORDS = ("vision_hidden_states", "vision_attentions")
_CROSS_RECORDS = ("cross_encoder_hidden_states", "cross_encoder_attentions")
_DECODER_RECORDS = ("decoder_hidden_states", "decoder_attentions", "decoder_cross_attentions")


@auto_docstring
@dataclass
@layer_records(
    TdenModelOutput, *_SENTENCE_RECORDS, *_GENERATION_RECORDS, *_OBJECT_RECORDS, *_CROSS_RECORDS, *_DECODER_RECORDS
)
class TdenForPreTrainingOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor` of shape `()`, *optional*):
        Sum of the objective losses computed (all weights 1, as the original).
    mlm_loss (`torch.FloatTensor` of shape `()`, *optional*):
        Masked language modelling, when `labels` are given.
    moc_loss (`torch.FloatTensor` of shape `()`, *optional*):
        Masked object classification, when `masked_regions` and `region_class_targets` are given.
    msg_loss (`torch.FloatTensor` of shape `()`, *optional*):
        Masked sentence generation, when `decoder_labels` are given.
    ism_loss (`torch.FloatTensor` of shape `()`, *optional*):
        Image-sentence matching (in training mode, or with `image_ids`).
    mlm_logits (`torch.FloatTensor` of shape `(batch, text_length, vocab_size)`):
        The LM head on the cross-modal encoder's text output (understanding stream).
    msg_logits (`torch.FloatTensor` of shape `(batch, generation_length, vocab_size)`, *optional*):
        The same LM head on the decoder output (generation stream).
    moc_logits (`torch.FloatTensor` of shape `(batch, num_regions, num_region_labels)`):
        Object classes of every visual token (index 0 is [IMG]).
    similarity (`torch.FloatTensor` of shape `(batch, batch)`, *optional*):
        `[sentence i, image j]` cosine similarity.
    text_embeds (`torch.FloatTensor` of shape `(batch, similarity_pooler_size)`, *optional*):
        The L2-normalised sentence vectors of image-sentence matching.
    image_embeds (`torch.FloatTensor` of shape `(batch, similarity_pooler_size)`, *optional*):
        The L2-normalised image vectors of image-sentence matching.
    """

    loss: torch.FloatTensor | None = None
    mlm_loss: torch.FloatTensor | None = None
    moc_loss: torch.FloatTensor | None = None
    msg_loss: torch.FloatTensor | None = None
    ism_loss: torch.FloatTensor | None = None
    mlm_logits: torch.FloatTensor | None = None
    msg_logits: torch.FloatTensor | None = None
    moc_logits: torch.FloatTensor | None = None
    similarity: torch.FloatTensor | None = None
    text_embeds: torch.FloatTensor | None = None
    image_embeds: torch.FloatTensor | None = None


@auto_docstring(
    custom_intro="""
    transformers' `CausalLMOutputWithPast` (what `generate()` reads) plus the per-layer records of the decoder and
    the object encoder (the object encoder's are `None` at the decoding steps that reuse the cached regions).
    """
)
@dataclass
@layer_records(
    TdenModelOutput,
    "decoder_hidden_states",
    "vision_hidden_states",
    "vision_attentions",
    "decoder_attentions",
    "decoder_cross_attentions",
)
class TdenCaptioningOutput(CausalLMOutputWithPast):
    r"""
    loss (`torch.FloatTensor` of shape `()`, *optional*, returned when `labels` are given):
        Cross-entropy of the next-token predictions.
    logits (`torch.FloatTensor` of shape `(batch, length, vocab_size)`):
        Next-token scores at every position (the last `logits_to_keep` positions when it is set).
    cache (`Cache`, *optional*, returned with `use_cache=True`):
        Keys and values of the sentence encoder and decoder (generation stream); `past_key_values` before
        transformers 5.24.
    hidden_states (`tuple(torch.FloatTensor)`, *optional*, returned with `output_hidden_states=True`):
        The sentence encoder over the caption tokens: the embeddings and one entry per layer, each
        `(batch, length, hidden_size)`.
    attentions (`tuple(torch.FloatTensor)`, *optional*, returned with `output_attentions=True`):
        The sentence encoder's self-attention per layer, `(batch, num_attention_heads, length, past + length)`.
    """


@auto_docstring
@dataclass
class TdenBeamSearchOutput(ModelOutput):
    r"""
    sequences (`torch.LongTensor` of shape `(batch, num_return_sequences, max_new_tokens)`):
        The generated words (without the start token), best beam first; 0 after [SEP], as X-modaler writes them.
    sequences_scores (`torch.FloatTensor` of shape `(batch, num_return_sequences)`):
        Each beam's summed log-probs.
    token_scores (`torch.FloatTensor` of shape `(batch, num_return_sequences, max_new_tokens)`):
        The log-prob of each word (0 after [SEP]); a row sums to its `sequences_scores`.
    """

    sequences: torch.LongTensor | None = None
    sequences_scores: torch.FloatTensor | None = None
    token_scores: torch.FloatTensor | None = None


@auto_docstring
@dataclass
@layer_records(TdenModelOutput, *_SENTENCE_RECORDS, *_OBJECT_RECORDS, *_CROSS_RECORDS, *_DECODER_RECORDS)
class TdenQuestionAnsweringOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor` of shape `()`, *optional*, returned when `labels` are given):
        Binary cross-entropy (mean × number of answers) on both heads' logits, summed.
    logits (`torch.FloatTensor` of shape `(batch, num_labels)`):
        `softmax(understanding_logits) + softmax(generation_logits)` — the original's eval score; its argmax is the
        answer.
    understanding_logits (`torch.FloatTensor` of shape `(batch, num_labels)`):
        The cross-modal encoder branch.
    generation_logits (`torch.FloatTensor` of shape `(batch, num_labels)`, *optional*):
        The decoder branch (`None` without a decoder).
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    understanding_logits: torch.FloatTensor | None = None
    generation_logits: torch.FloatTensor | None = None


@auto_docstring
@dataclass
@layer_records(TdenModelOutput, *_SENTENCE_RECORDS, *_OBJECT_RECORDS)
class TdenRetrievalOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor` of shape `()`, *optional*, returned with `return_loss=True`):
        Hardest-negative bidirectional triplet loss over the in-batch similarity matrix, divided by the batch size
        (the original's `BatchTriplet`).
    logits (`torch.FloatTensor` of shape `(batch, 1)`):
        The cosine similarity of each given (sentence, image) pair.
    logits_per_text (`torch.FloatTensor` of shape `(batch, batch)`):
        `[sentence i, image j]` cosine similarity of every sentence against every image of the batch (its diagonal
        is `logits`).
    logits_per_image (`torch.FloatTensor` of shape `(batch, batch)`):
        The transpose of `logits_per_text`.
    text_embeds (`torch.FloatTensor` of shape `(batch, similarity_pooler_size)`):
        L2-normalised sentence vectors.
    image_embeds (`torch.FloatTensor` of shape `(batch, similarity_pooler_size)`):
        L2-normalised image vectors.
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    logits_per_text: torch.FloatTensor | None = None
    logits_per_image: torch.FloatTensor | None = None
    text_embeds: torch.FloatTensor | None = None
    image_embeds: torch.FloatTensor | None = None


@auto_docstring
@dataclass
@layer_records(
    TdenModelOutput,
    *_SENTENCE_RECORDS,
    *_OBJECT_RECORDS,
    *_CROSS_RECORDS,
    *_DECODER_RECORDS,
    note=", one row per (example, choice)",
)
class TdenMultipleChoiceOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor` of shape `()`, *optional*, returned when `labels` are given):
        Cross-entropy over the choices.
    logits (`torch.FloatTensor` of shape `(batch, num_choices)`):
        One score per choice.
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None


# What auto_docstring does not know of TDEN's inputs, or knows only in general terms.
_TEXT_ARGS = r"""
input_ids (`torch.LongTensor` of shape `(batch_size, text_length)`, *optional*):
    Understanding stream: `[CLS] w [SEP]` word pieces, then padding.
attention_mask (`torch.Tensor` of shape `(batch_size, text_length)`, *optional*):
    1 = real token.
token_type_ids (`torch.LongTensor` of shape `(batch_size, text_length)`, *optional*):
    Defaults to `config.understanding_token_type_id` (0); VCR gives its answer tokens type 1.
inputs_embeds (`torch.FloatTensor` of shape `(batch_size, text_length, hidden_size)`, *optional*):
    Word embeddings instead of `input_ids`.
"""
_POSITION_ARG = r"""
position_ids (`torch.LongTensor` of shape `(batch_size or 1, text_length)`, *optional*):
    Defaults to `0..text_length-1`.
"""
_REGION_ARGS = r"""
region_features (`torch.FloatTensor` of shape `(batch_size, num_regions, region_feature_dim)`):
    Row 0 is [IMG] (the mean feature), then the regions, zero padded (the processor's output).
region_locations (`torch.FloatTensor` of shape `(batch_size, num_regions, 5)`):
    `[x1/W, y1/H, x2/W, y2/H, area/(W*H)]`; [IMG] has `[0, 0, 1, 1, 1]`.
region_attention_mask (`torch.Tensor` of shape `(batch_size, num_regions)`, *optional*):
    1 = real (incl. [IMG]).
"""
_GENERATION_ARGS = r"""
decoder_input_ids (`torch.LongTensor` of shape `(batch_size, generation_length)`, *optional*):
    Generation stream (run causally through the sentence encoder, then the decoder): a caption prefix `[CLS] w1 ...`
    (no [SEP]), or pre-training's masked sentence.
decoder_attention_mask (`torch.Tensor` of shape `(batch_size, past + generation_length)`, *optional*):
    1 = real token.
decoder_token_type_ids (`torch.LongTensor` of shape `(batch_size, generation_length)`, *optional*):
    Defaults to `config.generation_token_type_id`.
decoder_position_ids (`torch.LongTensor` of shape `(batch_size or 1, generation_length)`, *optional*):
    Defaults to `past..past+generation_length-1`.
decoder_inputs_embeds (`torch.FloatTensor` of shape `(batch_size, generation_length, hidden_size)`, *optional*):
    Word embeddings instead of `decoder_input_ids`.
"""
_CACHE_ARGS = r"""
cache (`Cache`, *optional*):
    An `EncoderDecoderCache` of earlier generation steps (also accepted as `past_key_values`, its name before
    transformers 5.24). Once its decoder cross-attention holds the visual keys, the object encoder is not run again
    (the regions may then be omitted).
use_cache (`bool`, *optional*, defaults to `config.use_cache`):
    Keep (and return) the generation stream's cache, made when none is given.
"""
_PRETRAINING_ARGS = r"""
decoder_input_ids (`torch.LongTensor` of shape `(batch_size, text_length)`, *optional*):
    The generation stream (the original feeds the same masked sentence; type 1). Its attention mask is
    `attention_mask` (the same sentence).
decoder_token_type_ids (`torch.LongTensor` of shape `(batch_size, text_length)`, *optional*):
    Defaults to `config.generation_token_type_id`.
decoder_inputs_embeds (`torch.FloatTensor` of shape `(batch_size, text_length, hidden_size)`, *optional*):
    Word embeddings instead of `decoder_input_ids`.
labels (`torch.LongTensor` of shape `(batch_size, text_length)`, *optional*):
    MLM targets; negative values (-1, -100) are ignored.
decoder_labels (`torch.LongTensor` of shape `(batch_size, text_length)`, *optional*):
    MSG targets, the clean sentence shifted left by one; negative values are ignored.
masked_regions (`torch.BoolTensor` of shape `(batch_size, num_regions)`, *optional*):
    Visual tokens whose detector classes are predicted (never [IMG]); their features were zeroed by the data
    pipeline.
region_class_targets (`torch.FloatTensor` of shape `(num_masked_regions, num_region_labels)`, *optional*):
    Detector class distributions of the masked regions, row-major over (example, region).
image_ids (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
    Pairs of the same image are not negatives in the matching loss.
compute_similarity (`bool`, defaults to `True`):
    Image-sentence matching (the original's second scheduled-sampling pass skips it). Its loss is computed in
    training mode, or with `image_ids`.
"""
_CAPTION_ARGS = r"""
input_ids (`torch.LongTensor` of shape `(batch_size, length)`):
    The caption prefix `[CLS] w1 ... wn` (captioning inputs have no [SEP]); with a cache, only the new tokens.
attention_mask (`torch.Tensor` of shape `(batch_size, past + length)`, *optional*):
    1 = real token.
token_type_ids (`torch.LongTensor` of shape `(batch_size, length)`, *optional*):
    Defaults to the generation type (1).
position_ids (`torch.LongTensor` of shape `(batch_size or 1, length)`, *optional*):
    Defaults to `past..past+length-1`.
inputs_embeds (`torch.FloatTensor` of shape `(batch_size, length, hidden_size)`, *optional*):
    Word embeddings instead of `input_ids`.
labels (`torch.LongTensor` of shape `(batch_size, length)`, *optional*):
    The next word at every position (`w1 ... wn [SEP]`, the original's targets); negative values are ignored.
shift_labels (`torch.LongTensor` of shape `(batch_size, length)`, *optional*):
    Targets already aligned with the logits, as transformers' causal LMs take them under sequence or context
    parallelism (the trainer shifts the whole sequence before sharding it): they replace `labels` in the loss.
logits_to_keep (`int`, defaults to 0):
    Compute the logits of the last `logits_to_keep` positions only (0 = all).
"""
_ANSWER_LABELS_ARG = r"""
labels (`torch.FloatTensor` of shape `(batch_size, num_labels)`, *optional*):
    Soft answer scores; the loss is the original's BCE-with-logits (mean × num_labels, `layers.soft_score_loss`, the
    same as the other architectures' VQA loss) on each branch, summed.
"""
_RETRIEVAL_ARGS = r"""
image_ids (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
    Pairs of the same image are not negatives in the loss.
return_loss (`bool`, *optional*):
    Compute the hardest-negative triplet loss (default: in training mode).
"""
_CHOICE_ARGS = r"""
input_ids (`torch.LongTensor` of shape `(batch_size, num_choices, text_length)`):
    The (question, choice) pairs `[CLS] q [SEP] a [SEP]`.
attention_mask (`torch.Tensor` of shape `(batch_size, num_choices, text_length)`, *optional*):
    1 = real token.
token_type_ids (`torch.LongTensor` of shape `(batch_size, num_choices, text_length)`, *optional*):
    0 for the question, 1 for the choice.
inputs_embeds (`torch.FloatTensor` of shape `(batch_size, num_choices, text_length, hidden_size)`, *optional*):
    Word embeddings instead of `input_ids`.
labels (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
    Index of the right choice.
"""


# ---------------------------------------------------------------------------------------------------- cache
class TdenBeamCache(EncoderDecoderCache):
    """transformers' `EncoderDecoderCache` (self-attention of the sentence encoder and the decoder, cross-attention
    keys and values of the regions) that knows when its cross-attention rows come in groups of identical copies: the
    beams of one image, made by `batch_repeat_interleave(k)` from one row per image. A beam reorder that keeps every
    row inside its group then leaves the cross-attention rows as they are (reordering them would copy every region's
    keys and values of every decoder layer at each step, to the same values). A selection of whole groups (images
    leaving a batch with all their beams) keeps the others as groups; any other reorder or selection moves both caches
    as `EncoderDecoderCache` does and forgets the groups. `generate()` and `xmodaler_beam_search` use it."""

    def __init__(self, *caches: DynamicCache) -> None:
        super().__init__(*(caches or (DynamicCache(), DynamicCache())))
        self.cross_attention_copies = 1

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self.cross_attention_copies *= repeats

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        whole = selects_whole_groups(indices, self.cross_attention_copies)
        super().batch_select_indices(indices)
        if not whole:
            self.cross_attention_copies = 1

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if reorders_within_groups(beam_idx, self.cross_attention_copies):
            self.self_attention_cache.reorder_cache(beam_idx)
            return
        super().reorder_cache(beam_idx)
        self.cross_attention_copies = 1


# ---------------------------------------------------------------------------------------------------- blocks
class TdenEmbeddings(BertEmbeddings):
    """BERT's text embeddings (word + position + type, LayerNorm, dropout) with the original's plain
    `nn.LayerNorm` eps (`config.embedding_layer_norm_eps`, 1e-5) and three token types."""

    def __init__(self, config: TdenConfig) -> None:
        super().__init__(config)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.embedding_layer_norm_eps)


class TdenRegionEmbeddings(LocatedRegionEmbeddings):
    """X-modaler's `VisualBaseEmbedding` (the location is added *before* the LayerNorm, eps 1e-5), under its
    parameter names `feature_embeddings` / `location_embeddings`. Locations are `(B, R, 5)`."""

    def __init__(self, config: TdenConfig) -> None:
        super().__init__(
            config.region_feature_dim,
            config.region_location_dim,
            config.hidden_size,
            config.embedding_layer_norm_eps,
            config.hidden_dropout_prob,
        )


class TdenLayerStack(nn.Module):
    """A stack of layers under the attribute `layer` (parameter names `<stack>.layer.N.*`, as BERT's encoder)."""

    def __init__(self, layers: Iterable[nn.Module]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(layers)


class TdenDecoderLayer(GradientCheckpointingLayer):
    """X-modaler's `BertGenerationLayer`: self-attention (causal during generation), cross-attention whose keys and
    values are the visual tokens, then BERT's feed-forward; each with dense + residual + LayerNorm. Built from
    transformers' BERT modules, so the attention backend and the key/value `Cache` (self-attention keys grow,
    cross-attention keys are computed once) are transformers'.

    forward(hidden_states `(B, T, H)`, attention_mask (backend format), encoder_hidden_states `(B, R, H)` or None
    once cached, encoder_attention_mask, cache) → `(hidden_states, self_probabilities, cross_probabilities)`.
    """

    def __init__(self, config: TdenConfig, layer_idx: int | None = None) -> None:
        super().__init__()
        self.attention = BertAttention(config, is_causal=True, layer_idx=layer_idx)
        self.crossattention = BertAttention(config, is_causal=False, layer_idx=layer_idx, is_cross_attention=True)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        attended, self_probabilities = self.attention(hidden_states, attention_mask, **cache_argument(cache), **kwargs)
        attended, cross_probabilities = self.crossattention(
            attended, None, encoder_hidden_states, encoder_attention_mask, **cache_argument(cache), **kwargs
        )
        return self.output(self.intermediate(attended), attended), self_probabilities, cross_probabilities


class TdenLMHead(TransformedLinearHead):
    """X-modaler's `BertPredictionHead`: `transform` (dense, GELU, LayerNorm 1e-12) then `decoder` (Linear to the
    vocabulary, with its bias). Not tied to the word embeddings; shared by MLM, MSG and captioning."""

    def __init__(self, config: TdenConfig) -> None:
        super().__init__(BertPredictionHeadTransform(config), config.hidden_size, config.vocab_size)


class TdenLMHeadMixin:
    """Output embeddings of a model with a `TdenLMHead` at `self.lm_head`: its `decoder` (transformers' default
    would return the whole head). List it before the `PreTrainedModel` base."""

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head.decoder = new_embeddings


class TdenWeightedPooler(nn.Module):
    """X-modaler's `AttentionPooler` (the paper's attention-based two-layer MLP): a score per token
    (`att`: Linear, ReLU, Dropout, Linear(·, 1)), softmax over the unmasked tokens, the weighted sum, then `embed`
    (Linear to `output_size`) and an optional `bn` (BatchNorm1d; eval mode uses its running statistics).

    Input `(B, L, H)` and a 0/1 mask `(B, L)`; output `(B, output_size)`. Training with BatchNorm needs a batch of
    at least two examples (BatchNorm1d's rule).
    """

    def __init__(self, hidden_size: int, output_size: int, dropout: float, use_batchnorm: bool) -> None:
        super().__init__()
        self.att = nn.Sequential(
            nn.Linear(hidden_size, hidden_size), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden_size, 1)
        )
        self.embed = nn.Linear(hidden_size, output_size)
        self.bn = nn.BatchNorm1d(output_size) if use_batchnorm else None

    def forward(self, hidden_states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = self.att(hidden_states).squeeze(-1)
        scores = scores + (1.0 - mask.to(scores.dtype)) * MASKED_SCORE
        weights = F.softmax(scores, dim=-1)
        pooled = self.embed(weights.unsqueeze(1).matmul(hidden_states).squeeze(1))
        return self.bn(pooled) if self.bn is not None else pooled


class TdenSimilarityHead(nn.Module):
    """X-modaler's `MultiModalSimilarity` (image-sentence matching and retrieval): `t_pooler` pools the sentence
    encoder's last layer (understanding stream); `v_pooler[i]` pools object-encoder layer i, the results are summed
    and divided by √(#layers). Both vectors are L2-normalised; the score of a pair is their dot product."""

    def __init__(self, config: TdenConfig) -> None:
        super().__init__()
        size, bn = config.similarity_pooler_size, config.similarity_pooler_batchnorm

        def pooler():
            return TdenWeightedPooler(config.hidden_size, size, config.pooler_dropout, bn)

        self.t_pooler = pooler()
        self.v_pooler = nn.ModuleList(pooler() for _ in range(config.num_visual_layers))

    def forward(
        self, outputs: TdenModelOutput, text_mask: torch.Tensor, region_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns `(text_embeds (B, size), image_embeds (B, size))`, both L2-normalised."""
        image = sum(pool(states, region_mask) for pool, states in zip(self.v_pooler, outputs.object_encoder_layers))
        image = F.normalize(image / len(self.v_pooler) ** 0.5, p=2, dim=1)
        text = F.normalize(self.t_pooler(outputs.sentence_encoder_output, text_mask), p=2, dim=1)
        return text, image


class TdenAnswerHead(nn.Module):
    """X-modaler's `MultiModalPredictor` (VQA, VCR). Understanding branch: `Σ_i v_pooler[i](cross-modal visual
    layer i)` (no scaling) times `u_pooler(last cross-modal text layer)`, then `u_logits` (LayerNorm eps 1e-5,
    Linear). Generation branch (`generation_branch`, when the model runs its decoder over the question):
    `g_logits(g_pooler(last decoder layer))`."""

    def __init__(self, config: TdenConfig, generation_branch: bool) -> None:
        super().__init__()
        size, bn, hidden = config.classifier_pooler_size, config.classifier_pooler_batchnorm, config.hidden_size

        def pooler():
            return TdenWeightedPooler(hidden, size, config.pooler_dropout, bn)

        def logits():
            return nn.Sequential(
                nn.LayerNorm(size, eps=config.embedding_layer_norm_eps), nn.Linear(size, config.num_labels)
            )

        self.u_pooler = pooler()
        self.v_pooler = nn.ModuleList(pooler() for _ in range(config.num_cross_encoder_layers))
        self.u_logits = logits()
        if generation_branch:
            self.g_pooler = pooler()
            self.g_logits = logits()

    def forward(
        self, outputs: TdenModelOutput, text_mask: torch.Tensor, region_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        visual = sum(
            pool(states, region_mask) for pool, states in zip(self.v_pooler, outputs.cross_encoder_vision_layers)
        )
        understanding = self.u_logits(visual * self.u_pooler(outputs.language_output, text_mask))
        generation = None
        if outputs.decoder_output is not None:
            generation = self.g_logits(self.g_pooler(outputs.decoder_output, text_mask))
        return understanding, generation


def batch_hardest_triplet_loss(
    similarity: torch.Tensor, margin: float, group_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """The original's `BatchTriplet` with `max_violation=True`, divided by the batch size (as `PretrainLosses` does).

    similarity `(B, B)`: `[sentence i, image j]` scores, matched pairs on the diagonal. For each sentence the hardest
    negative image and for each image the hardest negative sentence contribute `max(0, margin + s_neg - s_pos)`.
    `group_ids` `(B,)`: pairs sharing an id (the same image) are not negatives of each other.
    """
    batch = similarity.shape[0]
    diagonal = similarity.diagonal().view(batch, 1)
    cost_s = (margin + similarity - diagonal).clamp(min=0)  # sentence i vs other images j
    cost_im = (margin + similarity - diagonal.t()).clamp(min=0)  # image j vs other sentences i
    excluded = same_pair_mask(batch, group_ids, similarity.device)
    cost_s = cost_s.masked_fill(excluded, 0)
    cost_im = cost_im.masked_fill(excluded, 0)
    return (cost_s.max(dim=1).values.sum() + cost_im.max(dim=0).values.sum()) / batch


# ---------------------------------------------------------------------------------------------------- base
class TdenPreTrainedModel(VisionLanguagePreTrainedModel):
    config: TdenConfig
    base_model_prefix = "tden"
    _region_feature_layers = ("region_embeddings.feature_embeddings",)
    _no_split_modules = ["TdenEmbeddings", "TdenRegionEmbeddings", "BertLayer", "CrossModalLayer", "TdenDecoderLayer"]

    # Config fields a head sets when it loads a checkpoint of another head (e.g. pre-training) without a `config`
    # given: what the head itself needs (VQA: a bidirectional decoder) or never runs (retrieval: no decoder).
    _config_from_other_heads: dict = {}

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str | os.PathLike | None, *args: Any, **kwargs: Any
    ) -> Self:
        if "config" not in kwargs:
            for field, value in cls._config_from_other_heads.items():
                kwargs.setdefault(field, value)
        # A head's own weights missing from the checkpoint (a `TdenModel`'s or another head's) are initialised and
        # reported as missing, as in transformers.
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)


class _TextStream(NamedTuple):
    """The inputs of one text stream of `TdenModel.forward`: the understanding stream's, or the generation stream's
    (its `decoder_*` arguments)."""

    input_ids: torch.LongTensor | None
    attention_mask: torch.Tensor | None
    token_type_ids: torch.LongTensor | None
    position_ids: torch.LongTensor | None
    inputs_embeds: torch.FloatTensor | None

    @property
    def tokens(self) -> torch.Tensor | None:
        """The ids, else the embeddings: what gives the stream's batch and length (`None`: the stream is not given)."""
        return self.input_ids if self.input_ids is not None else self.inputs_embeds


class _Regions(NamedTuple):
    """The region inputs of `TdenModel.forward`."""

    features: torch.FloatTensor | None
    locations: torch.FloatTensor | None
    attention_mask: torch.Tensor | None


def _check_inputs(
    config: TdenConfig, text: _TextStream, generation: _TextStream, regions: _Regions, past_length: int
) -> None:
    """`TdenModel.forward`'s checks, on its three input groups."""
    for stream, prefix in ((text, ""), (generation, "decoder_")):
        if stream.input_ids is not None and stream.inputs_embeds is not None:
            raise ValueError(f"pass either {prefix}input_ids or {prefix}inputs_embeds, not both")
    text, generation = text.tokens, generation.tokens
    if text is None and generation is None:
        raise ValueError(
            "TDEN needs text: input_ids (understanding stream) and/or decoder_input_ids (generation stream)"
        )
    for stream, offset, name in ((text, 0, "input_ids"), (generation, past_length, "decoder_input_ids")):
        if stream is not None and stream.shape[1] + offset > config.max_position_embeddings:
            raise ValueError(
                f"{name} reach position {stream.shape[1] + offset}, beyond the model's {config.max_position_embeddings} "
                "position embeddings; shorten the text"
            )
    check_region_inputs(config, *regions, text, generation)


def _ones(reference: torch.Tensor, length: int | None = None) -> torch.Tensor:
    return torch.ones(
        reference.shape[0], reference.shape[1] if length is None else length, dtype=torch.long, device=reference.device
    )


# What `output_hidden_states` / `output_attentions` record (transformers' `capture_outputs`). The sentence encoder
# (`encoder.layer`) runs both text streams, understanding first: `_arrange_records` splits its records into
# `hidden_states` and `generation_*`, joins each cross-modal layer's visual and text outputs, and puts the decoder's
# input (the last text-encoder state) first among the decoder's hidden states.
_RECORDED_OUTPUTS = {
    "hidden_states": [
        OutputRecorder(TdenEmbeddings, capture_initial_hidden_state=False),
        OutputRecorder(BertLayer, layer_name="encoder.layer", capture_initial_hidden_state=False),
    ],
    "attentions": OutputRecorder(BertSelfAttention, index=1, layer_name="encoder.layer"),
    "vision_hidden_states": [
        OutputRecorder(TdenRegionEmbeddings),
        OutputRecorder(BertLayer, layer_name="visual_encoder.layer"),
    ],
    "vision_attentions": OutputRecorder(BertSelfAttention, index=1, layer_name="visual_encoder.layer"),
    "cross_encoder_hidden_states": [OutputRecorder(CrossModalLayer, index=0), OutputRecorder(CrossModalLayer, index=1)],
    "cross_encoder_attentions": OutputRecorder(CrossModalLayer, index=2),
    "decoder_hidden_states": OutputRecorder(TdenDecoderLayer, index=0),
    "decoder_attentions": OutputRecorder(TdenDecoderLayer, index=1),
    "decoder_cross_attentions": OutputRecorder(TdenDecoderLayer, index=2),
}
_GENERATION_FIELDS = dict(zip(_SENTENCE_RECORDS, _GENERATION_RECORDS))


def _arrange_records(outputs: TdenModelOutput, config: TdenConfig, both_streams: bool) -> None:
    """The records of `_RECORDED_OUTPUTS` laid out as `TdenModelOutput` documents them (see there)."""
    hidden = outputs.get("hidden_states")
    if outputs.get("decoder_hidden_states") is not None:
        outputs["decoder_hidden_states"] = (hidden[-1], *outputs["decoder_hidden_states"])
    if both_streams:  # the understanding stream's records come first
        for name, count in (("hidden_states", config.num_hidden_layers + 1), ("attentions", config.num_hidden_layers)):
            if outputs.get(name) is not None:
                records = outputs[name]
                outputs[name], outputs[_GENERATION_FIELDS[name]] = records[:count], records[count:]
    cross = outputs.get("cross_encoder_hidden_states")
    if cross is not None:  # (visual, text) of each layer
        pairs = range(0, len(cross), 2)
        outputs["cross_encoder_hidden_states"] = tuple(torch.cat(cross[i : i + 2], dim=1) for i in pairs)


def _run_stack(layers, hidden_states, mask, **kwargs) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Run BERT layers: `(output, every layer's output)`."""
    outputs = []
    for layer in layers:
        hidden_states = layer(hidden_states, mask, **kwargs)
        outputs.append(hidden_states)
    return hidden_states, tuple(outputs)


@auto_docstring(
    custom_intro="""
    The bare TDEN: embeddings, object encoder, sentence encoder, cross-modal encoder and decoder (the last two
    present when the config asks for layers). Heads build on `TdenModelOutput`.
    """,
    custom_args=r"""
    add_cross_encoder (`bool`, *optional*, defaults to `True`):
        Build the cross-modal encoder (when the config has layers for it); the captioning and retrieval heads never
        run it.
    add_decoder (`bool`, *optional*, defaults to `True`):
        Build the decoder (when the config has layers for it); the retrieval head never runs it.
    """,
)
class TdenModel(TdenPreTrainedModel):
    _can_record_outputs = _RECORDED_OUTPUTS

    def __init__(self, config: TdenConfig, add_cross_encoder: bool = True, add_decoder: bool = True) -> None:
        super().__init__(config)
        self.embeddings = TdenEmbeddings(config)
        self.region_embeddings = TdenRegionEmbeddings(config)
        self.encoder = TdenLayerStack(BertLayer(config, layer_idx=i) for i in range(config.num_hidden_layers))
        self.visual_encoder = TdenLayerStack(BertLayer(config) for _ in range(config.num_visual_layers))
        self.cross_encoder = (
            TdenLayerStack(CrossModalLayer(config) for _ in range(config.num_cross_encoder_layers))
            if add_cross_encoder and config.num_cross_encoder_layers > 0
            else None
        )
        # The decoder's layers continue the sentence encoder's cache indices: one Cache holds both.
        self.decoder = (
            TdenLayerStack(
                TdenDecoderLayer(config, layer_idx=config.num_hidden_layers + i)
                for i in range(config.num_decoder_layers)
            )
            if add_decoder and config.num_decoder_layers > 0
            else None
        )
        self.post_init()

    def _type_ids(self, reference, type_ids, type_id):
        if type_ids is not None:
            return type_ids
        return torch.full(reference.shape[:2], type_id, dtype=torch.long, device=reference.device)

    @auto_docstring(custom_args=_TEXT_ARGS + _POSITION_ARG + _REGION_ARGS + _GENERATION_ARGS + _CACHE_ARGS)
    @accepts_past_key_values
    @can_return_tuple
    @merge_with_config_defaults
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        region_features: torch.FloatTensor | None = None,
        region_locations: torch.FloatTensor | None = None,
        region_attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        decoder_token_type_ids: torch.LongTensor | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        decoder_inputs_embeds: torch.FloatTensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> TdenModelOutput:
        r"""
        Returns:
            `TdenModelOutput`.
        """
        past_length = cache.get_seq_length() if cache is not None else 0
        text = _TextStream(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        generation = _TextStream(
            decoder_input_ids,
            decoder_attention_mask,
            decoder_token_type_ids,
            decoder_position_ids,
            decoder_inputs_embeds,
        )
        regions = _Regions(region_features, region_locations, region_attention_mask)
        _check_inputs(self.config, text, generation, regions, past_length)
        outputs = self._encode(
            text,
            generation,
            regions,
            cache=cache,
            use_cache=bool(use_cache),
            return_dict=True,
            **recording_flags(self.config, kwargs, _RECORDED_OUTPUTS),
        )
        _arrange_records(outputs, self.config, both_streams=text.tokens is not None and generation.tokens is not None)
        return outputs

    @capture_outputs(tie_last_hidden_states=False)  # hidden_states[-1] is the sentence encoder's, as recorded
    def _encode(
        self, text: _TextStream, generation: _TextStream, regions: _Regions, cache, use_cache: bool, **kwargs
    ) -> TdenModelOutput:
        kwargs = {name: value for name, value in kwargs.items() if not name.startswith("output_")}
        has_text, has_generation = text.tokens is not None, generation.tokens is not None
        cross_cached = (
            isinstance(cache, EncoderDecoderCache) and bool(cache.is_updated) and all(cache.is_updated.values())
        )
        region_mask, vision, object_layers = self._encode_regions(regions, skip=cross_cached and not has_text)
        if regions.features is None and not cross_cached and (has_text or self.decoder is not None):
            raise ValueError("TDEN needs regions: pass region_features, region_locations and region_attention_mask")
        result = dict(object_encoder_layers=object_layers)
        language = sentence = text_mask = decoder_input = decoder_mask = None
        if has_text:
            text_mask = text.attention_mask if text.attention_mask is not None else _ones(text.tokens)
            sentence = language = self._encode_text(text, text_mask)
            if self.cross_encoder is not None:
                vision, language, result["cross_encoder_vision_layers"] = self._cross_encode(
                    vision, language, region_mask, text_mask
                )
        if has_generation:
            if use_cache and cache is None:
                cache = TdenBeamCache()
            decoder_input, decoder_mask = self._encode_generation(generation, cache, **kwargs)
        elif self.config.bidirectional_decoder and has_text and self.decoder is not None:
            # X-modaler's VQA/VCR model: the decoder reads the understanding stream's sentence encoding, unmasked.
            decoder_input = sentence
            decoder_mask = create_bidirectional_mask(
                config=self.config, inputs_embeds=sentence, attention_mask=text_mask, allow_is_bidirectional_skip=False
            )
        if decoder_input is not None and self.decoder is not None:
            fused = self.cross_encoder is not None and has_text and self.config.decoder_attends_fused_visual
            memory = vision if fused else (object_layers[-1] if object_layers is not None else None)
            result["decoder_output"] = self._decode(decoder_input, decoder_mask, memory, region_mask, cache)
        return TdenModelOutput(
            language_output=language,
            vision_output=vision,
            sentence_encoder_output=sentence,
            cache=cache if use_cache else None,
            **result,
        )

    def _encode_regions(self, regions: _Regions, skip: bool):
        """The object encoder (skipped once the decoder's cross-attention keys are cached and no understanding is
        asked): `(region padding mask, its output, every layer's output)`, the last two None when skipped."""
        features, mask = regions.features, regions.attention_mask
        if features is None or skip:
            return mask, None, None
        dtype = self.region_embeddings.feature_embeddings.weight.dtype
        embeddings = self.region_embeddings(features.to(dtype), regions.locations.to(dtype))
        mask = mask if mask is not None else _ones(features)
        output, layers = _run_stack(
            self.visual_encoder.layer, embeddings, extended_attention_mask(self.config, embeddings, mask)
        )
        return mask, output, layers

    def _encode_text(self, text: _TextStream, text_mask: torch.Tensor) -> torch.Tensor:
        """The understanding stream through the sentence encoder (bidirectional, token type 0 by default)."""
        embeddings = self.embeddings(
            input_ids=text.input_ids,
            inputs_embeds=text.inputs_embeds,
            position_ids=text.position_ids,
            token_type_ids=self._type_ids(text.tokens, text.token_type_ids, self.config.understanding_token_type_id),
        )
        sentence, _ = _run_stack(
            self.encoder.layer, embeddings, extended_attention_mask(self.config, embeddings, text_mask)
        )
        return sentence

    def _encode_generation(self, generation: _TextStream, cache, **kwargs):
        """The generation stream through the sentence encoder (causal, cached): `(its output, its causal mask)`."""
        reference = generation.tokens
        past_length = cache.get_seq_length() if cache is not None else 0
        attention_mask = generation.attention_mask
        if attention_mask is None:
            attention_mask = _ones(reference, past_length + reference.shape[1])
        position_ids = generation.position_ids
        if position_ids is None:  # counted on from the cache (given explicitly: BertEmbeddings' keyword for the
            # cache length changed name in transformers 5.24)
            position_ids = torch.arange(past_length, past_length + reference.shape[1], device=reference.device)
            position_ids = position_ids.unsqueeze(0)
        embeddings = self.embeddings(
            input_ids=generation.input_ids,
            inputs_embeds=generation.inputs_embeds,
            position_ids=position_ids,
            token_type_ids=self._type_ids(reference, generation.token_type_ids, self.config.generation_token_type_id),
        )
        # Always materialised: the sentence encoder's layers are not causal modules (they also run the
        # understanding stream), so sdpa must not be told "causal" through a missing mask.
        mask = create_causal_mask(
            config=self.config,
            inputs_embeds=embeddings,
            attention_mask=attention_mask,
            **cache_argument(cache),
            allow_is_causal_skip=False,
        )
        output, _ = _run_stack(self.encoder.layer, embeddings, mask, **cache_argument(cache))
        return output, mask

    def _cross_encode(self, vision, text, region_mask, text_mask):
        """The cross-modal encoder: `(visual output, text output, every layer's visual output)`."""
        mask_2d = torch.cat([region_mask.to(text_mask.dtype), text_mask], dim=1)
        mask = extended_attention_mask(self.config, torch.cat([vision, text], dim=1), mask_2d)
        vision_layers = []
        for layer in self.cross_encoder.layer:
            vision, text, _ = layer(vision, text, mask)
            vision_layers.append(vision)
        return vision, text, tuple(vision_layers)

    def _decode(self, hidden_states, mask, memory, region_mask, cache) -> torch.Tensor:
        """The decoder over `hidden_states`, cross-attending to `memory` (None once its keys are cached)."""
        memory_mask = None
        if region_mask is not None:
            memory_mask = create_bidirectional_mask(
                config=self.config,
                inputs_embeds=hidden_states,
                attention_mask=region_mask,
                # Once the cross-attention keys are cached, a stand-in of the regions' length and the model's dtype
                # (the eager mask is built in that dtype).
                encoder_hidden_states=memory if memory is not None else region_mask[..., None].to(hidden_states.dtype),
            )
        for layer in self.decoder.layer:
            hidden_states, _, _ = layer(hidden_states, mask, memory, memory_mask, cache=cache)
        return hidden_states


# ---------------------------------------------------------------------------------------------------- heads
def _run_trunk(
    tden: "TdenModel",
    task: str,
    input_ids: torch.LongTensor | None,
    attention_mask: torch.Tensor | None,
    token_type_ids: torch.LongTensor | None,
    region_features: torch.FloatTensor | None,
    region_locations: torch.FloatTensor | None,
    region_attention_mask: torch.Tensor | None,
    inputs_embeds: torch.FloatTensor | None,
    **kwargs: Unpack[TransformersKwargs],
) -> tuple[TdenModelOutput, torch.Tensor | None, torch.Tensor]:
    """A head's run of its `TdenModel` over the understanding stream and the regions (which every head but
    captioning needs; `kwargs` add the generation stream for pre-training): `(outputs, text mask, region mask)`, the
    0/1 masks that the head's poolers read, all ones where not given (the text mask None without a text)."""
    if region_features is None:
        raise ValueError(f"{task} needs regions: pass region_features, region_locations and region_attention_mask")
    outputs = tden(
        input_ids=input_ids,
        attention_mask=attention_mask,
        token_type_ids=token_type_ids,
        region_features=region_features,
        region_locations=region_locations,
        region_attention_mask=region_attention_mask,
        inputs_embeds=inputs_embeds,
        **kwargs,
    )
    text = input_ids if input_ids is not None else inputs_embeds
    text_mask = attention_mask if attention_mask is not None or text is None else _ones(text)
    region_mask = region_attention_mask if region_attention_mask is not None else _ones(region_features)
    return outputs, text_mask, region_mask


def _token_loss(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Cross-entropy over the positions with a label >= 0 (the original's -1 and transformers' -100 are ignored)."""
    if labels.shape != logits.shape[:-1]:
        raise ValueError(f"labels must have shape {tuple(logits.shape[:-1])}, got {tuple(labels.shape)}")
    targets = labels.flatten().masked_fill(labels.flatten() < 0, -100)
    # The mean over the real targets, written as sum / count so that a batch with nothing to predict (X-modaler
    # masks words without a minimum, then skips the loss) gives a zero that keeps the graph instead of NaN, without
    # asking the device whether there are targets.
    total = F.cross_entropy(
        logits.float().flatten(0, 1), targets, ignore_index=-100, label_smoothing=label_smoothing, reduction="sum"
    )
    return total / (targets >= 0).sum().clamp(min=1)


def _word_and_region_losses(
    mlm_logits, msg_logits, moc_logits, labels, decoder_labels, masked_regions, region_class_targets
) -> dict:
    """The MLM, MSG and MOC losses whose targets are given (see `TdenForPreTraining.forward`)."""
    losses = {}
    if labels is not None:
        if mlm_logits is None:
            raise ValueError("MLM labels need the understanding stream (input_ids)")
        losses["mlm_loss"] = _token_loss(mlm_logits, labels)
    if decoder_labels is not None:
        if msg_logits is None:
            raise ValueError("decoder_labels (MSG) need the generation stream (decoder_input_ids) and decoder layers")
        losses["msg_loss"] = _token_loss(msg_logits, decoder_labels)
    if region_class_targets is not None:
        if masked_regions is None:
            raise ValueError("region_class_targets need masked_regions (which visual tokens they belong to)")
        selected = gather_masked(moc_logits, masked_regions)
        if region_class_targets.shape != selected.shape:
            raise ValueError(
                f"region_class_targets must have shape {tuple(selected.shape)} (one row per masked "
                f"region), got {tuple(region_class_targets.shape)}"
            )
        kl = F.kl_div(F.log_softmax(selected.float(), dim=-1), region_class_targets.float(), reduction="sum")
        losses["moc_loss"] = kl / max(selected.shape[0], 1)
    return losses


@auto_docstring(
    custom_intro="""
    TDEN with its four pre-training objectives: masked language modelling (`lm_head` on the cross-modal text
    output), masked object classification (`region_head` on the cross-modal visual output), masked sentence
    generation (the same `lm_head` on the decoder output) and image-sentence matching (`similarity`, pooling the
    sentence encoder's last understanding layer and every object-encoder layer).

    The understanding stream is `input_ids` (type 0); the generation stream `decoder_input_ids` (type 1; the
    original feeds the same masked sentence). The decoder cross-attends to the cross-modal encoder's last visual
    output (`config.decoder_attends_fused_visual`), as the released weights were trained.

    """
)
class TdenForPreTraining(TdenLMHeadMixin, TdenPreTrainedModel):
    def __init__(self, config: TdenConfig) -> None:
        super().__init__(config)
        self.tden = TdenModel(config)
        self.lm_head = TdenLMHead(config)
        self.region_head = RegionClassificationHead(
            config.hidden_size, config.num_region_labels, config.hidden_act, config.layer_norm_eps
        )
        self.similarity = TdenSimilarityHead(config)
        self.post_init()

    @auto_docstring(custom_args=_TEXT_ARGS + _REGION_ARGS + _PRETRAINING_ARGS)
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        region_features: torch.FloatTensor | None = None,
        region_locations: torch.FloatTensor | None = None,
        region_attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_token_type_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        decoder_inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        decoder_labels: torch.LongTensor | None = None,
        masked_regions: torch.Tensor | None = None,
        region_class_targets: torch.FloatTensor | None = None,
        image_ids: torch.LongTensor | None = None,
        compute_similarity: bool = True,
        **kwargs: Unpack[TransformersKwargs],
    ) -> TdenForPreTrainingOutput:
        r"""
        Returns:
            `TdenForPreTrainingOutput`: the four objectives' logits and losses.
        """
        has_generation = decoder_input_ids is not None or decoder_inputs_embeds is not None
        outputs, text_mask, region_mask = _run_trunk(
            self.tden,
            "pre-training",
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            region_features=region_features,
            region_locations=region_locations,
            region_attention_mask=region_attention_mask,
            inputs_embeds=inputs_embeds,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=attention_mask if has_generation else None,
            decoder_token_type_ids=decoder_token_type_ids,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=False,  # a training objective: nothing is decoded further
            **kwargs,
        )
        mlm_logits = self.lm_head(outputs.language_output) if outputs.language_output is not None else None
        msg_logits = self.lm_head(outputs.decoder_output) if outputs.decoder_output is not None else None
        moc_logits = self.region_head(outputs.vision_output)
        losses = _word_and_region_losses(
            mlm_logits, msg_logits, moc_logits, labels, decoder_labels, masked_regions, region_class_targets
        )
        text_embeds, image_embeds, similarity, ism_loss = self._image_sentence_matching(
            outputs, text_mask, region_mask, image_ids, compute_similarity
        )
        if ism_loss is not None:  # last: the total sums the losses in the original's order
            losses["ism_loss"] = ism_loss
        return TdenForPreTrainingOutput(
            loss=sum(losses.values()) if losses else None,
            **losses,
            mlm_logits=mlm_logits,
            msg_logits=msg_logits,
            moc_logits=moc_logits,
            similarity=similarity,
            text_embeds=text_embeds,
            image_embeds=image_embeds,
            **passed_records(TdenForPreTrainingOutput, outputs),
        )

    def _image_sentence_matching(self, outputs, text_mask, region_mask, image_ids, compute_similarity):
        """Image-sentence matching apart from `forward`'s other objectives: `(text_embeds, image_embeds, similarity,
        loss)`, all None when skipped; the loss only in training mode or with `image_ids`."""
        if not compute_similarity or outputs.sentence_encoder_output is None:
            return None, None, None, None
        text_embeds, image_embeds = self.similarity(outputs, text_mask, region_mask)
        similarity = text_embeds @ image_embeds.t()
        loss = None
        if self.training or image_ids is not None:
            loss = batch_hardest_triplet_loss(similarity.float(), self.config.ranking_margin, image_ids)
        return text_embeds, image_embeds, similarity, loss


@auto_docstring(
    custom_intro="""
    Captioning: the caption prefix (`input_ids`, `[CLS] w1 ...`, no [SEP]) runs causally through the sentence
    encoder (token type 1) and the decoder, which cross-attends to the object encoder's output; `lm_head` predicts
    the next word. `generate()` keeps one key/value cache over the sentence encoder and the decoder and runs the
    object encoder once. The original decodes with `length_penalty=0.0` (no length normalisation), beam 2.

    """
)
class TdenForConditionalGeneration(SharedPrefillMixin, TdenLMHeadMixin, TdenPreTrainedModel, GenerationMixin):
    _keys_to_ignore_on_load_unexpected = [r"^(tden\.)?cross_encoder\.", r"^region_head\.", r"^similarity\."]

    def __init__(self, config: TdenConfig) -> None:
        super().__init__(config)
        if config.num_decoder_layers < 1:
            raise ValueError(
                "this TDEN config has no decoder (num_decoder_layers=0, as the retrieval and VCR releases), "
                "so it cannot generate captions: use a captioning or pre-training checkpoint"
            )
        self.tden = TdenModel(config, add_cross_encoder=False)  # X-modaler's captioner has none
        self.lm_head = TdenLMHead(config)
        self.post_init()

    def check_generation_inputs(self, input_ids: torch.Tensor | None, max_new_tokens: int | None) -> None:
        """Nothing to refuse before generating (the `CaptionScorer` protocol): a config without a decoder is refused
        by `__init__`, a checkpoint without the LM head loads with it newly initialised and reported missing (as in
        transformers), and `caption_scoring_inputs` checks the positions the captions need."""

    def caption_scoring_inputs(
        self, prompt: dict, caption_ids: torch.LongTensor, caption_mask: torch.Tensor | None = None
    ) -> dict:
        """Inputs of one teacher-forced `forward` that scores given captions word by word as decoding would
        (vlhub's captioning hook, used by self-critical training for the log-probabilities of sampled captions).

        The generation stream is causal, so decoding step `t` sees exactly the prefix `prompt w_1 .. w_(t-1)`: the
        sequence is the prompt followed by the caption without its last word, in the generation token type, and the
        last `T` positions' logits are kept (position `prompt_length - 1 + t` predicts `w_(t+1)`), as X-modaler's
        SCST scores its samples.

        Args:
            prompt: the processor's captioning inputs (`input_ids` `(B, P)`, `[CLS]`, and the region fields).
            caption_ids (`torch.LongTensor` of shape `(B, T)`): the captions, without the prompt.
            caption_mask (`torch.Tensor` of shape `(B, T)`, *optional*): 1 for the words to score (a prefix: the
                caption up to and including its end token); the words after it are masked as keys.
        Returns:
            keyword arguments for `forward`, whose `logits` `(B, T, vocab_size)` predict `caption_ids[:, t]` in row t.
        """
        input_ids = prompt["input_ids"]
        batch, length = input_ids.shape
        if caption_ids.ndim != 2 or caption_ids.shape[0] != batch or caption_ids.shape[1] == 0:
            raise ValueError(f"caption_ids must be (batch, length) = ({batch}, >= 1), got {tuple(caption_ids.shape)}")
        words = caption_ids.shape[1]
        if length + words - 1 > self.config.max_position_embeddings:
            raise ValueError(
                f"captions of {words} tokens after a {length}-token prompt need {length + words - 1} "
                f"positions; the model has {self.config.max_position_embeddings}"
            )
        if caption_mask is not None and caption_mask.shape != caption_ids.shape:
            raise ValueError(
                f"caption_mask must have the captions' shape {tuple(caption_ids.shape)}, "
                f"got {tuple(caption_mask.shape)}"
            )
        device = input_ids.device
        prompt_mask = prompt.get("attention_mask")
        prompt_mask = torch.ones_like(input_ids) if prompt_mask is None else prompt_mask.to(device).long()
        words_mask = (
            torch.ones_like(caption_ids) if caption_mask is None else caption_mask.to(device=device, dtype=torch.long)
        )
        inputs = {
            "input_ids": torch.cat([input_ids, caption_ids[:, :-1].to(device)], 1),
            "attention_mask": torch.cat([prompt_mask, words_mask[:, :-1]], 1),
            "logits_to_keep": words,
            "use_cache": False,
            **{k: prompt[k] for k in ("region_features", "region_locations", "region_attention_mask") if k in prompt},
        }
        if prompt.get("token_type_ids") is not None:
            types = prompt["token_type_ids"]
            inputs["token_type_ids"] = torch.cat(
                [
                    types,
                    torch.full(
                        (batch, words - 1), self.config.generation_token_type_id, dtype=types.dtype, device=types.device
                    ),
                ],
                1,
            )
        return inputs

    @torch.no_grad()
    def xmodaler_beam_search(
        self,
        region_features: torch.FloatTensor,
        region_locations: torch.FloatTensor,
        region_attention_mask: torch.Tensor | None = None,
        num_beams: int = 2,
        max_new_tokens: int = 20,
        num_return_sequences: int = 1,
    ) -> TdenBeamSearchOutput:
        r"""Deprecated: `generate(..., custom_generate=vlhub.modeling.tden.xmodaler_beam_search)` runs the same
        search (X-modaler's, see `generation_tden`) the way transformers runs decoding loops.

        Starts from [CLS] (`config.bos_token_id`), in eval mode. Returns a `TdenBeamSearchOutput`, shapes
        `(batch, num_return_sequences, ...)`, without the start token.
        """
        warnings.warn(
            "TdenForConditionalGeneration.xmodaler_beam_search is deprecated: use model.generate(**inputs, "
            "custom_generate=vlhub.modeling.tden.xmodaler_beam_search, num_beams=..., max_new_tokens=...)",
            FutureWarning,
            stacklevel=2,
        )
        if not 1 <= num_return_sequences <= num_beams:
            raise ValueError(
                f"num_return_sequences must be between 1 and num_beams={num_beams}, got {num_return_sequences}"
            )
        was_training = self.training
        self.eval()
        prompt = torch.full(
            (region_features.shape[0], 1), self.config.bos_token_id, dtype=torch.long, device=region_features.device
        )
        inputs = {
            "region_features": region_features,
            "region_locations": region_locations,
            "region_attention_mask": region_attention_mask,
        }
        found = beam_search(
            self,
            prompt,
            {k: v for k, v in inputs.items() if v is not None},
            num_beams,
            max_new_tokens,
            self.config.eos_token_id,
        )
        self.train(was_training)
        return TdenBeamSearchOutput(
            sequences=found["words"][:, :num_return_sequences],
            sequences_scores=found["scores"][:, :num_return_sequences],
            token_scores=found["token_scores"][:, :num_return_sequences],
        )

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs):
        # One cache for the sentence encoder and the decoder (self-attention), plus the decoder's cross-attention
        # keys over the regions: an EncoderDecoderCache whose layer indices run over both stacks.
        if "static" in str(generation_config.cache_implementation):
            raise ValueError(
                "TDEN decodes on its own TdenBeamCache (the sentence encoder's and the decoder's keys, and the "
                "decoder's cross-attention keys over the regions, computed once); a static cache "
                f"(cache_implementation={generation_config.cache_implementation!r}) is not supported"
            )
        if model_kwargs.get(CACHE_NAME) is None and generation_config.use_cache is not False:
            model_kwargs[CACHE_NAME] = TdenBeamCache()
            return
        return super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)

    @auto_docstring(custom_args=_CAPTION_ARGS + _REGION_ARGS + _CACHE_ARGS)
    @accepts_past_key_values
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
        inputs_embeds: torch.FloatTensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        labels: torch.LongTensor | None = None,
        logits_to_keep: int = 0,
        shift_labels: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> TdenCaptioningOutput:
        r"""
        Returns:
            `TdenCaptioningOutput`: `logits` `(batch_size, length, vocab_size)`.
        """
        outputs = self.tden(
            decoder_input_ids=input_ids,
            decoder_attention_mask=attention_mask,
            decoder_token_type_ids=token_type_ids,
            decoder_position_ids=position_ids,
            decoder_inputs_embeds=inputs_embeds,
            region_features=region_features,
            region_locations=region_locations,
            region_attention_mask=region_attention_mask,
            cache=cache,
            use_cache=use_cache,
            **kwargs,
        )
        states = outputs.decoder_output
        if logits_to_keep:
            states = states[:, -logits_to_keep:]
        logits = self.lm_head(states)
        # TDEN's labels are aligned with the logits already; pre-shifted targets, when given, are the ones to train on.
        targets = shift_labels if shift_labels is not None else labels
        loss = _token_loss(logits, targets, self.config.label_smoothing) if targets is not None else None
        return TdenCaptioningOutput(
            loss=loss,
            logits=logits,
            **cache_argument(outputs.cache),
            hidden_states=outputs.get("hidden_states"),
            attentions=outputs.get("attentions"),
            **passed_records(TdenCaptioningOutput, outputs),
        )


@auto_docstring(
    custom_intro="""
    VQA (X-modaler's `TDENBiTransformer` + `MultiModalPredictor`): the understanding stream through the
    cross-modal encoder feeds the `u_*` branch; the decoder runs bidirectionally over the same sentence encoding
    (`config.bidirectional_decoder`, which `from_pretrained` sets) and feeds the `g_*` branch. The answer is
    `argmax(softmax(u) + softmax(g))` (`logits` holds the summed probabilities).
    """
)
class TdenForQuestionAnswering(TdenPreTrainedModel):
    _keys_to_ignore_on_load_unexpected = [r"^region_head\.", r"^similarity\.", r"^lm_head\."]
    _config_from_other_heads = {"bidirectional_decoder": True}

    def __init__(self, config: TdenConfig) -> None:
        if config.num_cross_encoder_layers < 1:
            raise ValueError("the VQA head needs cross-modal encoder layers (config.num_cross_encoder_layers >= 1)")
        if config.num_decoder_layers > 0 and not config.bidirectional_decoder:
            raise ValueError("the VQA head runs the decoder over the question: set config.bidirectional_decoder=True")
        super().__init__(config)
        self.tden = TdenModel(config)
        self.answer_head = TdenAnswerHead(config, generation_branch=config.num_decoder_layers > 0)
        self.post_init()

    @auto_docstring(custom_args=_TEXT_ARGS + _REGION_ARGS + _ANSWER_LABELS_ARG)
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        region_features: torch.FloatTensor | None = None,
        region_locations: torch.FloatTensor | None = None,
        region_attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> TdenQuestionAnsweringOutput:
        r"""
        Returns:
            `TdenQuestionAnsweringOutput`: `logits` `(batch_size, num_labels)`.
        """
        outputs, text_mask, region_mask = _run_trunk(
            self.tden,
            "VQA",
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            region_features=region_features,
            region_locations=region_locations,
            region_attention_mask=region_attention_mask,
            inputs_embeds=inputs_embeds,
            **kwargs,
        )
        understanding, generation = self.answer_head(outputs, text_mask, region_mask)
        scores = F.softmax(understanding, dim=-1)
        if generation is not None:
            scores = scores + F.softmax(generation, dim=-1)
        loss = None
        if labels is not None:  # the original's BCEWithLogits (mean) x num_labels per branch: the shared VQA loss
            loss = sum(soft_score_loss(branch, labels) for branch in (understanding, generation) if branch is not None)
        return TdenQuestionAnsweringOutput(
            loss=loss,
            logits=scores,
            understanding_logits=understanding,
            generation_logits=generation,
            **passed_records(TdenQuestionAnsweringOutput, outputs),
        )


@auto_docstring(
    custom_intro="""
    Image-text retrieval (X-modaler's `TDENRetrieval` + `MultiModalSimilarity`): no cross-modal encoder and no
    decoder; a sentence vector pooled from the sentence encoder and an image vector pooled from every
    object-encoder layer, both L2-normalised. `logits` scores each given pair; `logits_per_text[i, j]` scores
    sentence i against image j, all `B × B` pairs of a batch; `text_embeds`/`image_embeds` can be indexed once and
    compared by dot product.

    """
)
class TdenForImageTextRetrieval(TdenPreTrainedModel):
    _keys_to_ignore_on_load_unexpected = [
        r"^(tden\.)?cross_encoder\.",
        r"^(tden\.)?decoder\.",
        r"^lm_head\.",
        r"^region_head\.",
    ]
    # Fine-tuning (`finetune.py --task retrieval`) feeds positive pairs only: the loss takes the hardest negatives
    # within the batch (the registration's `retrieval_negatives="in_batch"`), as X-modaler's retrieval training.
    # The cross-modal encoder and the decoder, which retrieval never runs, are not built (X-modaler's `TDENRetrieval`).
    _config_from_other_heads = {"num_cross_encoder_layers": 0, "num_decoder_layers": 0}

    def __init__(self, config: TdenConfig) -> None:
        super().__init__(config)
        self.tden = TdenModel(config, add_cross_encoder=False, add_decoder=False)
        self.similarity = TdenSimilarityHead(config)
        self.post_init()

    @auto_docstring(custom_args=_TEXT_ARGS + _REGION_ARGS + _RETRIEVAL_ARGS)
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        region_features: torch.FloatTensor | None = None,
        region_locations: torch.FloatTensor | None = None,
        region_attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        image_ids: torch.LongTensor | None = None,
        return_loss: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> TdenRetrievalOutput:
        r"""
        Returns:
            `TdenRetrievalOutput`: `logits` `(batch_size, 1)` and the in-batch similarity matrix.
        """
        outputs, text_mask, region_mask = _run_trunk(
            self.tden,
            "retrieval",
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            region_features=region_features,
            region_locations=region_locations,
            region_attention_mask=region_attention_mask,
            inputs_embeds=inputs_embeds,
            **kwargs,
        )
        if outputs.sentence_encoder_output is None:
            raise ValueError("retrieval needs the sentences (input_ids)")
        text_embeds, image_embeds = self.similarity(outputs, text_mask, region_mask)
        logits_per_text = text_embeds @ image_embeds.t()
        return_loss = self.training if return_loss is None else return_loss
        loss = None
        if return_loss:
            loss = batch_hardest_triplet_loss(logits_per_text.float(), self.config.ranking_margin, image_ids)
        return TdenRetrievalOutput(
            loss=loss,
            logits=(text_embeds * image_embeds).sum(-1, keepdim=True),
            logits_per_text=logits_per_text,
            logits_per_image=logits_per_text.t(),
            text_embeds=text_embeds,
            image_embeds=image_embeds,
            **passed_records(TdenRetrievalOutput, outputs),
        )


# Per-example dimensions of a region input shared by every choice (`flatten_choices` repeats it).
_REGION_NDIMS = {"region_features": 2, "region_locations": 2, "region_attention_mask": 1}


@auto_docstring(
    custom_intro="""
    VCR (X-modaler's `TDENBiTransformer` with a one-label `MultiModalPredictor`): each (question, choice) pair
    `[CLS] q [SEP] a [SEP]` (types 0 then 1) is encoded with the image; the understanding branch scores it (and the
    generation branch too when the model has decoder layers, which the released VCR model has not); the choices are
    ranked by the summed scores and trained with cross-entropy over the choices. The regions
    `(batch_size, num_regions, ...)` are shared by the choices, or given per choice
    `(batch_size, num_choices, num_regions, ...)`.
    """
)
class TdenForMultipleChoice(TdenPreTrainedModel):
    _keys_to_ignore_on_load_unexpected = [r"^(tden\.)?decoder\."]  # built only with a bidirectional decoder
    _config_from_other_heads = {"num_labels": 1}

    def __init__(self, config: TdenConfig) -> None:
        if config.num_cross_encoder_layers < 1:
            raise ValueError("the VCR head needs cross-modal encoder layers (config.num_cross_encoder_layers >= 1)")
        if config.num_labels != 1:
            raise ValueError(
                f"the VCR head scores each choice with one logit: config.num_labels must be 1, got {config.num_labels}"
            )
        super().__init__(config)
        # The decoder runs only over the question (`bidirectional_decoder`); otherwise it is left out, as the release
        # (no decoder) has it.
        runs_decoder = config.bidirectional_decoder and config.num_decoder_layers > 0
        self.tden = TdenModel(config, add_decoder=runs_decoder)
        self.answer_head = TdenAnswerHead(config, generation_branch=runs_decoder)
        self.post_init()

    @auto_docstring(custom_args=_CHOICE_ARGS + _REGION_ARGS)
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        region_features: torch.FloatTensor | None = None,
        region_locations: torch.FloatTensor | None = None,
        region_attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> TdenMultipleChoiceOutput:
        r"""
        Returns:
            `TdenMultipleChoiceOutput`: `logits` `(batch_size, num_choices)`.
        """
        batch, choices = text_with_choice_axis(input_ids, inputs_embeds).shape[:2]
        pairs = flatten_choices(
            dict(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
                region_features=region_features,
                region_locations=region_locations,
                region_attention_mask=region_attention_mask,
                inputs_embeds=inputs_embeds,
            ),
            batch,
            choices,
            _REGION_NDIMS,
        )
        outputs, text_mask, region_mask = _run_trunk(self.tden, "VCR", **pairs, **kwargs)
        understanding, generation = self.answer_head(outputs, text_mask, region_mask)
        scores = understanding if generation is None else understanding + generation
        logits = scores.view(batch, choices)
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return TdenMultipleChoiceOutput(loss=loss, logits=logits, **passed_records(TdenMultipleChoiceOutput, outputs))
