"""What every vlhub `PreTrainedModel` shares (in the spirit of transformers' per-model `XPreTrainedModel`, written once).

An architecture's base class subclasses `VisionLanguagePreTrainedModel` and sets only what is its own: `config` /
`config_class`, `base_model_prefix`, `_no_split_modules`, and (for BERT-encoder models) `_can_record_outputs`
(`BERT_RECORDED_OUTPUTS`); its `_init_weights` calls `super()._init_weights(module)` and adds its own modules.
"""

import torch
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.models.bert.modeling_bert import BertLMPredictionHead

from .layers import BertEmbeddings, BertLayer, BertSelfAttention

__all__ = ["BERT_RECORDED_OUTPUTS", "BertMLMHeadMixin", "VisionLanguagePreTrainedModel"]

# `output_hidden_states` / `output_attentions` of a model whose encoder is transformers' `BertEncoder`.
BERT_RECORDED_OUTPUTS = {"hidden_states": BertLayer, "attentions": BertSelfAttention}


class VisionLanguagePreTrainedModel(PreTrainedModel):
    """A text + region-feature model on transformers' BERT blocks: every attention backend, gradient checkpointing,
    and the text word embeddings at `embeddings.word_embeddings` of the bare model (transformers' default
    `get_input_embeddings` / `set_input_embeddings` find them there, and heads reach them through `base_model`)."""

    main_input_name = "input_ids"
    input_modalities = ("image", "text")
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _input_embed_layer = "word_embeddings"

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, BertEmbeddings):
            # Buffers: transformers' generic init does not know them (meta-device loading leaves them empty).
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
            init.zeros_(module.token_type_ids)
        elif isinstance(module, BertLMPredictionHead):
            init.zeros_(module.bias)


class BertMLMHeadMixin:
    """Output embeddings of a model whose MLM head is BERT's at `self.cls` (`BertOnlyMLMHead` or a head with the same
    `predictions`): the decoder, whose bias is the head's `bias` (tied, as in BERT). List it before the
    `PreTrainedModel` base: `class XForPreTraining(BertMLMHeadMixin, XPreTrainedModel)`."""

    def get_output_embeddings(self):
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings):
        self.cls.predictions.decoder = new_embeddings
        self.cls.predictions.bias = new_embeddings.bias
