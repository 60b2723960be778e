"""VL-BERT (Su et al., ICLR 2020): its classes (exported lazily) and its one registration with vlhub."""

from ...processing.stores.original import register_feature_format
from ...registry import DEFAULT_CONFIG_PRESETS, Architecture, lazy_exports, register_architecture

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "configuration_vl_bert": ["VlBertConfig"],
        "modeling_vl_bert": [
            "VlBertClassifierOutput",
            "VlBertForMultipleChoice",
            "VlBertForPreTraining",
            "VlBertForPreTrainingOutput",
            "VlBertForQuestionAnswering",
            "VlBertForReferringExpression",
            "VlBertModel",
            "VlBertModelOutput",
            "VlBertMultipleChoiceOutput",
            "VlBertPreTrainedModel",
            "geometry_embedding",
        ],
        "processing_vl_bert": [
            "VlBertProcessor",
            "VlBertRegionProcessor",
            "vl_bert_locations",
            "vl_bert_resized_boxes",
            "vl_bert_resized_size",
        ],
        "objectives_vl_bert": ["VL_BERT_OBJECTIVES"],
        "features_vl_bert": ["VlBertJsonReader"],
    },
)

# The released precomputed features (`vlhub import-features --format vl-bert-json FOLDER --output STORE`).
register_feature_format(
    "vl-bert-json",
    "a folder of VL-BERT's per-image json feature files (base64 boxes/features[, image_box_feature])",
    f"{__name__}.features_vl_bert:VlBertJsonReader",
)

ARCHITECTURE = register_architecture(
    Architecture.from_folder(
        __name__,
        name="VL-BERT",
        tasks=("pretraining", "vqa", "re", "vcr"),
        # The original trains MLM with visual clues, MVRC and the text-only MLM together in every batch.
        default_objectives={"mlm-mvrc": 1},
        # The processor keeps up to 64 text tokens; objects and [END] take the two positions after the text.
        config_presets={
            **DEFAULT_CONFIG_PRESETS,
            "tiny": {**DEFAULT_CONFIG_PRESETS["tiny"], "max_position_embeddings": 128},
        },
        lowercase=True,  # VL-BERT's vocabulary is bert-base-uncased
        choice_layout="vcr",  # multiple choice in the original VCR layout (the processor's vcr_text)
        heads_from_pretraining={"vqa", "re"},
        config_mask_token_id=True,  # the VQA head reads its answer at [MASK]
        original_repository="https://github.com/jackroos/VL-BERT",
        unsupported_tasks={
            "retrieval": "VL-BERT has no image-text matching head; its paper dropped the sentence-image relationship "
            "objective because it hurt every downstream task (Table 4c), and no release carries one"
        },
    )
)
