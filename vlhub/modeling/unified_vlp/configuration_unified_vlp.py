"""Unified VLP configuration."""

import os
from typing import Any

from huggingface_hub.dataclasses import strict

from ..configuration_text import RegionBertConfig, read_original_bert_config

__all__ = ["UnifiedVlpConfig"]


@strict
class UnifiedVlpConfig(RegionBertConfig):
    r"""Configuration of a Unified VLP model (Zhou et al., "Unified Vision-Language Pre-Training for Image Captioning
    and VQA", AAAI 2020).

    The defaults are those of the released checkpoints: bert-base-cased sizes (vocabulary 28996), six token types,
    every LayerNorm with eps 1e-5 (not BERT's 1e-12), and 100 region slots. The sequence is
    `[CLS] r_1 .. r_N [SEP] w_1 .. w_T [SEP]`: the region slots hold a placeholder token in `input_ids` whose word
    and position embeddings are replaced by the two region projections.

    Args:
        num_regions (`int`, defaults to 100): region slots after [CLS] (`len_vis_input`; the original asserts 100).
            Text starts at position `num_regions + 2`.
        region_feature_dim (`int`, defaults to 2048): size of one region feature (the detector's fc6 output).
        region_embed_dim (`int`, defaults to 2048): inner size of the region feature MLP (`vis_embed.0`, Detectron's
            fc7 in the original).
        region_location_dim (`int`, defaults to 1607): size of the region "position" vector `vis_pe`
            (6 geometry values + the detector class probabilities, each part layer-normalised).
        num_region_labels (`int`, defaults to 1601): detector classes in `vis_pe` (background first); always
            `region_location_dim - 6`. Give either field (the other follows) or both, consistent.
        s2s_image_token_type_id, s2s_text_token_type_id (`int`, defaults to 4 and 5): token types of the image block
            ([CLS], regions, first [SEP]) and of the text in the seq2seq (captioning) layout.
        bi_image_token_type_id, bi_text_token_type_id (`int`, defaults to 0 and 1): the same for the bidirectional
            (VQA) layout.
        region_token_id (`int`, defaults to 100): the placeholder id in the region slots ([UNK]).
        mask_token_id (`int`, defaults to 103): [MASK], the slot the captioner predicts the next word from.
        classifier_hidden_size (`int`, *optional*): inner size of the VQA head; defaults to `2 * hidden_size`.
        unknown_answer_id (`int`, *optional*): the VQA answer that stands for "unknown" and is never predicted (the
            original evaluation's `argmax(logits[:, 1:]) + 1` skips Pythia's `<unk>`, answer 0: the converter sets
            0). None (the default, e.g. the shapes world's answers): every answer can be predicted.
    """

    model_type = "unified_vlp"

    vocab_size: int = 28996  # BERT's other text fields, region_feature_dim: RegionBertConfig
    type_vocab_size: int = 6
    layer_norm_eps: float = 1e-5
    use_cache: bool = True
    bos_token_id: int | None = 101
    eos_token_id: int | None = 102
    region_token_id: int = 100
    mask_token_id: int = 103
    num_regions: int = 100
    region_embed_dim: int = 2048
    region_location_dim: int | None = None
    num_region_labels: int | None = None
    s2s_image_token_type_id: int = 4
    s2s_text_token_type_id: int = 5
    bi_image_token_type_id: int = 0
    bi_text_token_type_id: int = 1
    classifier_hidden_size: int | None = None
    unknown_answer_id: int | None = None

    def __post_init__(self, **kwargs):
        # vis_pe = 6 geometry values + one probability per detector class: either size gives the other.
        if self.region_location_dim is None and self.num_region_labels is None:
            self.num_region_labels = 1601
        if self.region_location_dim is None:
            self.region_location_dim = self.num_region_labels + 6
        elif self.num_region_labels is None:
            self.num_region_labels = self.region_location_dim - 6
        super().__post_init__(**kwargs)

    def validate_architecture(self) -> None:
        super().validate_architecture()  # BertTextConfig: hidden_size / num_attention_heads
        if self.num_region_labels < 1 or self.region_location_dim != self.num_region_labels + 6:
            raise ValueError(
                f"region_location_dim ({self.region_location_dim}) must be 6 geometry values + num_region_labels "
                f"({self.num_region_labels}) class probabilities, with at least one class"
            )
        if self.num_regions < 1:
            raise ValueError(f"num_regions must be at least 1, got {self.num_regions}")
        if self.max_position_embeddings < self.num_regions + 4:
            raise ValueError(
                f"max_position_embeddings ({self.max_position_embeddings}) leaves no room for text after the "
                f"{self.num_regions} region slots (text starts at position {self.num_regions + 2})"
            )
        types = (
            self.s2s_image_token_type_id,
            self.s2s_text_token_type_id,
            self.bi_image_token_type_id,
            self.bi_text_token_type_id,
        )
        if max(types) >= self.type_vocab_size:
            raise ValueError(f"token types {types} need type_vocab_size > {max(types)}, got {self.type_vocab_size}")

    @property
    def text_start(self) -> int:
        """Position of the first text token: after [CLS], the region slots and the first [SEP]."""
        return self.num_regions + 2

    @classmethod
    def from_original_config(cls, path_or_dict: str | os.PathLike | dict, **overrides: Any) -> "UnifiedVlpConfig":
        """Read the original `bert_config.json` (BERT fields only; the original fixes the rest in code)."""
        original = read_original_bert_config(path_or_dict, "VLP")
        if original.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"the original VLP uses the exact (erf) GELU; got hidden_act={original['hidden_act']!r}")
        return cls(**{**original, **overrides})
