"""The one registration an architecture makes, and the lookups shared code does instead of importing it.

An architecture is a sub-package of `vlhub.modeling` whose `__init__.py` calls `register_architecture(...)` with an
`Architecture`: which classes it has (by name, resolved lazily from the package), which Auto class each model class
belongs to, its task heads, processor, pre-training objectives and default objective mix. Training, conversion,
pipelines and the Auto classes loop over these declarations; nothing shared imports an architecture by name. The
registry imports nothing of vlhub: `import vlhub` imports the architecture packages
(`vlhub.modeling.discover_architectures`), so they have registered before anything looks one up.

Class names are strings so that registering costs nothing: the package exports its classes lazily (see
`lazy_exports`), and a class is imported the first time something asks for it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

__all__ = [
    "Architecture",
    "register_architecture",
    "get_architecture",
    "architectures",
    "lazy_exports",
    "resolve",
]

# The BERT-shaped sizes every architecture can start from (an architecture may override them).
DEFAULT_CONFIG_PRESETS: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    # Small enough to pre-train and fine-tune on 2 CPU cores in minutes (the README's main job).
    "tiny": MappingProxyType(dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=256, max_position_embeddings=64)),
    # BERT-base.
    "base": MappingProxyType(dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                  intermediate_size=3072)),
})


def resolve(path: str) -> Any:
    """`"package.module:attribute"` → the attribute (imported on first use)."""
    module, _, attribute = path.partition(":")
    if not attribute:
        raise ValueError(f"expected 'module.path:attribute', got {path!r}")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class Architecture:
    """What one architecture provides. Class names refer to the attributes of `package`.

    Attributes:
        model_type: the config's `model_type` ("uniter").
        name: the name people use ("UNITER"), for model cards and messages.
        package: the architecture's package ("vlhub.modeling.uniter"), exporting every class named below.
        config: the `PreTrainedConfig` subclass.
        processor: the `ProcessorMixin` subclass; `region_processor`: its region side (`RegionProcessor` subclass).
        auto_models: transformers Auto class name → model class (`{"AutoModel": "UniterModel", ...}`).
        task_models: task → head class, for the tasks training and conversion know by name: "pretraining", "vqa",
            "retrieval", and any others the architecture has ("nlvr2", "ve", "re", "vcr", "captioning", ...).
        objectives: `"module:attribute"` of the architecture's pre-training `Objective`s (a sequence).
        default_objectives: the original's objective mix (name → sampling ratio).
        from_scratch_objectives: a mix for a model trained from scratch on little data (the demo's tiny models), where
            it differs from `default_objectives` because the original's mix relies on a BERT initialisation (UNITER:
            image-text matching stays at chance without one, see `UniterForPreTraining`'s `itc`). Empty: the
            original's mix serves.
        config_presets: named config sizes for models built from scratch (`--config_name tiny`).
        lowercase: whether its word pieces are uncased (a bare `vocab.txt` is read accordingly).
        original_repository: where the original code lives (model cards).
        converter: module with `add_arguments(parser)` and `convert_from_args(args)`, which becomes
            `vlhub convert <model_type>` (the original release → a vlhub folder).
        unsupported_tasks: task → why the architecture has no head for it (said when someone asks for one, e.g.
            VL-BERT has no image-text matching head: `{"retrieval": "..."}`).
        finetuning_objectives: task → the name of the objective (among `objectives`) that fine-tunes that task's
            head, for tasks trained on captions (Unified VLP: `{"captioning": "s2s"}`, its masked seq2seq LM).
    """

    model_type: str
    name: str
    package: str
    config: str
    processor: str
    region_processor: str
    auto_models: Mapping[str, str] = field(default_factory=dict)
    task_models: Mapping[str, str] = field(default_factory=dict)
    objectives: str | None = None
    default_objectives: Mapping[str, float] = field(default_factory=dict)
    from_scratch_objectives: Mapping[str, float] = field(default_factory=dict)
    config_presets: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: DEFAULT_CONFIG_PRESETS)
    lowercase: bool = False
    original_repository: str | None = None
    converter: str | None = None
    unsupported_tasks: Mapping[str, str] = field(default_factory=dict)
    finetuning_objectives: Mapping[str, str] = field(default_factory=dict)

    # -- classes ------------------------------------------------------------------------------------------------
    def resolve(self, name: str) -> Any:
        return getattr(importlib.import_module(self.package), name)

    @property
    def config_class(self):
        return self.resolve(self.config)

    @property
    def processor_class(self):
        return self.resolve(self.processor)

    @property
    def region_processor_class(self):
        return self.resolve(self.region_processor)

    def module_of(self, name: str) -> str:
        """The module that defines the exported `name` (without importing it, for lazily exporting packages)."""
        package = importlib.import_module(self.package)
        structure = getattr(getattr(package, "__getattr__", None), "lazy_structure", {})
        return f"{self.package}.{structure[name]}" if name in structure else self.package

    def model_class_names(self) -> list[str]:
        return list(dict.fromkeys([*self.auto_models.values(), *self.task_models.values()]))

    def model_class(self, task: str):
        """The head for `task` ("pretraining", "vqa", "retrieval", ...)."""
        if task not in self.task_models:
            why = f" ({self.unsupported_tasks[task]})" if task in self.unsupported_tasks else ""
            raise ValueError(f"{self.name} has no {task!r} head{why}; its heads: {sorted(self.task_models)}")
        return self.resolve(self.task_models[task])

    def has_task(self, task: str) -> bool:
        return task in self.task_models

    # -- building blocks for training and conversion -------------------------------------------------------------
    def build_processor(self, tokenizer, region_feature_dim: int, **region_settings):
        """A processor of this architecture around `tokenizer` for regions with `region_feature_dim`-d features."""
        region_processor = self.region_processor_class(region_feature_dim=region_feature_dim, **region_settings)
        return self.processor_class(feature_extractor=region_processor, tokenizer=tokenizer)

    def config_fields(self, preset: str) -> dict:
        if preset not in self.config_presets:
            raise ValueError(f"{self.name} has no config preset {preset!r}; presets: {sorted(self.config_presets)}")
        return dict(self.config_presets[preset])

    def pretraining_objectives(self) -> dict:
        """name → `Objective` (empty when the architecture has none)."""
        if self.objectives is None:
            return {}
        return {objective.name: objective for objective in resolve(self.objectives)}


_ARCHITECTURES: dict[str, Architecture] = {}
_LISTENERS: list[Callable[[Architecture], None]] = []


def register_architecture(architecture: Architecture) -> Architecture:
    """Make an architecture known to vlhub (and, through `vlhub.modeling.auto`, to transformers' Auto classes).

    Registering the same declaration again is a no-op; a different one under a taken `model_type` is an error.
    """
    known = _ARCHITECTURES.get(architecture.model_type)
    if known is not None:
        if known == architecture:
            return known
        raise ValueError(f"model_type {architecture.model_type!r} is already registered by {known.package}")
    _ARCHITECTURES[architecture.model_type] = architecture
    for listener in list(_LISTENERS):
        listener(architecture)
    return architecture


def on_register(listener: Callable[[Architecture], None]) -> None:
    """Call `listener` for every architecture registered so far and every later one."""
    _LISTENERS.append(listener)
    for architecture in list(_ARCHITECTURES.values()):
        listener(architecture)


def unregister_architecture(model_type: str) -> None:
    """Forget an architecture (tests register throwaway ones). Auto-class entries made for it stay."""
    _ARCHITECTURES.pop(model_type, None)


def get_architecture(model_type: str) -> Architecture:
    if model_type not in _ARCHITECTURES:
        raise ValueError(f"unknown model type {model_type!r}; vlhub knows {sorted(_ARCHITECTURES)}")
    return _ARCHITECTURES[model_type]


def architectures() -> dict[str, Architecture]:
    return dict(_ARCHITECTURES)


def lazy_exports(module_name: str, structure: Mapping[str, list[str]]):
    """PEP 562 lazy exports for a package: `structure` maps a sub-module to the names it defines.

    Returns `(__getattr__, __dir__, __all__)` for the package's `__init__.py`, so `package.Name` imports the
    sub-module on first access — the way transformers' own model packages defer their heavy imports.
    """
    where = {name: submodule for submodule, names in structure.items() for name in names}
    exported = sorted(where)

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{module_name}.{where[name]}"), name)

    def __dir__():
        return exported

    __getattr__.lazy_structure = where

    return __getattr__, __dir__, exported
