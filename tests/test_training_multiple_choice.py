"""finetune.py --task multiple_choice: the shapes world's multiple-choice questions (seeded distractors), the
collator's (batch, choices, ...) layout per processor, checks of bad rows, and tiny end-to-end runs for every
architecture with a multiple-choice head."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch

import vlhub
from tests.training_helpers import (
    COLOURS,
    reset_accelerate_state,
    synthetic_corpus,
    tiny_pretraining_run,
    tiny_tokenizer,
)
from vlhub.data import ShapesWorld
from vlhub.data.shapes_language import draw_choices
from vlhub.registry import get_architecture
from vlhub.training.finetuning import (
    MultipleChoiceCollator,
    MultipleChoiceDataset,
    MultipleChoiceExample,
    MultipleChoiceTask,
)

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")

MULTIPLE_CHOICE_TYPES = ["uniter", "vl_bert", "vilbert", "tden"]


# ---------------------------------------------------------------------------------------------------- distractors
def test_draw_choices_is_seeded_keeps_the_answer_once_and_draws_from_the_pool():
    pool = ["red", "green", "blue", "yellow", "purple", "red"]
    drawn = [draw_choices("blue", pool, 4, np.random.default_rng([7, k])) for k in range(40)]
    assert drawn == [draw_choices("blue", pool, 4, np.random.default_rng([7, k])) for k in range(40)]
    for choices, label in drawn:
        assert len(choices) == 4 and choices[label] == "blue" and choices.count("blue") == 1
        assert len(set(choices)) == 4 and set(choices) <= set(pool)
    assert {label for _, label in drawn} == {0, 1, 2, 3}  # the right answer's position is shuffled
    # An answer outside the pool is still the right one; a pool too small for the distractors is refused.
    choices, label = draw_choices("orange", pool, 3, np.random.default_rng(0))
    assert choices[label] == "orange" and choices.count("orange") == 1
    with pytest.raises(
        ValueError, match=r"4 choices for the answer 'yes' need 3 other answers of its type, there are 1"
    ):
        draw_choices("yes", ["yes", "no"], 4, np.random.default_rng(0))


def test_shapes_multiple_choice_questions_come_from_its_vqa_questions():
    world = ShapesWorld(seed=3, num_train=30, num_validation=6, num_test=6)
    vqa = world.vqa()
    # The pools, independently: the train split's majority answers per answer type.
    pools = defaultdict(set)
    for kind, answer in zip(vqa["train"]["answer_type"], vqa["train"]["multiple_choice_answer"]):
        pools[kind].add(answer)
    mc = world.multiple_choice(num_choices=4)
    assert (
        world.multiple_choice_skipped_types(4)
        == sorted(k for k, p in pools.items() if len(p) < 4)
        == ["size", "yes/no"]
    )
    for split in ("train", "validation", "test"):
        questions = {row["question_id"]: row for row in vqa[split]}
        kept = [row for row in vqa[split] if len(pools[row["answer_type"]]) >= 4]
        assert len(mc[split]) == len(kept) > 0
        for row in mc[split]:
            source = questions[row["question_id"]]
            assert (row["image_id"], row["question"], row["answer_type"]) == (
                source["image_id"],
                source["question"],
                source["answer_type"],
            )
            right = source["multiple_choice_answer"]
            assert len(row["choices"]) == 4 and row["choices"][row["label"]] == right
            assert row["choices"].count(right) == 1 and len(set(row["choices"])) == 4
            assert set(row["choices"]) - {right} <= pools[row["answer_type"]]
    assert len(set(mc["train"]["label"])) == 4
    again = ShapesWorld(seed=3, num_train=30, num_validation=6, num_test=6).multiple_choice(4)
    assert again["train"].to_list() == mc["train"].to_list()
    two = world.multiple_choice(num_choices=2)
    assert len(two["train"]) == len(vqa["train"]) and all(len(c) == 2 for c in two["train"]["choices"])


# ---------------------------------------------------------------------------------------------------- collator
def processor_of(model_type: str, tmp_path):
    return get_architecture(model_type).build_processor(tiny_tokenizer(tmp_path), 12).for_task("multiple_choice")


@pytest.mark.parametrize("model_type", MULTIPLE_CHOICE_TYPES)
def test_collator_gives_a_row_per_choice_and_regions_once_per_question(tmp_path, model_type):
    corpus = synthetic_corpus()
    processor = processor_of(model_type, tmp_path)
    examples = [
        MultipleChoiceExample("the circle", "img000", ["red", "blue", "green"], 1),
        MultipleChoiceExample("the small square", "img001", ["red", "blue and green", "yellow"], 2),
    ]
    batch = MultipleChoiceCollator(processor, corpus.regions)(examples)
    assert batch["input_ids"].shape[:2] == (2, 3) and batch["attention_mask"].shape == batch["input_ids"].shape
    assert batch["token_type_ids"].shape == batch["input_ids"].shape
    single = processor(regions=[corpus.regions["img000"], corpus.regions["img001"]], return_tensors="pt")
    assert torch.equal(batch["region_features"], single["region_features"])  # (batch, regions, dim): shared
    assert batch["labels"].tolist() == [1, 2] and batch["labels"].dtype == torch.long
    tokenizer = processor.tokenizer
    for b, example in enumerate(examples):
        for k, choice in enumerate(example.choices):
            ids = batch["input_ids"][b, k][batch["attention_mask"][b, k].bool()].tolist()
            assert tokenizer.decode(ids) == f"[CLS] {example.question} [SEP] {choice} [SEP]"
            types = batch["token_type_ids"][b, k][: len(ids)].tolist()
            question_length = len(tokenizer.tokenize(example.question)) + 2
            # VL-BERT's VCR layout marks the choice and its [SEP] with type 1; the joined text keeps one type.
            second = 1 if model_type == "vl_bert" else types[0]
            assert types == [types[0]] * question_length + [second] * (len(ids) - question_length)
    unlabelled = MultipleChoiceCollator(processor, corpus.regions)(
        [MultipleChoiceExample("the circle", "img000", ["red", "blue"])]
    )
    assert "labels" not in unlabelled and unlabelled["input_ids"].shape[:2] == (1, 2)
    with pytest.raises(ValueError, match=r"the same number of choices, got \[2, 3\]"):
        MultipleChoiceCollator(processor, corpus.regions)([examples[0], unlabelled_example()])


def unlabelled_example():
    return MultipleChoiceExample("the circle", "img000", ["red", "blue"], 0)


def test_vilbert_task_ids_stay_one_per_question(tmp_path):
    tokenizer = tiny_tokenizer(tmp_path)
    processor = vlhub.VilbertProcessor(
        feature_extractor=vlhub.VilbertRegionProcessor(region_feature_dim=12),
        tokenizer=tokenizer,
        num_task_tokens=20,
        task_id=5,
    )
    examples = [MultipleChoiceExample("the circle", "img000", ["red", "blue", "green"], 0)] * 2
    batch = MultipleChoiceCollator(processor, synthetic_corpus().regions)(examples)
    assert batch["task_ids"].tolist() == [[5], [5]] and batch["input_ids"].shape[:2] == (2, 3)


# ---------------------------------------------------------------------------------------------------- bad input
ROWS = [
    {"question": "the circle", "image_id": "img000", "choices": ["red", "blue", "green"], "label": 0},
    {"question": "the square", "image_id": "img001", "choices": ["red", "blue", "green"], "label": 2},
    {"question": "the triangle", "image_id": "img002", "choices": ["red", "blue", "green"], "label": 1},
]


@pytest.mark.parametrize("as_datasets", [False, True])
@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"choices": ["red", "blue"]},
            r"row 1 \(question 'the square', image 'img001'\) has 2 choices but row 0 has 3",
        ),
        (
            {"label": 3},
            r"row 1 \(question 'the square', image 'img001'\) has the label 3, outside its 3 choices \(0\.\.2\)",
        ),
        ({"label": -1}, r"row 1 .* has the label -1, outside its 3 choices"),
        ({"choices": ["red", " ", "green"]}, r"row 1 \(question 'the square', image 'img001'\): choice 1"),
        ({"question": ""}, r"the question of row 1 \(image 'img001'\)"),
    ],
)
def test_bad_rows_are_refused_naming_the_row(change, message, as_datasets):
    import datasets

    rows = [dict(row, **change) if i == 1 else row for i, row in enumerate(ROWS)]
    with pytest.raises(ValueError, match=message):
        MultipleChoiceDataset.from_rows(datasets.Dataset.from_list(rows) if as_datasets else rows)


def test_rows_need_the_columns_and_a_choice_list():
    with pytest.raises(ValueError, match=r"lacks the column\(s\) \['label'\]; multiple choice needs"):
        MultipleChoiceDataset.from_rows([{k: v for k, v in row.items() if k != "label"} for row in ROWS])
    with pytest.raises(ValueError, match="has 1 choices; a question needs at least 2"):
        MultipleChoiceDataset.from_rows([dict(ROWS[0], choices=["red"])])
    dataset = MultipleChoiceDataset.from_rows(ROWS)
    assert dataset.num_choices == 3 and dataset[1] == MultipleChoiceExample(
        "the square", "img001", ["red", "blue", "green"], 2
    )


def test_task_refuses_unknown_images_and_uneven_splits(tmp_path):
    corpus = synthetic_corpus()
    processor = processor_of("uniter", tmp_path)
    model = torch.nn.Linear(1, 1)
    rows = [dict(row) for row in ROWS]
    rows[2]["image_id"] = "nowhere"
    with pytest.raises(
        ValueError,
        match=r"the train split: row 2 \(question 'the triangle'\) is about image "
        r"'nowhere', which has no region features",
    ):
        MultipleChoiceTask(model, processor, corpus.regions, MultipleChoiceDataset.from_rows(rows), None, "d", "d")
    two = MultipleChoiceDataset.from_rows([dict(ROWS[0], choices=["red", "blue"], label=1)])
    with pytest.raises(ValueError, match=r"the same number of choices, got \{'train': 3, 'validation': 2\}"):
        MultipleChoiceTask(model, processor, corpus.regions, MultipleChoiceDataset.from_rows(ROWS), two, "d", "d")


@pytest.mark.parametrize("as_datasets", [False, True])
def test_answer_prior_baseline_picks_the_answer_most_often_right_in_training(as_datasets):
    import datasets

    from vlhub.training.finetuning import answer_prior_baseline

    def make(rows):
        rows = [{"question": "q", "image_id": "i", "choices": c, "label": label} for c, label in rows]
        return MultipleChoiceDataset.from_rows(datasets.Dataset.from_list(rows) if as_datasets else rows)

    train = make([(["red", "blue", "green"], 0), (["blue", "red", "green"], 1), (["green", "blue", "red"], 1)])
    # red was right twice, blue once: red, then blue (at index 2), then the first of three never-right answers.
    held_out = make(
        [
            (["blue", "red", "green"], 1),
            (["green", "yellow", "blue"], 0),
            (["green", "yellow", "purple"], 0),
            (["purple", "blue", "red"], 1),
        ]
    )
    assert answer_prior_baseline(train, held_out) == pytest.approx(2 / 4)


# ---------------------------------------------------------------------------------------------------- finetune.py
def colour_choice_rows(pairs) -> list[dict]:
    """'the <shape>' of each caption's first object, with its colour among 3 choices at a rotating position."""
    rows = []
    for k, (image_id, caption) in enumerate(pairs):
        words = caption.split()
        colour, shape = words[1], words[2]
        others = [c for c in COLOURS if c != colour][:2]
        label = k % 3
        rows.append(
            {
                "image_id": image_id,
                "question": f"the {shape}",
                "choices": [*others[:label], colour, *others[label:]],
                "label": label,
            }
        )
    return rows


def write_choice_dataset(folder) -> None:
    import datasets

    corpus = synthetic_corpus()
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(colour_choice_rows(corpus.train)),
            "validation": datasets.Dataset.from_list(colour_choice_rows(corpus.validation)),
        }
    ).save_to_disk(str(folder))


@pytest.mark.parametrize(
    "model_type",
    # The fast loop keeps uniter's run (the cheapest, ~2 s); each architecture's rows, regions and vilbert's task ids
    # stay fast in the collator tests above, and the full suite runs every architecture end to end (2-4 s each).
    [
        model_type if model_type == "uniter" else pytest.param(model_type, marks=pytest.mark.slow)
        for model_type in MULTIPLE_CHOICE_TYPES
    ],
)
def test_finetune_py_multiple_choice_end_to_end(tmp_path, model_type):
    from transformers import AutoModelForMultipleChoice, AutoProcessor

    from vlhub.processing.stores import RegionStore
    from vlhub.training.cli import finetune_main

    tiny_pretraining_run(tmp_path, model_type)  # tmp_path/run, on the synthetic region store tmp_path/data
    reset_accelerate_state()
    write_choice_dataset(tmp_path / "mc")
    result = finetune_main(
        [
            "--task",
            "multiple_choice",
            "--model_name_or_path",
            str(tmp_path / "run"),
            "--dataset",
            str(tmp_path / "mc"),
            "--region_store",
            str(tmp_path / "data"),
            "--max_steps",
            "30",
            "--per_device_train_batch_size",
            "8",
            "--logging_steps",
            "1",
            "--learning_rate",
            "1e-3",
            "--warmup_steps",
            "0",
            "--output_dir",
            str(tmp_path / "ft"),
        ]
    )
    losses = [row["loss"] for row in result.log_history if "loss" in row]
    assert len(losses) == 30 and np.mean(losses[-5:]) < losses[0]
    assert set(result.eval_results) == {"validation_accuracy", "validation_loss", "validation_answer_prior_baseline"}
    model = AutoModelForMultipleChoice.from_pretrained(tmp_path / "ft").eval()
    assert type(model) is get_architecture(model_type).model_class("vcr")
    processor = AutoProcessor.from_pretrained(tmp_path / "ft")
    # The reported accuracy, recomputed from the saved model question by question.
    regions = RegionStore(tmp_path / "data")
    collate = MultipleChoiceCollator(processor, regions)
    rows = colour_choice_rows(synthetic_corpus().validation)
    right = []
    with torch.no_grad():
        for row in rows:
            example = MultipleChoiceExample(row["question"], row["image_id"], row["choices"])
            logits = model(**collate([example])).logits[0]
            right.append(int(logits.argmax()) == row["label"])
            # Each choice is scored on its own text: reordering the choices reorders the scores.
            order = [2, 0, 1]
            permuted = model(
                **collate([MultipleChoiceExample(row["question"], row["image_id"], [row["choices"][i] for i in order])])
            ).logits[0]
            torch.testing.assert_close(permuted, logits[order], rtol=1e-4, atol=1e-5)
    assert result.eval_results["validation_accuracy"] == pytest.approx(np.mean(right))
    card = (tmp_path / "ft" / "README.md").read_text()
    assert "fine-tuned for multiple-choice answer selection" in card and "validation_accuracy" in card
    assert model.config.num_labels == 1  # one score per (question, choice) pair


def test_finetune_py_refuses_multiple_choice_without_a_head(tmp_path):
    from vlhub.training.cli import finetune_main

    vlhub.UnifiedVlpConfig().save_pretrained(tmp_path / "vlp")
    with pytest.raises(
        SystemExit,
        match=r"--task multiple_choice: Unified VLP has no multiple_choice head \(its "
        r"heads: captioning, pretraining, vqa\)",
    ):
        finetune_main(
            [
                "--task",
                "multiple_choice",
                "--model_name_or_path",
                str(tmp_path / "vlp"),
                "--output_dir",
                str(tmp_path / "ft"),
            ]
        )
    assert not (tmp_path / "ft").exists()
    with pytest.raises(SystemExit, match="--task must be vqa, multiple_choice, retrieval, captioning, got 'vcr'"):
        finetune_main(["--task", "vcr", "--model_name_or_path", str(tmp_path / "vlp")])


@pytest.mark.slow  # builds the shapes world (minutes on a shared 2-core machine)
def test_finetune_py_multiple_choice_on_the_shapes_world(tmp_path):
    from vlhub.training.cli import finetune_main, pretrain_main

    pretrain_main(
        [
            "--model_type",
            "uniter",
            "--max_steps",
            "2",
            "--per_device_train_batch_size",
            "4",
            "--logging_steps",
            "1",
            "--output_dir",
            str(tmp_path / "pre"),
        ]
    )
    reset_accelerate_state()
    result = finetune_main(
        [
            "--task",
            "multiple_choice",
            "--model_name_or_path",
            str(tmp_path / "pre"),
            "--num_choices",
            "3",
            "--max_steps",
            "2",
            "--per_device_train_batch_size",
            "4",
            "--max_eval_samples",
            "16",
            "--logging_steps",
            "1",
            "--output_dir",
            str(tmp_path / "mc"),
        ]
    )
    assert result.global_step == 2
    assert {"validation_accuracy", "test_accuracy"} <= set(result.eval_results)
    card = (tmp_path / "mc" / "README.md").read_text()
    assert "3 candidate answers each" in card and "yes/no questions left out" in card


def test_a_long_question_is_cut_before_it_pushes_the_choice_out(tmp_path):
    processor = processor_of("uniter", tmp_path)
    processor.max_text_length = 8  # [CLS] + 5 pieces + [SEP] between + [SEP]
    long_question = "the big red circle left of the small blue square"
    with pytest.warns(UserWarning, match="is truncated to 5"):  # never silently
        batch = MultipleChoiceCollator(processor, synthetic_corpus().regions)(
            [MultipleChoiceExample(long_question, "img000", ["red", "blue green"], 0)]
        )
    decoded = [
        processor.tokenizer.decode(row[mask.bool()].tolist())
        for row, mask in zip(batch["input_ids"][0], batch["attention_mask"][0])
    ]
    assert decoded == ["[CLS] the big red circle [SEP] red [SEP]", "[CLS] the big red [SEP] blue green [SEP]"]
