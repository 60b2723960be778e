"""TDEN (Li et al., AAAI 2021; the X-modaler release): its classes (exported lazily) and its one registration."""

from ...registry import Architecture, lazy_exports, register_architecture

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "configuration_tden": ["TdenConfig"],
    "modeling_tden": [
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
    "processing_tden": ["TdenProcessor", "TdenRegionProcessor", "tden_locations"],
})

ARCHITECTURE = register_architecture(Architecture(
    model_type="tden",
    name="TDEN",
    package=__name__,
    config="TdenConfig",
    processor="TdenProcessor",
    region_processor="TdenRegionProcessor",
    auto_models={
        "AutoModel": "TdenModel",
        "AutoModelForPreTraining": "TdenForPreTraining",
        "AutoModelForVisualQuestionAnswering": "TdenForQuestionAnswering",
        "AutoModelForMultipleChoice": "TdenForMultipleChoice",
        "AutoModelForImageTextToText": "TdenForConditionalGeneration",
    },
    task_models={
        "pretraining": "TdenForPreTraining",
        "captioning": "TdenForConditionalGeneration",
        "vqa": "TdenForQuestionAnswering",
        "retrieval": "TdenForImageTextRetrieval",
        "vcr": "TdenForMultipleChoice",
    },
    lowercase=True,  # bert-base-uncased word pieces
    original_repository="https://github.com/YehLi/xmodaler",
    converter="vlhub.conversion.tden",
))
