"""vlhub: region-feature vision-language BERTs (UNITER, VL-BERT, ViLBERT, Unified VLP, TDEN) for transformers.

Importing vlhub registers every architecture with transformers, so `AutoModel.from_pretrained(folder)`,
`AutoProcessor.from_pretrained(folder)` and `pipeline("visual-question-answering", ...)` work on vlhub checkpoints.
The import is light (it loads neither datasets, pandas, pyarrow nor torchvision; `bench/bench_import.py`): configs,
model classes, processors and pipelines are registered when transformers' Auto-config, Auto-model, processor or
pipeline machinery is first imported, and vlhub's own names (`vlhub.UniterModel`, ...) on first access.
"""

from .modeling.auto import register_all
from .processing.region_extractors import register_region_extractor as _register_region_extractor
from .registry import architectures as _architectures
from .version import __version__

register_all()
# The embedded shapes world's extractor (named lazily: nothing is imported until a folder needs it).
_register_region_extractor("shapes", "vlhub.data.shapes_features:ShapesRegionExtractor")

_SHARED_EXPORTS = {
    "RegionFeatures": "vlhub.processing.regions",
    "pack_linear_weights": "vlhub.modeling.packed_linear",
    "unpack_linear_weights": "vlhub.modeling.packed_linear",
    "packed_linear_weights": "vlhub.modeling.packed_linear",
    "model_class_for": "vlhub.modeling.auto",
    "model_classes": "vlhub.modeling.auto",
    "Architecture": "vlhub.registry",
    "register_architecture": "vlhub.registry",
    "get_architecture": "vlhub.registry",
}


def _architecture_exports() -> dict[str, str]:
    return {
        name: architecture.package
        for architecture in _architectures().values()
        for name in getattr(__import__(architecture.package, fromlist=["__all__"]), "__all__", ())
    }


def __getattr__(name: str):
    import importlib

    module = _SHARED_EXPORTS.get(name) or _architecture_exports().get(name)
    if module is None:
        raise AttributeError(f"module 'vlhub' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__():
    return sorted({*globals(), *_SHARED_EXPORTS, *_architecture_exports()})


__all__ = ["__version__", "register_all", *_SHARED_EXPORTS, *_architecture_exports()]
