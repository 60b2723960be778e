"""vlhub: region-feature vision-language BERTs (UNITER, VL-BERT, ViLBERT, Unified VLP, TDEN) for transformers.

Importing vlhub registers every config, model, processor and pipeline with transformers' Auto classes and
pipeline registry, so `AutoModel.from_pretrained(folder)` and `pipeline("visual-question-answering", ...)`
work on vlhub checkpoints.
"""

__version__ = "0.1.0.dev0"

from .modeling.auto import model_class_for, register_all
from .modeling.uniter import (
    UniterConfig,
    UniterForImageTextRetrieval,
    UniterForMultipleChoice,
    UniterForPreTraining,
    UniterForQuestionAnswering,
    UniterForReferringExpression,
    UniterForVisualEntailment,
    UniterForVisualReasoning,
    UniterModel,
    UniterProcessor,
    UniterRegionProcessor,
)
from .pipelines import register_pipelines
from .processing.regions import RegionFeatures

register_all()
register_pipelines()

__all__ = [
    "RegionFeatures",
    "UniterConfig",
    "UniterForImageTextRetrieval",
    "UniterForMultipleChoice",
    "UniterForPreTraining",
    "UniterForQuestionAnswering",
    "UniterForReferringExpression",
    "UniterForVisualEntailment",
    "UniterForVisualReasoning",
    "UniterModel",
    "UniterProcessor",
    "UniterRegionProcessor",
    "__version__",
    "model_class_for",
    "register_all",
]
