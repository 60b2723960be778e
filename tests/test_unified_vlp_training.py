"""Unified VLP training: its masked-LM objectives (seq2seq / bidirectional, mixed per example as the original),
`pretrain.py --model_type unified_vlp` (presets, a processor fitted to the config, exact resume) and
`finetune.py --task captioning`."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from accelerate.state import AcceleratorState, GradientState
from transformers import AutoModelForPreTraining, AutoProcessor

import vlhub
from tests.test_training_cli import write_store_dataset
from tests.training_helpers import (
    assert_resume_reproduces,
    captioning_finetune_run,
    evaluate_pretraining,
    synthetic_corpus,
    tiny_tokenizer,
    write_vocab,
)
from vlhub.modeling.unified_vlp.objectives_unified_vlp import S2S_PROBABILITY, vlp_masked_positions
from vlhub.training.cli import pretrain_main
from vlhub.training.collators import PretrainingCollator
from vlhub.training.objectives import objectives_for
from vlhub.training.pretraining import build_pretraining_model


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def test_masking_follows_the_original_counts_candidates_and_replacements():
    # [CLS] r r [SEP] | w1..w7 [SEP] | pad pad: text starts at 4, the final [SEP] (position 11) may be masked.
    ids = torch.tensor([[2, 1, 1, 3, 10, 11, 12, 13, 14, 15, 16, 3, 0, 0]])
    mask = (ids != 0).long()
    mask[0, 1:3] = 1
    counts, positions_seen, replacement = Counter(), Counter(), Counter()
    for seed in range(600):
        corrupted, positions, labels = vlp_masked_positions(
            ids, mask, 4, 4, torch.tensor([20, 21]), [np.random.default_rng(seed)], probability=0.15
        )
        chosen = positions[0][labels[0] >= 0].tolist()
        counts[len(chosen)] += 1
        positions_seen.update(chosen)
        assert len(set(chosen)) == len(chosen)
        assert torch.equal(labels[0][labels[0] >= 0], ids[0, chosen])
        assert torch.equal(corrupted[0, :4], ids[0, :4]) and torch.equal(corrupted[0, 12:], ids[0, 12:])
        for p in chosen:
            replacement["mask" if corrupted[0, p] == 4 else "random" if corrupted[0, p] in (20, 21) else "same"] += 1
    assert counts == {1: 600}  # round(7 * 0.15) = 1
    assert set(positions_seen) == set(range(4, 12))  # every caption token and the final [SEP], nothing else
    assert 0.72 < replacement["mask"] / 600 < 0.88 and 0.05 < replacement["random"] / 600 < 0.15
    # 20 caption tokens: round(3.0) = 3 (the cap); 17 tokens: round(2.55) = 3; 10 tokens: round(1.5) = 2 (banker's).
    for length, expected in ((20, 3), (17, 3), (10, 2), (5, 1)):
        long_ids = torch.tensor([[2, 1, 3, *range(30, 30 + length), 3]])
        _, positions, labels = vlp_masked_positions(
            long_ids, torch.ones_like(long_ids), 3, 4, torch.tensor([20]), [np.random.default_rng(0)], probability=0.15
        )
        assert int((labels >= 0).sum()) == expected, length


def _collator(tmp_path, corpus):
    tokenizer = tiny_tokenizer(tmp_path)
    model, processor = build_pretraining_model(None, "tiny", tokenizer, corpus, model_type="unified_vlp")
    return model, processor, PretrainingCollator(processor, corpus.regions, objectives_for("unified_vlp"))


def test_the_processor_is_fitted_to_the_config_and_the_batches_train(tmp_path):
    corpus = synthetic_corpus()
    model, processor, collator = _collator(tmp_path, corpus)
    config = model.config
    # The tiny preset's slots and the data's classes reach the processor; the tokenizer's ids reach the config.
    assert processor.num_regions == config.num_regions == 10
    assert processor.feature_extractor.num_classes == config.num_region_labels == 4
    assert config.region_location_dim == 10
    tok = processor.tokenizer
    assert (config.eos_token_id, config.bos_token_id, config.mask_token_id, config.region_token_id) == (
        tok.sep_token_id,
        tok.cls_token_id,
        tok.mask_token_id,
        tok.unk_token_id,
    )
    examples = [{"image_id": i, "caption": c, "seed": (n,)} for n, (i, c) in enumerate(corpus.train[:16])]
    mixed = collator([{**e, "objective": "s2s-bi"} for e in examples])
    flags = mixed["seq2seq"]
    assert flags.dtype == torch.bool and flags.any() and (~flags).any()
    text_start = config.num_regions + 2
    real = mixed["attention_mask"].bool()
    for row in range(len(examples)):
        image_type, text_type = (4, 5) if flags[row] else (0, 1)
        types = mixed["token_type_ids"][row][real[row]]
        assert (types[:text_start] == image_type).all() and (types[text_start:] == text_type).all()
        assert (mixed["masked_positions"][row][mixed["labels"][row] >= 0] >= text_start).all()
    s2s = collator([{**e, "objective": "s2s"} for e in examples])
    bi = collator([{**e, "objective": "bi"} for e in examples])
    assert "seq2seq" not in s2s and bi["seq2seq"] is False  # seq2seq is the default (and the captioner's only)
    # Same seeds: the same masking whatever the pattern; only the types differ.
    assert torch.equal(s2s["input_ids"], bi["input_ids"]) and torch.equal(s2s["labels"], bi["labels"])
    for batch, name in ((mixed, "mlm_loss"), (s2s, "s2s_loss"), (bi, "bi_loss")):
        outputs = model(**batch)
        assert torch.isfinite(outputs.loss) and getattr(outputs, name) is outputs.loss
        assert outputs.mlm_logits.shape == (int((batch["labels"] >= 0).sum()), config.vocab_size)
    # The seq2seq pattern is really used: a caption token's prediction cannot depend on later words under s2s.
    model.eval()
    batch = {k: v for k, v in s2s.items() if k not in ("labels", "masked_positions")}
    changed = {**batch, "input_ids": batch["input_ids"].clone()}
    changed["input_ids"][0, text_start + 1] = tok.mask_token_id
    with torch.no_grad():
        for pattern, same in ((True, True), (False, False)):
            first = model(**batch, seq2seq=pattern).logits[0, text_start]
            second = model(**changed, seq2seq=pattern).logits[0, text_start]
            assert torch.allclose(first, second, atol=1e-5) == same


def test_the_per_example_mix_draws_seq2seq_three_times_in_four(tmp_path):
    corpus = synthetic_corpus()
    _, _, collator = _collator(tmp_path, corpus)
    examples = [
        {
            "image_id": corpus.train[n % len(corpus.train)][0],
            "caption": corpus.train[n % len(corpus.train)][1],
            "seed": (n,),
            "objective": "s2s-bi",
        }
        for n in range(400)
    ]
    flags = torch.cat([collator(examples[i : i + 50])["seq2seq"] for i in range(0, 400, 50)])
    assert abs(flags.float().mean().item() - S2S_PROBABILITY) < 0.06


def test_evaluation_scores_each_objective(tmp_path):
    corpus = synthetic_corpus()
    model, processor, _ = _collator(tmp_path, corpus)
    results = evaluate_pretraining(model, processor, corpus, {"s2s": 1, "bi": 1}, "unified_vlp")
    assert set(results) == {"s2s_loss", "bi_loss", "mlm_accuracy"}
    assert all(np.isfinite(v) for v in results.values())


def _run(tmp_path, store, *extra, callbacks=()):
    return pretrain_main(
        [
            "--model_type",
            "unified_vlp",
            "--config_name",
            "tiny",
            "--dataset",
            str(store),
            "--tokenizer_name",
            str(write_vocab(tmp_path)),
            "--max_steps",
            "4",
            "--per_device_train_batch_size",
            "4",
            "--logging_steps",
            "1",
            "--save_steps",
            "2",
            "--seed",
            "3",
            *extra,
        ],
        callbacks=callbacks,
    )


def test_pretrain_py_trains_unified_vlp_and_resumes_exactly(tmp_path):
    store = write_store_dataset(tmp_path / "data")
    straight = _run(tmp_path, store, "--output_dir", str(tmp_path / "a"))
    assert straight.global_step == 4
    logged = [r for r in straight.log_history if "loss" in r]
    assert [r["step"] for r in logged] == [1, 2, 3, 4] and all(r["mlm_loss"] == r["loss"] for r in logged)
    assert "s2s-bi:1" in (tmp_path / "a" / "README.md").read_text()
    model = AutoModelForPreTraining.from_pretrained(tmp_path / "a")
    processor = AutoProcessor.from_pretrained(tmp_path / "a")
    assert isinstance(model, vlhub.UnifiedVlpForPreTraining) and isinstance(processor, vlhub.UnifiedVlpProcessor)
    assert processor.num_regions == model.config.num_regions == 10
    assert processor.feature_extractor.num_classes == model.config.num_region_labels

    assert_resume_reproduces(
        lambda *extra, callbacks=(): _run(tmp_path, store, *extra, callbacks=callbacks),
        tmp_path / "a",
        tmp_path / "b",
        crash_step=3,
    )


def test_pretrain_py_per_batch_objectives_log_each_pattern(tmp_path):
    store = write_store_dataset(tmp_path / "data")
    result = _run(
        tmp_path, store, "--output_dir", str(tmp_path / "c"), "--objectives", "s2s:1", "bi:1", "--max_steps", "6"
    )
    names = {k for r in result.log_history for k in r if k.endswith("_loss")}
    assert names == {"s2s_loss", "bi_loss"}


def test_config_region_sizes_must_agree():
    assert vlhub.UnifiedVlpConfig().num_region_labels == 1601
    assert vlhub.UnifiedVlpConfig(num_region_labels=4).region_location_dim == 10
    assert vlhub.UnifiedVlpConfig(region_location_dim=10).num_region_labels == 4
    with pytest.raises(Exception, match="region_location_dim"):
        vlhub.UnifiedVlpConfig(region_location_dim=1607, num_region_labels=4)


# ---------------------------------------------------------------------------------------------------- captioning
CAPTION_METRICS = ["Bleu_4", "CIDEr"]  # METEOR's Java start alone takes ~20 s


def test_captioning_fine_tuning_trains_masked_seq2seq_and_scores_generated_captions(tmp_path):
    from accelerate.utils import set_seed

    from vlhub.evaluation import caption_scores
    from vlhub.training import VlhubTrainingArguments, train
    from vlhub.training.captioning import CaptioningTask

    corpus = synthetic_corpus()
    pretraining, processor, _ = _collator(tmp_path, corpus)
    pretraining.save_pretrained(tmp_path / "pre")
    set_seed(0)
    captioner = vlhub.UnifiedVlpForConditionalGeneration.from_pretrained(tmp_path / "pre")
    objective = objectives_for("unified_vlp")[vlhub.get_architecture("unified_vlp").finetuning_objectives["captioning"]]
    task = CaptioningTask(
        captioner,
        processor,
        corpus.regions,
        corpus.train,
        corpus.validation,
        "synthetic",
        "synthetic captions",
        objective=objective,
        max_new_tokens=8,
        metrics=CAPTION_METRICS,
    )
    # The objective as the 8th positional argument (its place before the fine-tuning tasks shared their arguments)
    # still works, with a FutureWarning.
    with pytest.warns(FutureWarning, match="objective as its 8th positional argument"):
        positional = CaptioningTask(captioner, processor, corpus.regions, corpus.train, None, "s", "s", objective)
    assert positional.objective is objective and positional.collate_fn.objectives == task.collate_fn.objectives
    # The training batches are the original's masked seq2seq: at most 3 predictions per caption, seq2seq types.
    batch = task.collate_fn(
        [
            {"image_id": i, "caption": c, "objective": objective.name, "seed": (n,)}
            for n, (i, c) in enumerate(corpus.train[:4])
        ]
    )
    assert "seq2seq" not in batch and ((batch["labels"] >= 0).sum(1) <= 3).all()
    assert set(batch["token_type_ids"][batch["attention_mask"].bool()].tolist()) == {4, 5}
    args = VlhubTrainingArguments(
        output_dir=str(tmp_path / "cap"),
        max_steps=3,
        per_device_train_batch_size=4,
        logging_steps=1,
        learning_rate=1e-3,
    )
    result = train(task, args)
    assert all(np.isfinite(r["loss"]) for r in result.log_history if "loss" in r)
    # Recompute the scores from the saved captioner's own greedy captions, independently of the task.
    trained = vlhub.UnifiedVlpForConditionalGeneration.from_pretrained(tmp_path / "cap").eval()
    saved_processor = AutoProcessor.from_pretrained(tmp_path / "cap")
    references: dict[str, list[str]] = {}
    for image_id, caption in corpus.validation:
        references.setdefault(image_id, []).append(caption)
    images = list(references)
    with torch.no_grad():
        generated = trained.generate(**saved_processor(regions=[corpus.regions[i] for i in images]), max_new_tokens=8)
    captions = saved_processor.batch_decode(generated)
    expected = caption_scores(captions, [references[i] for i in images], metrics=CAPTION_METRICS)
    frequent = Counter(c for _, c in corpus.train).most_common(1)[0][0]
    baseline = caption_scores([frequent] * len(images), [references[i] for i in images], metrics=CAPTION_METRICS)
    for metric in CAPTION_METRICS:
        assert result.eval_results[f"validation_{metric}"] == pytest.approx(expected[metric])
        assert result.eval_results[f"validation_baseline_{metric}"] == pytest.approx(baseline[metric])
    assert result.eval_results["validation_num_images"] == len(images)
    card = (tmp_path / "cap" / "README.md").read_text()
    assert "most frequent training caption" in card and frequent in card


def test_finetune_py_captioning_from_a_pretraining_run(tmp_path):
    from vlhub.training.cli import finetune_main

    store = write_store_dataset(tmp_path / "data")
    _run(tmp_path, store, "--output_dir", str(tmp_path / "pre"), "--max_steps", "2")
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    result = captioning_finetune_run(tmp_path, store, tmp_path / "pre", CAPTION_METRICS)
    assert result.global_step == 2
    assert {"validation_CIDEr", "validation_baseline_CIDEr", "validation_Bleu_4"} <= set(result.eval_results)
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(tmp_path / "cap")
    assert isinstance(model, vlhub.UnifiedVlpForConditionalGeneration)
    with pytest.raises(SystemExit, match="captioning"):
        finetune_main(["--task", "captions", "--model_name_or_path", str(tmp_path / "pre")])


# ---------------------------------------------------------------------------------------------------- VQA
def test_vqa_fine_tuning_from_a_pretraining_run_uses_the_bidirectional_layout(tmp_path):
    from vlhub.training import VlhubTrainingArguments, train
    from vlhub.training.finetuning import VqaTask
    from tests.test_training_finetune import colour_questions
    from tests.training_helpers import COLOURS

    corpus = synthetic_corpus()
    pretraining, processor, _ = _collator(tmp_path, corpus)
    pretraining.save_pretrained(tmp_path / "pre")
    processor.save_pretrained(tmp_path / "pre")
    vqa_processor = AutoProcessor.from_pretrained(tmp_path / "pre").for_task("vqa")
    assert vqa_processor.mode == "bidirectional" and vqa_processor.for_task("captioning").mode == "seq2seq"
    id2label = dict(enumerate(COLOURS))
    model = vlhub.UnifiedVlpForQuestionAnswering.from_pretrained(
        tmp_path / "pre", id2label=id2label, label2id={v: k for k, v in id2label.items()}
    )
    # The encoder comes from the pre-training run; only the answer head is new.
    torch.testing.assert_close(
        model.vlp.embeddings.word_embeddings.weight, pretraining.vlp.embeddings.word_embeddings.weight
    )
    task = VqaTask(
        model,
        vqa_processor,
        corpus.regions,
        colour_questions(corpus, corpus.train),
        colour_questions(corpus, corpus.validation),
        "synthetic",
        "colour questions",
        base_model="pre",
    )
    batch = task.collate_fn(task.train_dataset.examples[:4])
    assert set(batch["token_type_ids"][batch["attention_mask"].bool()].tolist()) == {0, 1}
    args = VlhubTrainingArguments(
        output_dir=str(tmp_path / "vqa"),
        max_steps=3,
        per_device_train_batch_size=4,
        logging_steps=1,
        learning_rate=1e-3,
    )
    result = train(task, args)
    assert all(np.isfinite(r["loss"]) for r in result.log_history if "loss" in r)
    assert 0.0 <= result.eval_results["validation_vqa_accuracy"] <= 1.0
    assert AutoProcessor.from_pretrained(tmp_path / "vqa").mode == "bidirectional"  # the pipeline gets VQA's layout
    # The shapes-like vocabulary has no unknown answer: answer 0 ("red") is predicted like any other. With
    # unknown_answer_id set (converted checkpoints: Pythia's <unk>), the evaluation never predicts it.
    from accelerate import Accelerator

    assert model.config.unknown_answer_id is None
    with torch.no_grad():
        model.ans_classifier[2].bias[0] = 1e4
    accelerator = Accelerator(cpu=True)
    assert set(task.predict(accelerator, model.eval(), task.validation, 4)) == {COLOURS[0]}
    model.config.unknown_answer_id = 0
    assert COLOURS[0] not in set(task.predict(accelerator, model, task.validation, 4))
