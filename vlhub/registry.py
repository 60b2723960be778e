"""The one registration an architecture makes, and the lookups shared code does instead of importing it.

An architecture is a sub-package of `vlhub.modeling` whose `__init__.py` calls `register_architecture(...)` with an
`Architecture` (usually `Architecture.from_folder`, which names what follows the folder's naming convention): which
classes it has (by name, resolved lazily from the package), its base model and task heads
(their Auto classes follow from the task, `AUTO_CLASS_OF_TASK`), processor, pre-training objectives and default
objective mix. Training, conversion,
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
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:  # annotations only: the registry imports nothing heavy and nothing of vlhub
    import torch
    from transformers import PreTrainedTokenizerBase, ProcessorMixin
    from transformers.utils import ModelOutput

__all__ = [
    "Architecture",
    "MatchScore",
    "ChoiceLayout",
    "VcrTokens",
    "CaptionScorer",
    "InitializesFromPretraining",
    "RETRIEVAL_NEGATIVES",
    "AUTO_CLASS_OF_TASK",
    "HEAD_CLASS_OF_TASK",
    "CHOICE_LAYOUTS",
    "register_architecture",
    "get_architecture",
    "architecture_of_processor",
    "architectures",
    "lazy_exports",
    "resolve",
]

# The BERT-shaped sizes every architecture can start from (an architecture may override them).
DEFAULT_CONFIG_PRESETS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        # Small enough to pre-train and fine-tune on 2 CPU cores in minutes (the README's main job).
        "tiny": MappingProxyType(
            dict(
                hidden_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=256,
                max_position_embeddings=64,
            )
        ),
        # BERT-base.
        "base": MappingProxyType(
            dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
        ),
    }
)


# The transformers Auto class each task's head registers with (heads of the other tasks have none), so that an
# architecture declares its heads once (`task_models`) and its Auto classes follow.
AUTO_CLASS_OF_TASK: Mapping[str, str] = MappingProxyType(
    {
        "pretraining": "AutoModelForPreTraining",
        "vqa": "AutoModelForVisualQuestionAnswering",
        "vcr": "AutoModelForMultipleChoice",
        "captioning": "AutoModelForImageTextToText",
    }
)


# The head class of each task by vlhub's naming convention (`<Prefix>` + this; transformers' own head names where
# transformers has the task), for `Architecture.from_folder`.
HEAD_CLASS_OF_TASK: Mapping[str, str] = MappingProxyType(
    {
        "pretraining": "ForPreTraining",
        "vqa": "ForQuestionAnswering",
        "retrieval": "ForImageTextRetrieval",
        "nlvr2": "ForVisualReasoning",
        "ve": "ForVisualEntailment",
        "re": "ForReferringExpression",
        "vcr": "ForMultipleChoice",
        "captioning": "ForConditionalGeneration",
    }
)


def resolve(path: str) -> Any:
    """`"package.module:attribute"` → the attribute (imported on first use)."""
    module, _, attribute = path.partition(":")
    if not attribute:
        raise ValueError(f"expected 'module.path:attribute', got {path!r}")
    return getattr(importlib.import_module(module), attribute)


# -- capabilities: what shared code may rely on, declared by an architecture instead of probed on its objects -------
# VCR's text: words and references to objects (lists of their indices), e.g. `["why", "is", [0], "smiling", "?"]`.
VcrTokens = Sequence[str | Sequence[int]]


@runtime_checkable
class ChoiceLayout(Protocol):
    """A processor that lays out multiple-choice pairs itself (`choice_layout="vcr"`: VL-BERT's VCR text)."""

    def vcr_text(
        self, question: VcrTokens, choices: Sequence[VcrTokens], objects: Sequence[str], max_length: int = 64
    ) -> dict: ...


@runtime_checkable
class InitializesFromPretraining(Protocol):
    """A task head that starts from the pre-trained heads (`heads_from_pretraining`); returns the names of the
    weights it set, so the load report lists only the ones that stay newly initialised."""

    def initialize_from_pretraining(self, pretraining_state_dict: dict) -> list[str]: ...


@runtime_checkable
class CaptionScorer(Protocol):
    """A captioning head that self-critical training can drive: `generate()`, `caption_scoring_inputs(prompt,
    caption_ids, caption_mask) -> forward kwargs` whose `logits` `(B, T, vocab)` score the given captions word by word
    as decoding would, and `check_generation_inputs(input_ids, max_new_tokens)` (a clear error for what it cannot
    generate)."""

    def generate(self, *args: Any, **kwargs: Any) -> torch.LongTensor | ModelOutput: ...

    def caption_scoring_inputs(
        self, prompt: dict, caption_ids: torch.LongTensor, caption_mask: torch.Tensor | None = None
    ) -> dict: ...

    def check_generation_inputs(self, input_ids: torch.Tensor | None, max_new_tokens: int | None) -> None: ...


# What each declared capability value means (the values shared code knows).
CHOICE_LAYOUTS = {
    "pair": "question and choice joined into one text by the shared code ([CLS] question [SEP] choice [SEP])",
    "vcr": "the processor's own VCR layout (`vcr_text`, the `ChoiceLayout` protocol)",
}
RETRIEVAL_NEGATIVES = {
    "sampled": "sampled hard negatives per positive pair (`RetrievalTask`)",
    "in_batch": "the other pairs of the batch, ranked within it (`InBatchRetrievalTask`)",
}


@dataclass(frozen=True)
class MatchScore:
    """Where a pre-training head says whether a text matches an image, read by zero-shot retrieval.

    vlhub's one convention for matching scores: **a pair's score is a logit, higher means "match"**, and the
    retrieval pipeline's `score` is its sigmoid. A two-class matching head is read through this declaration, so the
    class order of the original (UNITER: column 1 = match; ViLBERT: column 0 = aligned) stays inside the architecture.

    Attributes:
        field: the output field with the `(batch, 2)` matching logits ("itm_logits", "alignment_logits").
        match_class: the column that means "match" (0 or 1).
        log_odds: False: the score is the match column's logit (UNITER, whose retrieval head is initialised from that
            row of its ITM head); True: the match column minus the other one, the logit of the softmax's "match"
            probability (ViLBERT's zero-shot retrieval scores with `softmax(alignment)[0]`).
    """

    field: str
    match_class: int
    log_odds: bool = False

    def __post_init__(self):
        if not self.field:
            raise ValueError("MatchScore.field must name the output field with the matching logits")
        if self.match_class not in (0, 1):
            raise ValueError(
                f"MatchScore.match_class must be 0 or 1 (a two-class matching head), got {self.match_class!r}"
            )

    def __call__(self, outputs: ModelOutput) -> torch.Tensor:
        """`(batch,)` match scores from a model's outputs (a `ModelOutput`)."""
        logits = outputs[self.field] if self.field in outputs else None
        if logits is None or logits.ndim != 2 or logits.shape[1] != 2:
            shape = None if logits is None else tuple(logits.shape)
            raise ValueError(f"the model's {self.field!r} must be (batch, 2) matching logits, got {shape}")
        score = logits[:, self.match_class]
        return score - logits[:, 1 - self.match_class] if self.log_odds else score


@dataclass(frozen=True)
class Architecture:
    """What one architecture provides. Class names refer to the attributes of `package`.

    Attributes:
        model_type: the config's `model_type` ("uniter").
        name: the name people use ("UNITER"), for model cards and messages.
        package: the architecture's package ("vlhub.modeling.uniter"), exporting every class named below.
        config: the `PreTrainedConfig` subclass.
        processor: the `ProcessorMixin` subclass; `region_processor`: its region side (`RegionProcessor` subclass).
        base_model: the backbone class without a head ("UniterModel"), registered with `AutoModel`.
        auto_models: transformers Auto class name → model class, for what `base_model` and `task_models` do not give
            already: `AutoModel` gets `base_model`, and each head of `task_models` whose task is in
            `AUTO_CLASS_OF_TASK` gets that Auto class (an entry given here overrides a derived one).
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

    Capabilities (what shared code relies on; checked when registered, and each class against its protocol when it
    is first resolved):
        choice_layout: how multiple-choice pairs are laid out (`CHOICE_LAYOUTS`): "pair" (the default) or "vcr" (the
            processor implements `ChoiceLayout`, VL-BERT).
        match_score: how the pre-training head scores image-text matching (`MatchScore`), for zero-shot retrieval
            from a pre-training checkpoint; None: a pre-training checkpoint cannot rank pairs.
        retrieval_negatives: how the "retrieval" head trains (`RETRIEVAL_NEGATIVES`): "sampled" (the default) or
            "in_batch" (TDEN).
        heads_from_pretraining: the tasks whose heads start from the pre-trained heads when fine-tuned from a
            pre-training checkpoint (they implement `InitializesFromPretraining`).
        config_mask_token_id: the config names the tokenizer's [MASK] (`mask_token_id`), set from the tokenizer when a
            config is built (VL-BERT reads its VQA answer at [MASK]; Unified VLP predicts the next word there).
        The "captioning" head, where there is one, implements `CaptionScorer` (self-critical training drives it).
    """

    model_type: str
    name: str
    package: str
    config: str
    processor: str
    region_processor: str
    base_model: str | None = None
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
    choice_layout: str = "pair"
    match_score: MatchScore | None = None
    retrieval_negatives: str = "sampled"
    heads_from_pretraining: frozenset[str] = frozenset()
    config_mask_token_id: bool = False

    def __post_init__(self):
        object.__setattr__(self, "heads_from_pretraining", frozenset(self.heads_from_pretraining))
        derived = {
            AUTO_CLASS_OF_TASK[task]: head for task, head in self.task_models.items() if task in AUTO_CLASS_OF_TASK
        }
        if self.base_model is not None:
            derived["AutoModel"] = self.base_model
        object.__setattr__(self, "auto_models", {**derived, **self.auto_models})
        problems = []
        if self.choice_layout not in CHOICE_LAYOUTS:
            problems.append(f"choice_layout {self.choice_layout!r} is none of {sorted(CHOICE_LAYOUTS)}")
        if self.retrieval_negatives not in RETRIEVAL_NEGATIVES:
            problems.append(
                f"retrieval_negatives {self.retrieval_negatives!r} is none of {sorted(RETRIEVAL_NEGATIVES)}"
            )
        if self.match_score is not None and not isinstance(self.match_score, MatchScore):
            problems.append(f"match_score must be a MatchScore, got {type(self.match_score).__name__}")
        if self.match_score is not None and "pretraining" not in self.task_models:
            problems.append("match_score is declared but there is no 'pretraining' head to read it from")
        undeclared = sorted(self.heads_from_pretraining - set(self.task_models))
        if undeclared:
            problems.append(f"heads_from_pretraining names tasks without a head in task_models: {undeclared}")
        if self.heads_from_pretraining and "pretraining" not in self.task_models:
            problems.append("heads_from_pretraining is declared but there is no 'pretraining' head to start from")
        if problems:
            raise ValueError(f"architecture {self.model_type!r} ({self.package}): " + "; ".join(problems))

    @classmethod
    def from_folder(cls, package: str, name: str, tasks: Sequence[str], **declared: Any) -> Architecture:
        """The declaration of an architecture whose folder follows vlhub's naming convention: it gives only what is
        its own, and the rest follows from the folder's name, its model type (`vlhub.modeling.vl_bert` → "vl_bert").

        With `Prefix` the model type in CamelCase ("vl_bert" → "VlBert", transformers' convention): the classes are
        `<Prefix>Config`, `<Prefix>Processor`, `<Prefix>RegionProcessor`, `<Prefix>Model` (the base model) and, for
        each of `tasks`, `<Prefix>` + `HEAD_CLASS_OF_TASK[task]` ("vqa" → "VlBertForQuestionAnswering"); the
        pre-training objectives are `objectives_<model_type>.<MODEL_TYPE>_OBJECTIVES` and the converter is the
        module `convert_<model_type>`. A field in `declared` replaces what the convention gives (`objectives=None`,
        `converter=None` for an architecture without them; `task_models` adds heads of tasks the convention does not
        name, or renames one).
        """
        model_type = package.rpartition(".")[2]
        unnamed = [task for task in tasks if task not in HEAD_CLASS_OF_TASK]
        if unnamed:
            raise ValueError(
                f"architecture {model_type!r} ({package}): tasks {unnamed} have no conventional head name "
                f"(known: {sorted(HEAD_CLASS_OF_TASK)}); declare their heads in task_models instead"
            )
        prefix = "".join(part.capitalize() for part in model_type.split("_"))
        conventional = dict(
            model_type=model_type,
            config=f"{prefix}Config",
            processor=f"{prefix}Processor",
            region_processor=f"{prefix}RegionProcessor",
            base_model=f"{prefix}Model",
            objectives=f"{package}.objectives_{model_type}:{model_type.upper()}_OBJECTIVES",
            converter=f"{package}.convert_{model_type}",
        )
        task_models = {task: prefix + HEAD_CLASS_OF_TASK[task] for task in tasks}
        task_models.update(declared.pop("task_models", {}))
        return cls(package=package, name=name, task_models=task_models, **{**conventional, **declared})

    # -- classes ------------------------------------------------------------------------------------------------
    def resolve(self, name: str) -> Any:
        return getattr(importlib.import_module(self.package), name)

    @property
    def config_class(self) -> type:
        return self.resolve(self.config)

    @property
    def processor_class(self) -> type:
        processor_class = self.resolve(self.processor)
        if self.choice_layout == "vcr":
            self._check_protocol(processor_class, ChoiceLayout, 'choice_layout="vcr"')
        return processor_class

    def _check_protocol(self, cls, protocol, declared: str) -> None:
        if not issubclass(cls, protocol):
            methods = ", ".join(name for name in vars(protocol) if not name.startswith("_"))
            raise TypeError(
                f"architecture {self.model_type!r} declares {declared}, but {cls.__name__} does not "
                f"implement {protocol.__name__} ({methods})"
            )

    @property
    def region_processor_class(self) -> type:
        return self.resolve(self.region_processor)

    def module_of(self, name: str) -> str:
        """The module that defines the exported `name` (without importing it, for lazily exporting packages)."""
        package = importlib.import_module(self.package)
        structure = getattr(getattr(package, "__getattr__", None), "lazy_structure", {})
        return f"{self.package}.{structure[name]}" if name in structure else self.package

    def model_class_names(self) -> list[str]:
        return list(dict.fromkeys([*self.auto_models.values(), *self.task_models.values()]))

    def model_class(self, task: str) -> type:
        """The head for `task` ("pretraining", "vqa", "retrieval", ...)."""
        if task not in self.task_models:
            why = f" ({self.unsupported_tasks[task]})" if task in self.unsupported_tasks else ""
            raise ValueError(f"{self.name} has no {task!r} head{why}; its heads: {sorted(self.task_models)}")
        model_class = self.resolve(self.task_models[task])
        if task in self.heads_from_pretraining:
            self._check_protocol(model_class, InitializesFromPretraining, f"heads_from_pretraining={{{task!r}}}")
        if task == "captioning":
            self._check_protocol(model_class, CaptionScorer, "a 'captioning' head")
        return model_class

    def task_heads(self) -> dict[str, type]:
        """task → head class, for every task of `task_models` (each checked as `model_class` checks it)."""
        return {task: self.model_class(task) for task in self.task_models}

    def initializes_from_pretraining(self, model_class: type) -> bool:
        """Whether `model_class` (one of this architecture's heads) starts from the pre-trained heads."""
        return any(self.task_models[task] == model_class.__name__ for task in self.heads_from_pretraining)

    def is_pretraining_head(self, model: object) -> bool:
        return self.has_task("pretraining") and isinstance(model, self.model_class("pretraining"))

    def has_task(self, task: str) -> bool:
        return task in self.task_models

    # -- building blocks for training and conversion -------------------------------------------------------------
    def build_processor(
        self, tokenizer: PreTrainedTokenizerBase, region_feature_dim: int, **region_settings: Any
    ) -> ProcessorMixin:
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


def architecture_of_processor(processor: object) -> Architecture | None:
    """The registered architecture whose processor `processor` is (or derives from); None for another processor."""
    for cls in type(processor).__mro__:
        for architecture in _ARCHITECTURES.values():
            if cls.__name__ == architecture.processor and cls.__module__.startswith(architecture.package):
                return architecture
    return None


def get_architecture(model_type: str) -> Architecture:
    if model_type not in _ARCHITECTURES:
        raise ValueError(f"unknown model type {model_type!r}; vlhub knows {sorted(_ARCHITECTURES)}")
    return _ARCHITECTURES[model_type]


def architectures() -> dict[str, Architecture]:
    return dict(_ARCHITECTURES)


def lazy_exports(
    module_name: str, structure: Mapping[str, list[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
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
