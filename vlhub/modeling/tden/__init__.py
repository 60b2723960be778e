"""TDEN (Li et al., AAAI 2021; the X-modaler release): its classes (exported lazily) and its one registration."""

from ...registry import DEFAULT_CONFIG_PRESETS, Architecture, lazy_exports, register_architecture

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "configuration_tden": ["TdenConfig"],
        "modeling_tden": [
            "TdenBeamCache",
            "TdenBeamSearchOutput",
            "TdenCaptioningOutput",
            "TdenForConditionalGeneration",
            "TdenForImageTextRetrieval",
            "TdenForMultipleChoice",
            "TdenForPreTraining",
            "TdenForPreTrainingOutput",
            "TdenForQuestionAnswering",
            "TdenModel",
            "TdenModelOutput",
            "TdenMultipleChoiceOutput",
            "TdenPreTrainedModel",
            "TdenQuestionAnsweringOutput",
            "TdenRetrievalOutput",
            "batch_hardest_triplet_loss",
        ],
        "generation_tden": ["XmodalerBeamSearchOutput", "xmodaler_beam_search"],
        "objectives_tden": ["TDEN_OBJECTIVES", "tden_mask_regions", "tden_second_pass"],
        "processing_tden": ["TdenProcessor", "TdenRegionProcessor", "tden_locations"],
    },
)

# Captioning fine-tuning's label smoothing (X-modaler's XE captioner); it changes nothing in pre-training.
_CAPTIONING = {"label_smoothing": 0.1}

ARCHITECTURE = register_architecture(
    Architecture.from_folder(
        __name__,
        name="TDEN",
        tasks=("pretraining", "captioning", "vqa", "retrieval", "vcr"),
        # Every batch trains MLM + MOC + MSG + ISM at once (X-modaler's PretrainLosses, weights 1).
        default_objectives={"joint": 1},
        # tiny: every block at 2 layers of 128 and small poolers; base: TDEN-base (the config's defaults: 12 sentence,
        # 6 object, 6 cross-modal and 6 decoder layers, 1024-d matching poolers).
        config_presets={
            "tiny": {
                **DEFAULT_CONFIG_PRESETS["tiny"],
                "num_visual_layers": 2,
                "num_cross_encoder_layers": 2,
                "num_decoder_layers": 2,
                "similarity_pooler_size": 128,
                "classifier_pooler_size": 128,
                **_CAPTIONING,
            },
            "base": {**DEFAULT_CONFIG_PRESETS["base"], **_CAPTIONING},
        },
        # The captioner trains with teacher-forced cross-entropy on `[CLS] w` → `w [SEP]`.
        finetuning_objectives={"captioning": "caption"},
        lowercase=True,  # bert-base-uncased word pieces
        retrieval_negatives="in_batch",  # the hardest negative of the batch in both directions, as X-modaler
        original_repository="https://github.com/YehLi/xmodaler",
    )
)
