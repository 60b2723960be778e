"""UNITER configuration."""

import os
from typing import Any

from huggingface_hub.dataclasses import strict

from ...utils.choices import check_choice
from ..configuration_text import RegionBertConfig, read_original_bert_config

__all__ = ["UniterConfig"]


@strict
class UniterConfig(RegionBertConfig):
    r"""Configuration of a UNITER model (Chen et al., "UNITER: UNiversal Image-TExt Representation Learning").

    The defaults are those of the released `uniter-base` (a cased BERT-base text vocabulary of 28996 word pieces).
    Text fields are BERT's; the region fields describe the image embedder:

    Args:
        region_feature_dim (`int`, defaults to 2048): size of one region feature (bottom-up-attention pool5).
        region_location_dim (`int`, defaults to 7): size of the location vector `[x1, y1, x2, y2, w, h, w*h]`,
            every entry normalised by the image size.
        num_region_labels (`int`, defaults to 1601): detector classes the MRC heads predict (background first).
        region_token_type_id (`int`, defaults to 1): token type looked up (in the *text* type table) for regions.
        wra_weight (`float`, defaults to 0.1): weight of the word-region alignment (optimal transport) loss that is
            added to the ITM loss in `UniterForPreTraining` when WRA is requested.
        ot_beta, ot_iterations, ot_inner_steps: IPOT settings of the WRA distance (0.5, 50, 1 as the original).
        ranking_margin (`float`, defaults to 0.2): margin of the retrieval hinge loss.
        itc_temperature (`float`, defaults to 0.1): temperature of the image-text contrastive objective (`itc`), a
            vlhub extension that is not part of UNITER's recipe (see `UniterForPreTraining`).
        nlvr2_head (`str`, defaults to `"paired-attn"`): `"paired"` or `"paired-attn"`, the NLVR2 head variant.
        re_head_layers (`int`, defaults to 1): 1 for a linear referring-expression head, 2 for Linear-GELU-LN-Linear.
        classifier_activation (`str`, defaults to `"gelu"`): activation inside the VQA/VE answer head.
    """

    model_type = "uniter"

    vocab_size: int = 28996  # BERT's other text fields, region_feature_dim, num_region_labels: RegionBertConfig
    region_location_dim: int = 7
    region_token_type_id: int = 1
    wra_weight: float | int = 0.1
    ot_beta: float | int = 0.5
    ot_iterations: int = 50
    ot_inner_steps: int = 1
    ranking_margin: float | int = 0.2
    itc_temperature: float | int = 0.1
    nlvr2_head: str = "paired-attn"
    re_head_layers: int = 1
    classifier_activation: str = "gelu"

    def validate_architecture(self) -> None:
        super().validate_architecture()  # BertTextConfig: hidden_size / num_attention_heads
        check_choice(self.nlvr2_head, ("paired", "paired-attn"), "nlvr2_head")
        if not self.itc_temperature > 0:
            raise ValueError(f"itc_temperature must be positive, got {self.itc_temperature}")
        check_choice(self.re_head_layers, (1, 2), "re_head_layers")

    @classmethod
    def from_original_config(cls, path_or_dict: str | os.PathLike | dict, **overrides: Any) -> "UniterConfig":
        """Read a config in the original release's format (`config/uniter-base.json`: BERT fields only)."""
        return cls(**{**read_original_bert_config(path_or_dict, "UNITER"), **overrides})
