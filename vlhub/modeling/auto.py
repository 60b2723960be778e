"""vlhub's architectures in transformers' Auto classes, from each architecture's own declaration.

transformers has no plugin entry points: the Auto classes know vlhub's model types only after `import vlhub`. Configs,
model classes, processors and pipelines are registered when the user's code first imports transformers' Auto-config,
Auto-model, processor or pipeline machinery (`vlhub.utils.import_hooks`), so `import vlhub` stays as light as
`import transformers`: the first touch of `transformers.models` alone reads the import structure of every model
transformers ships (~1,700 files, seconds), which a user who never reaches for an Auto class does not pay.

Why the hook and not the simpler registration at `import vlhub`: registering needs the Auto module itself. Counted
with `python -X importtime` (2026-11-28): `import vlhub` imports 1,217 modules; with `configuration_auto` (enough for
AutoConfig alone) 1,560; with `modeling_auto` 2,928. `tests/test_package_import.py` holds `import vlhub` to the light
side (`test_import_vlhub_leaves_models_processors_pipelines_and_torchvision_unimported`) and, with
`tests/test_vilbert_registration.py`, every import order; `bench/bench_import.py` times it.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
from typing import TYPE_CHECKING

from . import discover_architectures
from ..registry import Architecture, architectures, get_architecture, on_register
from ..utils.import_hooks import when_imported

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

__all__ = ["register_all", "model_class_for", "model_classes"]

_CONFIGURATION_AUTO = "transformers.models.auto.configuration_auto"
_MODELING_AUTO = "transformers.models.auto.modeling_auto"
_PROCESSING_AUTO = "transformers.models.auto.processing_auto"
_FEATURE_EXTRACTION_AUTO = "transformers.models.auto.feature_extraction_auto"
_PIPELINES = "transformers.pipelines"
_VLHUB_PIPELINES = "vlhub.pipelines"
_BERT_MODELING = "transformers.models.bert.modeling_bert"


def _register_config(architecture: Architecture, configuration_auto) -> None:
    configuration_auto.AutoConfig.register(architecture.model_type, architecture.config_class, exist_ok=True)


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


def _folder_modules(architecture: Architecture) -> list[str]:
    """The modules of the architecture's own folder, listed without importing them: any of them may be the one
    half-way through importing BERT (e.g. a `layers_<arch>.py` imported first, which its modeling file imports)."""
    spec = importlib.util.find_spec(architecture.package)
    locations = (spec.submodule_search_locations or []) if spec is not None else []
    return [f"{architecture.package}.{module.name}" for module in pkgutil.iter_modules(locations)]


def _register_when_ready(architecture: Architecture, auto_module: str, class_names: list[str], register) -> None:
    """Run `register(auto module)` once transformers' `auto_module` is imported; `register` imports the modules that
    define `class_names`. Importing one can import the other (vlhub's modeling files import transformers' BERT, which
    imports the Auto classes), so while one of vlhub's modules is half-initialised the registration waits for its
    completion instead of reading it."""
    own_modules = sorted({architecture.module_of(name) for name in class_names} | set(_folder_modules(architecture)))
    _ARCHITECTURE_MODULES.update(own_modules)

    def attempt(completed=None):
        # A module whose completion runs this callback still reads as initialising: it is complete. Any
        # architecture's module still initialising (not only this one's) may be half-way through importing BERT,
        # which registering would import again: wait for its completion (`_retry_all`).
        done = getattr(completed, "__name__", None)
        if auto_module not in sys.modules or any(
            _initializing(m) for m in (auto_module, *_BLOCKING, *sorted(_ARCHITECTURE_MODULES)) if m != done
        ):
            return
        register(sys.modules[auto_module])

    _ATTEMPTS.append(attempt)
    when_imported(auto_module, attempt)
    for module in (*own_modules, *_BLOCKING):
        when_imported(module, _retry_all)


# The modules defining every registered architecture's classes, and every pending registration: the completion of
# any of these modules retries every registration (one architecture's import can start another's registration).
_ARCHITECTURE_MODULES: set[str] = set()
_ATTEMPTS: list = []
# transformers' modules that import the Auto classes half-way through their own import (BERT's modeling via
# `modeling_layers`), which vlhub's modeling files import in turn: `import vlhub; from transformers import BertModel`
# must not register (import vlhub's models) before they are complete.
# vlhub's shared layers and shared PreTrainedModel base import BERT's modeling too.
_BLOCKING = (
    "transformers.modeling_layers",
    "transformers.models.bert.modeling_bert",
    "vlhub.modeling.layers",
    "vlhub.modeling.modeling_utils",
)


def _retry_all(completed=None) -> None:
    for attempt in list(_ATTEMPTS):
        attempt(completed)


def _on_architecture(architecture: Architecture) -> None:
    _register_when_ready(
        architecture, _CONFIGURATION_AUTO, [architecture.config], lambda module: _register_config(architecture, module)
    )
    _register_when_ready(
        architecture,
        _MODELING_AUTO,
        list(architecture.auto_models.values()),
        lambda module: _register_models(architecture, module),
    )
    _register_when_ready(
        architecture,
        _PROCESSING_AUTO,
        [architecture.processor],
        lambda module: _register_processor(architecture, module),
    )
    _register_when_ready(
        architecture,
        _FEATURE_EXTRACTION_AUTO,
        [architecture.region_processor],
        lambda module: _register_region_processor(architecture, module),
    )


def _on_transformers_pipelines(_module) -> None:
    """`from transformers import pipeline` alone must find vlhub's tasks: bring vlhub's pipelines in and register
    them — unless vlhub's pipelines are being imported right now (they import transformers' first); their own
    completion registers them then."""
    if not _initializing(_VLHUB_PIPELINES):
        _register_pipelines_once(importlib.import_module(_VLHUB_PIPELINES))


def _on_vlhub_pipelines(module) -> None:
    if _PIPELINES in sys.modules and not _initializing(_PIPELINES):
        _register_pipelines_once(module)


_PIPELINES_REGISTERED = False


def _register_pipelines_once(vlhub_pipelines) -> None:
    global _PIPELINES_REGISTERED
    if not _PIPELINES_REGISTERED:
        vlhub_pipelines.register_pipelines()
        _PIPELINES_REGISTERED = True


_REGISTERED = False


def register_all() -> None:
    """Register every architecture (now and later ones) and vlhub's pipelines with transformers. Idempotent."""
    global _REGISTERED
    if _REGISTERED:
        return
    _REGISTERED = True
    on_register(_on_architecture)
    for module in _BLOCKING:
        if module not in sys.modules:
            when_imported(module, _retry_all)
    discover_architectures()  # vlhub's own architecture packages register themselves
    when_imported(_PIPELINES, _on_transformers_pipelines)
    when_imported(_VLHUB_PIPELINES, _on_vlhub_pipelines)


def model_classes() -> dict[str, type]:
    """Every model class of every registered architecture, by name (imports their modeling files)."""
    return {
        name: architecture.resolve(name)
        for architecture in architectures().values()
        for name in architecture.model_class_names()
    }


def model_class_for(config: PreTrainedConfig, default: type | None = None) -> type:
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
