"""Fine-tuning tasks for the training loop: VQA (soft-score BCE), multiple-choice answer selection (VCR-style) and
image-text retrieval (hinge loss with hard negatives), with evaluation through vlhub's `evaluate` metrics."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from ..evaluation.vqa import predictable_answer_logits
from ..processing.processor_base import check_text
from ..processing.regions import RegionFeatures
from ..registry import architecture_of_processor, get_architecture
from ..utils.deprecation import replaced_name
from .collators import CaptionDataset
from .data import arrow_slice
from .loop import TrainingTask
from .model_card import CardInfo
from .sampling import FixedObjective, ObjectiveBatchSampler, SampleKey, example_rng

if TYPE_CHECKING:
    import datasets
    import pyarrow as pa
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    from transformers import PreTrainedModel

    from ..processing.processor_base import VisionLanguageProcessor
    from .arguments import VlhubTrainingArguments

__all__ = [
    "VqaExample",
    "VqaDataset",
    "VqaCollator",
    "VqaTask",
    "MultipleChoiceExample",
    "MultipleChoiceDataset",
    "MultipleChoiceCollator",
    "MultipleChoiceTask",
    "encode_choices",
    "FinetuningTask",
    "QuestionTask",
    "QuestionDataset",
    "RetrievalCollator",
    "RetrievalTask",
    "InBatchRetrievalCollator",
    "InBatchRetrievalTask",
    "RETRIEVAL_TASKS",
    "retrieval_task",
    "concat_inputs",
    "load_pretraining_state",
]


def load_pretraining_state(model_name_or_path: str) -> dict[str, torch.Tensor]:
    """The weights of a pre-training checkpoint (folder or Hub id), for heads that start from its heads."""
    from safetensors.torch import load_file
    from transformers.utils import SAFE_WEIGHTS_NAME, cached_file

    return load_file(cached_file(model_name_or_path, SAFE_WEIGHTS_NAME))


def _architecture_name(model) -> str:
    from ..registry import get_architecture

    return get_architecture(model.config.model_type).name


def _lookup(regions: Mapping[str, RegionFeatures], image_id: str) -> RegionFeatures:
    try:
        return regions[image_id]
    except KeyError:
        raise KeyError(f"no region features for image {image_id!r} in the region store") from None


def _encode(processor, texts: Sequence[str], regions: Sequence[RegionFeatures]) -> dict:
    return dict(processor(text=list(texts), regions=list(regions), return_tensors="pt"))


def _encode_captions(processor, regions: Mapping[str, RegionFeatures], examples: Sequence[dict]) -> dict:
    """The model inputs of `(caption, image_id)` examples, each caption with its image's regions."""
    return _encode(processor, [e["caption"] for e in examples], [_lookup(regions, e["image_id"]) for e in examples])


# ---------------------------------------------------------------------------------------------------- VQA
@dataclass
class VqaExample:
    """One question: `labels` are answer ids (into the model's id2label) with soft `scores`; `answers` are the
    annotators' raw answers (the references of the VQA accuracy)."""

    question: str
    image_id: str
    labels: list[int]
    scores: list[float]
    answers: list[str]


class ArrowQuestions(Sequence):
    """Questions held as an Arrow table (memory-mapped when it comes from a `datasets` cache file), read as examples
    one at a time: millions of questions cost no Python object until one is read. Subclasses name their `_COLUMNS`
    and make an example of a row (`_example`)."""

    _COLUMNS: tuple[str, ...] = ()

    def __init__(self, table: pa.Table) -> None:
        self.table = table.select(list(self._COLUMNS))

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, index):
        if isinstance(index, slice):
            return type(self)(arrow_slice(self.table, index, len(self), type(self).__name__))
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"question {index} of {len(self)}")
        return self._example(self.table.slice(index, 1).to_pylist()[0])

    def _example(self, row: dict):
        raise NotImplementedError


class VqaQuestions(ArrowQuestions):
    """VQA questions over an Arrow table, read as `VqaExample`s."""

    _COLUMNS = ("question", "image_id", "labels", "scores", "answers")

    def _example(self, row: dict) -> VqaExample:
        return VqaExample(
            row["question"],
            str(row["image_id"]),
            list(row["labels"]),
            [float(s) for s in row["scores"]],
            list(row["answers"]),
        )


def _first(mask) -> int | None:
    """The first row where a boolean Arrow array is true (None: nowhere)."""
    import pyarrow.compute as pc

    return pc.index(mask, True).as_py() if len(mask) and pc.any(mask).as_py() else None


def question_table(
    rows: datasets.Dataset | Sequence[Mapping[str, Any]], required: tuple[str, ...], where: str, task: str
) -> pa.Table:
    """The Arrow table of `rows` (a `datasets` split, zero-copy, or a list of dicts) with the `required` columns,
    every question checked (missing or blank text is an error naming the row and its image)."""
    import pyarrow as pa

    columns = rows.column_names if hasattr(rows, "column_names") else list(rows[0]) if len(rows) else []
    missing = [c for c in required if c not in columns]
    if missing:
        raise ValueError(f"{where} lacks the column(s) {missing}; {task} needs {list(required)}")
    if hasattr(rows, "with_format"):  # a datasets split: its Arrow table, zero-copy
        return _checked_questions(rows.select_columns(list(required)).with_format("arrow")[:], where)
    for number, row in enumerate(rows):  # Python rows: check the text before Arrow would refuse it
        check_text(row["question"], f"{where}: the question of row {number} (image {row['image_id']!r})")
    return _checked_questions(pa.Table.from_pylist([{c: row[c] for c in required} for row in rows]), where)


def _checked_questions(table, where: str):
    import pyarrow.compute as pc

    questions = table.column("question")
    number = _first(pc.or_kleene(pc.is_null(questions), pc.equal(pc.utf8_trim_whitespace(questions), "")))
    if number is not None:
        check_text(
            questions[number].as_py(),
            f"{where}: the question of row {number} (image {table.column('image_id')[number].as_py()!r})",
        )
    return table


class QuestionDataset(Dataset):
    """Questions read by `SampleKey` (or index): a list of examples, or `ArrowQuestions` over an Arrow table (what
    `from_rows` makes of a `datasets` split)."""

    def __init__(self, examples: Iterable[VqaExample | MultipleChoiceExample]) -> None:
        self.examples = examples if isinstance(examples, ArrowQuestions) else list(examples)

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, key: SampleKey | int):
        return self.examples[key.index if isinstance(key, SampleKey) else key]


class VqaDataset(QuestionDataset):
    """VQA questions (`VqaExample`s, or `VqaQuestions` over an Arrow table)."""

    @classmethod
    def from_rows(
        cls, rows: datasets.Dataset | Sequence[Mapping[str, Any]], num_labels: int, where: str = "the VQA data"
    ) -> "VqaDataset":
        """Rows with `question`, `image_id`, `labels`, `scores`, `answers` (a `datasets` split, kept as its Arrow
        table, or a list of dicts). Every row is checked here, naming the row, rather than mid-training."""
        import pyarrow.compute as pc

        table = question_table(rows, VqaQuestions._COLUMNS, where, "VQA")
        questions = table.column("question")
        labels, scores = table.column("labels"), table.column("scores")
        number = _first(pc.not_equal(pc.list_value_length(labels), pc.list_value_length(scores)))
        if number is not None:
            raise ValueError(
                f"question {questions[number].as_py()!r} (row {number}): "
                f"{len(labels[number])} labels but {len(scores[number])} scores"
            )
        flat = pc.list_flatten(labels)
        first = _first(pc.or_kleene(pc.less(flat, 0), pc.greater_equal(flat, num_labels)))
        if first is not None:
            number = pc.list_parent_indices(labels)[first].as_py()
            bad = [label for label in labels[number].as_py() if not 0 <= label < num_labels]
            raise ValueError(
                f"question {questions[number].as_py()!r} (row {number}) has answer ids {bad} "
                f"outside the model's {num_labels} answers"
            )
        return cls(VqaQuestions(table))


class VqaCollator:
    """Questions + regions → processor inputs and `labels` `(batch, num_labels)` soft scores."""

    def __init__(
        self, processor: VisionLanguageProcessor, regions: Mapping[str, RegionFeatures], num_labels: int
    ) -> None:
        self.processor = processor
        self.regions = regions
        self.num_labels = num_labels

    def __call__(self, examples: Sequence[VqaExample]) -> dict:
        inputs = _encode(
            self.processor, [e.question for e in examples], [_lookup(self.regions, e.image_id) for e in examples]
        )
        targets = torch.zeros(len(examples), self.num_labels)
        for row, example in enumerate(examples):
            targets[row, example.labels] = torch.tensor(example.scores)
        inputs["labels"] = targets
        return inputs


class FinetuningTask(TrainingTask):
    """What the fine-tuning tasks share: their data arguments, `(model, processor, regions, train, validation,
    dataset_name, dataset_description, base_model=None, test=None)`, which every subclass takes in this order (its
    own settings by keyword), kept as `regions`, `train`, `validation` and `test`.

    Args:
        model: the head to fine-tune; processor: its processor. regions: image id → `RegionFeatures`, for the
            images the examples name. train: the training split; validation: the split evaluated during training
            (None: none); test: the split evaluated after the last step only (None: none); each as the subclass
            reads it (e.g. a `QuestionDataset`, or `(image_id, caption)` pairs).
        dataset_name, dataset_description, base_model: recorded in the model card (`TrainingTask`).
    """

    trainer_name = "finetune.py"

    def __init__(
        self,
        model: PreTrainedModel,
        processor: VisionLanguageProcessor,
        regions: Mapping[str, RegionFeatures],
        train: Any,
        validation: Any | None,
        dataset_name: str,
        dataset_description: str,
        base_model: str | None = None,
        test: Any | None = None,
    ) -> None:
        super().__init__(model, processor, dataset_name, dataset_description, base_model)
        self.regions = regions
        self.train, self.validation, self.test = train, validation, test

    def evaluation_splits(self, final: bool) -> list[tuple[str, Any]]:
        """`(name, split)` of the splits to evaluate: validation, and after the last step (`final`) test too; the
        missing and empty ones left out."""
        splits = (("validation", self.validation), ("test", self.test if final else None))
        return [(name, split) for name, split in splits if split is not None and len(split)]


class QuestionTask(FinetuningTask):
    """What the question-answering tasks share: batches of one fixed objective (`objective`) over the train split
    (a `QuestionDataset`), evaluation over the validation split (and, after the last step, the test split) in
    order, `max_eval_samples` at most each. Subclasses set `collate_fn` and give `split_metrics`."""

    objective = "vqa"
    validation: QuestionDataset | None = None
    test: QuestionDataset | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # `FinetuningTask`'s arguments; the train split is the training data as it is.
        super().__init__(*args, **kwargs)
        self.train_dataset = self.train

    def train_sampler(self, batch_size: int, group_size: int, seed: int) -> ObjectiveBatchSampler:
        return ObjectiveBatchSampler(
            len(self.train_dataset), batch_size, FixedObjective(self.objective), seed, group_size=group_size
        )

    def ordered_loader(self, accelerator: Accelerator, dataset: QuestionDataset, batch_size: int) -> DataLoader:
        """Batches of `dataset`'s questions in order, every question once."""
        sampler = ObjectiveBatchSampler(
            len(dataset), batch_size, FixedObjective(self.objective), 0, shuffle=False, drop_last=False
        )
        return self.eval_dataloader(accelerator, dataset, sampler, self.collate_fn)

    def split_metrics(
        self,
        split: str,
        accelerator: Accelerator,
        model: torch.nn.Module,
        dataset: QuestionDataset,
        args: VlhubTrainingArguments,
    ) -> dict[str, float]:
        raise NotImplementedError

    def evaluate(
        self, accelerator: Accelerator, model: torch.nn.Module, args: VlhubTrainingArguments, final: bool = False
    ) -> dict[str, float]:
        """The validation split's metrics; after the last step also the test split's (when there is one)."""
        results = {}
        for split, dataset in self.evaluation_splits(final):
            if args.max_eval_samples:
                dataset = type(dataset)(dataset.examples[: args.max_eval_samples])
            results.update(self.split_metrics(split, accelerator, model, dataset, args))
        return results


class VqaTask(QuestionTask):
    """Fine-tune a `…ForQuestionAnswering` model; evaluation is the official VQA accuracy (`vqa_accuracy`).

    Args: `FinetuningTask`'s, the splits as `VqaDataset`s, plus `majority_baselines` (split → the accuracy of always
    giving the most frequent training answer, reported next to the model's).
    """

    def __init__(self, *args: Any, majority_baselines: dict[str, float] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.collate_fn = VqaCollator(self.processor, self.regions, self.model.config.num_labels)
        self.majority_baselines = majority_baselines or {}

    def predict(
        self, accelerator: Accelerator, model: torch.nn.Module, dataset: VqaDataset, batch_size: int
    ) -> list[str]:
        """The model's best answer for every question of `dataset`, in order."""
        predicted = []
        config = accelerator.unwrap_model(model).config
        for batch in self.ordered_loader(accelerator, dataset, batch_size):
            batch.pop("labels")
            logits = predictable_answer_logits(model(**batch).logits, config)  # never the vocabulary's "unknown"
            predicted.append(accelerator.gather_for_metrics(logits.argmax(-1)))
        id2label = config.id2label
        return [id2label[int(i)] for i in torch.cat(predicted).tolist()]

    def split_metrics(
        self,
        split: str,
        accelerator: Accelerator,
        model: torch.nn.Module,
        dataset: VqaDataset,
        args: VlhubTrainingArguments,
    ) -> dict[str, float]:
        from ..evaluation import load

        predictions = self.predict(accelerator, model, dataset, args.per_device_eval_batch_size)
        metric = load("vqa_accuracy")
        results = {
            f"{split}_vqa_accuracy": metric.compute(
                predictions=predictions, references=[e.answers for e in dataset.examples]
            )["accuracy"]
        }
        if split in self.majority_baselines:
            results[f"{split}_majority_baseline"] = self.majority_baselines[split]
        return results

    def card_info(self) -> CardInfo:
        baselines = ", ".join(f"{v:.4f} on {k}" for k, v in self.majority_baselines.items())
        return self.task_card(
            title=f"{_architecture_name(self.model)} fine-tuned for VQA on {self.dataset_name}",
            summary=(
                f"Answers questions about an image's regions with one of {self.model.config.num_labels} answers "
                f"(binary cross-entropy against VQA soft scores, as the original {_architecture_name(self.model)})."
            ),
            pipeline_tag="visual-question-answering",
            usage=(
                "import vlhub\nfrom transformers import pipeline\n\n"
                'vqa = pipeline("visual-question-answering", model="<this folder>")\n'
                'vqa(image=regions, question="what colour is the circle?", top_k=3)  # vlhub.RegionFeatures\n'
                'vqa(image="shapes.png", question="how many shapes are there?")  # when it has an extractor'
            ),
            metric_task="visual-question-answering",
            baseline_note=(
                f"VQA accuracy is the official rule (min(#annotators agreeing / 3, 1), answers normalised). "
                f"The majority-answer baseline (always the most frequent training answer) scores "
                f"{baselines}."
            )
            if baselines
            else None,
            tags=["vqa"],
        )


# ---------------------------------------------------------------------------------------------------- multiple choice
@dataclass
class MultipleChoiceExample:
    """One multiple-choice question about an image: the candidate answers `choices` and the index of the right one
    (`label`; None when it is not known, e.g. at inference)."""

    question: str
    image_id: str
    choices: list[str]
    label: int | None = None


class MultipleChoiceQuestions(ArrowQuestions):
    """Multiple-choice questions over an Arrow table, read as `MultipleChoiceExample`s."""

    _COLUMNS = ("question", "image_id", "choices", "label")

    def _example(self, row: dict) -> MultipleChoiceExample:
        return MultipleChoiceExample(row["question"], str(row["image_id"]), list(row["choices"]), int(row["label"]))


class MultipleChoiceDataset(QuestionDataset):
    """Multiple-choice questions (`MultipleChoiceExample`s, or `MultipleChoiceQuestions` over an Arrow table), all
    with the same number of choices."""

    @property
    def num_choices(self) -> int | None:
        return len(self[0].choices) if len(self) else None

    @classmethod
    def from_rows(
        cls, rows: datasets.Dataset | Sequence[Mapping[str, Any]], where: str = "the multiple-choice data"
    ) -> "MultipleChoiceDataset":
        """Rows with `question`, `image_id`, `choices` (a list of answers, as many in every row) and `label` (the
        index of the right choice), a `datasets` split (kept as its Arrow table) or a list of dicts. Every row is
        checked here, naming the row, rather than mid-training."""
        import pyarrow as pa
        import pyarrow.compute as pc

        table = question_table(rows, MultipleChoiceQuestions._COLUMNS, where, "multiple choice")
        if not len(table):
            return cls(MultipleChoiceQuestions(table))
        choices, labels = table.column("choices"), table.column("label")

        def name(number: int) -> str:
            return (
                f"{where}: row {number} (question {table.column('question')[number].as_py()!r}, image "
                f"{table.column('image_id')[number].as_py()!r})"
            )

        if not pa.types.is_list(choices.type) and not pa.types.is_large_list(choices.type):
            raise ValueError(f"{where}: 'choices' must be a list of answers per row, got {choices.type}")
        counts = pc.fill_null(pc.list_value_length(choices), 0)
        number = _first(pc.less(counts, 2))
        if number is not None:
            raise ValueError(f"{name(number)} has {counts[number].as_py()} choices; a question needs at least 2")
        number = _first(pc.not_equal(counts, counts[0]))
        if number is not None:
            raise ValueError(
                f"{name(number)} has {counts[number].as_py()} choices but row 0 has "
                f"{counts[0].as_py()}: every question of a dataset needs the same number of choices"
            )
        flat = pc.list_flatten(choices)
        if not pa.types.is_string(flat.type) and not pa.types.is_large_string(flat.type):
            raise ValueError(f"{where}: the choices must be texts, got {flat.type}")
        first = _first(pc.or_kleene(pc.is_null(flat), pc.equal(pc.utf8_trim_whitespace(flat), "")))
        if first is not None:
            number = pc.list_parent_indices(choices)[first].as_py()
            check_text(flat[first].as_py(), f"{name(number)}: choice {first - number * counts[0].as_py()}")
        if not pa.types.is_integer(labels.type):
            raise ValueError(f"{where}: 'label' must be the index of the right choice (an integer), got {labels.type}")
        number = _first(
            pc.or_kleene(pc.is_null(labels), pc.or_kleene(pc.less(labels, 0), pc.greater_equal(labels, counts[0])))
        )
        if number is not None:
            raise ValueError(
                f"{name(number)} has the label {labels[number].as_py()!r}, outside its "
                f"{counts[0].as_py()} choices (0..{counts[0].as_py() - 1})"
            )
        return cls(MultipleChoiceQuestions(table))


def _choices_and_labels(dataset: MultipleChoiceDataset):
    """Every choice of `dataset`, flat (an Arrow string array, question by question), and the labels (numpy)."""
    import pyarrow as pa

    examples = dataset.examples
    if isinstance(examples, ArrowQuestions):
        table = examples.table
        return (
            pa.concat_arrays([chunk.flatten() for chunk in table.column("choices").chunks])
            if len(table)
            else pa.array([], pa.string()),
            table.column("label").to_numpy(),
        )
    return (
        pa.array([c for e in examples for c in e.choices], pa.string()),
        np.array([e.label for e in examples], dtype=np.int64),
    )


def answer_prior_baseline(train: MultipleChoiceDataset, dataset: MultipleChoiceDataset) -> float:
    """The accuracy on `dataset` of ignoring the image and the question: choosing the choice that was the right
    answer most often in `train` (ties: the first). A model that beats it uses more than the answers' frequencies."""
    import pyarrow as pa
    import pyarrow.compute as pc

    count = train.num_choices
    flat, labels = _choices_and_labels(train)
    right = pc.take(flat, pa.array(np.arange(len(labels)) * count + labels))
    frequencies = pc.value_counts(right)
    answers, counts = frequencies.field("values"), frequencies.field("counts").to_numpy()
    flat, labels = _choices_and_labels(dataset)
    where = pc.fill_null(pc.index_in(flat, value_set=answers), -1).to_numpy()
    prior = np.where(where >= 0, np.append(counts, 0)[where], 0).reshape(len(labels), count)
    return float((prior.argmax(1) == labels).mean())


def check_image_ids(dataset: QuestionDataset, regions: Mapping[str, RegionFeatures], where: str) -> None:
    """Every image id of `dataset` has region features in `regions`; else an error naming the first question
    without them."""
    examples = dataset.examples
    ids = (
        examples.table.column("image_id").cast("string").to_pylist()
        if isinstance(examples, ArrowQuestions)
        else [e.image_id for e in examples]
    )
    for number, image_id in enumerate(ids):
        if image_id not in regions:
            raise ValueError(
                f"{where}: row {number} (question {dataset[number].question!r}) is about image "
                f"{image_id!r}, which has no region features in the region store"
            )


def encode_choices(
    processor: VisionLanguageProcessor, questions: Sequence[str], choices: Sequence[Sequence[str]]
) -> dict:
    """Each question paired with each of its choices, laid out by the processor: `input_ids`, `attention_mask`,
    `token_type_ids` (and any other per-token input the processor gives) `(batch, num_choices, text_length)`, and
    per-question inputs (ViLBERT's `task_ids`) `(batch, ...)`.

    An architecture that declares `choice_layout="vcr"` (VL-BERT) has its processor lay out every choice as its
    original VCR model (`vcr_text`): `[CLS] question [SEP] choice [SEP]`, the choice and its `[SEP]` of token type 1.
    The other processors (`choice_layout="pair"`) take one
    text per example: the pair is joined into one, `[CLS] question [SEP] choice [SEP]` (the word pieces of both with
    the tokenizer's `[SEP]` between), every token of the processor's text type, a pair too long for the processor
    cut as VL-BERT cuts one (`_cut_pair`). That is the originals' layout, but for the type of the second segment:
    ViLBERT and TDEN give it type 1, UNITER a type row it adds for VCR, initialised from row 0 (the text's)."""
    batch, count = len(questions), len(choices[0])
    architecture = architecture_of_processor(processor)
    if architecture is not None and architecture.choice_layout == "vcr":
        rows = [
            processor.vcr_text([q], [[c] for c in cs], objects=[], max_length=processor.max_text_length - 3)
            for q, cs in zip(questions, choices)
        ]
        length = max(r["input_ids"].shape[1] for r in rows)
        pad = {"input_ids": processor.tokenizer.pad_token_id}
        return {
            name: torch.stack(
                [torch.nn.functional.pad(r[name], (0, length - r[name].shape[1]), value=pad.get(name, 0)) for r in rows]
            )
            for name in rows[0]
        }
    sep = processor.tokenizer.sep_token_id
    question_pieces = processor.word_pieces(text=list(questions))
    choice_pieces = processor.word_pieces(text=[c for cs in choices for c in cs])
    # Room for both texts and the [SEP] between them within the processor's limit, its own tokens aside.
    room = processor.max_text_length - len(processor.build_text_inputs([])[0]) - 1
    pairs = [_cut_pair(question_pieces[k // count], pieces, room) for k, pieces in enumerate(choice_pieces)]
    pairs = [question + [sep] + choice for question, choice in pairs]
    flat = processor(token_ids=pairs, return_tensors="pt")
    length = flat["input_ids"].shape[1]
    return {
        name: value.view(batch, count, length)
        if value.ndim == 2 and value.shape[1] == length
        else value.view(batch, count, *value.shape[1:])[:, 0]
        for name, value in flat.items()
    }


def _cut_pair(question: list[int], choice: list[int], room: int) -> tuple[list[int], list[int]]:
    """A (question, choice) pair of word pieces cut to `room` pieces as VL-BERT's original cuts VCR's Q→A pairs:
    the last piece of the longer of the two, until they fit (so a long question never pushes the choice out)."""
    question, choice, limit = list(question), list(choice), max(room, 2)
    if len(question) + len(choice) > limit:
        warnings.warn(
            f"a question-choice pair of {len(question)} + {len(choice)} word pieces is truncated to "
            f"{limit} (the processor's max_text_length), the longer text's last pieces first",
            stacklevel=3,
        )
    while len(question) + len(choice) > limit:
        (choice if len(choice) > len(question) else question).pop()
    return question, choice


class MultipleChoiceCollator:
    """Multiple-choice questions + regions → the text of every (question, choice) pair `(batch, num_choices,
    text_length)` (`encode_choices`), the regions once per question `(batch, num_regions, ...)` (shared by its
    choices), and `labels` `(batch,)` (the right choices' indices) when every example has one."""

    def __init__(self, processor: VisionLanguageProcessor, regions: Mapping[str, RegionFeatures]) -> None:
        self.processor = processor
        self.regions = regions

    def __call__(self, examples: Sequence[MultipleChoiceExample]) -> dict:
        counts = {len(e.choices) for e in examples}
        if len(counts) != 1:
            raise ValueError(f"the questions of a batch need the same number of choices, got {sorted(counts)}")
        inputs = encode_choices(self.processor, [e.question for e in examples], [e.choices for e in examples])
        inputs.update(
            self.processor(regions=[_lookup(self.regions, e.image_id) for e in examples], return_tensors="pt")
        )
        if all(e.label is not None for e in examples):
            inputs["labels"] = torch.tensor([e.label for e in examples], dtype=torch.long)
        return inputs


class MultipleChoiceTask(QuestionTask):
    """Fine-tune a `…ForMultipleChoice` model (VCR-style answer selection): each (question, choice) pair is scored
    with the image and the head's loss (its original's: cross-entropy over the choices, VL-BERT's binary
    cross-entropy against the one-hot answer) trains the scores. Evaluation reports the accuracy (the best-scored
    choice is the right one), the head's loss, and the accuracy of the answer prior (`answer_prior_baseline`).

    Args: `FinetuningTask`'s, the splits as `MultipleChoiceDataset`s with the same number of choices.
    """

    objective = "multiple_choice"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        splits = {"train": self.train, "validation": self.validation, "test": self.test}
        counts = {split: d.num_choices for split, d in splits.items() if d is not None and len(d)}
        if not counts.get("train"):
            raise ValueError("multiple choice needs training questions; the train split is empty")
        if len(set(counts.values())) > 1:
            raise ValueError(f"every split needs the same number of choices, got {counts}")
        for split, dataset in splits.items():
            if dataset is not None:
                check_image_ids(dataset, self.regions, f"the {split} split")
        self.num_choices = counts["train"]
        self.collate_fn = MultipleChoiceCollator(self.processor, self.regions)

    def split_metrics(
        self,
        split: str,
        accelerator: Accelerator,
        model: torch.nn.Module,
        dataset: MultipleChoiceDataset,
        args: VlhubTrainingArguments,
    ) -> dict[str, float]:
        right, losses = [], []
        for batch in self.ordered_loader(accelerator, dataset, args.per_device_eval_batch_size):
            outputs = model(**batch)
            right.append(accelerator.gather_for_metrics(outputs.logits.argmax(-1) == batch["labels"]))
            # The batch's mean loss once per question, so that the mean over questions weighs batches by size.
            losses.append(accelerator.gather_for_metrics(outputs.loss.detach().float().expand(len(batch["labels"]))))
        return {
            f"{split}_accuracy": torch.cat(right).float().mean().item(),
            f"{split}_loss": torch.cat(losses).mean().item(),
            f"{split}_answer_prior_baseline": answer_prior_baseline(self.train_dataset, dataset),
        }

    def hyperparameters(self) -> dict:
        return {"choices per question": self.num_choices}

    def card_info(self) -> CardInfo:
        name = _architecture_name(self.model)
        usage = (
            "import vlhub\nfrom transformers import AutoModelForMultipleChoice, AutoProcessor\n"
            "from vlhub.training.finetuning import MultipleChoiceCollator, MultipleChoiceExample\n\n"
            'model = AutoModelForMultipleChoice.from_pretrained("<this folder>")\n'
            'processor = AutoProcessor.from_pretrained("<this folder>")\n'
            'collate = MultipleChoiceCollator(processor, {"img": regions})  # vlhub.RegionFeatures\n'
            'batch = collate([MultipleChoiceExample("what colour is the circle?", "img", '
            '["red", "blue", "green", "purple"])])\n'
            "model(**batch).logits.argmax(-1)  # the chosen answer's index"
        )
        summary = (
            f"Chooses the right answer to a question about an image's regions among {self.num_choices} "
            f"candidates (VCR-style Q→A): each (question, candidate) pair is scored with the image, trained "
            f"with {name}'s multiple-choice loss."
        )
        return self.task_card(
            f"{name} fine-tuned for multiple-choice answer selection on {self.dataset_name}",
            summary,
            usage,
            "multiple-choice",
            baseline_note=(
                "The answer-prior baseline ignores the image and the question: it picks the "
                "choice that was right most often in training; chance is "
                f"{1 / self.num_choices:.4f}."
            ),
            tags=["multiple-choice", "vcr"],
        )


# ---------------------------------------------------------------------------------------------------- retrieval
def concat_inputs(parts: Sequence[dict]) -> dict:
    """Concatenate processor outputs along the batch, padding text and regions to the longest part."""
    text = max(p["input_ids"].shape[1] for p in parts)
    regions = max(p["region_features"].shape[1] for p in parts)
    out: dict[str, list[torch.Tensor]] = {}
    for part in parts:
        for key, value in part.items():
            if key in ("input_ids", "attention_mask", "token_type_ids"):
                value = torch.nn.functional.pad(value, (0, text - value.shape[1]))
            elif key in ("region_features", "region_locations"):
                value = torch.nn.functional.pad(value, (0, 0, 0, regions - value.shape[1]))
            elif key == "region_attention_mask":
                value = torch.nn.functional.pad(value, (0, regions - value.shape[1]))
            out.setdefault(key, []).append(value)
    return {k: torch.cat(v) for k, v in out.items()}


class RetrievalCollator:
    """Positive (caption, image) pairs plus, per positive, `num_sampled` random negative images (for the caption)
    and `num_sampled` random negative captions (of other images, for the image); hard negatives are chosen among
    them by the model in `RetrievalTask.training_step`, as the original's `ItmHardNeg` data does (399 → 31)."""

    def __init__(
        self,
        processor: VisionLanguageProcessor,
        regions: Mapping[str, RegionFeatures],
        pairs: Sequence[tuple[str, str]],
        num_sampled: int,
    ) -> None:
        self.processor = processor
        self.regions = regions
        self.pairs = list(pairs)
        self.image_ids = sorted({i for i, _ in self.pairs})
        self.num_sampled = num_sampled
        if len(self.image_ids) <= num_sampled:
            raise ValueError(
                f"{num_sampled} sampled negatives need more than {num_sampled} images; the data has "
                f"{len(self.image_ids)}"
            )

    def __call__(self, examples: Sequence[dict]) -> dict:
        rngs = [example_rng(SampleKey(0, "retrieval", tuple(e["seed"]))) for e in examples]
        positives = _encode_captions(self.processor, self.regions, examples)
        image_texts, image_regions, text_texts, text_regions = [], [], [], []
        for example, rng in zip(examples, rngs):
            others = [
                i
                for i in rng.choice(len(self.image_ids), self.num_sampled + 1, replace=False)
                if self.image_ids[i] != example["image_id"]
            ][: self.num_sampled]
            image_texts += [example["caption"]] * self.num_sampled
            image_regions += [_lookup(self.regions, self.image_ids[i]) for i in others]
            captions = []
            while len(captions) < self.num_sampled:
                image_id, caption = self.pairs[int(rng.integers(len(self.pairs)))]
                if image_id != example["image_id"]:
                    captions.append(caption)
            text_texts += captions
            text_regions += [_lookup(self.regions, example["image_id"])] * self.num_sampled
        return {
            "positives": positives,
            "image_negatives": _encode(self.processor, image_texts, image_regions),
            "text_negatives": _encode(self.processor, text_texts, text_regions),
        }


_RENAMED_RETRIEVAL_SPLITS = {"train_pairs": "train", "validation_pairs": "validation"}


class RetrievalTask(FinetuningTask):
    """Fine-tune `…ForImageTextRetrieval` with the original's hinge loss over [positive, hard negatives] groups in
    both directions; evaluation is recall@1/5/10 both ways (`retrieval_recall`) over a validation gallery.

    Args: `FinetuningTask`'s but the test split, the splits as `(image_id, caption)` pairs, plus `num_sampled`
    (random negatives per positive and direction), `num_hard` (the hardest of them trained on) and
    `max_gallery_images` (the validation gallery's size at most).
    """

    def __init__(
        self, *args: Any, num_sampled: int = 15, num_hard: int = 3, max_gallery_images: int = 50, **kwargs: Any
    ) -> None:
        for old, new in _RENAMED_RETRIEVAL_SPLITS.items():  # the keyword names before FinetuningTask's
            if old in kwargs:
                replaced_name(f"{type(self).__name__}'s {old}=", f"{new}=")
                kwargs[new] = kwargs.pop(old)
        super().__init__(*args, **kwargs)
        if self.test is not None:
            raise TypeError(f"{type(self).__name__} takes no test split: it evaluates over the validation gallery")
        self.train_dataset = CaptionDataset(self.train)
        self.validation = list(self.validation)
        self.num_sampled, self.num_hard = num_sampled, num_hard
        self.collate_fn = self.train_collator(self.train)
        self.max_gallery_images = max_gallery_images

    def train_collator(self, train_pairs: Sequence[tuple[str, str]]) -> Callable[[Sequence[dict]], dict]:
        """The training batches' collator (here: positives plus sampled negatives for each)."""
        if not 1 <= self.num_hard <= self.num_sampled:
            raise ValueError(
                f"hard negatives ({self.num_hard}) must be between 1 and the sampled negatives ({self.num_sampled})"
            )
        return RetrievalCollator(self.processor, self.regions, train_pairs, self.num_sampled)

    def train_sampler(self, batch_size: int, group_size: int, seed: int) -> ObjectiveBatchSampler:
        return ObjectiveBatchSampler(
            len(self.train_dataset), batch_size, FixedObjective("retrieval"), seed, group_size=group_size
        )

    def training_step(self, model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        positives = batch["positives"]
        size = positives["input_ids"].shape[0]
        groups = [[] for _ in range(size)]
        was_training = model.training
        model.eval()
        with torch.no_grad():
            for name in ("image_negatives", "text_negatives"):
                scores = model(**batch[name]).logits.view(size, self.num_sampled)
                hardest = scores.topk(self.num_hard, dim=1).indices
                for row in range(size):
                    groups[row].append((name, (row * self.num_sampled + hardest[row]).tolist()))
        model.train(was_training)
        parts = []
        for row in range(size):
            for name, indices in groups[row]:
                parts.append({k: v[row : row + 1] for k, v in positives.items()})
                parts.append({k: v[indices] for k, v in batch[name].items()})
        outputs = model(**concat_inputs(parts), num_negatives=self.num_hard)
        return outputs.loss, {}

    def evaluate(
        self, accelerator: Accelerator, model: torch.nn.Module, args: VlhubTrainingArguments, final: bool = False
    ) -> dict[str, float]:
        from ..evaluation import load

        images = sorted({i for i, _ in self.validation})[: self.max_gallery_images]
        index = {image_id: k for k, image_id in enumerate(images)}
        texts = [(image_id, caption) for image_id, caption in self.validation if image_id in index]
        if not texts:
            return {}
        matrix = self.gallery_scores(accelerator, model, args, texts, images)
        metric = load("retrieval_recall")
        result = metric.compute(predictions=matrix.tolist(), references=[index[i] for i, _ in texts])
        return {k: float(v) for k, v in result.items()}

    def gallery_scores(
        self,
        accelerator: Accelerator,
        model: torch.nn.Module,
        args: VlhubTrainingArguments,
        texts: Sequence[tuple[str, str]],
        images: Sequence[str],
    ) -> np.ndarray:
        """`(T, I)` scores of every gallery text (`(image_id, caption)`) against every gallery image id: the model
        runs over the `gallery_pairs`, in batches, and `gallery_matrix` makes the matrix of what `gallery_outputs`
        takes from each batch (gathered from every process, in order)."""
        gathered: dict[str, list[torch.Tensor]] = {}
        for batch in self._gallery_loader(accelerator, args, self.gallery_pairs(texts, images)):
            for name, value in self.gallery_outputs(model, batch).items():
                gathered.setdefault(name, []).append(accelerator.gather_for_metrics(value.float()))
        outputs = {name: torch.cat(values) for name, values in gathered.items()}
        return self.gallery_matrix(outputs, len(texts), len(images)).cpu().numpy().astype(np.float64)

    def gallery_pairs(self, texts: Sequence[tuple[str, str]], images: Sequence[str]) -> list[tuple[str, str]]:
        """The `(image_id, caption)` pairs the model runs over: here every pair, text-major."""
        return [(image_id, caption) for _, caption in texts for image_id in images]

    def gallery_outputs(self, model: torch.nn.Module, batch: dict) -> dict[str, torch.Tensor]:
        """What `gallery_matrix` needs of one batch of pairs: here each pair's cross-encoded score `(batch,)`."""
        return {"scores": model(**batch).logits.squeeze(-1)}

    def gallery_matrix(self, outputs: dict[str, torch.Tensor], num_texts: int, num_images: int) -> torch.Tensor:
        """The `(T, I)` scores from `gallery_outputs` of all the pairs: here the text-major scores, reshaped."""
        return outputs["scores"].view(num_texts, num_images)

    def _gallery_loader(self, accelerator, args, pairs):
        """Evaluation batches of `(image_id, caption)` pairs, in order."""
        dataset = CaptionDataset(pairs)
        sampler = ObjectiveBatchSampler(
            len(dataset),
            max(args.per_device_eval_batch_size, 64),
            FixedObjective("retrieval"),
            0,
            shuffle=False,
            drop_last=False,
        )

        def collate(examples):
            return _encode_captions(self.processor, self.regions, examples)

        return self.eval_dataloader(accelerator, dataset, sampler, collate)

    def hyperparameters(self) -> dict:
        return {"sampled / hard negatives": f"{self.num_sampled} / {self.num_hard}"}

    def card_info(self) -> CardInfo:
        return self.task_card(
            title=f"{_architecture_name(self.model)} fine-tuned for image-text retrieval on {self.dataset_name}",
            summary=_retrieval_summary(self.model.config),
            usage=(
                "import vlhub\nfrom transformers import pipeline\n\n"
                'retrieval = pipeline("image-text-retrieval", model="<this folder>")\n'
                'retrieval(image=regions, texts=["a red circle", "two blue squares"])'
            ),
            metric_task="image-text-retrieval",
            tags=["image-text-retrieval"],
        )


class InBatchRetrievalCollator:
    """Positive (caption, image) pairs only, plus `image_ids` `(batch,)`: one id per distinct image of the batch, so
    that a model scoring every caption against every image of the batch does not take a caption of the same image
    for a negative."""

    def __init__(self, processor: VisionLanguageProcessor, regions: Mapping[str, RegionFeatures]) -> None:
        self.processor = processor
        self.regions = regions

    def __call__(self, examples: Sequence[dict]) -> dict:
        batch = _encode_captions(self.processor, self.regions, examples)
        ids: dict[str, int] = {}
        batch["image_ids"] = torch.tensor([ids.setdefault(e["image_id"], len(ids)) for e in examples])
        return batch


class InBatchRetrievalTask(RetrievalTask):
    """Fine-tune a retrieval head that ranks within the batch (of an architecture that declares
    `retrieval_negatives="in_batch"`, e.g. TDEN's dual encoder): each batch is positive pairs only, and the model's own loss
    (`forward(..., image_ids=..., return_loss=True)`) takes the negatives among the batch's other images and
    captions (TDEN: X-modaler's `BatchTriplet`, the hardest in-batch negative both ways, margin
    `config.ranking_margin`). Evaluation reports `RetrievalTask`'s recall@1/5/10 both ways over a validation gallery,
    but encodes each text and each image once: such a head scores a pair as the dot product of its `text_embeds`
    (from the text alone) and `image_embeds` (from the regions alone), so T texts against I images take max(T, I)
    encodings instead of T x I cross-encodings."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # `RetrievalTask`'s arguments but the sampled-negative settings, which do not apply to in-batch negatives.
        for name in ("num_sampled", "num_hard"):
            if name in kwargs:
                raise TypeError(f"InBatchRetrievalTask takes no {name}: its negatives are the batch's other pairs")
        super().__init__(*args, **kwargs)

    def train_collator(self, train_pairs: Sequence[tuple[str, str]]) -> Callable[[Sequence[dict]], dict]:
        return InBatchRetrievalCollator(self.processor, self.regions)

    def train_sampler(self, batch_size: int, group_size: int, seed: int) -> ObjectiveBatchSampler:
        if batch_size < 2:
            raise ValueError(f"in-batch negatives need at least 2 pairs per batch, got a batch size of {batch_size}")
        return super().train_sampler(batch_size, group_size, seed)

    def training_step(self, model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return model(**batch, return_loss=True).loss, {}

    def gallery_pairs(self, texts: Sequence[tuple[str, str]], images: Sequence[str]) -> list[tuple[str, str]]:
        # Pair k is (text k mod T, image k mod I): every text and every image is encoded at least once.
        count = max(len(texts), len(images))
        return [(images[k % len(images)], texts[k % len(texts)][1]) for k in range(count)]

    def gallery_outputs(self, model: torch.nn.Module, batch: dict) -> dict[str, torch.Tensor]:
        outputs = model(**batch, return_loss=False)
        return {"text_embeds": outputs.text_embeds, "image_embeds": outputs.image_embeds}

    def gallery_matrix(self, outputs: dict[str, torch.Tensor], num_texts: int, num_images: int) -> torch.Tensor:
        return outputs["text_embeds"][:num_texts] @ outputs["image_embeds"][:num_images].t()

    def hyperparameters(self) -> dict:
        margin = getattr(self.model.config, "ranking_margin", None)
        return {
            "negatives": "hardest in the batch, both directions" + (f" (margin {margin})" if margin is not None else "")
        }

    def card_info(self) -> CardInfo:
        info = super().card_info()
        info.summary = (
            "Scores how well a text matches an image's regions, trained with the architecture's "
            "original in-batch ranking loss (the hardest negative of the batch in both directions)."
        )
        return info


# How each kind of retrieval head trains (the architecture's declared `retrieval_negatives`).
RETRIEVAL_TASKS = {"sampled": RetrievalTask, "in_batch": InBatchRetrievalTask}


def retrieval_task(
    model: PreTrainedModel, *args: Any, num_sampled: int = 15, num_hard: int = 3, **kwargs: Any
) -> RetrievalTask:
    """The retrieval task that trains `model` as its original did: `RetrievalTask` (sampled negatives, the hardest
    `num_hard` of `num_sampled` trained on) or, for an architecture that declares `retrieval_negatives="in_batch"`,
    `InBatchRetrievalTask` (the sampled-negative settings do not apply). Takes `RetrievalTask`'s arguments."""
    kind = get_architecture(model.config.model_type).retrieval_negatives
    sampled = dict(num_sampled=num_sampled, num_hard=num_hard) if kind == "sampled" else {}
    return RETRIEVAL_TASKS[kind](model, *args, **sampled, **kwargs)


def _retrieval_summary(config) -> str:
    # UNITER trains with a hinge loss (its config has the margin); other heads with their own ranking loss.
    margin = getattr(config, "ranking_margin", None)
    loss = f"the original hinge loss (margin {margin})" if margin is not None else "the architecture's ranking loss"
    return (
        f"Scores how well a text matches an image's regions, trained with {loss} over hard negatives in both "
        "directions."
    )
