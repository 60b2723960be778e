"""Unified VLP (Zhou et al., AAAI 2020): its classes (exported lazily) and its one registration with vlhub."""

from ...processing.stores.original import register_feature_format
from ...registry import DEFAULT_CONFIG_PRESETS, Architecture, lazy_exports, register_architecture

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "configuration_unified_vlp": ["UnifiedVlpConfig"],
        "modeling_unified_vlp": [
            "UnifiedVlpForConditionalGeneration",
            "UnifiedVlpForPreTraining",
            "UnifiedVlpForPreTrainingOutput",
            "UnifiedVlpForQuestionAnswering",
            "UnifiedVlpModel",
            "UnifiedVlpPreTrainedModel",
            "UnifiedVlpQuestionAnsweringOutput",
        ],
        "generation_unified_vlp": ["VlpBeamCache", "VlpBeamSearchOutput", "vlp_beam_search"],
        "objectives_unified_vlp": ["UNIFIED_VLP_OBJECTIVES"],
        "processing_unified_vlp": [
            "UnifiedVlpProcessor",
            "UnifiedVlpRegionProcessor",
            "vlp_region_geometry",
            "vlp_region_locations",
        ],
        "features_unified_vlp": ["VlpH5Reader"],
        "tokenization_unified_vlp": ["VLP_TOKEN_RENAMES", "vlp_release_tokenizer"],
    },
)

# The released feature files (`vlhub import-features --format vlp-h5 FEAT_H5 --boxes BBOX_H5 ... --output STORE`).
register_feature_format(
    "vlp-h5",
    "Unified VLP h5 files (features, class probabilities, 6-column boxes)",
    f"{__name__}.features_unified_vlp:VlpH5Reader",
)

ARCHITECTURE = register_architecture(
    Architecture.from_folder(
        __name__,
        name="Unified VLP",
        tasks=("pretraining", "captioning", "vqa"),
        # The original draws seq2seq (0.75) or bidirectional (0.25) masked LM per example: one objective.
        default_objectives={"s2s-bi": 1},
        # tiny: 10 region slots (text from position 12, room for 20 word pieces and 20 generated tokens) and a small
        # region MLP; base: the released sizes (the config's defaults: 100 slots, 2048-d region MLP).
        config_presets={
            "tiny": {**DEFAULT_CONFIG_PRESETS["tiny"], "num_regions": 10, "region_embed_dim": 128},
            "base": dict(DEFAULT_CONFIG_PRESETS["base"]),
        },
        # Captioning fine-tuning keeps the masked seq2seq objective (max 3 predictions, [SEP] maskable), as the original.
        finetuning_objectives={"captioning": "s2s"},
        lowercase=False,  # bert-base-cased
        config_mask_token_id=True,  # the captioner predicts the next word at [MASK]
        original_repository="https://github.com/LuoweiZhou/VLP",
    )
)
