"""The command lines of `pretrain.py` and `finetune.py` (argument dataclasses + the wiring of data, model, task).

Both parse with `transformers.HfArgumentParser`, so every option is a `--flag` documented by `--help`.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, ClassVar, Iterable

from accelerate.utils import set_seed

from ..registry import architectures, get_architecture
from ..utils.local_paths import missing_local_folder
from ..utils.logs import plain_text_outside_terminals
from ..utils.resources import raise_open_file_limit, retain_freed_memory
from ..utils.secrets import redact_secrets
from ..utils.network import HubTimeoutError, configure_hub_timeouts, local_or_download, with_deadline
from .arguments import VlhubTrainingArguments
from .data import (
    SHAPES,
    DEFAULT_REGION_CACHE_MB,
    RegionCache,
    load_caption_corpus,
    load_table,
    open_region_source,
    shapes_region_store,
    shapes_world,
)
from .loop import LoopState, TrainResult, train
from .objectives import ObjectiveMix, default_objective_mix, objectives_for

__all__ = [
    "pretrain_main",
    "finetune_main",
    "ModelArguments",
    "DataArguments",
    "PretrainArguments",
    "FinetuneArguments",
    "PretrainTrainingArguments",
    "FinetuneTrainingArguments",
    "launch_command",
    "redact_secrets",
]

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    model_type: str = field(
        default="uniter",
        metadata={
            "help": "Architecture of a model built from scratch (any registered vlhub model type).",
            "aliases": ["--model"],
        },
    )
    config_name: str = field(
        default="tiny",
        metadata={
            "help": "Preset (tiny, base) or a config.json, for a model built from scratch.",
            "aliases": ["--config"],
        },
    )
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Checkpoint (folder or Hub id) to start from instead of a fresh model."}
    )
    tokenizer_name: str | None = field(
        default=None,
        metadata={
            "help": "Tokenizer folder/Hub id or vocab.txt for a "
            "model built from scratch (default for shapes: the shapes world's WordPiece "
            "vocabulary).",
            "aliases": ["--tokenizer"],
        },
    )


@dataclass
class DataArguments:
    dataset: str = field(
        default=SHAPES,
        metadata={
            "help": "'shapes' (embedded), a region-store folder with "
            "captions.jsonl, or a `datasets` folder / data file / Hub name."
        },
    )
    region_store: str | None = field(
        default=None,
        metadata={
            "help": "Region store folder for a dataset without "
            "inline region columns (for shapes: where its store is written/reused)."
        },
    )
    caption_file: str | None = field(
        default=None,
        metadata={"help": "Captions (jsonl/csv/parquet with image_id, caption) of a region-store dataset."},
    )
    shapes_seed: int = field(default=0, metadata={"help": "Seed of the shapes world (not of training)."})
    region_cache_mb: int = field(
        default=DEFAULT_REGION_CACHE_MB,
        metadata={
            "help": "Most recently read region "
            "features kept per process, in MiB (0: none), used only when the whole store fits in "
            "it; the OS page cache over the store's memory-mapped shards does the rest."
        },
    )


@dataclass
class PretrainArguments:
    objectives: list[str] | None = field(
        default=None,
        metadata={
            "help": "name:ratio of the architecture's "
            "objectives (UNITER: mlm, mrfr, mrc, mrc-kl, itm, wra = ITM + word-region "
            "alignment, and itc, an image-text contrastive extension that is not "
            "UNITER's). Default: the architecture's original mix (UNITER's in-domain "
            "wra:2 mlm:2 mrfr:1 mrc-kl:1)."
        },
    )
    mlm_probability: float = field(default=0.15)
    region_mask_probability: float = field(default=0.15)
    itm_negative_probability: float = field(default=0.5)
    itm_hard_negative_probability: float = field(
        default=0.0,
        metadata={
            "help": "Share of ITM negatives that keep "
            "the image and take a caption contradicting it in one word (data "
            "that can make them: the shapes world); the others swap the image."
        },
    )
    # Two-pass scheduled sampling (TDEN's Two-Pass-A): objectives with a second pass (TDEN: joint) train each batch
    # again, with another optimizer step, after its masked words take the first pass's predictions.
    scheduled_sampling: bool = field(
        default=False,
        metadata={
            "help": "Two-pass scheduled sampling (TDEN's joint: "
            "a second pass and optimizer step per batch on the first pass's predictions)."
        },
    )
    scheduled_sampling_probability: float = field(
        default=1.0, metadata={"help": "Share of the masked positions given a prediction (1: all, as the original)."}
    )

    def task_settings(self) -> dict:
        """The `PretrainingTask` keyword arguments these flags set: every field of the same name, all but
        `objectives` (parsed into the task's objective mix)."""
        settings = asdict(self)
        del settings["objectives"]
        return settings


@dataclass
class PretrainTrainingArguments(VlhubTrainingArguments):
    default_max_steps: ClassVar[int] = 600

    output_dir: str = field(
        default="runs/uniter-shapes", metadata={"help": "Where checkpoints, the final model and log_history.jsonl go."}
    )
    learning_rate: float = field(
        default=1e-3,
        metadata={
            "help": "Peak learning rate (a tiny model from scratch "
            "takes a large one; the original uniter-base used 5e-5)."
        },
    )
    warmup_steps: int = field(default=30)
    eval_steps: int = field(default=0)
    max_eval_samples: int = field(default=256)
    logging_steps: int = field(default=50)


@dataclass
class FinetuneArguments:
    task: str = field(
        default="vqa",
        metadata={
            "help": "vqa | multiple_choice | retrieval | captioning. "
            "multiple_choice: choose the right answer among --num_choices candidates (VCR-style Q→A; "
            "UNITER, VL-BERT, ViLBERT, TDEN); on shapes the candidates are drawn from its VQA answers, on "
            "your data rows have image_id, question, choices, label."
        },
    )
    model_name_or_path: str = field(default="runs/uniter-shapes", metadata={"help": "Pre-trained checkpoint."})
    answer_vocabulary: str | None = field(
        default=None,
        metadata={"help": "VQA on a user dataset: a JSON list of answers (index = label id) or {id: answer}."},
    )
    num_choices: int = field(
        default=4,
        metadata={
            "help": "Multiple choice on the shapes world: candidates per "
            "question (the right answer and distractors of its answer type; types with fewer "
            "answers are left out)."
        },
    )
    num_sampled_negatives: int = field(
        default=15,
        metadata={
            "help": "Retrieval: random negatives scored per "
            "positive and direction (UNITER's original: 399; heads trained on in-batch "
            "negatives, as TDEN's, ignore it)."
        },
    )
    num_hard_negatives: int = field(
        default=3, metadata={"help": "Retrieval: hardest of them trained on (original: 31; ignored by in-batch heads)."}
    )
    max_gallery_images: int = field(default=50, metadata={"help": "Retrieval evaluation: images in the gallery."})
    caption_metrics: list[str] | None = field(
        default=None,
        metadata={
            "help": "Captioning evaluation: COCO caption "
            "metrics to report (Bleu_1..Bleu_4 METEOR ROUGE_L CIDEr; default all)."
        },
    )
    max_caption_tokens: int = field(
        default=20,
        metadata={
            "help": "Captioning evaluation (and --scst sampling): "
            "longest generated caption in word pieces, end token included (original: 20)."
        },
    )
    scst: bool = field(
        default=False,
        metadata={
            "help": "Captioning: self-critical sequence training from a "
            "fine-tuned captioner (reward: CIDEr-D of a sampled caption minus the greedy caption's; the "
            "original used lr 1e-6 for VLP-base)."
        },
    )
    scst_num_samples: int = field(default=1, metadata={"help": "--scst: captions sampled per image (original: 1)."})


@dataclass
class FinetuneTrainingArguments(VlhubTrainingArguments):
    default_max_steps: ClassVar[int] = 600

    output_dir: str = field(default="runs/uniter-shapes-vqa")
    learning_rate: float = field(default=1e-3)
    warmup_steps: int = field(default=30)
    max_eval_samples: int = field(default=0)
    logging_steps: int = field(default=50)
    max_grad_norm: float = field(default=2.0, metadata={"help": "2.0 as the original VQA fine-tuning."})


def launch_command(script: str, argv: list[str] | None = None) -> str:
    """The command as the user typed it (with the accelerate launcher when several processes run), secrets
    redacted: it is written into model cards and state files that are uploaded."""
    argv = sys.argv[1:] if argv is None else argv
    world = int(os.environ.get("WORLD_SIZE", "1"))
    launcher = f"accelerate launch --num_processes {world}" if world > 1 else "python"
    return " ".join([launcher, script, *map(shlex.quote, redact_secrets(list(argv)))])


def _prepare_process(training_args: VlhubTrainingArguments) -> None:
    """What a training script sets up for its process: progress messages of the loop (accelerate's logger, main
    process) reach the console unless the caller has configured logging itself; freed batch memory is reused rather
    than faulted in anew for every batch (`retain_freed_memory`); a store's shards may all stay open
    (`raise_open_file_limit`); every download (model, tokenizer, dataset) has the run's Hub deadlines."""
    configure_hub_timeouts(training_args.hub_timeout, training_args.hub_total_timeout)
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(message)s", level=logging.INFO)
    logging.getLogger("vlhub").setLevel(logging.INFO)
    plain_text_outside_terminals()  # transformers' load reports carry terminal codes even into log files
    retain_freed_memory()
    raise_open_file_limit()


def _load_tokenizer(name: str | None, dataset: str, lowercase: bool):
    """--tokenizer_name, else the shapes world's vocabulary for shapes, else the BERT vocabulary the architecture's
    original release used (bert-base-cased or -uncased, from the Hub)."""
    if name is None:
        if dataset == SHAPES:
            from ..data.shapes import shapes_tokenizer

            return shapes_tokenizer()
        name = f"google-bert/bert-base-{'uncased' if lowercase else 'cased'}"
        logger.info(f"no --tokenizer_name: using {name}, the vocabulary of the architecture's original release")
    if Path(name).is_file():
        from transformers import BertTokenizer

        return BertTokenizer(vocab=str(name), do_lower_case=lowercase)
    from transformers import AutoTokenizer

    try:
        return with_deadline(f"downloading the tokenizer {name}", lambda: AutoTokenizer.from_pretrained(name))
    except HubTimeoutError:
        raise
    except OSError as err:
        raise SystemExit(
            f"cannot load the tokenizer {name!r} ({err}); pass --tokenizer_name with a local folder or a "
            "vocab.txt (offline, nothing can be downloaded)"
        ) from err


def _default_mix_for_data(model_type: str, available, sample_regions) -> ObjectiveMix:
    """The architecture's original mix, without the objectives whose region fields the data lacks (said in the log);
    none left is an error naming --objectives."""
    mix = default_objective_mix(model_type)
    missing = {
        name: [f for f in available[name].region_fields if getattr(sample_regions, f) is None]
        for name in mix
        if name in available
    }
    kept = {name: ratio for name, ratio in mix.items() if not missing.get(name)}
    dropped = {name: fields for name, fields in missing.items() if fields}
    if not kept:
        raise SystemExit(
            f"none of {model_type}'s default objectives ({', '.join(mix)}) can train on these regions "
            f"(they lack {sorted({f for fields in dropped.values() for f in fields})}); choose "
            f"objectives with --objectives from {', '.join(sorted(available))}"
        )
    if dropped:
        logger.warning(
            "the data's regions have no "
            + ", ".join(sorted({f for v in dropped.values() for f in v}))
            + f": the default mix drops {', '.join(sorted(dropped))} and trains "
            + ", ".join(f"{name}:{ratio:g}" for name, ratio in kept.items())
            + " (set --objectives to choose)"
        )
    return ObjectiveMix(kept, available)


def _known_model_type(model_type: str) -> None:
    known = sorted(architectures())
    if model_type not in known:
        raise SystemExit(f"--model_type {model_type}: unknown; vlhub knows {', '.join(known)}")


def _refuse_pixel_models(config, script: str, source: str) -> None:
    """Training feeds precomputed region features (a region store). A model that computes its own from pixels
    (VL-BERT's "e2e" release, `image_feature_precomputed=False`) would need images, boxes and its CNN in the loop,
    which these scripts do not provide: say so before anything is built."""
    fields = config if isinstance(config, dict) else getattr(config, "__dict__", {})
    if fields.get("image_feature_precomputed", True) is False:
        raise SystemExit(
            f"{script}: {source} is an 'e2e' model (image_feature_precomputed=False: it computes region features from "
            "pixels with its own ResNet), but training here feeds precomputed region features from a region store; "
            "e2e training is not supported. Train a 'prec' model (image_feature_precomputed=True, the default), or "
            "fine-tune the e2e model in your own loop with processor(text, images=..., boxes=...)."
        )


def _source_config(source: str, how_to_make_one: str):
    """`(location, config)` of the checkpoint `--model_name_or_path source`: where its files are (a Hub id's
    downloaded within the Hub deadlines) and its config, or one line saying why there is none: a local path that
    names nothing is refused before any network call; a Hub id that cannot be loaded gives transformers' reason."""
    from transformers import AutoConfig

    if missing_local_folder(source):
        raise SystemExit(
            f"--model_name_or_path {source}: no such folder (make one with {how_to_make_one}, or pass a "
            "checkpoint folder or Hub id)"
        )
    location = local_or_download(source, "the model")
    try:
        return location, AutoConfig.from_pretrained(location)
    except OSError as err:
        raise SystemExit(f"--model_name_or_path {source}: {' '.join(str(err).split())}") from None


def _load_task_model(model_class, source: str, source_config, architecture, **kwargs):
    """`model_class` from `source`. From a pre-training checkpoint, a head the architecture declares in
    `heads_from_pretraining` starts from the pre-trained heads (UNITER's rank_output from ITM, ...); the load report then lists only the weights that
    stay newly initialised (transformers' own report would call the initialised ones MISSING)."""
    import torch
    from transformers.utils import logging as transformers_logging

    from .finetuning import load_pretraining_state

    if architecture.task_models.get("pretraining") not in (
        source_config.architectures or []
    ) or not architecture.initializes_from_pretraining(model_class):
        return model_class.from_pretrained(source, **kwargs)
    report_logger = transformers_logging.get_logger("transformers.modeling_utils")
    level = report_logger.level
    report_logger.setLevel(logging.ERROR)  # the report is written below, once the head is initialised
    try:
        model, info = model_class.from_pretrained(source, output_loading_info=True, **kwargs)
    finally:
        report_logger.setLevel(level)
    # initialize_from_pretraining names the weights it set from the pre-trained heads.
    with torch.no_grad():
        initialised = sorted(set(model.initialize_from_pretraining(load_pretraining_state(source))))
    missing = sorted(set(info["missing_keys"]) - set(initialised))
    if initialised:
        logger.info(
            f"{model_class.__name__}: {', '.join(initialised)} initialised from the pre-trained heads of {source}"
        )
    if missing:
        logger.warning(
            f"{model_class.__name__} from {source}: newly initialised (not in the checkpoint): {', '.join(missing)}"
        )
    if info["unexpected_keys"]:
        logger.info(
            f"{model_class.__name__} from {source}: unused weights of the checkpoint: "
            f"{', '.join(sorted(info['unexpected_keys']))}"
        )
    return model


def pretrain_main(argv: list[str] | None = None, callbacks: Iterable[Callable[[LoopState], None]] = ()) -> TrainResult:
    from transformers import HfArgumentParser

    from .pretraining import PretrainingTask, build_pretraining_model

    parser = HfArgumentParser((ModelArguments, DataArguments, PretrainArguments, PretrainTrainingArguments))
    model_args, data_args, pretrain_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    _prepare_process(training_args)
    if not model_args.model_name_or_path:
        _known_model_type(model_args.model_type)
        if not get_architecture(model_args.model_type).has_task("pretraining"):
            raise SystemExit(f"--model_type {model_args.model_type}: this architecture has no pre-training head")
    location = None  # where the starting checkpoint's files are: a Hub id's downloaded within the deadlines
    if model_args.model_name_or_path:
        location, config = _source_config(
            model_args.model_name_or_path, "python pretrain.py --model_type ... (from scratch)"
        )
        _refuse_pixel_models(config, "pretrain.py", model_args.model_name_or_path)
    elif (
        model_args.config_name
        and Path(model_args.config_name).is_file()
        and model_args.config_name not in get_architecture(model_args.model_type).config_presets
    ):
        _refuse_pixel_models(
            json.loads(Path(model_args.config_name).read_text()), "pretrain.py", model_args.config_name
        )
    set_seed(training_args.seed)
    corpus = load_caption_corpus(
        data_args.dataset,
        data_args.region_store,
        data_args.caption_file,
        shapes_seed=data_args.shapes_seed,
        region_cache_mb=data_args.region_cache_mb,
    )
    lowercase = get_architecture(model_args.model_type).lowercase if not model_args.model_name_or_path else False
    model, processor = build_pretraining_model(
        location,
        model_args.config_name,
        _load_tokenizer(model_args.tokenizer_name, data_args.dataset, lowercase),
        corpus,
        model_type=model_args.model_type,
    )
    if data_args.dataset == SHAPES and not model_args.model_name_or_path:
        from ..data.shapes_features import ShapesRegionExtractor

        # The extractor that made the world's region store travels with the processor, so the saved models also
        # answer from raw shapes images (`pipeline(...)(image=PIL image, ...)`).
        processor.region_extractor = ShapesRegionExtractor(feature_dim=model.config.region_feature_dim)
    model_type = model.config.model_type
    available = objectives_for(model_type)
    if pretrain_args.objectives:
        mix = ObjectiveMix.parse(pretrain_args.objectives, available)
    else:
        mix = _default_mix_for_data(model_type, available, corpus.sample_regions())
    task = PretrainingTask(
        model, processor, corpus, mix, base_model=model_args.model_name_or_path, **pretrain_args.task_settings()
    )
    return train(task, training_args, command=launch_command("pretrain.py", argv), callbacks=callbacks)


def _answer_vocabulary(path: str) -> dict[int, str]:
    data = json.loads(Path(path).read_text())
    if isinstance(data, list):
        return dict(enumerate(data))
    if isinstance(data, dict):
        return {int(k): v for k, v in data.items()}
    raise ValueError(f"{path}: the answer vocabulary must be a JSON list of answers or an {{id: answer}} object")


def _finetune_data(data_args: DataArguments, finetune_args: FinetuneArguments):
    """(table of the task's rows per split, regions, id2label or None, name, description, majority baselines)."""
    if data_args.dataset == SHAPES:
        world = shapes_world(seed=data_args.shapes_seed)
        regions = RegionCache(
            shapes_region_store(world, data_args.region_store, data_args.shapes_seed), data_args.region_cache_mb << 20
        )
        if finetune_args.task == "vqa":
            table = world.vqa()
            baselines = {split: world.majority_baseline(split) for split in ("validation", "test")}
            description = (
                f"VQA on the embedded shapes world (seed {data_args.shapes_seed}): {len(table['train'])} "
                f"training questions, {len(table['validation'])} validation and {len(table['test'])} test "
                f"questions about held-out images, {len(world.answer_vocabulary)} answers."
            )
            return table, regions, dict(world.id2label), "vlhub/shapes", description, baselines
        if finetune_args.task == "multiple_choice":
            try:
                table = world.multiple_choice(finetune_args.num_choices)
            except ValueError as err:
                raise SystemExit(f"--num_choices: {err}") from err
            skipped = world.multiple_choice_skipped_types(finetune_args.num_choices)
            description = (
                f"Multiple choice on the embedded shapes world (seed {data_args.shapes_seed}): its VQA "
                f"questions with {finetune_args.num_choices} candidate answers each (the right answer and "
                f"distractors of the same answer type, seeded), {len(table['train'])} training, "
                f"{len(table['validation'])} validation and {len(table['test'])} test questions"
                + (f"; {' and '.join(skipped)} questions left out (too few answers of their type)." if skipped else ".")
            )
            if not len(table["train"]):
                raise SystemExit(
                    f"--num_choices {finetune_args.num_choices}: no answer type of the shapes world has "
                    "that many answers"
                )
            return table, regions, None, "vlhub/shapes", description, {}
        table = world.captions()
        description = (
            f"Captions of the embedded shapes world (seed {data_args.shapes_seed}): "
            f"{len(table['train'])} training captions."
        )
        return table, regions, None, "vlhub/shapes", description, {}
    table = load_table(data_args.dataset)
    if not data_args.region_store:
        raise SystemExit("fine-tuning on your own data needs --region_store (the region features of its images)")
    regions = open_region_source(data_args.region_store, data_args.region_cache_mb)
    id2label = _answer_vocabulary(finetune_args.answer_vocabulary) if finetune_args.answer_vocabulary else None
    if finetune_args.task == "vqa" and id2label is None:
        raise SystemExit("VQA on your own data needs --answer_vocabulary (JSON list of answers, index = label id)")
    return table, regions, id2label, data_args.dataset, f"`{data_args.dataset}`", {}


# finetune.py's tasks → the head each needs (`Architecture.task_models` key).
FINETUNING_TASKS = {"vqa": "vqa", "multiple_choice": "vcr", "retrieval": "retrieval", "captioning": "captioning"}


@dataclass(frozen=True)
class _TaskData:
    """What every fine-tuning task is built from besides its model and splits: the processor, the region source,
    the dataset's name and description, and the fine-tuned checkpoint (`source`)."""

    processor: object
    regions: object
    name: str
    description: str
    source: str

    def task(self, task_class, model, splits: dict, *args, **options):
        """`task_class(model, processor, regions, train, validation, name, description, *args, base_model=source,
        test=..., **options)`: the arguments the split-based fine-tuning tasks share."""
        return task_class(
            model,
            self.processor,
            self.regions,
            splits["train"],
            splits.get("validation"),
            self.name,
            self.description,
            *args,
            base_model=self.source,
            test=splits.get("test"),
            **options,
        )


def finetune_main(argv: list[str] | None = None, callbacks: Iterable[Callable[[LoopState], None]] = ()) -> TrainResult:
    from transformers import AutoProcessor, HfArgumentParser

    from .data import caption_pairs
    from .finetuning import VqaDataset, VqaTask, retrieval_task

    parser = HfArgumentParser((FinetuneArguments, DataArguments, FinetuneTrainingArguments))
    finetune_args, data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    _prepare_process(training_args)
    if finetune_args.task not in FINETUNING_TASKS:
        raise SystemExit(f"--task must be {', '.join(FINETUNING_TASKS)}, got {finetune_args.task!r}")
    if finetune_args.scst and finetune_args.task != "captioning":
        raise SystemExit(
            f"--scst is self-critical training of a captioner: use it with --task captioning, not "
            f"--task {finetune_args.task}"
        )
    source = finetune_args.model_name_or_path
    location, source_config = _source_config(source, "python pretrain.py")
    _refuse_pixel_models(source_config, "finetune.py", source)
    architecture = get_architecture(source_config.model_type)
    head = FINETUNING_TASKS[finetune_args.task]
    if not architecture.has_task(head):
        raise SystemExit(
            f"--task {finetune_args.task}: {architecture.name} has no {finetune_args.task} head "
            f"(its heads: {', '.join(sorted(architecture.task_models))})"
        )
    set_seed(training_args.seed)
    table, regions, id2label, name, description, baselines = _finetune_data(data_args, finetune_args)
    if "train" not in table:
        raise SystemExit(f"--task {finetune_args.task}: the dataset has no train split (it has {', '.join(table)})")
    # A processor may lay text out per task (VL-BERT's VQA answer slot): `for_task` gives the task's processor.
    processor = AutoProcessor.from_pretrained(location).for_task(finetune_args.task)
    data = _TaskData(processor, regions, name, description, source)
    command = launch_command("finetune.py", argv)
    model_class = architecture.model_class(head)
    if finetune_args.task == "vqa":
        model = _load_vqa_model(model_class, location, source_config, architecture, id2label)
        num_labels = model.config.num_labels
        splits = {s: VqaDataset.from_rows(table[s], num_labels, f"the {s} split") for s in table}
        task = data.task(VqaTask, model, splits, majority_baselines=baselines)
    elif finetune_args.task == "multiple_choice":
        task = _multiple_choice_task(model_class, location, table, data)
    elif finetune_args.task == "captioning":
        task = _captioning_task(architecture, model_class, location, table, data, finetune_args)
    else:
        # e.g. the original's init_output: the ranking head starts from the pre-trained ITM head.
        model = _load_task_model(model_class, location, source_config, architecture)
        validation = table["validation"] if "validation" in table else table["train"]
        # The head says how its original trained (sampled hard negatives, or the hardest in the batch).
        task = retrieval_task(
            model,
            processor,
            regions,
            caption_pairs(table["train"], name),
            caption_pairs(validation, name),
            name,
            description,
            base_model=source,
            num_sampled=finetune_args.num_sampled_negatives,
            num_hard=finetune_args.num_hard_negatives,
            max_gallery_images=finetune_args.max_gallery_images,
        )
    return train(task, training_args, command=command, callbacks=callbacks)


def _load_vqa_model(model_class, location, source_config, architecture, id2label):
    """The VQA model with its answer head sized and labelled by the dataset's answer vocabulary (apart from
    `finetune_main` to keep it within the house's 80 lines)."""
    label2id = {v: k for k, v in id2label.items()}
    # An answer vocabulary with Pythia's "<unk>" (the VQA answer processors' unknown answer): never predicted.
    unknown = {"unknown_answer_id": label2id["<unk>"]} if "<unk>" in label2id else {}
    # e.g. VL-BERT: the answer head's transform starts from the pre-trained MLM transform.
    return _load_task_model(
        model_class, location, source_config, architecture, id2label=id2label, label2id=label2id, **unknown
    )


def _multiple_choice_task(model_class, location, table, data: _TaskData):
    """A `MultipleChoiceTask`, its input errors as a `SystemExit` naming `--task` (apart from `finetune_main` to
    keep it within the house's 80 lines)."""
    from .finetuning import MultipleChoiceDataset, MultipleChoiceTask

    splits = {s: MultipleChoiceDataset.from_rows(table[s], f"the {s} split") for s in table}
    # One score per (question, choice) pair (TDEN's head checks it; the other heads' outputs are fixed).
    model = model_class.from_pretrained(location, num_labels=1)
    try:
        return data.task(MultipleChoiceTask, model, splits)
    except ValueError as err:
        raise SystemExit(f"--task multiple_choice: {err}") from err


def _captioning_task(architecture, model_class, location, table, data: _TaskData, finetune_args):
    """A `CaptioningTask` trained with the architecture's caption objective (`Architecture.finetuning_objectives`),
    or with `--scst` a `SelfCriticalCaptioningTask`."""
    from ..evaluation.captions import CAPTION_METRICS
    from .captioning import CaptioningTask, SelfCriticalCaptioningTask
    from .data import caption_pairs

    splits = {s: caption_pairs(table[s], f"the {s} split") for s in table}
    common = dict(
        max_new_tokens=finetune_args.max_caption_tokens, metrics=finetune_args.caption_metrics or CAPTION_METRICS
    )
    if finetune_args.scst:
        model = model_class.from_pretrained(location)
        try:
            return data.task(
                SelfCriticalCaptioningTask, model, splits, num_samples=finetune_args.scst_num_samples, **common
            )
        except ValueError as err:
            raise SystemExit(f"--scst: {err}") from err
    objective_name = architecture.finetuning_objectives.get("captioning")
    if objective_name is None:
        raise SystemExit(
            f"--task captioning: {architecture.name} declares no caption training objective "
            "(Architecture.finetuning_objectives)"
        )
    objective = objectives_for(architecture.model_type)[objective_name]
    return data.task(CaptioningTask, model_class.from_pretrained(location), splits, objective=objective, **common)
