"""vlhub's architectures in transformers' Auto classes, from each architecture's own declaration.

transformers has no plugin entry points: the Auto classes know vlhub's model types only after `import vlhub`. Configs
are registered at once (cheap); model classes, processors and pipelines are registered when the user's code first
imports transformers' Auto-model, processor or pipeline machinery (`vlhub.utils.import_hooks`), so `import vlhub`
stays as light as `import transformers`.
"""

from __future__ import annotations

import sys

from ..registry import Architecture, architectures, get_architecture, on_register
from ..utils.import_hooks import when_imported

__all__ = ["register_all", "model_class_for", "model_classes"]

_MODELING_AUTO = "transformers.models.auto.modeling_auto"
_PROCESSING_AUTO = "transformers.models.auto.processing_auto"
_FEATURE_EXTRACTION_AUTO = "transformers.models.auto.feature_extraction_auto"
_PIPELINES = "transformers.pipelines"


def _register_config(architecture: Architecture) -> None:
    from transformers import AutoConfig

    AutoConfig.register(architecture.model_type, architecture.config_class, exist_ok=True)


def _register_models(architecture: Architecture, modeling_auto) -> None:
    config_class = architecture.config_class
    for auto_name, class_name in architecture.auto_models.items():
        auto_class = getattr(modeling_auto, auto_name)
        auto_class.register(config_class, architecture.resolve(class_name), exist_ok=True)


def _register_processor(architecture: Architecture, processing_auto) -> None:
    processing_auto.AutoProcessor.register(architecture.config_class, architecture.processor_class, exist_ok=True)


def _register_region_processor(architecture: Architecture, feature_extraction_auto) -> None:
    feature_extraction_auto.AutoFeatureExtractor.register(
        architecture.config_class, architecture.region_processor_class, exist_ok=True
    )


def _initializing(module_name: str) -> bool:
    module = sys.modules.get(module_name)
    return module is not None and bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def _register_when_ready(architecture: Architecture, auto_module: str, class_names: list[str], register) -> None:
    """Run `register(auto module)` once transformers' `auto_module` and the modules defining `class_names` are all
    imported. Either may be imported first, and importing one can import the other (vlhub's modeling files import
    transformers' BERT, which imports the Auto classes), so each completed import retries, and a registration never
    reads a half-initialised module."""
    own_modules = sorted({architecture.module_of(name) for name in class_names})

    def attempt(completed=None):
        # A module whose completion runs this callback still reads as initialising: it is complete.
        done = getattr(completed, "__name__", None)
        if auto_module not in sys.modules or any(_initializing(m) for m in (auto_module, *own_modules) if m != done):
            return
        register(sys.modules[auto_module])

    when_imported(auto_module, attempt)
    for module in own_modules:
        when_imported(module, attempt)


def _on_architecture(architecture: Architecture) -> None:
    _register_config(architecture)
    _register_when_ready(architecture, _MODELING_AUTO, list(architecture.auto_models.values()),
                         lambda module: _register_models(architecture, module))
    _register_when_ready(architecture, _PROCESSING_AUTO, [architecture.processor],
                         lambda module: _register_processor(architecture, module))
    _register_when_ready(architecture, _FEATURE_EXTRACTION_AUTO, [architecture.region_processor],
                         lambda module: _register_region_processor(architecture, module))


def _register_pipelines(_module) -> None:
    from ..pipelines import register_pipelines

    register_pipelines()


_REGISTERED = False


def register_all() -> None:
    """Register every architecture (now and later ones) and vlhub's pipelines with transformers. Idempotent."""
    global _REGISTERED
    if _REGISTERED:
        return
    _REGISTERED = True
    on_register(_on_architecture)
    architectures()  # discovers vlhub's own architecture packages
    when_imported(_PIPELINES, _register_pipelines)


def model_classes() -> dict[str, type]:
    """Every model class of every registered architecture, by name (imports their modeling files)."""
    return {name: architecture.resolve(name) for architecture in architectures().values()
            for name in architecture.model_class_names()}


def model_class_for(config, default: type | None = None) -> type:
    """The vlhub class named first in `config.architectures` (a checkpoint records the head it was saved with).

    Retrieval, NLVR2 and referring-expression heads have no fitting Auto class in transformers, so loaders that
    need "the head this checkpoint holds" ask here.
    """
    try:
        architecture = get_architecture(config.model_type)
    except ValueError:
        architecture = None
    names = architecture.model_class_names() if architecture is not None else []
    for name in config.architectures or []:
        if name in names:
            return architecture.resolve(name)
    if default is not None:
        return default
    raise ValueError(
        f"cannot tell which vlhub model class this checkpoint holds: config.architectures = {config.architectures!r}"
    )
