"""Pre-training objectives: what an objective is, what it may use, and the sampling mix.

An `Objective` turns a list of (caption, regions) examples into the model's inputs and targets for one objective.
Each architecture declares its own objectives next to its model (UNITER's: `vlhub/modeling/uniter/objectives_uniter.py`)
and names them in its `Architecture`; the training loop only knows names, ratios and the model's `*_loss` outputs.

Builders get an `ObjectiveContext` — the tokenizer, the masking settings, a way to encode examples into processor
inputs and to draw another image — never the collator itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from .masking import mask_tokens

__all__ = [
    "Objective",
    "ObjectiveContext",
    "ObjectiveMix",
    "register_objective",
    "objectives_for",
    "default_objective_mix",
    "mismatched_pair",
]


@dataclass(frozen=True)
class ObjectiveContext:
    """What an objective's builder may use.

    Attributes:
        tokenizer: the processor's tokenizer (special ids, [MASK]).
        random_token_ids: `(n,)` ids an MLM "random token" may take.
        mlm_probability, region_mask_probability, itm_negative_probability: the masking / negative settings.
        encode: `examples -> (processor inputs, each example's selected regions)`, the regions in the order the
            processor keeps them (so per-region targets line up with `region_features`).
        other_image: `(image_id, rng) -> a different image id` (for mismatched pairs).
        other_caption: `(image_id, rng) -> a caption of another image`, drawn from the whole caption table (for
            mismatched pairs made by replacing the caption); None where the collator was given no caption table.
        contradict: `(image_id, caption, rng) -> a caption that is false of the image, or None` (e.g. the shapes
            world's one-word contradictions), or None when the data cannot make such captions.
        itm_hard_negative_probability: the share of mismatched pairs that keep the image and take `contradict`'s
            caption (hard negatives); the others, and those `contradict` cannot make, swap the image.
    """

    tokenizer: object
    random_token_ids: torch.Tensor
    mlm_probability: float
    region_mask_probability: float
    itm_negative_probability: float
    encode: Callable[[Sequence[dict]], tuple[dict, list]]
    other_image: Callable[[str, np.random.Generator], str]
    other_caption: Callable[[str, np.random.Generator], str] | None = None
    contradict: Callable[[str, str, np.random.Generator], str | None] | None = None
    itm_hard_negative_probability: float = 0.0

    def mask_words(self, inputs: dict, rngs: Sequence[np.random.Generator]) -> None:
        """BERT's 80/10/10 masking of `inputs["input_ids"]` (every special token of the tokenizer kept, at least one
        word piece per example, random replacements from `random_token_ids`), in place, with the `labels` it sets."""
        inputs["input_ids"], inputs["labels"] = mask_tokens(
            inputs["input_ids"],
            inputs["attention_mask"],
            self.tokenizer.all_special_ids,
            self.tokenizer.mask_token_id,
            self.random_token_ids,
            rngs,
            self.mlm_probability,
        )


def mismatched_pair(context: ObjectiveContext, example: dict, rng: np.random.Generator) -> dict:
    """A mismatched version of `example` for image-text matching: with probability
    `context.itm_hard_negative_probability` (and when the data can) its caption replaced by a contradicting one of the
    same image (a hard negative: one word differs), otherwise its image replaced by a random other image."""
    if context.contradict is not None and rng.random() < context.itm_hard_negative_probability:
        caption = context.contradict(example["image_id"], example["caption"], rng)
        if caption is not None:
            return {**example, "caption": caption}
    return {**example, "image_id": context.other_image(example["image_id"], rng)}


BuildFn = Callable[[ObjectiveContext, Sequence[dict], Sequence[np.random.Generator]], dict]


@dataclass(frozen=True)
class Objective:
    """One pre-training objective.

    Attributes:
        name: the name users pass (`--objectives mlm:2 ...`).
        model_objective: the value given to the model's `objective=` argument (None: the model takes none).
        build: `(context, examples, rngs) -> model inputs with targets`; `rngs` holds one generator per example.
        region_fields: `RegionFeatures` fields the objective needs beyond features and boxes (e.g. `class_probs`).
        needs_other_images: the objective pairs captions with other images (at least two images are needed).
        second_pass: `(batch, first-pass outputs, replace) -> second-pass batch` for two-pass scheduled sampling
            (`PretrainingTask(scheduled_sampling=True)`, TDEN's Two-Pass-A): after the first pass's optimizer step the
            model trains again on the batch this returns, built from the first pass's (detached) predictions.
            `replace` is None (every target position) or a `(batch, text_length)` bool tensor of the positions that
            may take a prediction. None: the objective has no second pass.
    """

    name: str
    model_objective: str | None
    build: BuildFn
    region_fields: tuple[str, ...] = ()
    needs_other_images: bool = False
    second_pass: Callable[[dict, object, torch.Tensor | None], dict] | None = None


# Objectives registered at run time, on top of those an architecture declares (e.g. an experiment's own objective).
_EXTRA: dict[str, dict[str, Objective]] = {}


def register_objective(model_type: str, objective: Objective) -> None:
    """Add an objective to an architecture's own (for experiments; architectures declare theirs in their package)."""
    _EXTRA.setdefault(model_type, {})[objective.name] = objective


def objectives_for(model_type: str) -> dict[str, Objective]:
    """name → `Objective` of an architecture (its declared objectives plus any registered at run time)."""
    from ..registry import get_architecture

    found = {**get_architecture(model_type).pretraining_objectives(), **_EXTRA.get(model_type, {})}
    if not found:
        raise ValueError(f"no pre-training objectives are declared for model type {model_type!r}")
    return found


def default_objective_mix(model_type: str) -> dict[str, float]:
    from ..registry import get_architecture

    mix = dict(get_architecture(model_type).default_objectives)
    if not mix:
        raise ValueError(f"model type {model_type!r} declares no default objective mix; pass --objectives")
    return mix


class ObjectiveMix:
    """Objectives with sampling ratios; one objective is drawn per optimizer step (the original draws one per
    gradient-accumulation group and broadcasts it so every process runs the same objective).

    `ObjectiveMix.parse(["mlm:2", "itm:1"], available)` or `ObjectiveMix({"mlm": 2, "itm": 1}, available)`.
    """

    def __init__(self, ratios: Mapping[str, float], available: Mapping[str, Objective]) -> None:
        if not ratios:
            raise ValueError("at least one objective is needed")
        unknown = sorted(set(ratios) - set(available))
        if unknown:
            raise ValueError(f"unknown objective(s) {unknown}; available: {sorted(available)}")
        for name, ratio in ratios.items():
            if not (ratio > 0 and np.isfinite(ratio)):
                raise ValueError(f"the ratio of objective {name!r} must be a positive number, got {ratio}")
        self.names = list(ratios)
        self.ratios = [float(ratios[n]) for n in self.names]
        self.objectives = {n: available[n] for n in self.names}
        total = sum(self.ratios)
        self._probabilities = np.array(self.ratios) / total

    @classmethod
    def parse(cls, specs: Sequence[str], available: Mapping[str, Objective]) -> "ObjectiveMix":
        """`["mlm:2", "mrfr:1", "itm"]` (a missing ratio means 1; a comma-separated string is accepted too)."""
        if isinstance(specs, str):
            specs = [specs]
        ratios: dict[str, float] = {}
        for spec in (s for item in specs for s in item.split(",") if s.strip()):
            name, _, ratio = spec.strip().partition(":")
            try:
                value = float(ratio) if ratio else 1.0
            except ValueError:
                raise ValueError(f"objective {spec!r} must be written name or name:ratio (e.g. mlm:2)") from None
            if name in ratios:
                raise ValueError(f"objective {name!r} is given twice")
            ratios[name] = value
        return cls(ratios, available)

    def choose(self, rng: np.random.Generator) -> str:
        if len(self.names) == 1:
            return self.names[0]
        return self.names[int(rng.choice(len(self.names), p=self._probabilities))]

    def as_dict(self) -> dict[str, float]:
        return dict(zip(self.names, self.ratios))

    def __repr__(self) -> str:
        return "ObjectiveMix(" + ", ".join(f"{n}:{r:g}" for n, r in zip(self.names, self.ratios)) + ")"
