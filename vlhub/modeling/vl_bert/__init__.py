"""VL-BERT (Su et al., ICLR 2020): its classes (exported lazily) and its one registration with vlhub."""

from ...registry import Architecture, lazy_exports, register_architecture

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
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
    "processing_vl_bert": ["VlBertProcessor", "VlBertRegionProcessor", "vl_bert_locations", "vl_bert_resized_size"],
})

ARCHITECTURE = register_architecture(Architecture(
    model_type="vl_bert",
    name="VL-BERT",
    package=__name__,
    config="VlBertConfig",
    processor="VlBertProcessor",
    region_processor="VlBertRegionProcessor",
    auto_models={
        "AutoModel": "VlBertModel",
        "AutoModelForPreTraining": "VlBertForPreTraining",
        "AutoModelForVisualQuestionAnswering": "VlBertForQuestionAnswering",
        "AutoModelForMultipleChoice": "VlBertForMultipleChoice",
    },
    task_models={
        "pretraining": "VlBertForPreTraining",
        "vqa": "VlBertForQuestionAnswering",
        "re": "VlBertForReferringExpression",
        "vcr": "VlBertForMultipleChoice",
    },
    lowercase=True,  # VL-BERT's vocabulary is bert-base-uncased
    original_repository="https://github.com/jackroos/VL-BERT",
    converter="vlhub.conversion.vl_bert",
    unsupported_tasks={
        "retrieval": "VL-BERT has no image-text matching head; its paper dropped the sentence-image relationship "
                     "objective because it hurt every downstream task (Table 4c), and no release carries one",
    },
))
