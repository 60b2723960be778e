"""ViLBERT configuration."""

import os
from typing import Any

from huggingface_hub.dataclasses import strict

from ...utils.choices import check_choice
from ..configuration_text import RegionBertConfig, load_original_config

__all__ = ["VilbertConfig"]

# Original config fields that no code path of either release reads (kept in the JSON files for reference).
_UNREAD_ORIGINAL_FIELDS = {"bi_intermediate_size", "bi_attention_type", "pooling_method", "v_initializer_range"}
# Original field → VilbertConfig field.
_ORIGINAL_NAMES = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_hidden_layers": "num_hidden_layers",
    "num_attention_heads": "num_attention_heads",
    "intermediate_size": "intermediate_size",
    "hidden_act": "hidden_act",
    "hidden_dropout_prob": "hidden_dropout_prob",
    "attention_probs_dropout_prob": "attention_probs_dropout_prob",
    "max_position_embeddings": "max_position_embeddings",
    "type_vocab_size": "type_vocab_size",
    "initializer_range": "initializer_range",
    "v_feature_size": "region_feature_dim",
    "v_target_size": "num_region_labels",
    "v_hidden_size": "visual_hidden_size",
    "v_num_hidden_layers": "visual_num_hidden_layers",
    "v_num_attention_heads": "visual_num_attention_heads",
    "v_intermediate_size": "visual_intermediate_size",
    "v_hidden_act": "visual_hidden_act",
    "v_hidden_dropout_prob": "visual_hidden_dropout_prob",
    "v_attention_probs_dropout_prob": "visual_attention_probs_dropout_prob",
    "bi_hidden_size": "bi_hidden_size",
    "bi_num_attention_heads": "bi_num_attention_heads",
    "v_biattention_id": "visual_co_attention_layers",
    "t_biattention_id": "text_co_attention_layers",
    "fusion_method": "fusion_method",
}
# Switches of the original `BertConfig` (and the training scripts' flags) and the values vlhub implements.
_SUPPORTED_SWITCHES = {
    "with_coattention": (True,),
    "dynamic_attention": (False,),
    "visual_target": (0,),
    "model": ("bert",),
    "predict_feature": (False,),
    "intra_gate": (False,),
}
# Training-time switches that do not change what a forward computes in evaluation.
_TRAINING_SWITCHES = {
    "fast_mode",
    "in_batch_pairs",
    "fixed_v_layer",
    "fixed_t_layer",
    "visualization",
    "objective",
    "num_negative",
}
NUM_ORIGINAL_TASK_TOKENS = 20  # `task_embeddings = nn.Embedding(20, hidden)` in the multi-task release


@strict
class VilbertConfig(RegionBertConfig):
    r"""Configuration of a ViLBERT model (Lu et al., "ViLBERT: Pretraining Task-Agnostic Visiolinguistic
    Representations for Vision-and-Language Tasks", and the 12-in-1 multi-task release).

    ViLBERT has two streams: a BERT text stream (the BERT fields below) and a visual stream over region features,
    joined by co-attention layers. The text stream's fields are BERT's (`BertTextConfig`); the defaults are the
    released 6-layer / 6-co-attention model (`bert_base_6layer_6conect.json`, uncased BERT-base vocabulary).

    Args:
        region_feature_dim (`int`, defaults to 2048): size of one region feature.
        region_location_dim (`int`, defaults to 5): size of a region location `[x1/W, y1/H, x2/W, y2/H, area]`.
        num_region_labels (`int`, defaults to 1601): detector classes of the masked-region head (`v_target_size`).
        visual_hidden_size, visual_num_hidden_layers, visual_num_attention_heads, visual_intermediate_size,
        visual_hidden_act, visual_hidden_dropout_prob, visual_attention_probs_dropout_prob: the visual stream's
            transformer (1024 / 6 / 8 / 1024 in the release; the original `v_*` fields).
        bi_hidden_size (`int`, defaults to 1024): width of the co-attention space and of both pooled outputs.
        bi_num_attention_heads (`int`, defaults to 8): co-attention heads.
        visual_co_attention_layers (`list[int]`): visual layer index *before* which each co-attention layer runs
            (`v_biattention_id`); `text_co_attention_layers` the same for the text stream (`t_biattention_id`).
        fusion_method (`str`, defaults to `"mul"`): how the two pooled outputs are fused, `"mul"` or `"sum"`.
        num_task_tokens (`int`, defaults to 0): rows of the 12-in-1 task-token table (20 in the multi-task
            release; 0 = no task tokens). With task tokens every forward needs `task_ids`.
        classifier_dropout (`float`, defaults to 0.5): dropout inside the beta answer head.
        classifier_type (`str`, defaults to `"multi_task"`): the answer heads' form: `"multi_task"` —
            Linear, GELU, LayerNorm, Linear (12-in-1); `"beta"` — Linear, ReLU, Dropout(0.5), Linear (the beta release,
            whose weight norm is folded into plain weights by the converter).
        num_labels / id2label: answers of `VilbertForQuestionAnswering` (3129 for VQA, 1533 for GQA).
    """

    model_type = "vilbert"

    # BERT's text fields, region_feature_dim, num_region_labels: RegionBertConfig
    region_location_dim: int = 5
    visual_hidden_size: int = 1024
    visual_num_hidden_layers: int = 6
    visual_num_attention_heads: int = 8
    visual_intermediate_size: int = 1024
    visual_hidden_act: str = "gelu"
    visual_hidden_dropout_prob: float | int = 0.1
    visual_attention_probs_dropout_prob: float | int = 0.1
    bi_hidden_size: int = 1024
    bi_num_attention_heads: int = 8
    visual_co_attention_layers: list[int] | tuple[int, ...] = (0, 1, 2, 3, 4, 5)
    text_co_attention_layers: list[int] | tuple[int, ...] = (6, 7, 8, 9, 10, 11)
    fusion_method: str = "mul"
    num_task_tokens: int = 0
    classifier_type: str = "multi_task"
    classifier_dropout: float | int | None = 0.5

    def __post_init__(self, **kwargs):
        self.visual_co_attention_layers = list(self.visual_co_attention_layers)
        self.text_co_attention_layers = list(self.text_co_attention_layers)
        super().__post_init__(**kwargs)

    def validate_architecture(self) -> None:
        super().validate_architecture()
        for name, size, heads in (  # hidden_size: BertTextConfig
            ("visual_hidden_size", self.visual_hidden_size, self.visual_num_attention_heads),
            ("bi_hidden_size", self.bi_hidden_size, self.bi_num_attention_heads),
        ):
            if size % heads != 0:
                raise ValueError(f"{name} ({size}) must be a multiple of its number of attention heads ({heads})")
        visual, text = list(self.visual_co_attention_layers), list(self.text_co_attention_layers)
        if len(visual) != len(text):
            raise ValueError(
                f"visual_co_attention_layers {visual} and text_co_attention_layers {text} must have the same length "
                "(one entry per co-attention layer)"
            )
        for name, ids, count in (
            ("visual_co_attention_layers", visual, self.visual_num_hidden_layers),
            ("text_co_attention_layers", text, self.num_hidden_layers),
        ):
            if any(not 0 <= i < count for i in ids):
                raise ValueError(f"{name} {ids} must index the stream's {count} layers (0..{count - 1})")
            if any(b <= a for a, b in zip(ids, ids[1:])):
                raise ValueError(f"{name} {ids} must be strictly increasing")
        check_choice(self.fusion_method, ("mul", "sum"), "fusion_method")
        check_choice(self.classifier_type, ("multi_task", "beta"), "classifier_type")
        if self.num_task_tokens < 0:
            raise ValueError(f"num_task_tokens must be >= 0, got {self.num_task_tokens}")

    @property
    def num_co_attention_layers(self) -> int:
        return len(self.visual_co_attention_layers)

    @classmethod
    def from_original_config(cls, path_or_dict: str | os.PathLike | dict, **overrides: Any) -> "VilbertConfig":
        """Read a config in the original format (`config/bert_base_6layer_6conect.json`; `v_*`, `bi_*`,
        `*_biattention_id` fields, plus the multi-task flags `task_specific_tokens`, `visual_target`, ...).

        Fields the original code never reads are ignored; switches vlhub does not implement (dynamic attention,
        feature regression targets, RoBERTa text) are refused with a message, not silently dropped."""
        original = load_original_config(path_or_dict)
        fields = {}
        unknown = []
        for key, value in original.items():
            if key in _ORIGINAL_NAMES:
                fields[_ORIGINAL_NAMES[key]] = value
            elif key in _SUPPORTED_SWITCHES:
                if value not in _SUPPORTED_SWITCHES[key]:
                    raise ValueError(
                        f"the original config sets {key}={value!r}, which vlhub's ViLBERT does not implement "
                        f"(supported: {list(_SUPPORTED_SWITCHES[key])})"
                    )
            elif key == "task_specific_tokens":
                fields["num_task_tokens"] = NUM_ORIGINAL_TASK_TOKENS if value else 0
            elif key not in _UNREAD_ORIGINAL_FIELDS and key not in _TRAINING_SWITCHES:
                unknown.append(key)
        if unknown:
            raise ValueError(f"unexpected field(s) {sorted(unknown)} in the original ViLBERT config")
        missing = sorted(
            {
                "hidden_size",
                "visual_hidden_size",
                "bi_hidden_size",
                "visual_co_attention_layers",
                "text_co_attention_layers",
            }
            - set(fields)
        )
        if missing:
            raise ValueError(f"the original ViLBERT config lacks required field(s) {missing}")
        return cls(**{**fields, **overrides})
