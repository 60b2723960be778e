"""Unified VLP (Zhou et al., AAAI 2020): its classes (exported lazily) and its one registration with vlhub."""

from ...registry import Architecture, lazy_exports, register_architecture

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
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
    "generation_unified_vlp": ["VlpBeamSearchOutput", "vlp_beam_search"],
    "processing_unified_vlp": [
        "UnifiedVlpProcessor",
        "UnifiedVlpRegionProcessor",
        "vlp_region_geometry",
        "vlp_region_locations",
    ],
})

ARCHITECTURE = register_architecture(Architecture(
    model_type="unified_vlp",
    name="Unified VLP",
    package=__name__,
    config="UnifiedVlpConfig",
    processor="UnifiedVlpProcessor",
    region_processor="UnifiedVlpRegionProcessor",
    auto_models={
        "AutoModel": "UnifiedVlpModel",
        "AutoModelForPreTraining": "UnifiedVlpForPreTraining",
        "AutoModelForImageTextToText": "UnifiedVlpForConditionalGeneration",
        "AutoModelForVisualQuestionAnswering": "UnifiedVlpForQuestionAnswering",
    },
    task_models={
        "pretraining": "UnifiedVlpForPreTraining",
        "captioning": "UnifiedVlpForConditionalGeneration",
        "vqa": "UnifiedVlpForQuestionAnswering",
    },
    # Pre-training objectives (seq2seq + bidirectional masked LM, 0.75 / 0.25) are not registered yet.
    lowercase=False,  # bert-base-cased
    original_repository="https://github.com/LuoweiZhou/VLP",
    converter="vlhub.conversion.unified_vlp",
))
