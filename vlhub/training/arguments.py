"""Command-line / programmatic arguments of the training loop (shared by pre-training and fine-tuning).

Dataclasses read by `transformers.HfArgumentParser`, so every field is a `--flag` with its help text.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import torch

from ..utils import precision

__all__ = ["VlhubTrainingArguments", "TrainingArguments"]

_SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
               "inverse_sqrt", "warmup_stable_decay")  # fmt: skip


@dataclass
class VlhubTrainingArguments:
    """The settings of vlhub's accelerate loop (`vlhub.training.train`). Names follow transformers' `TrainingArguments`
    where the meaning is the same; this is not that class (vlhub's loop is accelerate's, not the Trainer)."""

    # Steps trained when neither --max_steps nor --num_train_epochs is given (scripts set their own).
    default_max_steps: ClassVar[int] = 300

    output_dir: str = field(
        default="runs/uniter-shapes", metadata={"help": "Where checkpoints, the final model and log_history.jsonl go."}
    )
    max_steps: int | None = field(
        default=None,
        metadata={
            "help": "Optimizer steps to train for (wins over "
            "--num_train_epochs; default: the script's default when no epochs are given)."
        },
    )
    num_train_epochs: float | None = field(
        default=None,
        metadata={"help": "Train for this many passes over the training data (used when --max_steps is not given)."},
    )
    per_device_train_batch_size: int = field(
        default=32,
        metadata={"help": "Examples per training batch on each process.", "aliases": ["--per_device_batch_size"]},
    )
    per_device_eval_batch_size: int | None = field(
        default=None,
        metadata={"help": "Examples per evaluation batch on each process (default: the training batch size)."},
    )
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "Batches per optimizer step."})
    learning_rate: float = field(default=5e-5, metadata={"help": "Peak learning rate (AdamW)."})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay (not on biases and LayerNorms)."})
    adam_beta1: float = field(default=0.9)
    adam_beta2: float = field(default=0.98, metadata={"help": "0.98 as the original UNITER."})
    adam_epsilon: float = field(default=1e-6)
    max_grad_norm: float = field(default=5.0, metadata={"help": "Gradient-norm clipping (0 disables)."})
    lr_scheduler_type: str = field(
        default="linear", metadata={"help": f"transformers.get_scheduler name: {_SCHEDULERS}"}
    )
    warmup_steps: int = field(default=0, metadata={"help": "Linear warm-up steps."})
    mixed_precision: str = field(
        default="no",
        metadata={
            "help": "no | fp16 | bf16 (accelerate's autocast) | auto: "
            "bf16 on a GPU that supports it, or on a CPU with bf16 matmul units (AMX, AVX512-BF16) where a bf16 "
            "product measured at least 1.2x fp32's speed at run time; else no (fp32: bf16 emulated, or on units "
            "slower than the fp32 ones, is slower than fp32)."
        },
    )
    eval_steps: int = field(default=0, metadata={"help": "Evaluate every N steps (0: only at the end)."})
    max_eval_samples: int = field(default=0, metadata={"help": "Evaluate on at most N examples (0: all)."})
    logging_steps: int = field(default=10, metadata={"help": "Log (and append to log_history.jsonl) every N steps."})
    save_steps: int = field(default=0, metadata={"help": "Save output_dir/checkpoint-<step> every N steps (0: never)."})
    save_total_limit: int = field(default=0, metadata={"help": "Keep only the newest N checkpoints (0: all)."})
    seed: int = field(default=0, metadata={"help": "Seed of initialisation, data order, masking and dropout."})
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Start a fresh run in an output_dir that "
            "holds another run's checkpoints, deleting them (without it, that is refused)."
        },
    )
    resume_from_checkpoint: str | None = field(
        default=None,
        metadata={"help": "A checkpoint folder, or 'latest' (the newest checkpoint-<step> in output_dir)."},
    )
    push_to_hub: bool = field(
        default=False, metadata={"help": "Upload checkpoints (in the background) and the final model to the Hub."}
    )
    hub_model_id: str | None = field(default=None, metadata={"help": "Repository to push to (user/name)."})
    hub_private_repo: bool = field(default=False)
    hub_token: str | None = field(default=None, metadata={"help": "Defaults to the logged-in token / HF_TOKEN."})
    hub_timeout: float = field(
        default=60.0,
        metadata={
            "help": "Seconds a Hub request may make no progress before it "
            "is retried (3 tries), then given up with an error; local checkpoints are kept."
        },
    )
    hub_total_timeout: float = field(
        default=3600.0,
        metadata={
            "help": "Seconds one Hub operation (a download of the "
            "model, tokenizer or dataset; creating the repository; one upload) may take in "
            "all, retries included: a server that trickles bytes ends in an error too."
        },
    )
    report_to: list[str] = field(
        default_factory=list,
        metadata={"help": "Extra accelerate trackers (tensorboard, wandb, ...); log_history.jsonl is always written."},
    )
    dataloader_num_workers: int = field(
        default=0,
        metadata={
            "help": "Worker processes that read regions, run the "
            "processor and collate batches off the training loop (0: in the loop). "
            "Batches stay the same, so exact resumption holds."
        },
    )
    dataloader_prefetch_factor: int | None = field(
        default=None, metadata={"help": "Batches each worker prepares ahead (default: PyTorch's 2; needs workers)."}
    )
    dataloader_pin_memory: bool = field(
        default=True,
        metadata={"help": "Pin batches in page-locked memory for faster copies to the GPU (ignored on the CPU)."},
    )
    dataloader_persistent_workers: bool = field(
        default=True, metadata={"help": "Keep workers alive between epochs (their region caches stay warm)."}
    )
    use_cpu: bool = field(default=False, metadata={"help": "Train on the CPU even when a GPU is present."})
    streaming: bool = field(
        default=False,
        metadata={
            "help": "Stream the region store's shards in order instead of "
            "reading images by id: each process reads its own shards (split by node), shuffled in "
            "blocks of --shuffle_buffer_size examples; train with --max_steps. For stores larger "
            "than a machine's disk and for many nodes."
        },
    )
    shuffle_buffer_size: int = field(
        default=1024,
        metadata={
            "help": "--streaming: examples shuffled together (the "
            "stream's regions of that many examples stay in memory)."
        },
    )

    def __post_init__(self):
        if self.max_steps is None and self.num_train_epochs is None:
            self.max_steps = self.default_max_steps
        if self.per_device_eval_batch_size is None:
            self.per_device_eval_batch_size = self.per_device_train_batch_size
        checks = {
            "max_steps": self.max_steps is None or self.max_steps >= 1,
            "num_train_epochs": self.num_train_epochs is None
            or (self.num_train_epochs > 0 and math.isfinite(self.num_train_epochs)),
            "per_device_train_batch_size": self.per_device_train_batch_size >= 1,
            "per_device_eval_batch_size": self.per_device_eval_batch_size >= 1,
            "gradient_accumulation_steps": self.gradient_accumulation_steps >= 1,
            "learning_rate": self.learning_rate > 0,
            "logging_steps": self.logging_steps >= 1,
            "warmup_steps": self.warmup_steps >= 0,
            "eval_steps": self.eval_steps >= 0,
            "save_steps": self.save_steps >= 0,
            "save_total_limit": self.save_total_limit >= 0,
            "max_eval_samples": self.max_eval_samples >= 0,
            "dataloader_num_workers": self.dataloader_num_workers >= 0,
            "dataloader_prefetch_factor": self.dataloader_prefetch_factor is None
            or (self.dataloader_prefetch_factor >= 1 and self.dataloader_num_workers > 0),
            "hub_timeout": self.hub_timeout > 0 and math.isfinite(self.hub_timeout),
            "hub_total_timeout": self.hub_total_timeout > 0 and math.isfinite(self.hub_total_timeout),
            "shuffle_buffer_size": self.shuffle_buffer_size >= 1,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(
                "invalid value for "
                + ", ".join(f"--{n}={getattr(self, n)!r}" for n in bad)
                + " (steps and sizes must be positive, or 0 where 0 disables)"
            )
        # "auto" becomes what this machine runs fast. Each process of a launch resolves it on its own; on a CPU that
        # is a timing (bf16_is_fast), and the CPU kinds measured lie far from its threshold (bf16 at ~0.5x and ~2x fp32).
        device = "cpu" if self.use_cpu or not torch.cuda.is_available() else "cuda"
        self.mixed_precision = precision.resolve_mixed_precision(self.mixed_precision, device)
        if self.mixed_precision == "bf16" and device == "cpu" and not precision.bf16_is_fast("cpu"):
            cpu = (
                f"a CPU whose bf16 products measured {precision.cpu_bf16_speedup():.2f}x fp32's speed"
                if precision.cpu_bf16_units()
                else "a CPU without bf16 matmul units (AMX, AVX512-BF16), where bf16 products are emulated"
            )
            warnings.warn(
                f"--mixed_precision bf16 on {cpu}: no faster than fp32 (--mixed_precision auto picks fp32 on such a CPU)",
                stacklevel=2,
            )
        if self.lr_scheduler_type not in _SCHEDULERS:
            raise ValueError(f"--lr_scheduler_type must be one of {_SCHEDULERS}, got {self.lr_scheduler_type!r}")
        if self.push_to_hub and not self.hub_model_id:
            raise ValueError("--push_to_hub needs --hub_model_id (the repository, e.g. user/uniter-shapes)")
        if isinstance(self.report_to, str):
            self.report_to = [self.report_to]
        self.report_to = [r for r in self.report_to if r != "none"]

    def total_steps(self, steps_per_epoch: int) -> int:
        """Optimizer steps of the run: `max_steps`, or `num_train_epochs` passes of `steps_per_epoch` steps."""
        if self.max_steps is not None:
            return self.max_steps
        return max(1, math.ceil(self.num_train_epochs * steps_per_epoch))

    def to_dict(self) -> dict:
        data = asdict(self)
        data.pop("hub_token")  # never written to disk
        return data


class TrainingArguments(VlhubTrainingArguments):
    """Deprecated name of `VlhubTrainingArguments` (it read like transformers' own class); also accepts the old
    `per_device_batch_size=`."""

    def __init__(self, *args: Any, per_device_batch_size: int | None = None, **kwargs: Any) -> None:
        warnings.warn(
            "vlhub.training.TrainingArguments is deprecated: use VlhubTrainingArguments "
            "(per_device_batch_size is now per_device_train_batch_size)",
            DeprecationWarning,
            stacklevel=2,
        )
        if per_device_batch_size is not None:
            kwargs.setdefault("per_device_train_batch_size", per_device_batch_size)
        super().__init__(*args, **kwargs)
