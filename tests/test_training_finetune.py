"""Fine-tuning tasks on tiny synthetic data: VQA (soft scores, the vqa_accuracy metric, the pipeline on the result)
and image-text retrieval (hard negatives, recall through the retrieval_recall metric)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from accelerate.utils import set_seed

import vlhub
from tests.training_helpers import COLOURS, TINY_CONFIG, synthetic_corpus, tiny_tokenizer
from vlhub.registry import get_architecture
from vlhub.training import TrainingArguments, build_config, train
from vlhub.training.finetuning import RetrievalTask, VqaDataset, VqaExample, VqaTask, concat_inputs


pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def processor_and_config(tmp_path, corpus, **overrides):
    processor = vlhub.UniterProcessor(
        feature_extractor=vlhub.UniterRegionProcessor(region_feature_dim=12), tokenizer=tiny_tokenizer(tmp_path)
    )
    config = build_config(get_architecture("uniter"), {**TINY_CONFIG, **overrides}, processor, corpus.sample_regions())
    return processor, config


def colour_questions(corpus, pairs) -> VqaDataset:
    """'the <shape>' (asking for its colour; the tiny vocabulary has only shape, colour and a few filler words) about
    the first object named in each caption; 10 identical annotators."""
    examples = []
    for image_id, caption in pairs:
        words = caption.split()
        colour, shape = words[1], words[2]
        examples.append(VqaExample(f"the {shape}", image_id, [COLOURS.index(colour)], [1.0], [colour] * 10))
    return VqaDataset(examples)


def test_vqa_fine_tuning_evaluates_with_the_metric_and_serves_the_pipeline(tmp_path):
    from transformers import pipeline

    corpus = synthetic_corpus()
    processor, config = processor_and_config(tmp_path, corpus, id2label=dict(enumerate(COLOURS)))
    set_seed(0)
    model = vlhub.UniterForQuestionAnswering(config)
    validation = colour_questions(corpus, corpus.validation)
    task = VqaTask(
        model,
        processor,
        corpus.regions,
        colour_questions(corpus, corpus.train),
        validation,
        "synthetic",
        "synthetic colour questions",
        majority_baselines={"validation": 0.25},
    )
    args = TrainingArguments(
        output_dir=str(tmp_path / "vqa"), max_steps=6, per_device_batch_size=8, logging_steps=2, learning_rate=1e-3
    )
    result = train(task, args)
    losses = [r["loss"] for r in result.log_history if "loss" in r]
    assert losses[-1] < losses[0]
    vqa = pipeline("visual-question-answering", model=str(tmp_path / "vqa"))
    answers = [
        vqa(image=corpus.regions[e.image_id], question=e.question, top_k=1)[0]["answer"] for e in validation.examples
    ]
    # Every annotator gave the same answer, so the official accuracy is the exact-match rate.
    expected = np.mean([a == e.answers[0] for a, e in zip(answers, validation.examples)])
    assert result.eval_results["validation_vqa_accuracy"] == pytest.approx(expected)
    card = (tmp_path / "vqa" / "README.md").read_text()
    assert "validation_vqa_accuracy" in card and "majority-answer baseline" in card and "0.2500 on validation" in card


def test_vqa_rows_are_checked(tmp_path):
    with pytest.raises(ValueError, match="lacks the column"):
        VqaDataset.from_rows([{"question": "q", "image_id": "x"}], num_labels=3)
    with pytest.raises(ValueError, match="outside the model's 3 answers"):
        VqaDataset.from_rows([{"question": "q", "image_id": "x", "labels": [5], "scores": [1.0], "answers": ["a"]}], 3)


def test_vqa_questions_of_a_datasets_split_stay_arrow_and_are_checked_by_row():
    import datasets

    from vlhub.training.finetuning import VqaQuestions

    rows = [
        {
            "question": f"what colour is shape {i}?",
            "image_id": i,
            "labels": [i % 3],
            "scores": [1.0],
            "answers": ["red"],
        }
        for i in range(5)
    ]
    dataset = VqaDataset.from_rows(datasets.Dataset.from_list(rows), num_labels=3)
    assert isinstance(dataset.examples, VqaQuestions) and len(dataset) == 5
    assert dataset[3] == VqaExample("what colour is shape 3?", "3", [0], [1.0], ["red"])
    assert [e.image_id for e in dataset.examples[1:3]] == ["1", "2"]
    for change, message in (
        ({"labels": [1, 3], "scores": [0.5, 0.5]}, r"row 2\) has answer ids \[3\] outside the model's 3"),
        ({"scores": [0.3, 0.6]}, r"row 2\): 1 labels but 2 scores"),
        ({"question": "  "}, r"the question of row 2 \(image 2\)"),
    ):
        broken = [dict(row, **change) if i == 2 else row for i, row in enumerate(rows)]
        with pytest.raises(ValueError, match=message):
            VqaDataset.from_rows(datasets.Dataset.from_list(broken), num_labels=3)


def test_concat_inputs_pads_text_and_regions():
    short = {
        "input_ids": torch.ones(1, 3, dtype=torch.long),
        "attention_mask": torch.ones(1, 3, dtype=torch.long),
        "region_features": torch.ones(1, 2, 4),
        "region_locations": torch.ones(1, 2, 7),
        "region_attention_mask": torch.ones(1, 2, dtype=torch.long),
    }
    long = {
        "input_ids": torch.ones(2, 5, dtype=torch.long),
        "attention_mask": torch.ones(2, 5, dtype=torch.long),
        "region_features": torch.ones(2, 4, 4),
        "region_locations": torch.ones(2, 4, 7),
        "region_attention_mask": torch.ones(2, 4, dtype=torch.long),
    }
    merged = concat_inputs([short, long])
    assert merged["input_ids"].shape == (3, 5) and merged["attention_mask"][0].tolist() == [1, 1, 1, 0, 0]
    assert merged["region_features"].shape == (3, 4, 4) and merged["region_attention_mask"][0].tolist() == [1, 1, 0, 0]


def test_retrieval_fine_tuning_with_hard_negatives_reports_recall(tmp_path):
    corpus = synthetic_corpus()
    processor, config = processor_and_config(tmp_path, corpus)
    set_seed(0)
    model = vlhub.UniterForImageTextRetrieval(config)
    task = RetrievalTask(
        model,
        processor,
        corpus.regions,
        corpus.train,
        corpus.validation,
        "synthetic",
        "synthetic captions",
        num_sampled=4,
        num_hard=2,
        max_gallery_images=6,
    )
    args = TrainingArguments(
        output_dir=str(tmp_path / "itr"), max_steps=3, per_device_batch_size=4, logging_steps=1, learning_rate=1e-3
    )
    result = train(task, args)
    assert all(np.isfinite(r["loss"]) for r in result.log_history if "loss" in r)
    # Recompute text→image recall@1 from the saved model's scores, independently of the task's evaluation.
    trained = vlhub.UniterForImageTextRetrieval.from_pretrained(tmp_path / "itr").eval()
    images = sorted({i for i, _ in corpus.validation})[:6]
    texts = [(i, c) for i, c in corpus.validation if i in images]
    with torch.no_grad():
        scores = torch.stack(
            [
                trained(
                    **processor(text=[c] * len(images), regions=[corpus.regions[i] for i in images])
                ).logits.squeeze(-1)
                for _, c in texts
            ]
        )
    hits = [images[int(row.argmax())] == image_id for row, (image_id, _) in zip(scores, texts)]
    assert result.eval_results["text_to_image_recall@1"] == pytest.approx(np.mean(hits))
    assert result.eval_results["num_images"] == 6


def test_the_load_report_lists_only_weights_that_stay_newly_initialised(tmp_path, caplog):
    import logging

    from transformers import AutoConfig

    from vlhub.training.cli import _load_task_model

    corpus = synthetic_corpus()
    _, config = processor_and_config(tmp_path, corpus)
    vlhub.UniterForPreTraining(config).save_pretrained(tmp_path / "pretrained")
    source = str(tmp_path / "pretrained")
    source_config = AutoConfig.from_pretrained(source)
    architecture = vlhub.get_architecture("uniter")
    with caplog.at_level(logging.INFO):
        ranker = _load_task_model(vlhub.UniterForImageTextRetrieval, source, source_config, architecture)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("vlhub")]
    # rank_output starts from the pre-trained ITM head (the original's init_output): not missing.
    assert not any("rank_output" in w for w in warnings), warnings
    assert any(
        "rank_output.bias, rank_output.weight initialised from the pre-trained heads" in r.getMessage()
        for r in caplog.records
    )
    assert ranker.__class__ is vlhub.UniterForImageTextRetrieval


def test_terminal_codes_are_stripped_from_log_records_written_to_files(tmp_path):
    import io
    import logging

    from vlhub.utils.logs import plain_text_outside_terminals

    logger = logging.getLogger()
    handler = logging.StreamHandler(io.StringIO())  # a file, not a terminal
    logger.addHandler(handler)
    try:
        plain_text_outside_terminals()
        logging.getLogger("vlhub.test").warning("\x1b[1mUniterModel LOAD REPORT\x1b[0m from: x")
        assert handler.stream.getvalue() == "UniterModel LOAD REPORT from: x\n"
    finally:
        logger.removeHandler(handler)


def test_a_warning_repeated_from_one_line_is_shown_once_with_its_count():
    import warnings

    from vlhub.utils.logs import repeated_warnings_counted

    shown = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, *args, **kwargs: shown.append(str(message))
        with repeated_warnings_counted():
            for n in range(94):
                warnings.warn(f"text {n} has 70 tokens; truncated to max_text_length=60")
            warnings.warn("something else")
    assert shown == [
        "text 0 has 70 tokens; truncated to max_text_length=60",
        "something else",
        "text 0 has 70 tokens; truncated to max_text_length=60 (raised 94 times in all; only the first is shown)",
    ]
