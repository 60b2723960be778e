"""ViLBERT (Lu et al., NeurIPS 2019; the 12-in-1 multi-task release): its classes (exported lazily) and its one
registration with vlhub."""

from ...processing.stores.original import register_feature_format
from ...registry import DEFAULT_CONFIG_PRESETS, Architecture, MatchScore, lazy_exports, register_architecture

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "configuration_vilbert": ["VilbertConfig"],
        "modeling_vilbert": [
            "VilbertClassifierOutput",
            "VilbertForImageTextRetrieval",
            "VilbertForMultipleChoice",
            "VilbertForPreTraining",
            "VilbertForPreTrainingOutput",
            "VilbertForQuestionAnswering",
            "VilbertForReferringExpression",
            "VilbertForVisualEntailment",
            "VilbertForVisualReasoning",
            "VilbertModel",
            "VilbertModelOutput",
            "VilbertPreTrainedModel",
        ],
        "processing_vilbert": ["VilbertProcessor", "VilbertRegionProcessor", "pointing_targets", "vilbert_locations"],
        "objectives_vilbert": ["VILBERT_OBJECTIVES"],
        "features_vilbert": ["VilbertLmdbReader"],
    },
)

# The released feature LMDBs (`vlhub import-features --format vilbert-lmdb LMDB --output STORE`).
register_feature_format(
    "vilbert-lmdb", "ViLBERT beta / multi-task LMDB (pickled rows)", f"{__name__}.features_vilbert:VilbertLmdbReader"
)

ARCHITECTURE = register_architecture(
    Architecture.from_folder(
        __name__,
        name="ViLBERT",
        tasks=("pretraining", "vqa", "retrieval", "nlvr2", "ve", "re", "vcr"),
        # The original trains MLM, masked-region KL and alignment together on every batch.
        default_objectives={"joint": 1},
        config_presets={
            # Small enough for 2 CPU cores: both streams 2 layers, one co-attention layer before each text layer.
            "tiny": {
                **DEFAULT_CONFIG_PRESETS["tiny"],
                "visual_hidden_size": 128,
                "visual_num_hidden_layers": 2,
                "visual_num_attention_heads": 4,
                "visual_intermediate_size": 128,
                "bi_hidden_size": 128,
                "bi_num_attention_heads": 4,
                "visual_co_attention_layers": [0, 1],
                "text_co_attention_layers": [0, 1],
            },
            # The released 6-layer / 6-co-attention model (the config defaults).
            "base": {},
        },
        lowercase=True,  # bert-base-uncased
        # The alignment head's class 0 means "aligned"; zero-shot retrieval scores softmax(alignment)[0] as the original.
        match_score=MatchScore("alignment_logits", match_class=0, log_odds=True),
        heads_from_pretraining={"retrieval"},
        original_repository="https://github.com/jiasenlu/vilbert_beta",
    )
)
