"""The accelerate training loop every vlhub task runs: pre-training (any mix of objectives) and fine-tuning.

A `TrainingTask` supplies the model, processor, data and evaluation; `train(task, args)` does the rest with
accelerate: `prepare`, gradient accumulation, mixed precision, the learning-rate schedule
(`transformers.get_scheduler`), per-objective loss logging (trackers + `log_history.jsonl`), periodic evaluation
(`gather_for_metrics`), checkpoints (`save_pretrained` folder + `save_state`), exact resumption and Hub uploads.

Checkpoint layout, `<output_dir>/checkpoint-<step>/`:
    config.json, model.safetensors, processor files   a complete `save_pretrained` folder
    README.md                                          model card: data, command, settings, evaluation
    vlhub_state.json                                   what exact resumption needs beyond that: the pending log
                                                       window, process count, arguments, command, evaluation
    trainer_state.json                                 transformers' `TrainerState` (step, epoch, log history),
                                                       readable with `TrainerState.load_from_json`
    training_state/                                    accelerate.save_state: optimizer, scheduler, RNG, scaler
    checksums.json                                     sha256 and size of every file above; written last, when the
                                                       checkpoint is complete
The final model is saved the same way (without `training_state/`) in `<output_dir>` itself. Every JSON file is
written atomically. Resuming verifies the checksums first: a damaged checkpoint is named with its bad file, and
`latest` falls back to the newest intact one. A fresh run refuses an `output_dir` holding another run's
checkpoints unless `overwrite_output_dir` is set (then those checkpoints are deleted first). A run owns its
`output_dir` while it runs (`vlhub.utils.locks.FolderLock`, `.vlhub-run.lock`): a second run started on it, at the
same moment or later, is refused with a message naming the first (process id, host, start time).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from accelerate import Accelerator, skip_first_batches
from accelerate.logging import get_logger
from accelerate.utils import DistributedDataParallelKwargs, broadcast_object_list, send_to_device, set_seed
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm
from transformers import TrainerState, get_scheduler

from ..utils.files import atomic_write, atomic_write_json, file_checksums, sha256_file
from ..utils.locks import FolderInUseError, FolderLock
from ..utils.logs import repeated_warnings_counted
from ..utils.secrets import scrub_secrets
from ..utils.tensors import SingleThreaded
from .arguments import VlhubTrainingArguments
from .collators import Float16RegionTransfer, InlineSmallTensors
from .hub import HubUploader
from .model_card import CardInfo, write_training_card
from .sampling import ObjectiveBatchSampler
from .tracking import LOG_HISTORY, JsonlTracker, write_log_history

if TYPE_CHECKING:
    from transformers.utils import ModelOutput

__all__ = [
    "TrainingTask",
    "model_losses",
    "TrainResult",
    "LoopState",
    "train",
    "resolve_checkpoint",
    "verify_checkpoint",
    "DamagedCheckpointError",
    "TRAINER_STATE",
    "VLHUB_STATE",
    "CHECKSUMS",
]

logger = get_logger(__name__)

TRAINER_STATE = "trainer_state.json"
VLHUB_STATE = "vlhub_state.json"
TRAINING_STATE_DIR = "training_state"
CHECKSUMS = "checksums.json"
_RNG_STATE = "random_states_{}.pkl"  # accelerate.save_state's name for process i's RNG state
_STREAM_STATE = "stream_state_{}.json"  # --streaming: process i's stateful-loader state
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def model_losses(outputs: ModelOutput) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A model output's `loss` and its `*_loss` parts (logged separately)."""
    if outputs.loss is None:
        raise ValueError("the model returned no loss for a training batch: the batch carries no targets")
    parts = {k: v for k, v in outputs.items() if k.endswith("_loss") and k != "loss" and v is not None}
    return outputs.loss, parts


class TrainingTask:
    """What a task gives the loop. Subclasses set the attributes and implement `train_sampler`, `evaluate`,
    `card_info`; `training_step` defaults to `model(**batch)` with every `*_loss` output logged separately.

    Attributes:
        model: the `PreTrainedModel` to train. processor: saved with every checkpoint.
        dataset_name, dataset_description: what it is trained on. base_model: what its weights started from (a
            folder or Hub id; None: from scratch). All three are recorded in the model card.
        train_dataset: a map-style dataset read with `SampleKey`s. collate_fn: batch → model inputs.
        trainer_name: the script recorded in model cards.
    """

    model: torch.nn.Module
    processor = None
    dataset_name: str
    dataset_description: str
    base_model: str | None = None
    train_dataset: Dataset
    collate_fn: Callable
    trainer_name = "vlhub"

    def __init__(
        self,
        model: torch.nn.Module,
        processor: Any,
        dataset_name: str,
        dataset_description: str,
        base_model: str | None = None,
    ) -> None:
        self.model = model
        self.processor = processor
        self.dataset_name, self.dataset_description, self.base_model = dataset_name, dataset_description, base_model

    def train_sampler(self, batch_size: int, group_size: int, seed: int) -> ObjectiveBatchSampler:
        raise NotImplementedError

    # Optimizer steps `training_passes` may take per batch (more than one rules out gradient accumulation).
    optimizer_steps_per_batch = 1

    def train_stream(
        self, args: VlhubTrainingArguments, process_index: int, num_processes: int
    ) -> torch.utils.data.IterableDataset:
        """The training data as an endless stream of batches for `--streaming` (a `StreamedCaptionBatches`, or any
        iterable dataset with `state_dict`/`load_state_dict` and `approximate_steps_per_epoch()`)."""
        raise ValueError(f"--streaming is not available for {type(self).__name__}: it reads its data by index")

    def training_step(self, model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return model_losses(model(**batch))

    def training_passes(
        self, model: torch.nn.Module, batch: dict
    ) -> Iterator[tuple[torch.Tensor, dict[str, torch.Tensor]]]:
        """`(loss, logged parts)` per pass over `batch`; the loop runs backward and an optimizer step after each
        (the generator resumes after that step). The default is one pass, `training_step`. The learning-rate
        schedule advances once per batch, whatever the number of passes."""
        yield self.training_step(model, batch)

    def evaluate(
        self, accelerator: Accelerator, model: torch.nn.Module, args: VlhubTrainingArguments, final: bool = False
    ) -> dict[str, float]:
        """Metrics on held-out data (`final`: the evaluation after the last step, which may cover more splits)."""
        return {}

    def card_info(self) -> CardInfo:
        raise NotImplementedError

    def task_card(
        self,
        title: str,
        summary: str,
        usage: str,
        metric_task: str,
        *,
        pipeline_tag: str | None = None,
        tags: Sequence[str] = (),
        baseline_note: str | None = None,
    ) -> CardInfo:
        """The `CardInfo` a `card_info` returns: the task's own title, summary, usage snippet, metric task, Hub
        pipeline tag, tags and baseline note, with what every task records the same way (the trainer script, the
        dataset, the base model, and the model type after the task's tags)."""
        return CardInfo(
            title=title,
            summary=summary,
            trainer=self.trainer_name,
            dataset_name=self.dataset_name,
            dataset_description=self.dataset_description,
            pipeline_tag=pipeline_tag,
            usage=usage,
            metric_task=metric_task,
            base_model=self.base_model,
            baseline_note=baseline_note,
            tags=[*tags, self.model.config.model_type],
        )

    def hyperparameters(self) -> dict:
        return {}

    # -- helper for subclasses ----------------------------------------------------------------------------------
    @staticmethod
    def eval_dataloader(
        accelerator: Accelerator,
        dataset: Dataset,
        sampler: ObjectiveBatchSampler,
        collate_fn: Callable[[Sequence[Any]], dict],
    ) -> DataLoader:
        loader = DataLoader(
            dataset, batch_sampler=sampler, collate_fn=SingleThreaded(collate_fn), generator=torch.Generator()
        )
        return accelerator.prepare(loader)


def loader_collate(collate_fn: Callable[[Sequence[Any]], dict], workers: int) -> Callable[[Sequence[Any]], dict]:
    """The collate function as the training DataLoader runs it: on one intra-op thread (workers run with one
    already; without workers the main process gets the same), and in workers with float16-exact region features
    sent as float16 (`Float16RegionTransfer`) and small tensors inside the pickled batch (`InlineSmallTensors`)."""
    collate_fn = SingleThreaded(collate_fn)
    return InlineSmallTensors(Float16RegionTransfer(collate_fn)) if workers > 0 else collate_fn


@dataclass
class LoopState:
    """Passed to callbacks after every optimizer step."""

    step: int
    max_steps: int
    logs: dict | None = None


@dataclass
class TrainResult:
    global_step: int
    output_dir: Path
    log_history: list[dict]
    eval_results: dict[str, float]
    checkpoints: list[Path] = field(default_factory=list)
    hub_failures: list[str] = field(default_factory=list)


class _LogWindow:
    """Running sums of the losses since the last log line (saved in checkpoints so a resumed run logs the same)."""

    def __init__(self, sums=None, counts=None):
        self.sums: dict[str, float] = dict(sums or {})
        self.counts: dict[str, int] = dict(counts or {})

    def add(self, values: dict[str, float]):
        for key, value in values.items():
            self.sums[key] = self.sums.get(key, 0.0) + value
            self.counts[key] = self.counts.get(key, 0) + 1

    def flush(self) -> dict[str, float]:
        means = {k: self.sums[k] / self.counts[k] for k in self.sums}
        self.sums, self.counts = {}, {}
        return means

    def state(self) -> dict:
        return {"sums": self.sums, "counts": self.counts}


class DamagedCheckpointError(ValueError):
    """A checkpoint is incomplete or its files differ from the checksums recorded when it was complete."""


def verify_checkpoint(folder: str | os.PathLike) -> None:
    """Check every file recorded in `folder/checksums.json` (size, then sha256); raises `DamagedCheckpointError`
    naming the checkpoint and the first bad file. A checkpoint without `checksums.json` was never completed."""
    folder = Path(folder)
    manifest = folder / CHECKSUMS
    if not manifest.is_file():
        raise DamagedCheckpointError(
            f"checkpoint {folder} is incomplete: it has no {CHECKSUMS} (written last, once "
            "every file of a checkpoint is saved); the run was probably interrupted saving it"
        )
    try:
        recorded = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError) as err:
        raise DamagedCheckpointError(f"checkpoint {folder}: {CHECKSUMS} is unreadable ({err})") from err
    for name, expected in recorded.items():
        path = folder / name
        if not path.is_file():
            raise DamagedCheckpointError(f"checkpoint {folder} is damaged: {name} is missing")
        size = path.stat().st_size
        if size != expected["size"]:
            raise DamagedCheckpointError(
                f"checkpoint {folder} is damaged: {name} has {size} bytes, "
                f"{expected['size']} were saved (truncated or overwritten)"
            )
        if sha256_file(path) != expected["sha256"]:
            raise DamagedCheckpointError(
                f"checkpoint {folder} is damaged: the content of {name} differs from what was saved (sha256 mismatch)"
            )
    for required in (TRAINER_STATE, VLHUB_STATE):
        if required not in recorded:
            raise DamagedCheckpointError(f"checkpoint {folder} is not a vlhub training checkpoint: no {required}")


def resolve_checkpoint(value: str, output_dir: str | os.PathLike) -> Path:
    """`latest` → the newest intact `checkpoint-<step>` in output_dir (damaged newer ones are skipped with a
    warning); otherwise the folder given, which must be intact (`verify_checkpoint`)."""
    if value == "latest":
        found = _checkpoints(Path(output_dir))
        if not found:
            raise FileNotFoundError(f"--resume_from_checkpoint latest: no checkpoint-<step> folder in {output_dir}")
        problems = []
        for folder in reversed(found):
            try:
                verify_checkpoint(folder)
            except DamagedCheckpointError as err:
                problems.append(str(err))
                continue
            if problems:
                logger.warning(
                    f"skipping damaged checkpoints ({'; '.join(problems)}); resuming from {folder} instead",
                    main_process_only=True,
                )
            return folder
        raise DamagedCheckpointError(
            f"--resume_from_checkpoint latest: no intact checkpoint in {output_dir}: " + "; ".join(problems)
        )
    path = Path(value)
    if not (path / TRAINER_STATE).is_file() or not (path / TRAINING_STATE_DIR).is_dir():
        raise FileNotFoundError(
            f"--resume_from_checkpoint {value}: not a vlhub training checkpoint (expected a folder with "
            f"{TRAINER_STATE} and {TRAINING_STATE_DIR}/, such as {Path(output_dir) / 'checkpoint-500'})"
        )
    verify_checkpoint(path)
    return path


def _claim_output_dir(output_dir: Path, overwrite: bool, is_main: bool) -> None:
    """A fresh run must not mix with another run's checkpoints (resume would pick them, rotation would keep them)."""
    earlier = [p for p in output_dir.glob("checkpoint-*") if _CHECKPOINT.match(p.name) and p.is_dir()]
    if not earlier and not (output_dir / TRAINER_STATE).is_file():
        return
    if not overwrite:
        names = ", ".join(sorted(p.name for p in earlier)) or TRAINER_STATE
        raise FileExistsError(
            f"--output_dir {output_dir} already holds another run ({names}). Resume it with "
            "--resume_from_checkpoint latest, choose another --output_dir, or pass --overwrite_output_dir to delete "
            "its checkpoints and start afresh."
        )
    if is_main:
        logger.warning(
            f"--overwrite_output_dir: deleting the earlier run's checkpoints in {output_dir}: "
            f"{', '.join(sorted(p.name for p in earlier))}"
        )
        for folder in earlier:
            shutil.rmtree(folder)


def _checkpoints(output_dir: Path) -> list[Path]:
    if not output_dir.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in output_dir.iterdir()
        if (m := _CHECKPOINT.match(p.name)) and p.is_dir() and (p / TRAINER_STATE).is_file()
    ]
    return [p for _, p in sorted(found)]


def _optimizer(model: torch.nn.Module, args: VlhubTrainingArguments) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        (no_decay if parameter.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(parameter)
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(
        groups, lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon
    )


def _format_logs(step: int, logs: dict) -> str:
    parts = [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in logs.items()]
    return f"step {step}: " + " | ".join(parts)


@repeated_warnings_counted()  # e.g. one truncation warning per long caption: said once, with its count
def train(
    task: TrainingTask,
    args: VlhubTrainingArguments,
    command: str = "",
    callbacks: Iterable[Callable[[LoopState], None]] = (),
    accelerator: Accelerator | None = None,
) -> TrainResult:
    """Train `task.model` for `args.max_steps` optimizer steps (or `args.num_train_epochs` epochs); returns the final step, log history and evaluation.

    `command` is recorded in the model cards. Callbacks run after every optimizer step (tests use one to simulate
    a crash). Pass an `accelerator` to reuse one; otherwise one is built from `args`.
    """
    output_dir = Path(args.output_dir)
    command = scrub_secrets(command, [args.hub_token])  # it goes into model cards and state files, then the Hub
    if accelerator is None:
        accelerator = Accelerator(
            gradient_accumulation_steps=args.gradient_accumulation_steps,
            mixed_precision=args.mixed_precision,
            cpu=args.use_cpu or not torch.cuda.is_available(),
            log_with=[JsonlTracker(output_dir), *args.report_to],
            project_dir=str(output_dir),
            step_scheduler_with_optimizer=False,
            # One objective per step uses only some heads (MRM's mask embedding, the MLM head, ...).
            kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)],
        )
    # The run owns output_dir before anything is written there, until it ends (main process; every process stops
    # if the main process cannot get it).
    lock = FolderLock(output_dir, "--output_dir")
    refusal = None
    if accelerator.is_main_process:
        try:
            lock.acquire()
        except Exception as err:  # in use, or not writable: the other processes must stop too, not wait
            refusal = err
    if accelerator.num_processes > 1:
        message = broadcast_object_list([str(refusal) if refusal else None])[0]
        if message and refusal is None:
            refusal = FolderInUseError(message)
    if refusal is not None:
        raise refusal
    try:
        return _train(task, args, command, callbacks, accelerator, output_dir)
    finally:
        lock.release()


def _train(
    task: TrainingTask,
    args: VlhubTrainingArguments,
    command: str,
    callbacks: Iterable[Callable[[LoopState], None]],
    accelerator: Accelerator,
    output_dir: Path,
) -> TrainResult:
    run = _TrainingRun(task, args, command, accelerator, output_dir)
    run.resume_or_start()
    run.train_steps(callbacks)
    return run.finish()


class _TrainingRun:
    """One run of the loop. Everything a checkpoint saves and resuming restores (step, log window, history,
    evaluation) lives here, so that the run's parts are plain methods over one state."""

    def __init__(
        self, task: TrainingTask, args: VlhubTrainingArguments, command: str, accelerator: Accelerator, output_dir: Path
    ):
        self.task, self.args, self.command, self.accelerator, self.output_dir = (
            task,
            args,
            command,
            accelerator,
            output_dir,
        )
        self.is_main = accelerator.is_main_process
        self.resume_dir = (
            resolve_checkpoint(args.resume_from_checkpoint, output_dir) if args.resume_from_checkpoint else None
        )
        if self.resume_dir is None:
            _claim_output_dir(output_dir, args.overwrite_output_dir, self.is_main)
        accelerator.wait_for_everyone()

        self.uploader = None
        if args.push_to_hub and self.is_main:
            self.uploader = HubUploader(
                args.hub_model_id,
                token=args.hub_token,
                private=args.hub_private_repo,
                timeout=args.hub_timeout,
                total_timeout=args.hub_total_timeout,
            )

        if task.optimizer_steps_per_batch > 1 and args.gradient_accumulation_steps > 1:
            raise ValueError(
                f"this task takes {task.optimizer_steps_per_batch} optimizer steps per batch (e.g. "
                "two-pass scheduled sampling), which gradient accumulation cannot split: set "
                "--gradient_accumulation_steps 1 (raise the batch size or the number of processes "
                "instead)"
            )
        set_seed(args.seed)
        self._build_train_loader()
        self.max_steps = args.total_steps(self.steps_per_epoch)
        self._prepare()
        self.step, self.window, self.history, self.eval_results = 0, _LogWindow(), [], {}
        self.checkpoints: list[Path] = []
        self.hub_failures: list[str] = []

    def _build_train_loader(self) -> None:
        """The training loader (a stream's with `--streaming`), its sampler and the steps of one epoch."""
        args, accelerator = self.args, self.accelerator
        workers = args.dataloader_num_workers
        self.pin_memory = args.dataloader_pin_memory and accelerator.device.type == "cuda"
        loader_settings = dict(
            collate_fn=loader_collate(self.task.collate_fn, workers),
            num_workers=workers,
            prefetch_factor=args.dataloader_prefetch_factor if workers else None,
            persistent_workers=args.dataloader_persistent_workers and workers > 0,
            pin_memory=self.pin_memory,
            generator=torch.Generator(),  # the global RNG stays untouched
        )
        self.sampler = None
        if args.streaming:
            from torchdata.stateful_dataloader import StatefulDataLoader

            # Each process streams its own shards, so the loader is not sharded again by accelerate; its state is
            # saved per process with each checkpoint (accelerate's own stateful-loader file is one file for all
            # processes).
            stream = self.task.train_stream(args, accelerator.process_index, accelerator.num_processes)
            self.steps_per_epoch = stream.approximate_steps_per_epoch()
            self.train_loader = StatefulDataLoader(stream, batch_size=None, **loader_settings)
        else:
            group_size = accelerator.num_processes * args.gradient_accumulation_steps
            self.sampler = self.task.train_sampler(args.per_device_train_batch_size, group_size, args.seed)
            self.steps_per_epoch = self.sampler.steps_per_epoch
            self.train_loader = DataLoader(self.task.train_dataset, batch_sampler=self.sampler, **loader_settings)

    def _prepare(self) -> None:
        """Optimizer and schedule, then everything through `accelerator.prepare` (a stream is not sharded again)."""
        optimizer = _optimizer(self.task.model, self.args)
        scheduler = get_scheduler(
            self.args.lr_scheduler_type,
            optimizer,
            num_warmup_steps=self.args.warmup_steps,
            num_training_steps=self.max_steps,
        )
        if self.args.streaming:
            self.model, self.optimizer, self.scheduler = self.accelerator.prepare(self.task.model, optimizer, scheduler)
        else:
            self.model, self.optimizer, self.train_loader, self.scheduler = self.accelerator.prepare(
                self.task.model, optimizer, self.train_loader, scheduler
            )

    def resume_or_start(self) -> None:
        """Restore the checkpoint's state (resuming), or start a fresh log history; then start the trackers."""
        accelerator, output_dir, resume_dir = self.accelerator, self.output_dir, self.resume_dir
        if resume_dir is not None:
            trainer_state = TrainerState.load_from_json(str(resume_dir / TRAINER_STATE))
            state = json.loads((resume_dir / VLHUB_STATE).read_text())
            _warn_if_layout_changed(state, self.args, accelerator.num_processes)
            _load_training_state(accelerator, resume_dir, saved_processes=state.get("num_processes"))
            if self.args.streaming:
                _load_stream_state(
                    self.train_loader, accelerator, resume_dir, saved_processes=state.get("num_processes")
                )
            self.step = trainer_state.global_step
            self.window = _LogWindow(state["log_window"]["sums"], state["log_window"]["counts"])
            self.history = trainer_state.log_history
            self.eval_results = state.get("eval_results", {})
            if self.is_main:
                output_dir.mkdir(parents=True, exist_ok=True)
                # The checkpoint's history is the truth: records a crashed run logged after it are redone.
                write_log_history(output_dir / LOG_HISTORY, self.history)
            logger.info(f"resumed from {resume_dir} at step {self.step}", main_process_only=True)
        elif self.is_main:
            output_dir.mkdir(parents=True, exist_ok=True)
            if (output_dir / LOG_HISTORY).exists():
                (output_dir / LOG_HISTORY).unlink()  # a fresh run starts a fresh history
        accelerator.wait_for_everyone()
        accelerator.init_trackers(self.task.trainer_name.replace(".py", ""), config=_flat_config(self.args, self.task))

    def save(self, folder: Path, with_training_state: bool) -> None:
        """A checkpoint (`with_training_state`) or the final model; `checksums.json` last, once all is written."""
        accelerator = self.accelerator
        folder.mkdir(parents=True, exist_ok=True)
        if with_training_state:
            accelerator.save_state(str(folder / TRAINING_STATE_DIR))
            if self.args.streaming:  # every process its own: where its stream stands after its last batch
                atomic_write_json(
                    folder / TRAINING_STATE_DIR / _STREAM_STATE.format(accelerator.process_index),
                    self.train_loader.state_dict(),
                )
        if self.is_main:
            self._save_model_and_state(folder)
        accelerator.wait_for_everyone()
        if with_training_state and self.is_main:
            # Last, once every process has written its part: the checkpoint is complete when this file exists.
            atomic_write_json(folder / CHECKSUMS, {"files": file_checksums(folder, exclude=(CHECKSUMS,))})
        accelerator.wait_for_everyone()

    def _save_model_and_state(self, folder: Path) -> None:
        """The main process's part of a save: model, processor, card, `vlhub_state.json`, `trainer_state.json`."""
        args, step, max_steps, num_processes = self.args, self.step, self.max_steps, self.accelerator.num_processes
        self.accelerator.unwrap_model(self.model).save_pretrained(folder)
        if self.task.processor is not None:
            self.task.processor.save_pretrained(folder)
        write_training_card(
            folder,
            self.task.card_info(),
            step=step,
            max_steps=max_steps,
            command=self.command,
            hyperparameters=_card_hyperparameters(args, self.task, num_processes, max_steps),
            eval_results=self.eval_results,
        )
        atomic_write_json(
            folder / VLHUB_STATE,
            {
                "num_processes": num_processes,
                "log_window": self.window.state(),
                "eval_results": self.eval_results,
                "args": args.to_dict(),
                "command": self.command,
            },
        )
        trainer_state = TrainerState(
            epoch=step / self.steps_per_epoch,
            global_step=step,
            max_steps=max_steps,
            logging_steps=args.logging_steps,
            eval_steps=args.eval_steps,
            save_steps=args.save_steps,
            train_batch_size=args.per_device_train_batch_size,
            num_train_epochs=math.ceil(max_steps / self.steps_per_epoch),
            log_history=self.history,
        )
        atomic_write(folder / TRAINER_STATE, lambda temporary: trainer_state.save_to_json(str(temporary)))

    def batches(self) -> Iterator[dict]:
        """Training batches from where the run stands, epoch after epoch (a stream resumes by its own state)."""
        if self.args.streaming:
            for batch in self.train_loader:
                yield send_to_device(batch, self.accelerator.device, non_blocking=self.pin_memory)
            return
        epoch, skip = divmod(self.step, self.steps_per_epoch)
        for current in itertools.count(epoch):
            self.train_loader.set_epoch(current)
            self.sampler.set_epoch(current)
            yield from (
                skip_first_batches(self.train_loader, skip * self.args.gradient_accumulation_steps)
                if skip
                else self.train_loader
            )
            skip = 0

    def train_steps(self, callbacks: Iterable[Callable[[LoopState], None]]) -> None:
        """Optimizer steps until `max_steps`; after each: logs, evaluation, checkpoint, callbacks."""
        self.progress = tqdm(
            total=self.max_steps,
            initial=self.step,
            disable=not self.accelerator.is_local_main_process,
            desc=self.task.trainer_name,
            dynamic_ncols=True,
        )
        self.model.train()
        if self.step < self.max_steps:
            for batch in self.batches():
                if not self.train_on(batch):
                    continue
                self.step += 1
                self.progress.update(1)
                logs = self.log_losses()
                if self.args.eval_steps and self.step % self.args.eval_steps == 0 and self.step < self.max_steps:
                    self.eval_results = _evaluate(
                        self.task,
                        self.accelerator,
                        self.model,
                        self.args,
                        self.step,
                        self.history,
                        self.progress,
                        final=False,
                    )
                if self.args.save_steps and self.step % self.args.save_steps == 0:
                    self.save_checkpoint()
                for callback in callbacks:
                    callback(LoopState(step=self.step, max_steps=self.max_steps, logs=logs))
                if self.step >= self.max_steps:
                    break
        self.progress.close()

    def train_on(self, batch: dict) -> bool:
        """Backward and optimizer step(s) for one batch, its losses added to the log window; True when the
        gradients were synchronised (an optimizer step of the run was completed)."""
        accelerator, args = self.accelerator, self.args
        with accelerator.accumulate(self.model):
            total, parts = 0.0, {}
            for loss, pass_parts in self.task.training_passes(self.model, batch):
                accelerator.backward(loss)
                if accelerator.sync_gradients and args.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(self.model.parameters(), args.max_grad_norm)
                self.optimizer.step()
                self.optimizer.zero_grad()
                total = total + loss.detach().float()
                parts.update(pass_parts)
            if accelerator.sync_gradients:
                self.scheduler.step()
        keys = sorted(parts)
        values = torch.stack([total, *(parts[k].detach().float() for k in keys)])
        values = accelerator.reduce(values, reduction="mean").tolist()
        self.window.add(dict(zip(["loss", *keys], values)))
        return accelerator.sync_gradients

    def log_losses(self) -> dict | None:
        """At a logging step (and the last): the window's mean losses and the learning rate, logged; else None."""
        if self.step % self.args.logging_steps != 0 and self.step != self.max_steps:
            return None
        logs = {**self.window.flush(), "learning_rate": self.scheduler.get_last_lr()[0]}
        self.history.append({"step": self.step, **logs})
        self.accelerator.log(logs, step=self.step)
        self.progress.set_postfix(loss=f"{logs['loss']:.4g}")
        if self.is_main:
            self.progress.write(_format_logs(self.step, logs))
        return logs

    def save_checkpoint(self) -> None:
        """`checkpoint-<step>`, then rotation and (in the background) the Hub upload."""
        folder = self.output_dir / f"checkpoint-{self.step}"
        self.save(folder, with_training_state=True)
        self.checkpoints.append(folder)
        if self.is_main:
            _rotate_checkpoints(self.output_dir, self.args.save_total_limit)
            if self.uploader is not None:
                self.hub_failures += self.uploader.collect_finished()
                self.uploader.upload_in_background(folder, self.step)

    def finish(self) -> TrainResult:
        """The final evaluation, the final model in `output_dir`, the trackers closed and the last upload."""
        self.eval_results = _evaluate(
            self.task, self.accelerator, self.model, self.args, self.step, self.history, None, final=True
        )
        self.save(self.output_dir, with_training_state=False)
        self.accelerator.end_training()
        if self.uploader is not None:
            self.hub_failures += self.uploader.collect_finished(wait=True)
            commit = self.uploader.upload(self.output_dir, commit_message=f"End of training (step {self.step})")
            logger.info(f"pushed the final model to {commit}", main_process_only=True)
        return TrainResult(
            self.step, self.output_dir, self.history, self.eval_results, self.checkpoints, self.hub_failures
        )


def _evaluate(task, accelerator, model, args, step, history, progress, final: bool) -> dict[str, float]:
    model.eval()
    with torch.no_grad():
        results = task.evaluate(accelerator, model, args, final=final)
    model.train()
    if results:
        record = {f"eval_{k}": v for k, v in results.items()}
        history.append({"step": step, **record})
        accelerator.log(record, step=step)
        if accelerator.is_main_process:
            if progress is not None:
                progress.write(_format_logs(step, record))
            else:
                logger.info(_format_logs(step, record))
    return results


def _rotate_checkpoints(output_dir: Path, limit: int):
    if limit <= 0:
        return
    for old in _checkpoints(output_dir)[:-limit]:
        shutil.rmtree(old, ignore_errors=True)


def _process_file(
    accelerator: Accelerator,
    folder: Path,
    name: str,
    what: str,
    without_it: str,
    fallback: str,
    saved_processes: int | None,
) -> Path | None:
    """This process's own file of a checkpoint (`name` formatted with the process index). Missing: an error when the
    checkpoint was saved by as many processes (`without_it` says why it matters); else a warning (`fallback` says
    what happens instead) and None."""
    path = folder / TRAINING_STATE_DIR / name.format(accelerator.process_index)
    if path.is_file():
        return path
    if saved_processes in (None, accelerator.num_processes):
        raise DamagedCheckpointError(
            f"checkpoint {folder} has no {what} for process {accelerator.process_index} ({path.name}): {without_it}"
        )
    logger.warning(
        f"process {accelerator.process_index} has no {what} in {folder} (it was saved by "
        f"{saved_processes} processes): {fallback}"
    )
    return None


def _load_training_state(accelerator: Accelerator, folder: Path, saved_processes: int | None) -> None:
    """accelerate.load_state, then this process's RNG state restored here: accelerate only logs (at INFO) an RNG
    file it cannot read, and resuming would silently differ from the interrupted run. Load errors name the
    checkpoint, and for the RNG state the file and the piece."""
    rng_path = _process_file(
        accelerator, folder, _RNG_STATE, "RNG state", _WITHOUT_RNG, "it starts from the seed", saved_processes
    )
    try:
        accelerator.load_state(str(folder / TRAINING_STATE_DIR))
    except Exception as err:
        raise DamagedCheckpointError(
            f"could not load the training state of checkpoint {folder}: {type(err).__name__}: {err}"
        ) from err
    if rng_path is not None:
        _restore_rng_state(accelerator, folder, rng_path)


_WITHOUT_RNG = "resuming without it would not reproduce the interrupted run's masking, sampling and dropout"

# The generators accelerate.save_state records: (key in its RNG file, what it is, how to restore it).
_RNG_PIECES = (
    ("random_state", "Python's random generator", random.setstate),
    ("numpy_random_seed", "numpy's global generator", np.random.set_state),
    ("torch_manual_seed", "torch's CPU generator", torch.set_rng_state),
)


def _restore_rng_state(accelerator: Accelerator, folder: Path, path: Path) -> None:
    """Restore every generator recorded in `path` (loaded as accelerate loads it: `weights_only`), or raise
    `DamagedCheckpointError` naming the file and the piece that cannot be restored."""
    from accelerate.utils import load

    where = f"checkpoint {folder}: the RNG state {path.relative_to(folder)}"
    try:
        states = load(path)
    except Exception as err:  # truncated, not a torch.save file, a pickle weights_only refuses: all damaged
        raise DamagedCheckpointError(
            f"{where} cannot be read ({type(err).__name__}: {_first_line(err)}); {_WITHOUT_RNG}"
        ) from err
    if not isinstance(states, dict):
        raise DamagedCheckpointError(
            f"{where} holds a {type(states).__name__}, not accelerate's dictionary of generator states; {_WITHOUT_RNG}"
        )
    pieces = list(_RNG_PIECES)
    if torch.cuda.is_available():
        if "torch_cuda_manual_seed" in states:
            pieces.append(("torch_cuda_manual_seed", "the CUDA generators", torch.cuda.set_rng_state_all))
        else:  # saved without CUDA: the run changed devices, which no generator state can make exact
            logger.warning(
                f"{where} has no CUDA generator state (saved without CUDA): the CUDA generators start from the seed"
            )
    for key, what, restore in pieces:
        if key not in states:
            raise DamagedCheckpointError(f"{where} has no {key} ({what}); {_WITHOUT_RNG}")
        try:
            restore(states[key])
        except Exception as err:
            raise DamagedCheckpointError(
                f"{where}: {key} ({what}) cannot be restored ({type(err).__name__}: {_first_line(err)}); {_WITHOUT_RNG}"
            ) from err
    if "step" in states:
        accelerator.step = states["step"]


def _first_line(err: BaseException) -> str:
    return next((line.strip() for line in str(err).splitlines() if line.strip()), "")


def _load_stream_state(loader, accelerator: Accelerator, folder: Path, saved_processes: int | None) -> None:
    """Put a `--streaming` loader where the checkpoint's run left this process's stream."""
    path = _process_file(
        accelerator,
        folder,
        _STREAM_STATE,
        "stream state",
        "was it saved without --streaming? Resume it without --streaming, or start a fresh run",
        "its stream starts from the beginning",
        saved_processes,
    )
    if path is None:
        return
    try:
        loader.load_state_dict(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as err:
        raise DamagedCheckpointError(
            f"checkpoint {folder}: the stream state {path.name} cannot be restored ({type(err).__name__}: {err})"
        ) from err


def _warn_if_layout_changed(state: dict, args: VlhubTrainingArguments, num_processes: int):
    saved = state.get("args", {})
    changed = [
        f"{name}: {saved.get(name)} -> {getattr(args, name)}"
        for name in (
            "seed",
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "max_steps",
            "num_train_epochs",
        )
        if name in saved and saved[name] != getattr(args, name)
    ]
    if state.get("num_processes", num_processes) != num_processes:
        changed.append(f"num_processes: {state['num_processes']} -> {num_processes}")
    if changed:
        logger.warning(
            "resuming with different settings (%s): training continues, but the data order and schedule "
            "no longer match the interrupted run",
            "; ".join(changed),
        )


def _card_hyperparameters(args: VlhubTrainingArguments, task: TrainingTask, num_processes: int, max_steps: int) -> dict:
    total_batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * num_processes
    return {
        "optimizer steps": max_steps,
        "examples per step": total_batch,
        "processes": num_processes,
        "per-device batch (examples)": args.per_device_train_batch_size,
        "gradient accumulation": args.gradient_accumulation_steps,
        "learning rate": args.learning_rate,
        "schedule": f"{args.lr_scheduler_type}, {args.warmup_steps} warm-up steps",
        "weight decay": args.weight_decay,
        "AdamW betas / eps": f"({args.adam_beta1}, {args.adam_beta2}) / {args.adam_epsilon}",
        "gradient clipping": args.max_grad_norm,
        "mixed precision": args.mixed_precision,
        "seed": args.seed,
        **task.hyperparameters(),
    }


def _flat_config(args: VlhubTrainingArguments, task: TrainingTask) -> dict:
    config = {}
    for key, value in {**args.to_dict(), **task.hyperparameters()}.items():
        config[key] = value if isinstance(value, (int, float, str, bool)) or value is None else json.dumps(value)
    return config
