"""ViLBERT (Lu et al., NeurIPS 2019; the 12-in-1 multi-task release): its classes (exported lazily) and its one
registration with vlhub."""

from ...registry import Architecture, lazy_exports, register_architecture

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
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
    "processing_vilbert": ["VilbertProcessor", "VilbertRegionProcessor", "vilbert_locations"],
})

ARCHITECTURE = register_architecture(Architecture(
    model_type="vilbert",
    name="ViLBERT",
    package=__name__,
    config="VilbertConfig",
    processor="VilbertProcessor",
    region_processor="VilbertRegionProcessor",
    auto_models={
        "AutoModel": "VilbertModel",
        "AutoModelForPreTraining": "VilbertForPreTraining",
        "AutoModelForVisualQuestionAnswering": "VilbertForQuestionAnswering",
        "AutoModelForMultipleChoice": "VilbertForMultipleChoice",
    },
    task_models={
        "pretraining": "VilbertForPreTraining",
        "vqa": "VilbertForQuestionAnswering",
        "retrieval": "VilbertForImageTextRetrieval",
        "nlvr2": "VilbertForVisualReasoning",
        "ve": "VilbertForVisualEntailment",
        "re": "VilbertForReferringExpression",
        "vcr": "VilbertForMultipleChoice",
    },
    lowercase=True,  # bert-base-uncased
    original_repository="https://github.com/jiasenlu/vilbert_beta",
    converter="vlhub.conversion.vilbert",
))
