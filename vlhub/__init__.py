"""vlhub: region-feature vision-language BERTs (UNITER, VL-BERT, ViLBERT, Unified VLP, TDEN) for transformers.

Importing vlhub registers every config, model, processor and pipeline with transformers' Auto classes and
pipeline registry, so `AutoModel.from_pretrained(folder)` and `pipeline("visual-question-answering", ...)`
work on vlhub checkpoints.
"""

__version__ = "0.1.0.dev0"

from .processing.regions import RegionFeatures

__all__ = ["RegionFeatures", "__version__"]
