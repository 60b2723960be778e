"""Captioning fine-tuning as a `TrainingTask`: a captioner (an architecture's "captioning" head) trained with its
architecture's caption objective, evaluated by generating captions for held-out images and scoring them with the
COCO caption metrics next to a baseline that always says the most frequent training caption."""

from __future__ import annotations

from collections import Counter
from typing import Mapping, Sequence

import torch

from ..evaluation.captions import CAPTION_METRICS
from ..processing.regions import RegionFeatures
from .collators import CaptionDataset, PretrainingCollator
from .finetuning import _architecture_name
from .loop import TrainingTask
from .model_card import CardInfo
from .objectives import Objective
from .sampling import FixedObjective, ObjectiveBatchSampler

__all__ = ["CaptioningTask", "most_frequent_caption", "references_by_image"]


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


class CaptioningTask(TrainingTask):
    """Fine-tune a captioner on (image, caption) pairs.

    Args:
        model: the architecture's captioning head (with `generate()`); processor: its processor, whose call with
            regions only gives the captioning prompt and whose `batch_decode` gives captions.
        regions: image id → `RegionFeatures`. train, validation, test: `(image_id, caption)` pairs (test is scored
            after the last step only).
        objective: the architecture's caption training objective (e.g. Unified VLP's masked seq2seq `s2s`).
        max_new_tokens: longest generated caption (capped by the model's positions).
        metrics: the COCO caption metrics to report (`CAPTION_METRICS`; METEOR's Java start takes ~20 s).
        max_eval_images: score at most this many images per split (0: all).
    """

    trainer_name = "finetune.py"

    def __init__(self, model, processor, regions: Mapping[str, RegionFeatures], train, validation,
                 dataset_name: str, dataset_description: str, objective: Objective, base_model: str | None = None,
                 test=None, max_new_tokens: int = 20, metrics: Sequence[str] = CAPTION_METRICS):
        unknown = sorted(set(metrics) - set(CAPTION_METRICS))
        if unknown or not metrics:
            raise ValueError(f"caption metrics must be a non-empty subset of {list(CAPTION_METRICS)}, got {list(metrics)}")
        self.model = model
        self.processor = processor
        self.regions = regions
        self.objective = objective
        self.train_dataset = CaptionDataset(train)
        self.collate_fn = PretrainingCollator(processor, regions, {objective.name: objective})
        self.splits = {"validation": validation, "test": test}
        self.baseline_caption = most_frequent_caption(train)
        self.dataset_name, self.dataset_description, self.base_model = dataset_name, dataset_description, base_model
        self.max_new_tokens = max_new_tokens
        self.metrics = list(metrics)

    def train_sampler(self, batch_size, group_size, seed):
        return ObjectiveBatchSampler(len(self.train_dataset), batch_size, FixedObjective(self.objective.name), seed,
                                     group_size=group_size)

    def generate_captions(self, model, image_ids: Sequence[str], batch_size: int) -> list[str]:
        """Greedy captions of `image_ids`, in order (every process computes all of them: evaluation sets are small)."""
        model = getattr(model, "module", model)  # generate() lives on the model, not on a DDP wrapper
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

    def evaluate(self, accelerator, model, args, final: bool = False) -> dict[str, float]:
        """COCO caption metrics of greedy captions on the validation split (and the test split after the last step),
        each next to `baseline_<metric>`: the same metric when every image gets the most frequent training caption."""
        from ..evaluation.captions import caption_scores

        results: dict[str, float] = {}
        for split, pairs in self.splits.items():
            if pairs is None or not len(pairs) or (split == "test" and not final):
                continue
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
        return {"caption objective": self.objective.name, "evaluation decoding": f"greedy, at most "
                f"{self.max_new_tokens} tokens"}

    def card_info(self) -> CardInfo:
        name = _architecture_name(self.model)
        summary = (f"Describes an image's regions in a sentence. Trained with {name}'s caption objective "
                   f"`{self.objective.name}`; captions come from `generate()` (greedy here; beam search available).")
        usage = ("import vlhub\nfrom transformers import pipeline\n\n"
                 "captioner = pipeline(\"image-captioning\", model=\"<this folder>\")\n"
                 "captioner(regions)  # vlhub.RegionFeatures, or an image when the folder has a region extractor")
        note = (f"The captions are scored with the COCO caption metrics (PTB tokenisation, CIDEr-D with the split's "
                f"document frequencies). The baseline gives every image the most frequent training caption, "
                f"{self.baseline_caption!r}, and is scored the same way (`baseline_*`).")
        # CardInfo(title, summary, trainer, dataset name, description, pipeline tag, usage, metric task, ...)
        return CardInfo(f"{name} fine-tuned for captioning on {self.dataset_name}", summary, self.trainer_name,
                        self.dataset_name, self.dataset_description, "image-to-text", usage, "image-to-text",
                        base_model=self.base_model, baseline_note=note,
                        tags=["image-captioning", self.model.config.model_type])
