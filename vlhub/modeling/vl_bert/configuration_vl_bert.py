"""VL-BERT configuration."""

import os
from typing import Any

from huggingface_hub.dataclasses import strict

from ..configuration_text import RegionBertConfig

__all__ = ["VlBertConfig"]


@strict
class VlBertConfig(RegionBertConfig):
    r"""Configuration of a VL-BERT model (Su et al., "VL-BERT: Pre-training of Generic Visual-Linguistic
    Representations", ICLR 2020), as the released code (jackroos/VL-BERT) builds it.

    The defaults are those of the released `vl-bert-base-prec` (an uncased BERT-base vocabulary of 30522 word pieces,
    three token types: 0 = sentence A, 1 = sentence B, 2 = objects and [END]). BERT's fields keep BERT's names; the
    others describe VL-BERT's visual side:

    Args:
        region_feature_dim (`int`, defaults to 2048): size of one region's appearance feature (bottom-up-attention
            pool5 in the "prec" release).
        geometry_embedding_dim (`int`, defaults to 256): sin/cos frequencies per box coordinate; the geometry
            embedding of a box has `4 * 2 * geometry_embedding_dim` values (2048 in every release).
        geometry_scale (`float`, defaults to 100): the normalised box `(xc/W, yc/H, w/W, h/H)` is multiplied by this
            before the sinusoids.
        geometry_wavelength (`float`, defaults to 1000): base of the frequencies, `wavelength ** (i / dim)`.
        num_region_labels (`int`, defaults to 1601): detector classes the MVRC head predicts (background first).
        num_vcr_region_labels (`int`, defaults to 81): COCO classes of the optional VCR object head (0 to leave it
            out).
        mask_token_id (`int`, defaults to 103): the tokenizer's [MASK], whose output the VQA head reads (the answer
            slot of `[CLS] q [SEP] [MASK] [SEP]`).
        with_pooler (`bool`, defaults to `False`): whether `VlBertModel` builds the pooler by default. The released
            pre-training, VQA and RefCOCO+ models have none; VCR (`VlBertForMultipleChoice`) always builds it.
        visual_scale_text_init, visual_scale_object_init (`float`, defaults to 0.0): initial weight of the two visual
            LayerNorms (`visual_ln_text`, `visual_ln_object`), as the original initialises them.
        object_token_type_id (`int`, defaults to 2): token type of the objects and of [END].
        image_feature_dropout (`float`, defaults to 0.1): dropout before the visual feature projection.
        image_feature_precomputed (`bool`, defaults to `True`): the "prec" release (precomputed bottom-up-attention
            features as `region_features`); `False` for the "e2e" release, whose model owns its Caffe-style ResNet
            (stem + res2..res4 on the image, dilated res5 on 14x14 RoIAlign of every box, average-pooled) and takes
            `pixel_values` + `region_boxes` instead.
        backbone_depth (`int`, defaults to 101), backbone_width_per_group (`int`, defaults to 64),
            backbone_stem_channels (`int`, defaults to 64), backbone_res2_channels (`int`, defaults to 256): the e2e
            ResNet's size (the release: ResNet-101 at full width; res5 gives `8 * backbone_res2_channels` = 2048
            channels, which must equal `region_feature_dim`).
        roi_resolution (`int`, defaults to 14), roi_sampling_ratio (`int`, defaults to 1): the e2e RoIAlign (legacy,
            not pixel-aligned, on the stride-16 res4 map).
        classifier_dropout (`float`, defaults to 0.1): dropout inside the task heads (`NETWORK.CLASSIFIER_DROPOUT`:
            0.1 for VQA and VCR, 0.0 for RefCOCO+ as released).
    """

    model_type = "vl_bert"

    type_vocab_size: int = 3  # BERT's other text fields, region_feature_dim, num_region_labels: RegionBertConfig
    geometry_embedding_dim: int = 256
    geometry_scale: float | int = 100.0
    geometry_wavelength: float | int = 1000.0
    num_vcr_region_labels: int = 81
    mask_token_id: int = 103
    with_pooler: bool = False
    visual_scale_text_init: float | int = 0.0
    visual_scale_object_init: float | int = 0.0
    object_token_type_id: int = 2
    image_feature_dropout: float | int = 0.1
    classifier_dropout: float | int = 0.1
    image_feature_precomputed: bool = True
    backbone_depth: int = 101
    backbone_width_per_group: int = 64
    backbone_stem_channels: int = 64
    backbone_res2_channels: int = 256
    roi_resolution: int = 14
    roi_sampling_ratio: int = 1

    def validate_architecture(self) -> None:
        super().validate_architecture()  # BertTextConfig: hidden_size / num_attention_heads
        if not self.image_feature_precomputed and 8 * self.backbone_res2_channels != self.region_feature_dim:
            raise ValueError(
                f"an e2e VL-BERT's res5 gives {8 * self.backbone_res2_channels}-d features (8 x backbone_res2_channels) "
                f"but region_feature_dim is {self.region_feature_dim}"
            )
        if self.type_vocab_size <= self.object_token_type_id:
            raise ValueError(
                f"type_vocab_size ({self.type_vocab_size}) must include the object token type {self.object_token_type_id}"
            )

    @property
    def region_input_dim(self) -> int:
        """Size of the visual feature embedding's input: geometry (`8 * geometry_embedding_dim`) then appearance."""
        return 8 * self.geometry_embedding_dim + self.region_feature_dim

    # The original YAML's NETWORK.VLBERT fields that map onto this config (the others are checked or ignored).
    _ORIGINAL_FIELDS = (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
        "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
        "initializer_range", "visual_scale_text_init", "visual_scale_object_init", "with_pooler",
    )  # fmt: skip

    @classmethod
    def from_original_config(cls, path_or_dict: str | os.PathLike | dict, **overrides: Any) -> "VlBertConfig":
        """Read the original YAML (`cfgs/<task>/*.yaml`, the format of `*/function/config.py:update_config`).

        Only settings vlhub reproduces are accepted: `visual_size == hidden_size` (no 1x1 projections), `visual_ln`
        true, class-agnostic objects (`object_word_embed_mode: 2`), relative object positions, no semantic class
        embedding. Anything else raises a `ValueError` naming the field.
        """
        if isinstance(path_or_dict, dict):
            original = dict(path_or_dict)
        else:
            from ...utils.files import read_yaml

            original = read_yaml(path_or_dict, "the original VL-BERT config")
        if not isinstance(original, dict) or "NETWORK" not in original or "VLBERT" not in (original["NETWORK"] or {}):
            raise ValueError("not an original VL-BERT config: it has no NETWORK.VLBERT section")
        network = original["NETWORK"]
        vlbert = network["VLBERT"]
        missing = sorted({"hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"} - set(vlbert))
        if missing:
            raise ValueError(f"the original VL-BERT config lacks NETWORK.VLBERT field(s) {missing}")
        checks = {
            "visual_size": (vlbert.get("visual_size", vlbert["hidden_size"]), vlbert["hidden_size"]),
            "visual_ln": (vlbert.get("visual_ln", True), True),
            "object_word_embed_mode": (vlbert.get("object_word_embed_mode", 2), 2),
            "obj_pos_id_relative": (vlbert.get("obj_pos_id_relative", True), True),
            "position_padding_idx": (vlbert.get("position_padding_idx", -1), -1),
            "word_embedding_frozen": (vlbert.get("word_embedding_frozen", False), False),
            "NETWORK.IMAGE_SEMANTIC": (network.get("IMAGE_SEMANTIC", False), False),
        }
        for name, (value, supported) in checks.items():
            if value != supported:
                raise ValueError(
                    f"original VL-BERT setting {name}={value!r} is not supported (vlhub needs {supported!r})"
                )
        final_dim = network.get("IMAGE_FINAL_DIM", vlbert["hidden_size"])
        if final_dim != vlbert["hidden_size"]:
            raise ValueError(f"NETWORK.IMAGE_FINAL_DIM ({final_dim}) must equal hidden_size ({vlbert['hidden_size']})")
        fields = {name: vlbert[name] for name in cls._ORIGINAL_FIELDS if name in vlbert}
        fields["image_feature_precomputed"] = bool(network.get("IMAGE_FEAT_PRECOMPUTED", True))
        if not fields["image_feature_precomputed"]:
            for name, supported in (("IMAGE_STRIDE_IN_1x1", True), ("IMAGE_C5_DILATED", True)):
                if network.get(name, supported) != supported:
                    raise ValueError(
                        f"original VL-BERT setting NETWORK.{name}={network[name]!r} is not supported "
                        f"(vlhub needs {supported!r})"
                    )
            fields["backbone_depth"] = network.get("IMAGE_NUM_LAYERS", 101)
        fields.setdefault("with_pooler", False)
        if "visual_region_classes" in vlbert:
            fields["num_region_labels"] = vlbert["visual_region_classes"]
        dropout = network.get("CLASSIFIER_DROPOUT")
        if dropout is not None:
            fields["classifier_dropout"] = dropout
        return cls(**{**fields, **overrides})
