"""UNITER (Chen et al., ECCV 2020)."""

from .configuration_uniter import UniterConfig
from .modeling_uniter import (
    PRETRAINING_OBJECTIVES,
    UniterClassifierOutput,
    UniterForImageTextRetrieval,
    UniterForMultipleChoice,
    UniterForPreTraining,
    UniterForPreTrainingOutput,
    UniterForQuestionAnswering,
    UniterForReferringExpression,
    UniterForVisualEntailment,
    UniterForVisualReasoning,
    UniterModel,
    UniterMultipleChoiceOutput,
    UniterPreTrainedModel,
    UniterReferringExpressionOutput,
)
from .processing_uniter import UniterProcessor, UniterRegionProcessor, uniter_locations

__all__ = [
    "PRETRAINING_OBJECTIVES",
    "UniterClassifierOutput",
    "UniterConfig",
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
    "UniterProcessor",
    "UniterReferringExpressionOutput",
    "UniterRegionProcessor",
    "uniter_locations",
]
