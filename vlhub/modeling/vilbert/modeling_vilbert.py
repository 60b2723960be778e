"""PyTorch ViLBERT: a BERT text stream and a visual stream over region features, joined by co-attention layers.

Faithful to the released code (jiasenlu/vilbert_beta and facebookresearch/vilbert-multi-task, `vilbert/vilbert.py`):
the text stream is BERT (transformers' blocks, BERT's parameter names); the visual stream embeds region features and
5-d locations (no position embeddings) and runs BERT layers of its own size; co-attention layers (`layers_vilbert.py`,
`CoAttentionLayer`) exchange keys and values between the streams on the original schedule (the image embeddings go
straight into the first co-attention layer; the text stream runs its first BERT layers before it). Both pooled
outputs are `ReLU(Linear(·))` of the first position (text [CLS], the global image token), fused by product.

Unlike the original, a head computes only what its task reads (the original fine-tuned model computes every
pre-training head on every forward); the numbers of what is computed are the same.

Attention runs through transformers' attention interface in every layer (BERT's and the co-attention), so
`attn_implementation="eager" | "sdpa" | ...` is a config choice and `set_attn_implementation` switches a built model.
Attention maps (`output_attentions=True`) come from the eager backend; the others warn and return none, as in
transformers' BERT. Keep attention-like modules out of this file.
"""

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from transformers.modeling_outputs import ModelOutput
from transformers.models.bert.modeling_bert import BertLMPredictionHead
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, auto_docstring
from transformers.utils.generic import can_return_tuple
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from ..layers import (
    MASKED_SCORE,
    BertEmbeddings,
    BertPredictionHeadTransform,
    LocatedRegionEmbeddings,
    TransformedLinearHead,
    check_text_and_region_inputs,
    classifier_head,
    extended_attention_mask,
    flatten_choices,
    labelled_tokens,
    negative_groups,
    soft_score_loss,
    text_with_choice_axis,
)
from ..modeling_outputs import layer_records, passed_records
from ..modeling_utils import BertMLMHeadMixin, VisionLanguagePreTrainedModel, recording_flags
from .configuration_vilbert import VilbertConfig
from .layers_vilbert import CoAttentionLayer, StreamConfig, StreamLayer, cross_stream_mask

__all__ = [
    "VilbertPreTrainedModel",
    "VilbertModel",
    "VilbertForPreTraining",
    "VilbertForQuestionAnswering",
    "VilbertForImageTextRetrieval",
    "VilbertForReferringExpression",
    "VilbertForVisualReasoning",
    "VilbertForVisualEntailment",
    "VilbertForMultipleChoice",
    "VilbertModelOutput",
    "VilbertForPreTrainingOutput",
    "VilbertClassifierOutput",
]


# ---------------------------------------------------------------------------------------------------- outputs
@auto_docstring
@dataclass
class VilbertModelOutput(ModelOutput):
    r"""
    last_hidden_state (`torch.FloatTensor` of shape `(batch, text_length, hidden_size)`):
        The text stream's output. With task tokens the task token sits at position 1 and `text_length` is the input
        length + 1.
    vision_last_hidden_state (`torch.FloatTensor` of shape `(batch, num_regions, visual_hidden_size)`):
        The visual stream's output (row 0 = the global image token).
    pooler_output (`torch.FloatTensor` of shape `(batch, bi_hidden_size)`):
        The fused pooled output (`text_pooler_output * vision_pooler_output`, or their sum with
        `fusion_method="sum"`), before dropout.
    text_pooler_output (`torch.FloatTensor` of shape `(batch, bi_hidden_size)`):
        `ReLU(Linear(·))` of the text [CLS].
    vision_pooler_output (`torch.FloatTensor` of shape `(batch, bi_hidden_size)`):
        `ReLU(Linear(·))` of the global image token.
    hidden_states (`tuple(torch.FloatTensor)`, *optional*, returned with `output_hidden_states=True`):
        The text stream: the embeddings and the output of each of the `num_hidden_layers` BERT layers, each
        `(batch, text_length, hidden_size)` (co-attention layers run between some of them).
    attentions (`tuple(torch.FloatTensor)`, *optional*, returned with `output_attentions=True`):
        Text self-attention probabilities per BERT layer, `(batch, num_attention_heads, text_length, text_length)`
        (eager attention only; the other backends warn and return none).
    vision_hidden_states (`tuple(torch.FloatTensor)`, *optional*, returned with `output_hidden_states=True`):
        The visual stream: the embeddings and each of the `visual_num_hidden_layers` layers' output,
        `(batch, num_regions, visual_hidden_size)`.
    vision_attentions (`tuple(torch.FloatTensor)`, *optional*, returned with `output_attentions=True`):
        Visual self-attention per layer, `(batch, visual_num_attention_heads, num_regions, num_regions)`.
    text_to_vision_attentions (`tuple(torch.FloatTensor)`, *optional*, returned with `output_attentions=True`):
        Per co-attention layer, text queries over regions `(batch, bi_num_attention_heads, text_length, num_regions)`.
    vision_to_text_attentions (`tuple(torch.FloatTensor)`, *optional*, returned with `output_attentions=True`):
        Per co-attention layer, region queries over text `(batch, bi_num_attention_heads, num_regions, text_length)`.
    """

    last_hidden_state: torch.FloatTensor | None = None
    vision_last_hidden_state: torch.FloatTensor | None = None
    pooler_output: torch.FloatTensor | None = None
    text_pooler_output: torch.FloatTensor | None = None
    vision_pooler_output: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    vision_hidden_states: tuple[torch.FloatTensor, ...] | None = None
    vision_attentions: tuple[torch.FloatTensor, ...] | None = None
    text_to_vision_attentions: tuple[torch.FloatTensor, ...] | None = None
    vision_to_text_attentions: tuple[torch.FloatTensor, ...] | None = None


# The per-layer records of both streams and the co-attention (`VilbertModelOutput` documents them), which every head
# passes on.
_PER_LAYER_FIELDS = (
    "hidden_states",
    "attentions",
    "vision_hidden_states",
    "vision_attentions",
    "text_to_vision_attentions",
    "vision_to_text_attentions",
)


@auto_docstring
@dataclass
@layer_records(VilbertModelOutput, *_PER_LAYER_FIELDS)
class VilbertClassifierOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor` of shape `()`, *optional*, returned when labels are given):
        The head's loss.
    logits (`torch.FloatTensor`):
        `(batch, num_labels)` answers / classes, `(batch, 1)` retrieval scores, `(batch, num_regions)` region
        scores or `(batch, num_choices)` choice scores, depending on the head.
    pooler_output (`torch.FloatTensor` of shape `(batch, bi_hidden_size)`, *optional*):
        The fused pooled output (see `VilbertModelOutput`); None for `VilbertForReferringExpression`, which has no
        poolers.
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    pooler_output: torch.FloatTensor | None = None


@auto_docstring
@dataclass
@layer_records(VilbertModelOutput, *_PER_LAYER_FIELDS)
class VilbertForPreTrainingOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor` of shape `()`, *optional*):
        Sum of the losses whose targets were given (the original weighs them equally).
    mlm_loss (`torch.FloatTensor` of shape `()`, *optional*):
        Masked language modelling.
    region_kl_loss (`torch.FloatTensor` of shape `()`, *optional*):
        Masked-region classification (KL to the detector's class distribution).
    alignment_loss (`torch.FloatTensor` of shape `()`, *optional*):
        Image-caption alignment.
    prediction_logits (`torch.FloatTensor` of shape `(batch, text_length, vocab_size)`):
        Masked-LM logits.
    mlm_logits (`torch.FloatTensor` of shape `(num_masked_tokens, vocab_size)`, *optional*):
        With `labels`, the rows of `prediction_logits` at the positions with a label >= 0, row-major over
        (example, position).
    region_logits (`torch.FloatTensor` of shape `(batch, num_regions, num_region_labels)`):
        Masked-region class logits of every region row (the global image token and padding included).
    alignment_logits (`torch.FloatTensor` of shape `(batch, 2)`):
        Image-caption alignment; **class 0 = aligned**, as in the original.
    pooler_output (`torch.FloatTensor` of shape `(batch, bi_hidden_size)`):
        The fused pooled output (see `VilbertModelOutput`).
    """

    loss: torch.FloatTensor | None = None
    mlm_loss: torch.FloatTensor | None = None
    region_kl_loss: torch.FloatTensor | None = None
    alignment_loss: torch.FloatTensor | None = None
    prediction_logits: torch.FloatTensor | None = None
    mlm_logits: torch.FloatTensor | None = None
    region_logits: torch.FloatTensor | None = None
    alignment_logits: torch.FloatTensor | None = None
    pooler_output: torch.FloatTensor | None = None


# What auto_docstring does not know of ViLBERT's inputs (it documents `input_ids`, `attention_mask`, ... itself).
_REGION_ARGS = r"""
region_features (`torch.FloatTensor` of shape `(batch_size, num_regions, region_feature_dim)`):
    Region features, row 0 the global image token (the mean feature; the processor adds it), zero padded.
region_locations (`torch.FloatTensor` of shape `(batch_size, num_regions, 5)`):
    `[x1/W, y1/H, x2/W, y2/H, area/(W*H)]` per region, `[0, 0, 1, 1, 1]` for the global token.
region_attention_mask (`torch.Tensor` of shape `(batch_size, num_regions)`, *optional*):
    1 for real regions (the global token included), 0 for padding. Required for a batch of several images.
task_ids (`torch.LongTensor` of shape `(batch_size, 1)` or `(batch_size,)`, *optional*):
    12-in-1 task number of each example (e.g. 1 = VQA, 15 = GQA); required when the model has task tokens
    (`config.num_task_tokens > 0`), which it inserts after [CLS].
"""
_IN_BATCH_PAIRS_ARG = r"""
in_batch_pairs (`bool`, defaults to `False`):
    Pair every text with every image: `Bt` texts (`input_ids` `(Bt, T)`, `task_ids` one per text) and `Bv`
    images (regions `(Bv, R, ·)`) give `Bt * Bv` pairs, row `i * Bv + j` = (text i, image j). The layers
    before the first co-attention layer run once per text and once per image (the first 6 text layers of
    the released model), as the original's `in_batch_pairs` and, for one text against many images
    (`Bt = 1`, its zero-shot retrieval), `fast_mode`. Every output then has one row per pair.
"""
_LABELS_ARG = r"""
labels (`torch.Tensor`, *optional*):
    The task's targets, as described by the head's class (which also names any further target arguments it
    takes).
"""


# ---------------------------------------------------------------------------------------------------- embeddings
class VilbertEmbeddings(BertEmbeddings):
    """BERT's text embeddings plus the 12-in-1 task token: with `num_task_tokens > 0`, `task_embeddings[task_id]` is
    inserted after [CLS], after the word + position + type sum and before the LayerNorm, with no position or type
    embedding of its own (the later tokens keep their positions), as the multi-task release does."""

    def __init__(self, config: VilbertConfig) -> None:
        super().__init__(config)
        self.task_embeddings = (
            nn.Embedding(config.num_task_tokens, config.hidden_size) if config.num_task_tokens > 0 else None
        )

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        task_ids: torch.LongTensor | None = None,
    ) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        batch, length = inputs_embeds.shape[:2]
        if position_ids is None:
            position_ids = self.position_ids[:, :length]
        if token_type_ids is None:
            token_type_ids = torch.zeros((batch, length), dtype=torch.long, device=inputs_embeds.device)
        # The original's order of the sum.
        embeddings = inputs_embeds + self.position_embeddings(position_ids) + self.token_type_embeddings(token_type_ids)
        if self.task_embeddings is not None:
            task = self.task_embeddings(task_ids.reshape(batch, 1))
            embeddings = torch.cat([embeddings[:, :1], task, embeddings[:, 1:]], dim=1)
        return self.dropout(self.LayerNorm(embeddings))


class VilbertImageEmbeddings(LocatedRegionEmbeddings):
    """The region embeddings at the visual width, under the release's names (the text stream's dropout
    probability, as the original)."""

    feature_layer_name = "image_embeddings"
    location_layer_name = "image_location_embeddings"

    def __init__(self, config: VilbertConfig) -> None:
        super().__init__(
            config.region_feature_dim,
            config.region_location_dim,
            config.visual_hidden_size,
            config.layer_norm_eps,
            config.hidden_dropout_prob,
        )


class VilbertPooler(nn.Module):
    """`ReLU(Linear(first position))` into the `bi_hidden_size` space (ViLBERT's poolers use ReLU, not tanh)."""

    def __init__(self, hidden_size: int, pooled_size: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, pooled_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.relu(self.dense(hidden_states[:, 0]))


def text_stream_config(config: VilbertConfig) -> StreamConfig:
    return StreamConfig(config)


def visual_stream_config(config: VilbertConfig) -> StreamConfig:
    return StreamConfig(
        config,
        hidden_size=config.visual_hidden_size,
        num_attention_heads=config.visual_num_attention_heads,
        intermediate_size=config.visual_intermediate_size,
        hidden_act=config.visual_hidden_act,
        hidden_dropout_prob=config.visual_hidden_dropout_prob,
        attention_probs_dropout_prob=config.visual_attention_probs_dropout_prob,
    )


class VilbertEncoder(nn.Module):
    """The two streams and the co-attention layers between them, run on the original schedule: for the k-th
    co-attention layer, the visual layers up to `visual_co_attention_layers[k]` and the text layers up to
    `text_co_attention_layers[k]` run first; after the last one, each stream's remaining layers. Parameter names are
    the original's: `layer` (text), `v_layer` (visual), `c_layer` (co-attention).

    With `add_text_output=False` the text stream ends at the last co-attention layer, which is one-sided (only the
    region queries over the text): the text layers after it are not built and the text output is None."""

    def __init__(self, config: VilbertConfig, add_text_output: bool = True) -> None:
        super().__init__()
        self.config = config
        text, visual = text_stream_config(config), visual_stream_config(config)
        num_text_layers = config.num_hidden_layers if add_text_output else config.text_co_attention_layers[-1]
        self.layer = nn.ModuleList([StreamLayer(text) for _ in range(num_text_layers)])
        self.v_layer = nn.ModuleList([StreamLayer(visual) for _ in range(config.visual_num_hidden_layers)])
        last = config.num_co_attention_layers - 1
        self.c_layer = nn.ModuleList(
            [
                CoAttentionLayer(
                    visual,
                    text,
                    config.bi_hidden_size,
                    config.bi_num_attention_heads,
                    update_stream2=add_text_output or index < last,
                )
                for index in range(config.num_co_attention_layers)
            ]
        )

    def _masks(self, text, vision, attention_mask, region_attention_mask) -> dict:
        """The masks in the attention backend's format: each stream's self-attention, text queries over regions
        and region queries over text."""
        return {
            "text": extended_attention_mask(self.config, text, attention_mask),
            "vision": extended_attention_mask(self.config, vision, region_attention_mask),
            "vision_over_text": cross_stream_mask(self.config, vision, text, attention_mask),
            "text_over_vision": cross_stream_mask(self.config, text, vision, region_attention_mask),
        }

    def forward(
        self,
        text: torch.Tensor,
        vision: torch.Tensor,
        attention_mask: torch.Tensor,
        region_attention_mask: torch.Tensor,
        pair_index: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> VilbertModelOutput:
        """text `(Bt, T, H)`, vision `(Bv, R, Hv)` with their `(batch, length)` 1/0 masks; Bt = Bv unless
        `pair_index` = (text rows, region rows) `(P,)` each: the pairs to form right before the first co-attention
        layer (the layers before it run once per text and once per image, as the original's `fast_mode` /
        `in_batch_pairs`). Per-layer outputs are recorded by `VilbertModel` (`_can_record_outputs`)."""
        masks = self._masks(text, vision, attention_mask, region_attention_mask)
        v_start = t_start = 0
        schedule = zip(self.config.visual_co_attention_layers, self.config.text_co_attention_layers, self.c_layer)
        for v_stop, t_stop, co_layer in schedule:
            vision = _run_layers(self.v_layer[v_start:v_stop], vision, masks["vision"], **kwargs)
            text = _run_layers(self.layer[t_start:t_stop], text, masks["text"], **kwargs)
            if pair_index is not None:  # form the pairs once, before the first co-attention layer
                text_rows, vision_rows = pair_index
                text, attention_mask = text[text_rows], attention_mask[text_rows]
                vision, region_attention_mask = vision[vision_rows], region_attention_mask[vision_rows]
                masks = self._masks(text, vision, attention_mask, region_attention_mask)
                pair_index = None
            # Stream 1 = vision, stream 2 = text: mask_over1 masks regions (for text queries), mask_over2 text.
            vision, text, _, _ = co_layer(vision, text, masks["text_over_vision"], masks["vision_over_text"], **kwargs)
            v_start, t_start = v_stop, t_stop
        vision = _run_layers(self.v_layer[v_start:], vision, masks["vision"], **kwargs)
        if text is not None:  # None after a one-sided last co-attention layer
            text = _run_layers(self.layer[t_start:], text, masks["text"], **kwargs)
        return VilbertModelOutput(last_hidden_state=text, vision_last_hidden_state=vision)


def _run_layers(layers, hidden_states, mask, **kwargs):
    for layer in layers:
        hidden_states, _ = layer(hidden_states, mask, **kwargs)
    return hidden_states


# What `output_hidden_states` / `output_attentions` record (transformers' `capture_outputs`): each stream's embeddings
# and layers (the text stream's in `encoder.layer`, the visual stream's in `encoder.v_layer`), and each co-attention
# layer's maps both ways, all asked for with `output_hidden_states` / `output_attentions` (`recording_flags`).
_RECORDED_OUTPUTS = {
    "hidden_states": [
        OutputRecorder(VilbertEmbeddings, capture_initial_hidden_state=False),
        OutputRecorder(StreamLayer, index=0, layer_name="encoder.layer", capture_initial_hidden_state=False),
    ],
    "attentions": OutputRecorder(StreamLayer, index=1, layer_name="encoder.layer"),
    "vision_hidden_states": [
        OutputRecorder(VilbertImageEmbeddings),
        OutputRecorder(StreamLayer, index=0, layer_name="encoder.v_layer"),
    ],
    "vision_attentions": OutputRecorder(StreamLayer, index=1, layer_name="encoder.v_layer"),
    "vision_to_text_attentions": OutputRecorder(CoAttentionLayer, index=2),
    "text_to_vision_attentions": OutputRecorder(CoAttentionLayer, index=3),
}


def _pair_early_records(outputs: VilbertModelOutput, config: VilbertConfig, pair_index) -> None:
    """With `in_batch_pairs`, the states and maps recorded before the first co-attention layer have one row per text
    (or per image): give them one row per pair, as every later record has."""
    text_rows, vision_rows = pair_index
    early = {
        "hidden_states": 1 + config.text_co_attention_layers[0],
        "attentions": config.text_co_attention_layers[0],
        "vision_hidden_states": 1 + config.visual_co_attention_layers[0],
        "vision_attentions": config.visual_co_attention_layers[0],
    }
    for name, count in early.items():
        if outputs.get(name) is not None:
            rows = vision_rows if name.startswith("vision") else text_rows
            outputs[name] = tuple(
                value if value is None or i >= count else value[rows] for i, value in enumerate(outputs[name])
            )


# ---------------------------------------------------------------------------------------------------- base
class VilbertPreTrainedModel(VisionLanguagePreTrainedModel):
    config: VilbertConfig
    base_model_prefix = "vilbert"
    _region_feature_layers = ("v_embeddings.image_embeddings",)
    _no_split_modules = ["VilbertEmbeddings", "VilbertImageEmbeddings", "StreamLayer", "CoAttentionLayer"]
    _can_record_outputs = _RECORDED_OUTPUTS


def _check_inputs(
    config: VilbertConfig,
    input_ids,
    inputs_embeds,
    region_features,
    region_locations,
    region_attention_mask,
    task_ids,
    in_batch_pairs: bool = False,
):
    if in_batch_pairs:  # texts and images are separate batches
        check_text_and_region_inputs(config, input_ids, inputs_embeds, None, None, None, "ViLBERT")
        check_text_and_region_inputs(
            config, None, None, region_features, region_locations, region_attention_mask, "ViLBERT"
        )
        if config.num_co_attention_layers == 0:
            raise ValueError("in_batch_pairs forms the pairs at the first co-attention layer; this ViLBERT has none")
    else:
        check_text_and_region_inputs(
            config,
            input_ids,
            inputs_embeds,
            region_features,
            region_locations,
            region_attention_mask,
            "ViLBERT",
            require_both=True,
        )
    batch = (input_ids if input_ids is not None else inputs_embeds).shape[0]
    if config.num_task_tokens > 0:
        if task_ids is None:
            raise ValueError(
                f"this is a multi-task ViLBERT (task tokens for {config.num_task_tokens} tasks): pass task_ids, the "
                "12-in-1 task number of each example (e.g. 1 for VQA; the processor's task_id= setting adds them)"
            )
        if task_ids.numel() != batch:
            raise ValueError(f"task_ids must hold one task per text ({batch}), got shape {tuple(task_ids.shape)}")
        # Host tensors only: checking a device tensor would wait for the device.
        if task_ids.device.type == "cpu":
            values = task_ids.detach().numpy()
            if (values < 0).any() or (values >= config.num_task_tokens).any():
                raise ValueError(
                    f"task_ids {sorted(set(values.reshape(-1).tolist()))} out of range: this checkpoint has task tokens "
                    f"for task ids 0..{config.num_task_tokens - 1}"
                )
    elif task_ids is not None:
        raise ValueError("task_ids were given but this ViLBERT has no task tokens (config.num_task_tokens = 0)")


@auto_docstring(
    custom_intro="""
    The bare ViLBERT: text embeddings (BERT's, plus task tokens), region embeddings, the two-stream encoder with
    co-attention, and both poolers. Module names follow the original `BertModel` of ViLBERT (`embeddings`,
    `v_embeddings`, `encoder.layer` / `encoder.v_layer` / `encoder.c_layer`, `t_pooler`, `v_pooler`).
    """,
    custom_args=r"""
    add_pooling_layer (`bool`, *optional*, defaults to `True`):
        Build both poolers (`pooler_output`, `text_pooler_output`, `vision_pooler_output`; None without them).
    add_text_output (`bool`, *optional*, defaults to `True`):
        Build the text stream after the last co-attention layer. Without it (for a head that reads only the visual
        stream's output, as referring expressions) the last co-attention layer is one-sided, only the region
        queries over the text, and the text layers after it are not built: `last_hidden_state` is None,
        `hidden_states` / `attentions` cover the `text_co_attention_layers[-1]` text layers that run, and
        `text_to_vision_attentions` lacks the last layer's map. Needs `add_pooling_layer=False` (the text pooler
        reads the text output) and at least one co-attention layer.
    """,
)
class VilbertModel(VilbertPreTrainedModel):
    def __init__(self, config: VilbertConfig, add_pooling_layer: bool = True, add_text_output: bool = True) -> None:
        super().__init__(config)
        if not add_text_output and add_pooling_layer:
            raise ValueError(
                "add_text_output=False needs add_pooling_layer=False: the text pooler reads the text output"
            )
        if not add_text_output and config.num_co_attention_layers == 0:
            raise ValueError(
                "add_text_output=False keeps the text stream up to the last co-attention layer; this config has none"
            )
        self.embeddings = VilbertEmbeddings(config)
        self.v_embeddings = VilbertImageEmbeddings(config)
        self.encoder = VilbertEncoder(config, add_text_output=add_text_output)
        self.t_pooler = VilbertPooler(config.hidden_size, config.bi_hidden_size) if add_pooling_layer else None
        self.v_pooler = VilbertPooler(config.visual_hidden_size, config.bi_hidden_size) if add_pooling_layer else None
        self.post_init()

    @auto_docstring(custom_args=_REGION_ARGS + _IN_BATCH_PAIRS_ARG)
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
        task_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        in_batch_pairs: bool = False,
        **kwargs: Unpack[TransformersKwargs],
    ) -> VilbertModelOutput:
        r"""
        Returns:
            `VilbertModelOutput`: both streams' outputs, both pooled outputs and their fusion (`pooler_output`).
        """
        _check_inputs(
            self.config,
            input_ids,
            inputs_embeds,
            region_features,
            region_locations,
            region_attention_mask,
            task_ids,
            in_batch_pairs,
        )
        pair_index = None
        if in_batch_pairs:
            texts = (input_ids if input_ids is not None else inputs_embeds).shape[0]
            images, device = region_features.shape[0], region_features.device
            pair_index = (
                torch.arange(texts, device=device).repeat_interleave(images),
                torch.arange(images, device=device).repeat(texts),
            )
        outputs = self._encode(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            region_features=region_features,
            region_locations=region_locations,
            region_attention_mask=region_attention_mask,
            task_ids=task_ids,
            inputs_embeds=inputs_embeds,
            pair_index=pair_index,
            return_dict=True,
            **recording_flags(self.config, kwargs, _RECORDED_OUTPUTS),
        )
        if pair_index is not None:
            _pair_early_records(outputs, self.config, pair_index)
        return outputs

    @capture_outputs(tie_last_hidden_states=False)  # hidden_states[-1] is the text stream's, as recorded
    def _encode(
        self,
        input_ids,
        attention_mask,
        token_type_ids,
        position_ids,
        region_features,
        region_locations,
        region_attention_mask,
        task_ids,
        inputs_embeds,
        pair_index,
        **kwargs,
    ) -> VilbertModelOutput:
        text = self.embeddings(
            input_ids=input_ids,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            task_ids=task_ids,
        )
        batch, text_length = text.shape[:2]
        if attention_mask is None:
            attention_mask = torch.ones((batch, text_length), dtype=torch.long, device=text.device)
        elif self.config.num_task_tokens > 0:  # the task token is always attended
            attention_mask = torch.cat([attention_mask.new_ones(batch, 1), attention_mask], dim=1)
        weight = self.v_embeddings.image_embeddings.weight
        vision = self.v_embeddings(region_features.to(weight.dtype), region_locations.to(weight.dtype))
        if region_attention_mask is None:
            region_attention_mask = torch.ones(vision.shape[:2], dtype=torch.long, device=vision.device)
        attention_mask = attention_mask.to(text.device, torch.long)
        region_attention_mask = region_attention_mask.to(vision.device, torch.long)
        # `output_attentions` reaches the attention functions, as in BERT: sdpa and the other backends without maps
        # warn and the records stay empty.
        layer_kwargs = {
            name: value
            for name, value in kwargs.items()
            if not name.startswith("output_") or name == "output_attentions"
        }
        encoded = self.encoder(
            text, vision, attention_mask, region_attention_mask, pair_index=pair_index, **layer_kwargs
        )
        if self.t_pooler is None:
            return encoded
        pooled_text = self.t_pooler(encoded.last_hidden_state)
        pooled_vision = self.v_pooler(encoded.vision_last_hidden_state)
        fused = pooled_text * pooled_vision if self.config.fusion_method == "mul" else pooled_text + pooled_vision
        return VilbertModelOutput(
            last_hidden_state=encoded.last_hidden_state,
            vision_last_hidden_state=encoded.vision_last_hidden_state,
            pooler_output=fused,
            text_pooler_output=pooled_text,
            vision_pooler_output=pooled_vision,
        )


class _VilbertHead(VilbertPreTrainedModel):
    """A ViLBERT trunk plus a task head. The forward is shared: the inputs (laid out per pair by `_pairs`, for the
    heads whose examples hold several pairs) go through the trunk, then `_head` computes the task's logits and loss
    from the trunk's outputs. The original applies dropout to the fused pooled output before every head."""

    def __init__(self, config: VilbertConfig, **model_arguments) -> None:
        super().__init__(config)
        self.vilbert = VilbertModel(config, **model_arguments)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def _pairs(self, inputs: dict) -> dict:
        """The trunk's inputs, one row per (text, image) pair."""
        return inputs

    # Keyword arguments of `forward` that belong to the head (targets, loss settings), not to the trunk.
    _head_arguments: tuple[str, ...] = ()
    # Whether the head's outputs are per pair, so that `in_batch_pairs=True` (every text with every image) applies.
    _scores_in_batch_pairs = False

    def _head(self, outputs: VilbertModelOutput, labels, inputs: dict, **head_arguments):
        raise NotImplementedError

    @auto_docstring(custom_args=_REGION_ARGS + _LABELS_ARG)
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
        task_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ):
        r"""
        Returns:
            The head's output (`VilbertClassifierOutput` for the task heads); see the head's class.
        """
        inputs = dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            region_features=region_features,
            region_locations=region_locations,
            region_attention_mask=region_attention_mask,
            task_ids=task_ids,
            inputs_embeds=inputs_embeds,
        )
        head_arguments = {name: kwargs.pop(name) for name in self._head_arguments if name in kwargs}
        if kwargs.get("in_batch_pairs"):
            if not self._scores_in_batch_pairs:
                raise ValueError(
                    f"{type(self).__name__} does not take in_batch_pairs (every text with every image); "
                    "VilbertModel, VilbertForImageTextRetrieval and VilbertForPreTraining do"
                )
            if labels is not None or any(v is not None for v in head_arguments.values()):
                raise ValueError("in_batch_pairs scores every text with every image; it takes no training targets")
        outputs = self.vilbert(**self._pairs(inputs), **kwargs)
        return self._head(outputs, labels, inputs, **head_arguments)

    def _output(self, loss, logits, outputs) -> VilbertClassifierOutput:
        return VilbertClassifierOutput(
            loss=loss,
            logits=logits,
            pooler_output=outputs.pooler_output,
            **passed_records(VilbertClassifierOutput, outputs),
        )


# ---------------------------------------------------------------------------------------------------- pre-training
class VilbertImagePredictionHead(TransformedLinearHead):
    """Masked-region classification (`cls.imagePredictions`): BERT's prediction transform at the visual width (with
    the text stream's activation, as the original), then `decoder` Linear(visual_hidden_size, num_region_labels)."""

    def __init__(self, config: VilbertConfig) -> None:
        visual = StreamConfig(config, hidden_size=config.visual_hidden_size)
        super().__init__(BertPredictionHeadTransform(visual), config.visual_hidden_size, config.num_region_labels)


class VilbertPreTrainingHeads(nn.Module):
    """`predictions` (BERT's MLM head, decoder tied to the word embeddings), `bi_seq_relationship` (alignment, class
    0 = aligned) and `imagePredictions` (masked-region classes), named as the original's `cls`."""

    def __init__(self, config: VilbertConfig) -> None:
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        self.bi_seq_relationship = nn.Linear(config.bi_hidden_size, 2)
        self.imagePredictions = VilbertImagePredictionHead(config)


@auto_docstring(
    custom_intro="""
    ViLBERT with its pre-training heads (`cls`): masked language modelling, masked-region classification against
    the detector's class distribution (KL) and image-caption alignment (**class 0 = aligned**, as the original).

    Losses are computed for the targets given and summed with equal weights (the original's `img_weight` is 1).
    The forward takes `VilbertModel`'s inputs and these targets:

    labels (`torch.LongTensor` of shape `(batch_size, input_length)`, *optional*):
        MLM targets; negative labels (-100, or the original's -1) are ignored. With task tokens they are the
        input positions (the task token is skipped).
    region_labels (`torch.Tensor` of shape `(batch_size, num_regions)`, *optional*):
        1 at the masked regions (whose features the data pipeline zeroed), 0 elsewhere; row 0 (the global
        image token) never counts.
    region_class_targets (`torch.FloatTensor` of shape `(batch_size, num_regions, num_region_labels)`, *optional*):
        The detector's class distribution (`cls_prob`, background first) of every region row; needs
        `region_labels`. The loss is `KL(target || softmax(logits))` summed over classes and masked regions,
        divided by the number of masked regions (at least 1; the original divides by zero when none is masked).
    alignment_labels (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
        0 = the caption belongs to the image, 1 = a random caption (the original's convention).

    Returns:
        `VilbertForPreTrainingOutput` with the logits of all three heads.
    """
)
class VilbertForPreTraining(BertMLMHeadMixin, _VilbertHead):
    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "vilbert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def __init__(self, config: VilbertConfig) -> None:
        super().__init__(config)
        self.cls = VilbertPreTrainingHeads(config)
        self.post_init()

    _head_arguments = ("region_labels", "region_class_targets", "alignment_labels")
    _scores_in_batch_pairs = True

    def _head(
        self, outputs, labels, inputs, region_labels=None, region_class_targets=None, alignment_labels=None
    ) -> VilbertForPreTrainingOutput:
        text, vision = outputs.last_hidden_state, outputs.vision_last_hidden_state
        prediction_logits = self.cls.predictions(text)
        region_logits = self.cls.imagePredictions(vision)
        alignment_logits = self.cls.bi_seq_relationship(self.dropout(outputs.pooler_output))
        losses, mlm_logits = {}, None
        if labels is not None:
            if self.config.num_task_tokens > 0 and labels.shape[1] == text.shape[1] - 1:
                labels = torch.cat([labels[:, :1], torch.full_like(labels[:, :1], -100), labels[:, 1:]], dim=1)
            labelled = labelled_tokens(labels, text)
            losses["mlm_loss"] = F.cross_entropy(
                prediction_logits.flatten(0, 1).float(), labels.masked_fill(~labelled, -100).flatten()
            )
            mlm_logits = prediction_logits[labelled]
        if region_class_targets is not None:
            if region_labels is None:
                raise ValueError("region_class_targets need region_labels (1 at the masked regions)")
            if region_class_targets.shape != region_logits.shape:
                raise ValueError(
                    f"region_class_targets must have shape {tuple(region_logits.shape)}, "
                    f"got {tuple(region_class_targets.shape)}"
                )
            masked = (region_labels[:, 1:] == 1).to(region_logits.dtype)
            divergence = F.kl_div(
                F.log_softmax(region_logits[:, 1:].float(), dim=-1),
                region_class_targets[:, 1:].float(),
                reduction="none",
            ).sum(-1)
            losses["region_kl_loss"] = (divergence * masked).sum() / masked.sum().clamp(min=1)
        if alignment_labels is not None:
            losses["alignment_loss"] = F.cross_entropy(alignment_logits.float(), alignment_labels.view(-1))
        return VilbertForPreTrainingOutput(
            loss=sum(losses.values()) if losses else None,
            **losses,
            prediction_logits=prediction_logits,
            mlm_logits=mlm_logits,
            region_logits=region_logits,
            alignment_logits=alignment_logits,
            pooler_output=outputs.pooler_output,
            **passed_records(VilbertForPreTrainingOutput, outputs),
        )


# ---------------------------------------------------------------------------------------------------- downstream
def answer_head(config: VilbertConfig, in_size: int, num_labels: int) -> nn.Sequential:
    """The released answer heads (`SimpleClassifier`): inner width `2 * bi_hidden_size`.

    `"multi_task"`: Linear, GELU, LayerNorm, Linear (indices 0, 2, 3). `"beta"`: Linear, ReLU, Dropout, Linear
    (indices 0, 3; the original's weight norm is folded into the weights by the converter)."""
    inner = 2 * config.bi_hidden_size
    if config.classifier_type == "beta":
        dropout = 0.5 if config.classifier_dropout is None else config.classifier_dropout
        return nn.Sequential(nn.Linear(in_size, inner), nn.ReLU(), nn.Dropout(dropout), nn.Linear(inner, num_labels))
    return classifier_head(in_size, inner, num_labels, "gelu", config.layer_norm_eps)


@auto_docstring(
    custom_intro="""
    VQA (3129 answers) / GQA (1533 answers): `vil_prediction` on the fused pooled output. `config.id2label` holds
    the answers.

    `labels` (`(batch_size, num_labels)` soft answer scores in [0, 1]): the original's loss, BCE with logits averaged
    and times the number of answers. Returns `VilbertClassifierOutput` with `logits` `(batch_size, num_labels)`.
    """
)
class VilbertForQuestionAnswering(_VilbertHead):
    def __init__(self, config: VilbertConfig) -> None:
        super().__init__(config)
        self.vil_prediction = answer_head(config, config.bi_hidden_size, config.num_labels)
        self.post_init()

    def _head(self, outputs, labels, inputs):
        logits = self.vil_prediction(self.dropout(outputs.pooler_output))
        loss = None
        if labels is not None:
            loss = soft_score_loss(logits, labels)
        return self._output(loss, logits, outputs)


@auto_docstring(
    custom_intro="""
    SNLI-VE (12-in-1): `vil_tri_prediction` Linear(bi_hidden_size, 3) on the fused pooled output.

    `labels` (`(batch_size,)` class ids, in the order of the training data): cross-entropy. Returns
    `VilbertClassifierOutput` with `logits` `(batch_size, 3)`.
    """
)
class VilbertForVisualEntailment(_VilbertHead):
    def __init__(self, config: VilbertConfig) -> None:
        super().__init__(config)
        self.vil_tri_prediction = nn.Linear(config.bi_hidden_size, 3)
        self.post_init()

    def _head(self, outputs, labels, inputs):
        logits = self.vil_tri_prediction(self.dropout(outputs.pooler_output))
        return self._output(_cross_entropy(logits, labels), logits, outputs)


def _cross_entropy(logits, labels):
    return None if labels is None else F.cross_entropy(logits.float(), labels.view(-1))


@auto_docstring(
    custom_intro="""
    Image-text retrieval: `vil_logit` Linear(bi_hidden_size, 1) scores a pair from the fused pooled output.
    Returns `VilbertClassifierOutput` with `logits` `(batch_size, 1)`.

    Training, as the original: `num_negatives=N` reads the batch as groups of `1 + N` pairs, the matched pair first,
    with cross-entropy over each group's scores (the original uses 3 negatives). A pre-trained checkpoint converted
    to this head gets the original's zero-shot score (`softmax(alignment)[0]`, see `vil_logit_from_alignment`).

    Scoring one caption against many images (or every text against every image of a batch): `in_batch_pairs=True`
    with `Bt` texts and `Bv` images gives `logits` `(Bt * Bv, 1)`, `logits.view(Bt, Bv)` the score matrix; the text
    layers before the first co-attention run once per text (the original's `fast_mode` retrieval evaluation).
    """
)
class VilbertForImageTextRetrieval(_VilbertHead):
    def __init__(self, config: VilbertConfig) -> None:
        super().__init__(config)
        self.vil_logit = nn.Linear(config.bi_hidden_size, 1)
        self.post_init()

    @staticmethod
    def vil_logit_from_alignment(weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`vil_logit` `(1, H)` weight and `(1,)` bias from a pre-training alignment head (`(2, H)`, `(2,)`, class
        0 = aligned): `row 0 - row 1`, so that `sigmoid(vil_logit) = softmax(alignment)[0]`, the original's
        zero-shot retrieval score."""
        if weight.ndim != 2 or weight.shape[0] != 2 or tuple(bias.shape) != (2,):
            raise ValueError(
                f"expected an alignment head of weight (2, hidden) and bias (2,), got "
                f"{tuple(weight.shape)} and {tuple(bias.shape)}"
            )
        return (weight[0:1] - weight[1:2]).clone(), (bias[0:1] - bias[1:2]).clone()

    def initialize_from_pretraining(self, pretraining_state_dict: dict[str, torch.Tensor]) -> list[str]:
        """Start `vil_logit` from a pre-training checkpoint's alignment head (the zero-shot score). Returns the names
        it set."""
        weight, bias = self.vil_logit_from_alignment(
            pretraining_state_dict["cls.bi_seq_relationship.weight"],
            pretraining_state_dict["cls.bi_seq_relationship.bias"],
        )
        with torch.no_grad():
            self.vil_logit.weight.copy_(weight)
            self.vil_logit.bias.copy_(bias)
        return ["vil_logit.weight", "vil_logit.bias"]

    _head_arguments = ("num_negatives",)
    _scores_in_batch_pairs = True

    def _head(self, outputs, labels, inputs, num_negatives: int | None = None):
        logits = self.vil_logit(self.dropout(outputs.pooler_output))
        loss = None
        if num_negatives is not None:
            scores = negative_groups(logits, num_negatives)
            loss = F.cross_entropy(scores, torch.zeros(scores.shape[0], dtype=torch.long, device=scores.device))
        return self._output(loss, logits, outputs)


_REGION_NDIMS = {"region_features": 2, "region_locations": 2, "region_attention_mask": 1}


@auto_docstring(
    custom_intro="""
    VCR (and other multiple choice): each (question, choice) text is encoded with the image; `vil_logit` scores
    it and the choices compete in a cross-entropy, as the original.

    Inputs: `input_ids` / `attention_mask` / `token_type_ids` / `position_ids` `(batch_size, num_choices,
    text_length)` (`inputs_embeds` with a trailing hidden dimension); regions `(batch_size, num_regions, ...)` shared
    by the choices or `(batch_size, num_choices, num_regions, ...)`; `task_ids` one per question. `labels`
    (`(batch_size,)`): the right choice. Returns `VilbertClassifierOutput` with `logits` `(batch_size, num_choices)`;
    per-layer outputs cover the `batch_size * num_choices` pairs.
    """
)
class VilbertForMultipleChoice(_VilbertHead):
    def __init__(self, config: VilbertConfig) -> None:
        super().__init__(config)
        self.vil_logit = nn.Linear(config.bi_hidden_size, 1)
        self.post_init()

    def _pairs(self, inputs):
        batch, choices = text_with_choice_axis(inputs["input_ids"], inputs["inputs_embeds"]).shape[:2]
        task_ids = inputs["task_ids"]
        flat = flatten_choices({k: v for k, v in inputs.items() if k != "task_ids"}, batch, choices, _REGION_NDIMS)
        flat["task_ids"] = None if task_ids is None else task_ids.reshape(batch, 1).repeat_interleave(choices, dim=0)
        return flat

    def _head(self, outputs, labels, inputs):
        batch, choices = text_with_choice_axis(inputs["input_ids"], inputs["inputs_embeds"]).shape[:2]
        logits = self.vil_logit(self.dropout(outputs.pooler_output)).view(batch, choices)
        return self._output(_cross_entropy(logits, labels), logits, outputs)


@auto_docstring(
    custom_intro="""
    NLVR2 (12-in-1): one statement, two images. Each (text, image) pair is encoded and the two fused pooled
    outputs, concatenated, go through `vil_binary_prediction` (Linear, GELU, LayerNorm, Linear → 2).

    Inputs: regions `(batch_size, 2, num_regions, ...)` (left and right image); the text `(batch_size, T)` (used
    with both images) or `(batch_size, 2, T)` (one per image); `task_ids` one per example. `labels` (`(batch_size,)`):
    1 = the statement is true. Returns `VilbertClassifierOutput` with `logits` `(batch_size, 2)`; per-layer outputs
    cover the `2 * batch_size` pairs, left then right for each example.
    """
)
class VilbertForVisualReasoning(_VilbertHead):
    def __init__(self, config: VilbertConfig) -> None:
        super().__init__(config)
        self.vil_binary_prediction = answer_head(config, 2 * config.bi_hidden_size, 2)
        self.post_init()

    def _pairs(self, inputs):
        features = inputs["region_features"]
        if features is None or features.ndim != 4 or features.shape[1] != 2:
            shape = None if features is None else tuple(features.shape)
            raise ValueError(
                f"NLVR2 needs the regions of two images: region_features of shape (batch, 2, R, F), got {shape}"
            )
        batch = features.shape[0]
        ids = inputs["input_ids"]
        text = ids if ids is not None else inputs["inputs_embeds"]
        shared_text = text is not None and text.ndim == (2 if ids is not None else 3)
        # A statement used with both images is repeated: as regions shared by the choices of `flatten_choices`.
        ndims = {"input_ids": 1, "attention_mask": 1, "token_type_ids": 1, "inputs_embeds": 2} if shared_text else {}
        position_ids = inputs["position_ids"]
        flat = flatten_choices(
            {k: v for k, v in inputs.items() if k not in ("task_ids", "position_ids")}, batch, 2, ndims
        )
        flat["position_ids"] = (
            position_ids
            if position_ids is None or position_ids.shape[0] == 1
            else flatten_choices({"position_ids": position_ids}, batch, 2, {"position_ids": 1} if shared_text else {})[
                "position_ids"
            ]
        )
        task_ids = inputs["task_ids"]
        flat["task_ids"] = None if task_ids is None else task_ids.reshape(batch, 1).repeat_interleave(2, dim=0)
        return flat

    def _head(self, outputs, labels, inputs):
        pooled = self.dropout(outputs.pooler_output).reshape(-1, 2 * self.config.bi_hidden_size)
        logits = self.vil_binary_prediction(pooled)
        return self._output(_cross_entropy(logits, labels), logits, outputs)


def _checked_choices(choice_region_ids: torch.Tensor, region_scores_shape) -> torch.Tensor:
    batch, regions = region_scores_shape
    if choice_region_ids.ndim != 2 or choice_region_ids.shape[0] != batch or choice_region_ids.is_floating_point():
        raise ValueError(
            f"choice_region_ids must be integer region rows of shape (batch, num_choices) with batch "
            f"{batch}, got {choice_region_ids.dtype} {tuple(choice_region_ids.shape)}"
        )
    if (
        choice_region_ids.device.type == "cpu"
        and choice_region_ids.numel()
        and (choice_region_ids.min() < 0 or choice_region_ids.max() >= regions)
    ):
        raise ValueError(
            f"choice_region_ids must name region rows 0..{regions - 1}, got rows "
            f"{choice_region_ids.min().item()}..{choice_region_ids.max().item()}"
        )
    return choice_region_ids.long()


@auto_docstring(
    custom_intro="""
    Referring expressions (RefCOCO/+/g, and the grounding tasks of 12-in-1): `vision_logit` Linear(visual_hidden,
    1) scores every region output; padded regions get -10000 added, as the original.

    The head reads the visual stream's output alone, so its trunk is `VilbertModel(add_pooling_layer=False,
    add_text_output=False)`: the original computes the text stream's tail (its layers after the last co-attention
    layer and the text side of that layer), both poolers and the per-token score `linguisic_logit` on every forward,
    but no loss or output of the task reads them, so this head has none of them (the converter drops them; an older
    folder that has them loads, their weights ignored). The region scores are the original's. `pooler_output` is
    None; `hidden_states` / `attentions` cover the text layers that run (the embeddings and the
    `text_co_attention_layers[-1]` layers before the last co-attention layer); `text_to_vision_attentions` has one
    map fewer than `vision_to_text_attentions` (the last layer's text queries are not computed).

    `labels`: soft targets `(batch_size, num_regions)` (IoU-based, the original's): BCE with logits averaged and
    times the number of regions; region indices `(batch_size,)`: cross-entropy over the regions. Returns
    `VilbertClassifierOutput` with `logits` `(batch_size, num_regions)`.

    Pointing among candidate boxes (12-in-1 "V-logit-mc": Visual7w pointing, task 4; GuessWhat pointing, task 17):
    `choice_region_ids` `(batch_size, num_choices)` names the region rows of the candidates, and `logits` become
    their scores `(batch_size, num_choices)` (labels then `(batch_size, num_choices)` soft targets, the original's
    IoU >= 0.5 scores, or `(batch_size,)` choice indices). In the original layout the candidate boxes follow the 101
    rows of the detected regions (global token first), so a row is `101 + multiple_choice_idx`;
    `VilbertProcessor.pointing` lays the inputs out so, with `choice_region_ids` and the soft targets as `labels`.
    """
)
class VilbertForReferringExpression(_VilbertHead):
    def __init__(self, config: VilbertConfig) -> None:
        super().__init__(config, add_pooling_layer=False, add_text_output=False)
        self.vision_logit = nn.Linear(config.visual_hidden_size, 1)
        # What a full model's (or an older version's) checkpoint has and this head does not build.
        self._keys_to_ignore_on_load_unexpected = list(text_output_weights(config))
        self.post_init()

    _head_arguments = ("choice_region_ids",)

    def _head(self, outputs, labels, inputs, choice_region_ids=None):
        logits = self.vision_logit(self.dropout(outputs.vision_last_hidden_state)).squeeze(-1)
        region_attention_mask = inputs["region_attention_mask"]
        if region_attention_mask is not None:
            logits = logits + (1 - region_attention_mask.to(logits.dtype)) * MASKED_SCORE
        if choice_region_ids is not None:
            logits = logits.gather(1, _checked_choices(choice_region_ids, logits.shape))
        loss = None
        if labels is not None and labels.dtype.is_floating_point:
            loss = soft_score_loss(logits, labels, "soft region targets")
        elif labels is not None:
            loss = _cross_entropy(logits, labels)
        return self._output(loss, logits, outputs)


def text_output_weights(config: VilbertConfig) -> tuple[str, ...]:
    """Regexes of the weights that only the text stream's output reads, which a head on the visual stream's output
    alone (`VilbertModel(add_text_output=False)`) does not have: the text layers after the last co-attention layer,
    the text side of that layer, both poolers and the original's per-token score `linguisic_logit`."""
    tail = "|".join(str(index) for index in range(config.text_co_attention_layers[-1], config.num_hidden_layers))
    last = config.num_co_attention_layers - 1
    return (
        rf"^(vilbert\.)?encoder\.layer\.({tail})\.",
        rf"^(vilbert\.)?encoder\.c_layer\.{last}\.(biattention\.(query2|key1|value1)|biOutput\.(dense2|LayerNorm2)|t_)",
        r"^(vilbert\.)?[tv]_pooler\.",
        r"^linguisic_logit\.",
    )
