"""What every vlhub `PreTrainedModel` shares (in the spirit of transformers' per-model `XPreTrainedModel`, written once).

An architecture's base class subclasses `VisionLanguagePreTrainedModel` and sets only what is its own: `config` /
`config_class`, `base_model_prefix`, `_no_split_modules`, and (for BERT-encoder models) `_can_record_outputs`
(`BERT_RECORDED_OUTPUTS`); its `_init_weights` calls `super()._init_weights(module)` and adds its own modules.
"""

import torch
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.models.bert.modeling_bert import BertLMPredictionHead

from ..utils.compat import CACHE_NAME
from .layers import BertEmbeddings, BertLayer, BertSelfAttention

__all__ = ["BERT_RECORDED_OUTPUTS", "BertMLMHeadMixin", "SharedPrefillMixin", "VisionLanguagePreTrainedModel"]

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


class SharedPrefillMixin:
    """Encodes each distinct prompt once in `generate()` (captioners with a key/value cache; list it before
    `GenerationMixin`).

    For beam search (and `num_return_sequences > 1`) transformers repeats every input `k` times before the first
    forward, which then encodes the same prompt `k` times: for a captioner the regions and the prompt, most of the
    work of a short caption. Here the first forward runs on one copy of each input and its key/value cache and logits
    are repeated `k` times (`Cache.batch_repeat_interleave`), which is what the `k` identical forwards would have
    given. Only with a cache that is still empty, when the copies are really identical, and when no per-step
    hidden states or attentions are asked for; anything else runs transformers' own first forward.
    """

    def _prefill(self, input_ids, generation_config, model_kwargs, *args, **kwargs):
        copies = max(generation_config.num_beams or 1, generation_config.num_return_sequences or 1)
        cache = model_kwargs.get(CACHE_NAME)
        rows = input_ids.shape[0]
        plain = (
            copies == 1 or rows % copies or cache is None or cache.get_seq_length() > 0
            or not model_kwargs.get("use_cache", True) or getattr(generation_config, "prefill_chunk_size", None)
            or generation_config.output_hidden_states or generation_config.output_attentions
        )
        batch_first = {name: value for name, value in model_kwargs.items()
                       if isinstance(value, torch.Tensor) and value.ndim and value.shape[0] == rows}
        if not plain:
            plain = not all(torch.equal(value, value[::copies].repeat_interleave(copies, dim=0))
                            for value in (input_ids, *batch_first.values()))
        if plain:
            return super()._prefill(input_ids, generation_config, model_kwargs, *args, **kwargs)
        unique = {**model_kwargs, **{name: value[::copies] for name, value in batch_first.items()}}
        outputs = super()._prefill(input_ids[::copies], generation_config, unique, *args, **kwargs)
        filled = getattr(outputs, CACHE_NAME, None)
        (filled if filled is not None else cache).batch_repeat_interleave(copies)
        outputs.logits = outputs.logits.repeat_interleave(copies, dim=0)
        return outputs
