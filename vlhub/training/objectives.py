"""Pre-training objectives: what each one does to a batch, a registry per architecture, and the sampling mix.

An `Objective` turns a list of (caption, regions) examples into the model's inputs and targets for one objective.
Architectures register theirs with `register_objective(model_type, objective)`; the training loop only knows names,
ratios and the model's `*_loss` outputs, so VL-BERT, ViLBERT, VLP and TDEN plug in their own without touching it.

UNITER's objectives follow the original data code (`data/mlm.py`, `data/mrm.py`, `data/itm.py`): conditional masking
(one objective per batch, one modality corrupted), BERT 80/10/10 word masking, 15% region masking with at least one
region, and ITM negatives that swap the *image* for a random other image with probability 0.5. `wra` is ITM with the
word-region alignment (optimal transport) loss added, as the released models were trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import torch

from .masking import mask_regions, mask_tokens

if TYPE_CHECKING:
    from .collators import PretrainingCollator

__all__ = [
    "Objective",
    "ObjectiveMix",
    "register_objective",
    "objectives_for",
    "DEFAULT_MIXES",
]

BuildFn = Callable[["PretrainingCollator", Sequence[dict], Sequence[np.random.Generator]], dict]


@dataclass(frozen=True)
class Objective:
    """One pre-training objective.

    Attributes:
        name: the name users pass (`--objectives mlm:2 ...`).
        model_objective: the value given to the model's `objective=` argument.
        build: `(collator, examples, rngs) -> model inputs with targets`; `rngs` holds one generator per example.
        region_fields: `RegionFeatures` fields the objective needs beyond features and boxes (e.g. `class_probs`).
    """

    name: str
    model_objective: str
    build: BuildFn
    region_fields: tuple[str, ...] = ()


_REGISTRY: dict[str, dict[str, Objective]] = {}

# The original's default mixes, by architecture (UNITER: the in-domain [itm+WRA, mlm, mrfr, mrc-kl] = [2, 2, 1, 1],
# `config/pretrain-indomain-base-8gpu.json`; the released all-data mixes have the same proportions up to 6:8:4:4).
DEFAULT_MIXES: dict[str, dict[str, float]] = {"uniter": {"wra": 2, "mlm": 2, "mrfr": 1, "mrc-kl": 1}}


def register_objective(model_type: str, objective: Objective) -> None:
    _REGISTRY.setdefault(model_type, {})[objective.name] = objective


def objectives_for(model_type: str) -> dict[str, Objective]:
    if model_type not in _REGISTRY:
        raise ValueError(f"no pre-training objectives are registered for model type {model_type!r}; "
                         f"known: {sorted(_REGISTRY)}")
    return dict(_REGISTRY[model_type])


class ObjectiveMix:
    """Objectives with sampling ratios; one objective is drawn per optimizer step (the original draws one per
    gradient-accumulation group and broadcasts it so every process runs the same objective).

    `ObjectiveMix.parse(["mlm:2", "itm:1"], available)` or `ObjectiveMix({"mlm": 2, "itm": 1}, available)`.
    """

    def __init__(self, ratios: dict[str, float], available: dict[str, Objective]):
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
    def parse(cls, specs: Sequence[str], available: dict[str, Objective]) -> "ObjectiveMix":
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


# ---------------------------------------------------------------------------------------------------- UNITER
def _build_mlm(collator: "PretrainingCollator", examples, rngs) -> dict:
    inputs, _ = collator.encode(examples)
    tokenizer = collator.processor.tokenizer
    inputs["input_ids"], inputs["labels"] = mask_tokens(
        inputs["input_ids"], inputs["attention_mask"], tokenizer.all_special_ids, tokenizer.mask_token_id,
        collator.random_ids, rngs, collator.mlm_probability,
    )
    return inputs


def _masked_region_inputs(collator: "PretrainingCollator", examples, rngs):
    inputs, regions = collator.encode(examples)
    masks = mask_regions(inputs["region_attention_mask"], rngs, collator.region_mask_probability)
    inputs["region_masks"] = masks
    return inputs, regions, masks


def _build_mrfr(collator, examples, rngs) -> dict:
    inputs, _, masks = _masked_region_inputs(collator, examples, rngs)
    # Targets are the features the model saw before masking (row-major over (example, region)).
    inputs["region_feature_targets"] = inputs["region_features"][masks]
    return inputs


def _build_mrc(collator, examples, rngs) -> dict:
    inputs, regions, masks = _masked_region_inputs(collator, examples, rngs)
    inputs["region_class_targets"] = torch.cat(
        [r.class_probs[masks[i, : len(r)]] for i, r in enumerate(regions)], dim=0
    )
    return inputs


def _build_itm(collator, examples, rngs) -> dict:
    """With probability `itm_negative_probability` the image is replaced by a random other image (label 0)."""
    pairs, labels = [], []
    for example, rng in zip(examples, rngs):
        if rng.random() < collator.itm_negative_probability:
            pairs.append({**example, "image_id": collator.random_other_image(example["image_id"], rng)})
            labels.append(0)
        else:
            pairs.append(example)
            labels.append(1)
    inputs, _ = collator.encode(pairs)
    inputs["itm_labels"] = torch.tensor(labels, dtype=torch.long)
    return inputs


for _objective in (
    Objective("mlm", "mlm", _build_mlm),
    Objective("mrfr", "mrfr", _build_mrfr),
    Objective("mrc", "mrc", _build_mrc, region_fields=("class_probs",)),
    Objective("mrc-kl", "mrc-kl", _build_mrc, region_fields=("class_probs",)),
    Objective("itm", "itm", _build_itm),
    Objective("wra", "itm-wra", _build_itm),
):
    register_objective("uniter", _objective)
