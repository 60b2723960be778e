"""UNITER (Chen et al., ECCV 2020): its classes (exported lazily) and its one registration with vlhub."""

from ...processing.stores.original import register_feature_format
from ...registry import Architecture, MatchScore, lazy_exports, register_architecture

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "configuration_uniter": ["UniterConfig"],
        "modeling_uniter": [
            "PRETRAINING_OBJECTIVES",
            "UniterClassifierOutput",
            "UniterForImageTextRetrieval",
            "UniterForMultipleChoice",
            "UniterForPreTraining",
            "UniterForPreTrainingOutput",
            "UniterForQuestionAnswering",
            "UniterForReferringExpression",
            "UniterForVisualEntailment",
            "UniterForVisualReasoning",
            "UniterModel",
            "UniterMultipleChoiceOutput",
            "UniterPreTrainedModel",
            "UniterReferringExpressionOutput",
        ],
        "processing_uniter": ["UniterProcessor", "UniterRegionProcessor", "uniter_locations"],
        "objectives_uniter": ["UNITER_OBJECTIVES"],
        "features_uniter": ["UniterLmdbReader"],
    },
)

# The released image databases (`vlhub import-features --format uniter-lmdb IMG_DB --output STORE`).
register_feature_format(
    "uniter-lmdb",
    "UNITER image LMDB (compressed npz or msgpack per image)",
    f"{__name__}.features_uniter:UniterLmdbReader",
)

ARCHITECTURE = register_architecture(
    Architecture.from_folder(
        __name__,
        name="UNITER",
        tasks=("pretraining", "vqa", "retrieval", "nlvr2", "ve", "re", "vcr"),
        # The original in-domain mix [itm+WRA, mlm, mrfr, mrc-kl] = [2, 2, 1, 1] (`config/pretrain-indomain-base-8gpu.json`;
        # the released all-data mixes have the same proportions up to 6:8:4:4).
        default_objectives={"wra": 2, "mlm": 2, "mrfr": 1, "mrc-kl": 1},
        # From scratch (no BERT initialisation) ITM with random negatives stays at chance for ~900 steps; the contrastive
        # extension gives each modality a first-order signal, and retrieval then learns (README, the demo).
        from_scratch_objectives={"itc": 1, "itm": 1},
        lowercase=False,  # UNITER's vocabulary is bert-base-cased
        # Zero-shot retrieval reads the ITM head's "match" column (1); the retrieval head starts from that row.
        match_score=MatchScore("itm_logits", match_class=1),
        heads_from_pretraining={"retrieval"},
        original_repository="https://github.com/ChenRocks/UNITER",
    )
)
