"""The BERT text fields every vlhub config shares (a light module: configs must not import transformers' models)."""

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

__all__ = ["BertTextConfig"]


@strict
class BertTextConfig(PreTrainedConfig):
    """`BertConfig`'s fields (bert-base-uncased defaults) for the BERT text side of a vision-language model; an
    architecture's config subclasses it and adds its own fields (and may change a default, e.g. `vocab_size`)."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float | int = 0.1
    attention_probs_dropout_prob: float | int = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    is_decoder: bool = False
    add_cross_attention: bool = False
    use_cache: bool = False
    tie_word_embeddings: bool = True
