"""Deterministic batch order: which examples, which objective and which random seed each training batch gets.

A batch is a list of `SampleKey`s, each a pure function of `(seed, epoch, position)`; datasets read the example from
the key and collators seed their random corruption from it. Nothing depends on the global random state, on data
loader prefetching or on worker processes, so resuming at a step (accelerate's `skip_first_batches`) reproduces the
batches of an uninterrupted run exactly.

Batches are laid out for accelerate's `BatchSamplerShard`: with `P` processes and `G` gradient-accumulation steps,
global batches `[s*P*G, (s+1)*P*G)` make optimizer step `s`, and they all share one objective.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np
from torch.utils.data import BatchSampler

__all__ = ["SampleKey", "ObjectiveBatchSampler", "FixedObjective", "example_rng"]

_OBJECTIVE_STREAM = 1
_EXAMPLE_STREAM = 2


class SampleKey(NamedTuple):
    """What a dataset needs to produce one example: its index, the batch's objective and its random seed."""

    index: int
    objective: str
    seed: tuple[int, ...]


def example_rng(key: SampleKey) -> np.random.Generator:
    return np.random.default_rng(key.seed)


class ObjectiveChooser(Protocol):
    """Picks the objective of a group of batches (an `ObjectiveMix`, or a `FixedObjective`)."""

    def choose(self, rng: np.random.Generator) -> str: ...


class FixedObjective:
    """The "mix" of a task with one objective (fine-tuning, or evaluating one pre-training objective)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def choose(self, rng: np.random.Generator) -> str:
        return self.name


class ObjectiveBatchSampler(BatchSampler):
    """Batches of `SampleKey`s.

    Args:
        num_examples: size of the dataset.
        batch_size: examples per batch (per process).
        mix: the objectives and their ratios, or a `FixedObjective` (fine-tuning, evaluation).
        seed: the run's seed.
        group_size: batches that share one objective (`num_processes * gradient_accumulation_steps`); with
            `drop_last` an epoch is cut to whole groups so every optimizer step sees full batches.
        shuffle: a new permutation per epoch (training) or the dataset order (evaluation).
        drop_last: drop the incomplete tail (training); evaluation keeps it.
    """

    def __init__(
        self,
        num_examples: int,
        batch_size: int,
        mix: ObjectiveChooser,
        seed: int,
        group_size: int = 1,
        shuffle: bool = True,
        drop_last: bool = True,
    ) -> None:
        if batch_size < 1 or group_size < 1:
            raise ValueError(f"batch_size and group_size must be positive, got {batch_size} and {group_size}")
        if drop_last and num_examples < batch_size * group_size:
            raise ValueError(
                f"the dataset has {num_examples} examples, fewer than one optimizer step needs "
                f"({batch_size} per batch x {group_size} batches (processes x gradient accumulation)); "
                "lower --per_device_batch_size or --gradient_accumulation_steps"
            )
        self.num_examples = num_examples
        self.batch_size = batch_size
        self.mix = mix
        self.seed = int(seed)
        self.group_size = group_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        if self.drop_last:
            return (self.num_examples // self.batch_size) // self.group_size * self.group_size
        return -(-self.num_examples // self.batch_size)

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps in one epoch (training layout)."""
        return len(self) // self.group_size

    def __iter__(self):
        if self.shuffle:
            order = np.random.default_rng((self.seed, self.epoch)).permutation(self.num_examples)
        else:
            order = np.arange(self.num_examples)
        for batch in range(len(self)):
            group = batch // self.group_size
            objective = self.mix.choose(np.random.default_rng((self.seed, self.epoch, group, _OBJECTIVE_STREAM)))
            indices = order[batch * self.batch_size : (batch + 1) * self.batch_size]
            yield [SampleKey(int(i), objective, (self.seed, self.epoch, int(i), _EXAMPLE_STREAM)) for i in indices]
