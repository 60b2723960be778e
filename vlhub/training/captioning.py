"""Captioning fine-tuning as a `TrainingTask`: a captioner (an architecture's "captioning" head) trained with its
architecture's caption objective, evaluated by generating captions for held-out images and scoring them with the
COCO caption metrics next to a baseline that always says the most frequent training caption."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np
import torch
from accelerate.utils import extract_model_from_parallel
from torch.utils.data import Dataset

from ..evaluation.captions import CAPTION_METRICS
from ..processing.regions import RegionFeatures
from ..registry import get_architecture
from ..utils.arguments import check_positive_int
from ..utils.deprecation import replaced_name
from .collators import CaptionDataset, PretrainingCollator
from .finetuning import FinetuningTask, _architecture_name
from .model_card import CardInfo
from .objectives import Objective
from .sampling import FixedObjective, ObjectiveBatchSampler, SampleKey

if TYPE_CHECKING:
    from accelerate import Accelerator
    from transformers import PreTrainedModel

    from ..processing.processor_base import VisionLanguageProcessor
    from .arguments import VlhubTrainingArguments

__all__ = [
    "CaptioningTask",
    "SelfCriticalCaptioningTask",
    "most_frequent_caption",
    "references_by_image",
    "caption_token_mask",
    "self_critical_loss",
    "check_can_caption",
]


def references_by_image(pairs: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    """image id → its reference captions, images in first-seen order."""
    references: dict[str, list[str]] = {}
    for image_id, caption in pairs:
        references.setdefault(image_id, []).append(caption)
    return references


def most_frequent_caption(pairs: Sequence[tuple[str, str]]) -> str:
    """The training caption seen most often (ties: the first seen) — the baseline a captioner must beat."""
    if not len(pairs):
        raise ValueError("no training captions: the most-frequent-caption baseline needs at least one")
    return Counter(caption for _, caption in pairs).most_common(1)[0][0]


class _Positional:
    """`CaptioningTask`'s objective when not given by keyword: then it is the 8th positional argument."""


def _positional_objective(args: tuple) -> tuple[Objective | None, tuple]:
    """The objective given as `CaptioningTask`'s 8th positional argument (after `dataset_description`, its place
    before the fine-tuning tasks shared their arguments) and the other arguments."""
    if len(args) < 8:
        raise TypeError("CaptioningTask needs its caption training objective: objective=... (None for a subclass)")
    return args[7], args[:7] + args[8:]


class CaptioningTask(FinetuningTask):
    """Fine-tune a captioner on (image, caption) pairs.

    Args: `FinetuningTask`'s, the splits as `(image_id, caption)` pairs (test is scored after the last step only),
    plus:
        objective: the architecture's caption training objective (e.g. Unified VLP's masked seq2seq `s2s`); None
            when a subclass sets its own `train_dataset` and `collate_fn` (`SelfCriticalCaptioningTask`). Given
            positionally (after `dataset_description`, as it once was) it still works, with a FutureWarning.
        max_new_tokens: longest generated caption (capped by the model's positions).
        metrics: the COCO caption metrics to report (`CAPTION_METRICS`; METEOR's Java start takes ~20 s).
    The model is the architecture's captioning head (with `generate()`); the processor's call with regions only
    gives the captioning prompt and its `batch_decode` gives captions.
    """

    def __init__(
        self,
        *args: Any,
        objective: Objective | None | type[_Positional] = _Positional,
        max_new_tokens: int = 20,
        metrics: Sequence[str] = CAPTION_METRICS,
        **kwargs: Any,
    ) -> None:
        if objective is _Positional:
            objective, args = _positional_objective(args)
            replaced_name("CaptioningTask's objective as its 8th positional argument", "objective=...")
        unknown = sorted(set(metrics) - set(CAPTION_METRICS))
        if unknown or not metrics:
            raise ValueError(
                f"caption metrics must be a non-empty subset of {list(CAPTION_METRICS)}, got {list(metrics)}"
            )
        super().__init__(*args, **kwargs)
        self.objective = objective
        if objective is not None:  # None: a subclass trains differently (self-critical training)
            self.train_dataset = CaptionDataset(self.train)
            self.collate_fn = PretrainingCollator(self.processor, self.regions, {objective.name: objective})
        self.baseline_caption = most_frequent_caption(self.train)
        self.max_new_tokens = max_new_tokens
        self.metrics = list(metrics)

    def train_sampler(self, batch_size: int, group_size: int, seed: int) -> ObjectiveBatchSampler:
        return ObjectiveBatchSampler(
            len(self.train_dataset), batch_size, FixedObjective(self.objective.name), seed, group_size=group_size
        )

    def generate_captions(self, model: torch.nn.Module, image_ids: Sequence[str], batch_size: int) -> list[str]:
        """Greedy captions of `image_ids`, in order (every process computes all of them: evaluation sets are small)."""
        model = _unwrapped(model)
        device = next(model.parameters()).device
        prompt = self.processor(regions=[self.regions[image_ids[0]]], return_tensors="pt")["input_ids"]
        new_tokens = max(1, min(self.max_new_tokens, model.config.max_position_embeddings - prompt.shape[1]))
        captions: list[str] = []
        was_training = model.training
        model.eval()
        with torch.no_grad():
            for start in range(0, len(image_ids), batch_size):
                regions = [self.regions[i] for i in image_ids[start : start + batch_size]]
                inputs = {k: v.to(device) for k, v in self.processor(regions=regions, return_tensors="pt").items()}
                generated = model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False, num_beams=1)
                captions += self.processor.batch_decode(generated)
        model.train(was_training)
        return captions

    def evaluate(
        self, accelerator: Accelerator, model: torch.nn.Module, args: VlhubTrainingArguments, final: bool = False
    ) -> dict[str, float]:
        """COCO caption metrics of greedy captions on the validation split (and the test split after the last step),
        each next to `baseline_<metric>`: the same metric when every image gets the most frequent training caption."""
        from ..evaluation.captions import caption_scores

        results: dict[str, float] = {}
        for split, pairs in self.evaluation_splits(final):
            references = references_by_image(pairs)
            image_ids = list(references)
            if args.max_eval_samples:
                image_ids = image_ids[: args.max_eval_samples]
            refs = [references[i] for i in image_ids]
            captions = self.generate_captions(model, image_ids, args.per_device_eval_batch_size)
            scores = caption_scores(captions, refs, metrics=self.metrics)
            baseline = caption_scores([self.baseline_caption] * len(image_ids), refs, metrics=self.metrics)
            for metric in self.metrics:
                results[f"{split}_{metric}"] = scores[metric]
                results[f"{split}_baseline_{metric}"] = baseline[metric]
            results[f"{split}_num_images"] = float(len(image_ids))
        return results

    def hyperparameters(self) -> dict:
        return {
            "caption objective": self.objective.name,
            "evaluation decoding": f"greedy, at most {self.max_new_tokens} tokens",
        }

    def training_summary(self, name: str) -> str:
        """How the captioner was trained, for the model card."""
        return f"Trained with {name}'s caption objective `{self.objective.name}`"

    def card_info(self) -> CardInfo:
        name = _architecture_name(self.model)
        summary = (
            f"Describes an image's regions in a sentence. {self.training_summary(name)}; captions come from "
            "`generate()` (greedy here; beam search available)."
        )
        usage = (
            "import vlhub\nfrom transformers import pipeline\n\n"
            'captioner = pipeline("image-captioning", model="<this folder>")\n'
            "captioner(regions)  # vlhub.RegionFeatures, or an image when the folder has a region extractor"
        )
        note = (
            f"The captions are scored with the COCO caption metrics (PTB tokenisation, CIDEr-D with the split's "
            f"document frequencies). The baseline gives every image the most frequent training caption, "
            f"{self.baseline_caption!r}, and is scored the same way (`baseline_*`)."
        )
        return self.task_card(
            f"{name} fine-tuned for captioning on {self.dataset_name}",
            summary,
            usage,
            "image-to-text",
            pipeline_tag="image-to-text",
            baseline_note=note,
            tags=["image-captioning"],
        )


# ---------------------------------------------------------------------------------------------------- SCST
def caption_token_mask(caption_ids: torch.Tensor, stop_ids: Sequence[int]) -> torch.Tensor:
    """`(batch, T)` bool: the tokens of each generated caption up to and including its first stop token ([SEP] /
    end of sequence, or padding), i.e. the words whose log-probabilities self-critical training weighs."""
    stops = torch.isin(caption_ids, torch.tensor(sorted(set(stop_ids)), device=caption_ids.device))
    return (stops.long().cumsum(1) - stops.long()) == 0


def self_critical_loss(log_probs: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """`-sum(log p(w_t) * (r - b)) / #tokens` over the masked tokens of the batch (the original's `RewardCriterion`).

    log_probs, mask `(batch, T)`; advantages `(batch,)`: the sampled caption's reward minus its baseline."""
    weights = mask.to(log_probs.dtype)
    return -(log_probs * weights * advantages.to(log_probs)[:, None]).sum() / weights.sum().clamp(min=1.0)


class TrainingImages(Dataset):
    """The distinct images of a caption split, read by `SampleKey` (self-critical training samples per image)."""

    def __init__(self, image_ids: Sequence[str]) -> None:
        self.image_ids = list(image_ids)

    def __len__(self) -> int:
        return len(self.image_ids)

    def __getitem__(self, key: SampleKey) -> dict:
        return {"index": key.index, "seed": key.seed}


class PromptCollator:
    """Images → the processor's captioning prompt (regions only), `image_index` `(batch,)` into the task's training
    images and `sample_seed`: one seed drawn from the examples' `SampleKey` seeds, so the captions sampled for a batch
    are a pure function of (seed, epoch, position), like every other random choice of the loop."""

    def __init__(
        self, processor: VisionLanguageProcessor, regions: Mapping[str, RegionFeatures], image_ids: Sequence[str]
    ) -> None:
        self.processor = processor
        self.regions = regions
        self.image_ids = image_ids

    def __call__(self, examples: Sequence[dict]) -> dict:
        regions = []
        for example in examples:
            image_id = self.image_ids[example["index"]]
            try:
                regions.append(self.regions[image_id])
            except KeyError:
                raise KeyError(f"no region features for image {image_id!r} in the region store") from None
        batch = dict(self.processor(regions=regions, return_tensors="pt"))
        entropy = [int(v) for example in examples for v in example["seed"]]
        seed = int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0]) & ((1 << 63) - 1)
        batch["image_index"] = torch.tensor([example["index"] for example in examples])
        batch["sample_seed"] = torch.tensor(seed)
        return batch


def _unwrapped(model):
    return extract_model_from_parallel(model)  # generate() and the hooks live on the model, not on a DDP wrapper


class SelfCriticalCaptioningTask(CaptioningTask):
    """Self-critical sequence training (Rennie et al., 2017) of a captioner, as Unified VLP's `--scst` fine-tuning.

    Each step, for every training image of the batch: a greedy caption (eval mode, the baseline) and
    `num_samples` captions sampled from the full softmax (train mode: dropout on, as the original); reward = CIDEr-D of
    a sample minus CIDEr-D of the greedy caption, both against the image's training references with the document
    frequencies of all training references (`vlhub.evaluation.captions.CiderD`); loss = `self_critical_loss` over the
    sampled words up to and including the end token. Logged: `reward` (mean CIDEr-D of the samples),
    `baseline_reward` (of the greedy captions) and `scst_loss`.

    Architecture-agnostic: the model is its architecture's "captioning" head, which implements
    `vlhub.registry.CaptionScorer`: `generate()` (greedy and `do_sample=True`) and the captioning hook
    `caption_scoring_inputs(prompt, caption_ids, caption_mask) -> forward kwargs` whose `logits` `(B, T, vocab)`
    score `caption_ids` word by word as decoding would (the architecture's segment ids and attention masks). The
    log-probabilities come from that one teacher-forced forward (through the DDP wrapper, so gradients synchronise).

    Sampling draws from a generator seeded by the batch's `SampleKey` seeds (`PromptCollator`), never from the global
    random state, so a resumed run samples the same captions; dropout of the scored forward comes from the global
    state, which checkpoints save and restore.

    Args: as `CaptioningTask` without the objective, plus `num_samples` (sampled captions per image; the original:
    1). Evaluation is `CaptioningTask`'s (greedy captions, COCO caption metrics next to the baseline).
    """

    def __init__(self, *args: Any, num_samples: int = 1, **options: Any) -> None:
        # `CaptioningTask`'s arguments without its objective: this task trains by sampling and scoring captions.
        check_positive_int(num_samples, "num_samples")
        super().__init__(*args, objective=None, **options)
        check_can_caption(self.model, self.max_new_tokens)
        from ..evaluation.captions import CiderD

        references = references_by_image(self.train)
        self.train_image_ids = list(references)
        self.reward = CiderD(references)
        self.train_dataset = TrainingImages(self.train_image_ids)
        self.collate_fn = PromptCollator(self.processor, self.regions, self.train_image_ids)
        self.num_samples = num_samples

    def train_sampler(self, batch_size: int, group_size: int, seed: int) -> ObjectiveBatchSampler:
        return ObjectiveBatchSampler(
            len(self.train_dataset), batch_size, FixedObjective("scst"), seed, group_size=group_size
        )

    def _generation_config(self, captioner, sample: bool):
        from transformers import GenerationConfig

        config = captioner.config
        # Plain greedy / ancestral sampling over the whole vocabulary: none of the checkpoint's decoding defaults
        # (top-k, repetition penalties, beams), so the samples follow the distribution the loss differentiates.
        return GenerationConfig(
            do_sample=sample,
            num_beams=1,
            top_k=0 if sample else None,
            top_p=1.0 if sample else None,
            temperature=1.0 if sample else None,
            max_new_tokens=self.max_new_tokens,
            num_return_sequences=self.num_samples if sample else 1,
            eos_token_id=config.eos_token_id,
            pad_token_id=config.pad_token_id,
            bos_token_id=config.bos_token_id,
        )

    def training_step(self, model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        captioner = _unwrapped(model)
        image_index = batch.pop("image_index").tolist()
        seed = int(batch.pop("sample_seed"))
        prompt = batch
        length = prompt["input_ids"].shape[1]
        was_training = captioner.training
        with torch.no_grad():
            captioner.eval()
            greedy = captioner.generate(**prompt, generation_config=self._generation_config(captioner, False))
            captioner.train(was_training)
            device = prompt["input_ids"].device
            with torch.random.fork_rng(devices=[device] if device.type != "cpu" else [], device_type=device.type):
                torch.manual_seed(seed)
                sampled = captioner.generate(**prompt, generation_config=self._generation_config(captioner, True))
        image_ids = [self.train_image_ids[i] for i in image_index]
        sampled_ids = [i for i in image_ids for _ in range(self.num_samples)]  # generate() repeats each input k times
        baseline = self.reward(self.processor.batch_decode(greedy[:, length:]), image_ids)  # the captions only
        rewards = self.reward(self.processor.batch_decode(sampled[:, length:]), sampled_ids)
        advantages = torch.as_tensor(
            rewards - np.repeat(baseline, self.num_samples), dtype=torch.float32, device=device
        )
        captions = sampled[:, length:]
        config = captioner.config
        mask = caption_token_mask(captions, [t for t in (config.eos_token_id, config.pad_token_id) if t is not None])
        repeated = {k: v.repeat_interleave(self.num_samples, 0) for k, v in prompt.items()}
        logits = model(**captioner.caption_scoring_inputs(repeated, captions, mask)).logits
        log_probs = torch.log_softmax(logits.float(), dim=-1).gather(-1, captions[..., None]).squeeze(-1)
        loss = self_critical_loss(log_probs, mask, advantages)
        return loss, {
            "reward": torch.tensor(rewards.mean(), device=device),
            "baseline_reward": torch.tensor(baseline.mean(), device=device),
            "scst_loss": loss.detach(),
        }

    def hyperparameters(self) -> dict:
        return {
            "training": "self-critical sequence training (reward: CIDEr-D with the training references' "
            "document frequencies, minus the greedy caption's)",
            "sampled captions per image": self.num_samples,
            "longest caption (tokens, end included)": self.max_new_tokens,
            "evaluation decoding": f"greedy, at most {self.max_new_tokens} tokens",
        }

    def training_summary(self, name: str) -> str:
        return (
            "Fine-tuned with self-critical sequence training (reward: CIDEr-D of a sampled caption minus that of "
            "the greedy caption)"
        )


def check_can_caption(model: PreTrainedModel, max_new_tokens: int | None = None) -> None:
    """A clear error when `model` cannot be trained by self-critical captioning (not its architecture's captioning
    head, which has `generate()` and the `caption_scoring_inputs` hook, or a checkpoint whose captioning head was
    not kept)."""
    architecture = get_architecture(model.config.model_type)
    captioner = architecture.model_class("captioning") if architecture.has_task("captioning") else None
    if captioner is None or not isinstance(model, captioner):
        raise ValueError(
            f"{type(model).__name__} cannot be trained as a captioner with self-critical training: it is not "
            f"{architecture.name}'s captioning head ({captioner.__name__ if captioner else 'it has none'}), with "
            "generate() and the caption_scoring_inputs hook that scores given captions word by word "
            "(vlhub.registry.CaptionScorer; see vlhub.training.captioning)"
        )
    model.check_generation_inputs(None, max_new_tokens)
