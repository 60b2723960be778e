"""Pre-training as a `TrainingTask`: a model with pre-training heads, a caption corpus and a mix of objectives."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np
import torch
from transformers import AutoModelForPreTraining, AutoProcessor

from ..registry import Architecture, get_architecture
from .collators import CaptionDataset, PretrainingCollator
from .data import CaptionCorpus, CaptionPairs
from .loop import TrainingTask, model_losses
from .model_card import CardInfo
from .objectives import ObjectiveMix, default_objective_mix, objectives_for
from .sampling import FixedObjective, ObjectiveBatchSampler

if TYPE_CHECKING:
    from accelerate import Accelerator
    from transformers import PreTrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

    from ..processing.processor_base import VisionLanguageProcessor
    from ..processing.regions import RegionFeatures
    from .arguments import VlhubTrainingArguments
    from .streaming import StreamedCaptionBatches

__all__ = ["PretrainingTask", "TwoPassCollator", "build_config", "build_pretraining_model", "EVAL_EPOCH"]

# Evaluation masks and negatives come from one fixed "epoch" of the seeded streams, so every evaluation of a run
# scores exactly the same corrupted examples.
EVAL_EPOCH = 2**31 - 1


def build_config(
    architecture: Architecture, config: str | dict, processor: VisionLanguageProcessor, sample_regions: RegionFeatures
) -> PreTrainedConfig:
    """An architecture's config from a preset name (`tiny`, `base`), a config.json path or a dict of fields; the
    vocabulary, region feature size and region classes are set from the processor and the data so the model fits
    them (every vlhub config names these `vocab_size`, `region_feature_dim`, `num_region_labels`)."""
    if isinstance(config, dict):
        fields = dict(config)
    elif config in architecture.config_presets:
        fields = architecture.config_fields(config)
    elif Path(config).is_file():
        fields = json.loads(Path(config).read_text())
        fields.pop("model_type", None)
    else:
        raise ValueError(
            f"--config_name must be a preset ({', '.join(architecture.config_presets)}) or a "
            f"config.json file, got {config!r}"
        )
    fields["vocab_size"] = len(processor.tokenizer)
    if architecture.config_mask_token_id:
        # A config that names [MASK] follows the tokenizer (VL-BERT reads its VQA answer from that slot).
        fields["mask_token_id"] = processor.tokenizer.mask_token_id
    fields["region_feature_dim"] = sample_regions.feature_dim
    if sample_regions.class_probs is not None:
        fields["num_region_labels"] = sample_regions.class_probs.shape[1]
    fields.update(processor.model_config_fields())  # e.g. the special token ids a generating model needs
    return architecture.config_class(**fields)


def build_uniter_config(
    config: str | dict, processor: VisionLanguageProcessor, sample_regions: RegionFeatures
) -> PreTrainedConfig:
    """Deprecated: `build_config(get_architecture("uniter"), ...)`, the route for every architecture."""
    warnings.warn(
        'build_uniter_config is deprecated: use build_config(get_architecture("uniter"), config, processor, '
        "sample_regions) (build_uniter_config will stop working in a later release)",
        FutureWarning,
        stacklevel=2,
    )
    return build_config(get_architecture("uniter"), config, processor, sample_regions)


def build_pretraining_model(
    model_name_or_path: str | None,
    config: str | dict,
    tokenizer: PreTrainedTokenizerBase | None,
    corpus: CaptionCorpus,
    model_type: str = "uniter",
) -> tuple[torch.nn.Module, object]:
    """(model, processor): from a checkpoint (its own processor) or freshly initialised from a config of
    `model_type`'s architecture."""
    if model_name_or_path:
        model = AutoModelForPreTraining.from_pretrained(model_name_or_path)
        processor = AutoProcessor.from_pretrained(model_name_or_path)
        return model, processor
    if tokenizer is None:
        raise ValueError(
            "a model trained from scratch needs a tokenizer: pass --tokenizer_name (a folder or vocab.txt)"
        )
    architecture = get_architecture(model_type)
    sample = corpus.sample_regions()
    processor = architecture.build_processor(tokenizer, sample.feature_dim)
    model_config = build_config(architecture, config, processor, sample)
    settings = architecture.region_processor_class.settings_from_config(model_config)
    if settings:  # the config fixes some region settings (e.g. a number of region slots): rebuild to fit
        processor = architecture.build_processor(tokenizer, sample.feature_dim, **settings)
    model_class = architecture.model_class("pretraining")
    return model_class(model_config), processor


class PretrainingTask(TrainingTask):
    """Pre-train `model` on `corpus` with the objectives of `mix` (one objective per optimizer step).

    Args:
        model: a model with pre-training heads (its architecture's "pretraining" head).
        processor: its processor. corpus: captions and regions.
        mix: objectives with ratios (default: the architecture's original mix).
        base_model: what the weights started from (recorded in the card).
        itm_hard_negative_probability: share of ITM negatives that keep the image and take a contradicting caption
            (`corpus.contradict`; corpora without one always swap the image).
    """

    trainer_name = "pretrain.py"

    def __init__(
        self,
        model: PreTrainedModel,
        processor: VisionLanguageProcessor,
        corpus: CaptionCorpus,
        mix: ObjectiveMix | None = None,
        base_model: str | None = None,
        mlm_probability: float = 0.15,
        region_mask_probability: float = 0.15,
        itm_negative_probability: float = 0.5,
        itm_hard_negative_probability: float = 0.0,
        scheduled_sampling: bool = False,
        scheduled_sampling_probability: float = 1.0,
    ) -> None:
        super().__init__(model, processor, corpus.name, corpus.description, base_model)
        self.corpus = corpus
        model_type = model.config.model_type
        self.mix = mix or ObjectiveMix(default_objective_mix(model_type), objectives_for(model_type))
        self._check_data(model.config, corpus)
        image_ids = _unique_image_ids(corpus.train)
        self.train_dataset = CaptionDataset(corpus.train)
        self.itm_hard_negative_probability = itm_hard_negative_probability
        settings = dict(
            mlm_probability=mlm_probability,
            region_mask_probability=region_mask_probability,
            itm_negative_probability=itm_negative_probability,
            contradict=corpus.contradict,
            itm_hard_negative_probability=itm_hard_negative_probability,
        )
        self.collate_fn = PretrainingCollator(
            processor, corpus.regions, self.mix.objectives, image_ids=image_ids, pairs=corpus.train, **settings
        )
        self.scheduled_sampling_probability = scheduled_sampling_probability
        self.scheduled_sampling = scheduled_sampling
        if scheduled_sampling:
            two_pass = {n: o for n, o in self.mix.objectives.items() if o.second_pass is not None}
            if not two_pass:
                with_pass = sorted(n for n, o in objectives_for(model_type).items() if o.second_pass is not None)
                raise ValueError(
                    f"scheduled sampling needs an objective with a second pass; the mix "
                    f"({', '.join(self.mix.names)}) has none"
                    + (
                        f" (this architecture's: {', '.join(with_pass)})"
                        if with_pass
                        else " and this architecture defines none"
                    )
                )
            if not 0.0 < scheduled_sampling_probability <= 1.0:
                raise ValueError(
                    f"scheduled_sampling_probability must be in (0, 1], got {scheduled_sampling_probability}"
                )
            self.optimizer_steps_per_batch = 2
            self.collate_fn = TwoPassCollator(self.collate_fn, two_pass, scheduled_sampling_probability)
        eval_ids = _unique_image_ids(corpus.validation) or image_ids
        # Evaluation keeps the original's random-image negatives, so eval_itm_accuracy compares across runs; data that
        # can contradict its captions is also scored on hard negatives only (eval_hard_itm_accuracy).
        settings["itm_hard_negative_probability"] = 0.0
        eval_pairs = corpus.validation or corpus.train
        self.eval_collate_fn = PretrainingCollator(
            processor, corpus.regions, self.mix.objectives, image_ids=eval_ids, pairs=eval_pairs, **settings
        )
        self.hard_eval_collate_fn = None
        if corpus.contradict is not None:
            settings["itm_hard_negative_probability"] = 1.0
            self.hard_eval_collate_fn = PretrainingCollator(
                processor, corpus.regions, self.mix.objectives, image_ids=eval_ids, pairs=eval_pairs, **settings
            )

    def _check_data(self, config, corpus: CaptionCorpus):
        sample = corpus.sample_regions()
        if sample.feature_dim != config.region_feature_dim:
            raise ValueError(
                f"the data's regions have {sample.feature_dim}-d features but the model expects "
                f"{config.region_feature_dim}-d (config.region_feature_dim)"
            )
        for objective in self.mix.objectives.values():
            for name in objective.region_fields:
                value = getattr(sample, name)
                if value is None:
                    raise ValueError(
                        f"objective {objective.name!r} needs region {name} but the data's regions have "
                        f"none; drop it from --objectives or use regions with {name}"
                    )
                if name == "class_probs" and value.shape[1] != config.num_region_labels:
                    raise ValueError(
                        f"the regions' class_probs have {value.shape[1]} classes but the model predicts "
                        f"{config.num_region_labels} (config.num_region_labels)"
                    )

    def train_sampler(self, batch_size: int, group_size: int, seed: int) -> ObjectiveBatchSampler:
        return ObjectiveBatchSampler(len(self.train_dataset), batch_size, self.mix, seed, group_size=group_size)

    def training_passes(
        self, model: torch.nn.Module, batch: dict
    ) -> Iterator[tuple[torch.Tensor, dict[str, torch.Tensor]]]:
        """One pass, or with scheduled sampling two for objectives with a `second_pass`: the first pass trains on the
        batch; the second (after the first's optimizer step) on the batch the objective builds from the first pass's
        predictions. The second pass's parts are logged as `ss_<name>_loss`; the logged `loss` sums both passes."""
        batch = dict(batch)
        name = batch.pop(SECOND_PASS_OBJECTIVE, None)
        draws = batch.pop(SECOND_PASS_DRAWS, None)
        outputs = model(**batch)
        loss, parts = model_losses(outputs)
        if name is None:
            yield loss, parts
            return
        with torch.no_grad():
            replace = None if draws is None else draws < self.scheduled_sampling_probability
            second = self.mix.objectives[name].second_pass(batch, outputs, replace)
        del outputs
        yield loss, parts
        loss, parts = model_losses(model(**second))
        yield loss, {f"ss_{key}": value for key, value in parts.items()}

    def train_stream(
        self, args: VlhubTrainingArguments, process_index: int, num_processes: int
    ) -> StreamedCaptionBatches:
        """`--streaming`: the training captions paired with the region store's images as they stream by (see
        `vlhub.training.streaming`); evaluation still reads its images by id."""
        from ..processing.stores import RegionStore
        from .data import RegionCache
        from .streaming import CaptionIndex, StreamedCaptionBatches

        store = self.corpus.regions.store if isinstance(self.corpus.regions, RegionCache) else self.corpus.regions
        if not isinstance(store, RegionStore) or store.version < 2:
            raise ValueError(
                "--streaming reads the shards of a vlhub region store (format 2); this corpus's regions "
                f"come from {type(store).__name__}"
                + (
                    " (a format-1 store: upgrade it with `vlhub import-features OLD --format vlhub --output NEW`)"
                    if isinstance(store, RegionStore)
                    else ""
                )
            )
        return StreamedCaptionBatches(
            store,
            CaptionIndex(self.corpus.train),
            args.per_device_train_batch_size,
            self.mix,
            args.seed,
            gradient_accumulation_steps=args.gradient_accumulation_steps,
            process_index=process_index,
            num_processes=num_processes,
            shuffle_buffer_size=args.shuffle_buffer_size,
            num_workers=args.dataloader_num_workers,
        )

    def evaluate(
        self, accelerator: Accelerator, model: torch.nn.Module, args: VlhubTrainingArguments, final: bool = False
    ) -> dict[str, float]:
        pairs = self.corpus.validation
        if not pairs:
            return {}
        if args.max_eval_samples:
            pairs = pairs[: args.max_eval_samples]
        dataset = CaptionDataset(pairs)
        results: dict[str, float] = {}
        passes = [(name, "", self.eval_collate_fn) for name in self.mix.names]
        if self.hard_eval_collate_fn is not None:
            passes += [
                (name, "hard_", self.hard_eval_collate_fn)
                for name, objective in self.mix.objectives.items()
                if objective.needs_other_images
            ]
        for name, prefix, collate_fn in passes:
            sampler = ObjectiveBatchSampler(
                len(dataset),
                args.per_device_eval_batch_size,
                FixedObjective(name),
                args.seed,
                shuffle=False,
                drop_last=False,
            )
            sampler.set_epoch(EVAL_EPOCH)
            loader = self.eval_dataloader(accelerator, dataset, sampler, collate_fn)
            sums: dict[str, list[torch.Tensor]] = {}
            for batch in loader:
                outputs = model(**batch)
                size = batch["region_features"].shape[0]
                for key, value in outputs.items():
                    if key.endswith("_loss") and key != "loss" and value is not None:
                        per_example = value.detach().float().repeat(size)  # weight each batch by its size
                        sums.setdefault(key, []).append(accelerator.gather_for_metrics(per_example))
                if "itm_labels" in batch:
                    correct = (outputs.itm_logits.argmax(-1) == batch["itm_labels"]).float()
                    sums.setdefault("itm_accuracy", []).append(accelerator.gather_for_metrics(correct))
                if "itc_image_ids" in batch:  # in-batch text -> image: the best-scored image is the caption's own
                    ids = batch["itc_image_ids"]
                    correct = (ids[outputs.itc_logits.argmax(-1)] == ids).float()
                    sums.setdefault("itc_accuracy", []).append(accelerator.gather_for_metrics(correct))
                if "labels" in batch:
                    selected = batch["labels"] >= 0
                    predicted = torch.full_like(batch["labels"], -100)
                    guesses = outputs.mlm_logits.argmax(-1)
                    # MLM logits at the selected positions only, or at every position (TDEN)
                    predicted[selected] = guesses[selected] if guesses.shape == selected.shape else guesses
                    hits = ((predicted == batch["labels"]) & selected).sum(1).float()
                    counts = selected.sum(1).float()
                    sums.setdefault("_mlm_hits", []).append(accelerator.gather_for_metrics(hits))
                    sums.setdefault("_mlm_counts", []).append(accelerator.gather_for_metrics(counts))
            if prefix:  # the hard-negative pass reports matching only (objectives whose batches carry itm_labels)
                if "itm_accuracy" in sums:
                    results[f"{prefix}itm_accuracy"] = torch.cat(sums["itm_accuracy"]).mean().item()
                continue
            for key, values in sums.items():
                if not key.startswith("_"):
                    results[key] = torch.cat(values).mean().item()
            if "_mlm_hits" in sums:
                hits, counts = torch.cat(sums["_mlm_hits"]).sum(), torch.cat(sums["_mlm_counts"]).sum()
                results["mlm_accuracy"] = (hits / counts).item()
        return results

    def hyperparameters(self) -> dict:
        settings = {"objectives (ratio)": self.mix.as_dict()}
        if self.scheduled_sampling:
            settings["scheduled sampling"] = (
                f"two passes per batch (share of target positions replaced: {self.scheduled_sampling_probability:g})"
            )
        return settings

    def card_info(self) -> CardInfo:
        arch = type(self.model).__name__
        name = get_architecture(self.model.config.model_type).name
        return self.task_card(
            title=f"{name} pre-trained on {self.dataset_name}",
            summary=(
                f"A `{arch}` (vision-language BERT over text and image regions) pre-trained with "
                f"{', '.join(f'{n} ({r:g})' for n, r in self.mix.as_dict().items())} "
                "(objective: sampling ratio, one objective per step)."
            ),
            usage=(
                "import vlhub\nfrom transformers import AutoModel, AutoProcessor\n\n"
                'model = AutoModel.from_pretrained("<this folder>")\n'
                'processor = AutoProcessor.from_pretrained("<this folder>")\n'
                'inputs = processor(text=["a red circle"], regions=[regions], return_tensors="pt")  '
                "# regions: vlhub.RegionFeatures\n"
                "outputs = model(**inputs)"
            ),
            metric_task="pretraining",
            tags=["pretraining"],
        )


# Batch entries `TwoPassCollator` adds (popped before the model sees the batch).
SECOND_PASS_OBJECTIVE = "second_pass_objective"
SECOND_PASS_DRAWS = "second_pass_draws"
_SECOND_PASS_STREAM = 3  # a random stream of each example's seed apart from its objective's own draws


class TwoPassCollator:
    """Wraps a pre-training collator for scheduled sampling: batches of an objective with a `second_pass` are
    marked with its name, and, when `probability` < 1, carry one uniform draw per example and text position
    (`input_ids`) from a stream of the example's own `SampleKey` seed, so which predictions replace targets is
    reproduced exactly on resume (nothing comes from the global random state)."""

    def __init__(self, collator: PretrainingCollator, objectives: dict, probability: float) -> None:
        self.collator, self.objectives, self.probability = collator, objectives, probability

    def __call__(self, examples: Sequence[dict]) -> dict:
        batch = self.collator(examples)
        name = examples[0]["objective"]
        if name not in self.objectives:
            return batch
        batch[SECOND_PASS_OBJECTIVE] = name
        if self.probability < 1.0:
            width = batch["input_ids"].shape[1]
            draws = [np.random.default_rng((*e["seed"], _SECOND_PASS_STREAM)).random(width) for e in examples]
            batch[SECOND_PASS_DRAWS] = torch.from_numpy(np.stack(draws)).float()
        return batch


def _unique_image_ids(pairs) -> Sequence[str]:
    """The sorted distinct image ids of caption pairs (kept in Arrow for `CaptionPairs`)."""
    if isinstance(pairs, CaptionPairs):
        return pairs.image_ids.unique_sorted()
    return sorted({image_id for image_id, _ in pairs})
