"""Training: objectives, collators, deterministic batch order, the accelerate loop, checkpoints, Hub uploads.

`pretrain.py` / `finetune.py` at the repository root are thin command lines over `vlhub.training.cli`.
"""

from .arguments import TrainingArguments, VlhubTrainingArguments
from .collators import CaptionDataset, PretrainingCollator
from .data import CaptionCorpus, load_caption_corpus
from .hub import HubError, HubUploader
from .loop import LoopState, TrainingTask, TrainResult, resolve_checkpoint, train
from .masking import mask_regions, mask_tokens
from .objectives import (
    Objective,
    ObjectiveContext,
    ObjectiveMix,
    default_objective_mix,
    objectives_for,
    register_objective,
)
from .pretraining import PretrainingTask, build_config, build_pretraining_model, build_uniter_config
from .sampling import ObjectiveBatchSampler, SampleKey

__all__ = [
    "CaptionCorpus",
    "CaptionDataset",
    "HubError",
    "HubUploader",
    "LoopState",
    "Objective",
    "ObjectiveBatchSampler",
    "ObjectiveContext",
    "ObjectiveMix",
    "PretrainingCollator",
    "PretrainingTask",
    "SampleKey",
    "TrainResult",
    "TrainingArguments",
    "VlhubTrainingArguments",
    "TrainingTask",
    "build_config",
    "build_pretraining_model",
    "build_uniter_config",
    "default_objective_mix",
    "load_caption_corpus",
    "mask_regions",
    "mask_tokens",
    "objectives_for",
    "register_objective",
    "resolve_checkpoint",
    "train",
]
