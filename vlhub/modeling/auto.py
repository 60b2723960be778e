"""Registration of vlhub's architectures with transformers' Auto classes, and lookup of a checkpoint's class.

transformers has no plugin entry points: the Auto classes know vlhub's model types only after `import vlhub`,
which runs `register_all()` once.
"""

from __future__ import annotations

from transformers import (
    AutoConfig,
    AutoFeatureExtractor,
    AutoModel,
    AutoModelForMultipleChoice,
    AutoModelForPreTraining,
    AutoModelForVisualQuestionAnswering,
    AutoProcessor,
    PreTrainedConfig,
    PreTrainedModel,
)

from . import uniter

__all__ = ["register_all", "model_class_for", "MODEL_CLASSES"]

# Every vlhub model class by name, so a checkpoint's `config.architectures` resolves without an Auto mapping
# (retrieval, NLVR2 and referring-expression heads have no fitting Auto class in transformers).
MODEL_CLASSES: dict[str, type[PreTrainedModel]] = {
    name: getattr(uniter, name)
    for name in uniter.__all__
    if name.startswith("Uniter") and isinstance(getattr(uniter, name), type)
    and issubclass(getattr(uniter, name), PreTrainedModel)
}

_REGISTERED = False


def register_all() -> None:
    global _REGISTERED
    if _REGISTERED:
        return
    AutoConfig.register("uniter", uniter.UniterConfig, exist_ok=True)
    AutoModel.register(uniter.UniterConfig, uniter.UniterModel, exist_ok=True)
    AutoModelForPreTraining.register(uniter.UniterConfig, uniter.UniterForPreTraining, exist_ok=True)
    AutoModelForVisualQuestionAnswering.register(uniter.UniterConfig, uniter.UniterForQuestionAnswering, exist_ok=True)
    AutoModelForMultipleChoice.register(uniter.UniterConfig, uniter.UniterForMultipleChoice, exist_ok=True)
    AutoFeatureExtractor.register(uniter.UniterConfig, uniter.UniterRegionProcessor, exist_ok=True)
    AutoProcessor.register(uniter.UniterConfig, uniter.UniterProcessor, exist_ok=True)
    _REGISTERED = True


def model_class_for(config: PreTrainedConfig, default: type[PreTrainedModel] | None = None) -> type[PreTrainedModel]:
    """The vlhub class named first in `config.architectures` (a checkpoint records the head it was saved with)."""
    for name in config.architectures or []:
        if name in MODEL_CLASSES:
            return MODEL_CLASSES[name]
    if default is not None:
        return default
    raise ValueError(
        f"cannot tell which vlhub model class this checkpoint holds: config.architectures = {config.architectures!r}"
    )
