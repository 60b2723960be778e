"""The BERT text fields and the region fields every vlhub config shares (a light module: configs must not import
transformers' models)."""

import json
import os

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

__all__ = ["BertTextConfig", "RegionBertConfig", "load_original_config", "read_original_bert_config"]

# The fields of an original release's BERT-only `bert_config.json` (UNITER, Unified VLP).
ORIGINAL_BERT_FIELDS = frozenset(
    {
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "hidden_act",
        "hidden_dropout_prob",
        "attention_probs_dropout_prob",
        "max_position_embeddings",
        "type_vocab_size",
        "initializer_range",
    }
)
ORIGINAL_BERT_REQUIRED = frozenset({"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"})


def load_original_config(path_or_dict: str | os.PathLike | dict) -> dict:
    """An original release's JSON config as a (new) dict: read from `path_or_dict`, or copied when it is a dict."""
    if isinstance(path_or_dict, dict):
        return dict(path_or_dict)
    with open(path_or_dict, encoding="utf-8") as f:
        return json.load(f)


def read_original_bert_config(path_or_dict: str | os.PathLike | dict, model_name: str) -> dict:
    """`load_original_config`, for a release whose config holds BERT's fields only: any other field, or a missing
    size field, is a `ValueError` naming it (`model_name` says whose config it is)."""
    original = load_original_config(path_or_dict)
    unknown = sorted(set(original) - ORIGINAL_BERT_FIELDS)
    if unknown:
        raise ValueError(
            f"unexpected field(s) {unknown} in the original {model_name} config; expected only "
            f"{sorted(ORIGINAL_BERT_FIELDS)}"
        )
    missing = sorted(ORIGINAL_BERT_REQUIRED - set(original))
    if missing:
        raise ValueError(f"the original {model_name} config lacks required field(s) {missing}")
    return original


@strict
class BertTextConfig(PreTrainedConfig):
    """`BertConfig`'s fields (bert-base-uncased defaults) for the BERT text side of a vision-language model; an
    architecture's config subclasses it (through `RegionBertConfig`) and adds its own fields (and may change a
    default, e.g. `vocab_size`)."""

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

    def validate_architecture(self) -> None:
        super().validate_architecture()
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads ({self.num_attention_heads})"
            )


@strict
class RegionBertConfig(BertTextConfig):
    """`BertTextConfig` and the region fields of every vlhub architecture, each config's base (its docstring says what
    the fields mean for its model; a config may change a default, e.g. Unified VLP derives `num_region_labels`).

    Args:
        region_feature_dim (`int`, defaults to 2048): size of one region feature (bottom-up-attention pool5).
        num_region_labels (`int`, defaults to 1601): detector classes of the masked-region heads (background first).
    """

    region_feature_dim: int = 2048
    num_region_labels: int = 1601
