"""TDEN training: its objectives' batches as X-modaler builds them, `pretrain.py --model_type tden` with each
objective, two-pass scheduled sampling (two optimizer steps per batch, exact resume), and `finetune.py --task
captioning` / VQA from a TDEN pre-training run."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import vlhub
from tests.test_training_cli import write_store_dataset
from tests.training_helpers import (
    COLOURS,
    assert_resume_reproduces,
    captioning_finetune_run,
    evaluate_pretraining,
    reset_accelerate_state,
    synthetic_corpus,
    tiny_tokenizer,
    write_vocab,
)
from vlhub.modeling.tden.objectives_tden import tden_mask_regions, tden_second_pass
from vlhub.training.cli import pretrain_main
from vlhub.training.collators import PretrainingCollator
from vlhub.training.objectives import objectives_for
from vlhub.training.pretraining import build_pretraining_model

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


class FixedDraws:
    """A stand-in generator whose `random(n)` returns given numbers (to test the masking rules case by case)."""

    def __init__(self, draws):
        self.draws = np.asarray(draws, dtype=float)

    def random(self, size):
        assert size == len(self.draws)
        return self.draws


def _regions(boxes, classes=3):
    boxes = torch.tensor(boxes, dtype=torch.float32)
    features = torch.arange(1, len(boxes) * 2 + 1, dtype=torch.float32).view(len(boxes), 2)
    class_probs = torch.eye(classes)[torch.arange(len(boxes)) % classes]
    return vlhub.RegionFeatures(features=features, boxes=boxes, image_size=(100, 100), class_probs=class_probs)


def test_region_masking_zeroes_selected_and_overlapping_regions_and_recomputes_img():
    # A and B overlap (pixel-inclusive IoU 81/119 = 0.68 > 0.4), C is apart; D pads the second example.
    first = _regions([[0, 0, 9, 9], [1, 1, 10, 10], [50, 50, 60, 60]])
    second = _regions([[0, 0, 9, 9], [1, 1, 10, 10]])
    batch = torch.zeros(2, 4, 2)
    batch[0, 1:] = first.features
    batch[1, 1:3] = second.features
    # First example: A selected (0.14 < 0.15) but not itself zeroed by its own draw (>= 0.135): its overlap with
    # itself zeroes it anyway, and B's overlap with A zeroes B. Second example: nothing selected.
    features, masked, targets = tden_mask_regions(
        batch, [first, second], [FixedDraws([0.14, 0.5, 0.9]), FixedDraws([0.5, 0.2])]
    )
    assert masked.tolist() == [[False, True, False, False], [False, False, False, False]]
    torch.testing.assert_close(targets, first.class_probs[:1])
    assert (features[0, 1:3] == 0).all() and torch.equal(features[0, 3], first.features[2])
    torch.testing.assert_close(features[0, 0], first.features[2] / 1)  # sum / max(1, 3 - 2 zeroed)
    torch.testing.assert_close(features[1, 0], second.features.sum(0) / 2)  # nothing zeroed: the mean
    torch.testing.assert_close(features[1, 1:3], second.features)
    # A region drawn below 0.135 is zeroed even without overlaps; C is apart from the others.
    features, masked, _ = tden_mask_regions(batch[:1], [first], [FixedDraws([0.9, 0.9, 0.1])])
    assert masked[0].tolist() == [False, False, False, True]
    assert (features[0, 3] == 0).all() and torch.equal(features[0, 1:3], first.features[:2])
    torch.testing.assert_close(features[0, 0], first.features[:2].sum(0) / 2)


def _collator(tmp_path, corpus, **settings):
    model, processor = build_pretraining_model(None, "tiny", tiny_tokenizer(tmp_path), corpus, model_type="tden")
    return model, processor, PretrainingCollator(processor, corpus.regions, objectives_for("tden"), **settings)


def _examples(corpus, objective, count=8):
    return [
        {"image_id": i, "caption": c, "objective": objective, "seed": (n,)}
        for n, (i, c) in enumerate(corpus.train[:count])
    ]


def test_joint_batch_masks_words_without_minimum_and_feeds_the_masked_sentence_to_the_decoder(tmp_path):
    corpus = synthetic_corpus()
    model, processor, collator = _collator(tmp_path, corpus, mlm_probability=0.5)
    examples = _examples(corpus, "joint")
    batch = collator(examples)
    clean, _ = collator.encode(examples)
    tok = processor.tokenizer
    selected = batch["labels"] >= 0
    assert selected.any() and torch.equal(batch["labels"][selected], clean["input_ids"][selected])
    specials = torch.isin(clean["input_ids"], torch.tensor([tok.cls_token_id, tok.sep_token_id, tok.pad_token_id]))
    assert not (selected & specials).any()
    assert torch.equal(batch["input_ids"][~selected], clean["input_ids"][~selected])
    # MSG: the same masked sentence (type 1 by default), targets the clean sentence shifted left.
    assert torch.equal(batch["decoder_input_ids"], batch["input_ids"]) and "decoder_token_type_ids" not in batch
    lengths = clean["attention_mask"].sum(1)
    for row, length in enumerate(lengths.tolist()):
        assert batch["decoder_labels"][row, : length - 1].tolist() == clean["input_ids"][row, 1:length].tolist()
        assert (batch["decoder_labels"][row, length - 1 :] == -100).all()
    # Captions of the same image are grouped for the matching loss.
    ids = [e["image_id"] for e in examples]
    assert batch["image_ids"].tolist() == [ids.index(i) for i in ids]
    # No minimum: with probability 0 nothing is a target, and the MLM loss is a zero that keeps the graph.
    _, _, none = _collator(tmp_path, corpus, mlm_probability=0.0, region_mask_probability=0.0)
    empty = none(examples)
    assert (empty["labels"] < 0).all() and not empty["masked_regions"].any()
    out = model.train()(**empty)
    assert out.mlm_loss == 0 and out.mlm_loss.requires_grad and torch.isfinite(out.loss)


def test_each_objective_trains_its_losses(tmp_path):
    corpus = synthetic_corpus()
    model, _, collator = _collator(tmp_path, corpus)
    expected = {
        "joint": {"mlm_loss", "moc_loss", "msg_loss", "ism_loss"},
        "mlm": {"mlm_loss"},
        "moc": {"moc_loss"},
        "msg": {"msg_loss"},
        "ism": {"ism_loss"},
    }
    model.train()
    for name, losses in expected.items():
        out = model(**collator(_examples(corpus, name)))
        got = {k for k, v in out.items() if k.endswith("_loss") and v is not None}
        assert got == losses, name
        torch.testing.assert_close(out.loss, sum(out[k] for k in losses))


def test_second_pass_replaces_every_target_with_the_first_pass_argmax():
    batch = {
        "input_ids": torch.tensor([[2, 4, 9, 4, 3], [2, 9, 4, 3, 0]]),
        "labels": torch.tensor([[-100, 5, -100, 6, -100], [-100, -100, 7, -100, -100]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]),
        "image_ids": torch.tensor([0, 1]),
    }
    batch["decoder_input_ids"] = batch["input_ids"].clone()
    vocab = 20
    mlm_logits = torch.zeros(2, 5, vocab)
    mlm_logits[..., 11] = 1.0  # the cross-modal encoder predicts 11 everywhere
    msg_logits = torch.zeros(2, 5, vocab)
    msg_logits[torch.arange(2)[:, None], torch.arange(5)[None], 12 + torch.arange(5)[None]] = 1.0  # 12 + position
    outputs = SimpleNamespace(mlm_logits=mlm_logits, msg_logits=msg_logits)
    second = tden_second_pass(batch, outputs, None)
    assert second["input_ids"].tolist() == [[2, 11, 9, 11, 3], [2, 9, 11, 3, 0]]
    # The decoder's prediction at t - 1 (12 + t - 1) goes to position t.
    assert second["decoder_input_ids"].tolist() == [[2, 12, 9, 14, 3], [2, 9, 13, 3, 0]]
    assert second["compute_similarity"] is False and "image_ids" not in second
    assert torch.equal(second["labels"], batch["labels"])
    limited = tden_second_pass(batch, outputs, torch.tensor([[True, True, True, False, True]] * 2))
    assert limited["input_ids"].tolist() == [[2, 11, 9, 4, 3], [2, 9, 11, 3, 0]]


def _run(tmp_path, store, *extra, callbacks=()):
    return pretrain_main(
        [
            "--model_type",
            "tden",
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
            "5",
            *extra,
        ],
        callbacks=callbacks,
    )


@pytest.mark.parametrize("objective", ["mlm", "moc", "msg", "ism"])
def test_pretrain_py_trains_each_tden_objective(tmp_path, objective):
    store = write_store_dataset(tmp_path / "data")
    result = _run(tmp_path, store, "--objectives", objective, "--max_steps", "2", "--output_dir", str(tmp_path / "o"))
    logged = [r for r in result.log_history if "loss" in r]
    assert [r["step"] for r in logged] == [1, 2]
    assert all(r[f"{objective}_loss"] == pytest.approx(r["loss"]) and np.isfinite(r["loss"]) for r in logged)


def test_pretrain_py_trains_tden_jointly_and_resumes_exactly(tmp_path):
    from transformers import AutoModelForPreTraining, AutoProcessor

    store = write_store_dataset(tmp_path / "data")
    straight = _run(tmp_path, store, "--output_dir", str(tmp_path / "a"), "--eval_steps", "0")
    logged = [r for r in straight.log_history if "loss" in r]
    assert [r["step"] for r in logged] == [1, 2, 3, 4]
    for row in logged:
        parts = [row[k] for k in ("mlm_loss", "moc_loss", "msg_loss", "ism_loss")]
        assert row["loss"] == pytest.approx(sum(parts), rel=1e-5)
    assert "joint:1" in (tmp_path / "a" / "README.md").read_text()
    model = AutoModelForPreTraining.from_pretrained(tmp_path / "a")
    processor = AutoProcessor.from_pretrained(tmp_path / "a")
    assert isinstance(model, vlhub.TdenForPreTraining) and isinstance(processor, vlhub.TdenProcessor)
    tok = processor.tokenizer
    config = model.config
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (
        tok.cls_token_id,
        tok.sep_token_id,
        tok.pad_token_id,
    )
    assert (config.num_visual_layers, config.num_cross_encoder_layers, config.num_decoder_layers) == (2, 2, 2)

    assert_resume_reproduces(
        lambda *extra, callbacks=(): _run(tmp_path, store, *extra, callbacks=callbacks),
        tmp_path / "a",
        tmp_path / "b",
        crash_step=3,
    )


def _optimizer_steps(checkpoint) -> int:
    state = torch.load(checkpoint / "training_state" / "optimizer.bin", map_location="cpu", weights_only=True)
    return int(next(iter(state["state"].values()))["step"])


# The fast loop keeps probability 1.0 (every target replaced); 0.5 (the same two passes and resume, ~4 s more) runs in the
# full suite.
@pytest.mark.parametrize("probability", ["1.0", pytest.param("0.5", marks=pytest.mark.slow)])
def test_scheduled_sampling_takes_two_optimizer_steps_per_batch_and_resumes_exactly(tmp_path, probability):
    store = write_store_dataset(tmp_path / "data")
    settings = ("--scheduled_sampling", "--scheduled_sampling_probability", probability)
    straight = _run(tmp_path, store, *settings, "--output_dir", str(tmp_path / "a"))
    logged = [r for r in straight.log_history if "loss" in r]
    for row in logged:  # the logged loss sums both passes; the second has no matching loss
        first = sum(row[k] for k in ("mlm_loss", "moc_loss", "msg_loss", "ism_loss"))
        second = sum(row[k] for k in ("ss_mlm_loss", "ss_moc_loss", "ss_msg_loss"))
        assert "ss_ism_loss" not in row and row["loss"] == pytest.approx(first + second, rel=1e-5)
    assert _optimizer_steps(tmp_path / "a" / "checkpoint-2") == 4  # two batches, two passes each
    assert "scheduled sampling" in (tmp_path / "a" / "README.md").read_text()
    assert_resume_reproduces(
        lambda *extra, callbacks=(): _run(tmp_path, store, *settings, *extra, callbacks=callbacks),
        tmp_path / "a",
        tmp_path / "b",
        crash_step=3,
        keys=("loss", "ss_mlm_loss", "ss_msg_loss"),
    )
    reset_accelerate_state()
    plain = _run(tmp_path, store, "--output_dir", str(tmp_path / "c"), "--max_steps", "2")
    # The first pass of step 1 is the plain run's step 1 (same batch, same weights); the second pass is extra.
    assert plain.log_history[0]["mlm_loss"] == logged[0]["mlm_loss"]


def test_scheduled_sampling_refuses_what_it_cannot_do(tmp_path):
    store = write_store_dataset(tmp_path / "data")
    with pytest.raises(ValueError, match="second pass.*joint"):
        _run(tmp_path, store, "--scheduled_sampling", "--objectives", "mlm", "--output_dir", str(tmp_path / "a"))
    reset_accelerate_state()
    with pytest.raises(ValueError, match="gradient_accumulation_steps 1"):
        _run(
            tmp_path,
            store,
            "--scheduled_sampling",
            "--gradient_accumulation_steps",
            "2",
            "--output_dir",
            str(tmp_path / "b"),
        )
    reset_accelerate_state()
    with pytest.raises(ValueError, match=r"scheduled_sampling_probability must be in \(0, 1\]"):
        _run(
            tmp_path,
            store,
            "--scheduled_sampling",
            "--scheduled_sampling_probability",
            "0",
            "--output_dir",
            str(tmp_path / "c"),
        )


def test_evaluation_scores_each_objective(tmp_path):
    corpus = synthetic_corpus()
    model, processor, _ = _collator(tmp_path, corpus)
    results = evaluate_pretraining(model, processor, corpus, {"joint": 1, "msg": 1}, "tden")
    assert {"mlm_loss", "moc_loss", "msg_loss", "ism_loss", "mlm_accuracy"} <= set(results)
    assert all(np.isfinite(v) for v in results.values()) and 0 <= results["mlm_accuracy"] <= 1


# ---------------------------------------------------------------------------------------------------- fine-tuning
CAPTION_METRICS = ["Bleu_4", "CIDEr"]


def test_caption_objective_teacher_forces_the_generation_layout(tmp_path):
    corpus = synthetic_corpus()
    _, processor, _ = _collator(tmp_path, corpus)
    captioning = processor.for_task("captioning")
    assert captioning.text_stream == "generation" and processor.text_stream == "understanding"
    assert captioning.for_task("vqa").text_stream == "understanding"
    objective = objectives_for("tden")[vlhub.get_architecture("tden").finetuning_objectives["captioning"]]
    examples = _examples(corpus, objective.name, 4)
    batch = PretrainingCollator(captioning, corpus.regions, {objective.name: objective})(examples)
    tok = processor.tokenizer
    for row, (_, caption) in enumerate(corpus.train[:4]):
        words = tok(caption, add_special_tokens=False)["input_ids"]
        length = len(words) + 1
        assert batch["input_ids"][row, :length].tolist() == [tok.cls_token_id, *words]
        assert batch["labels"][row, :length].tolist() == [*words, tok.sep_token_id]
        assert (batch["labels"][row, length:] == -100).all()
    assert set(batch["token_type_ids"][batch["attention_mask"].bool()].tolist()) == {1}
    with pytest.raises(ValueError, match="generation layout"):  # the understanding layout ends with [SEP]
        PretrainingCollator(processor, corpus.regions, {objective.name: objective})(examples)
    prompt = captioning(regions=[corpus.regions[corpus.train[0][0]]])  # regions only: the captioning prompt
    assert prompt["input_ids"].tolist() == [[tok.cls_token_id]] and "input_ids" not in processor(
        regions=[corpus.regions[corpus.train[0][0]]]
    )


def test_finetune_py_captioning_and_vqa_from_a_tden_pretraining_run(tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from tests.test_training_finetune import colour_questions
    from vlhub.evaluation import caption_scores
    from vlhub.training import VlhubTrainingArguments, train
    from vlhub.training.finetuning import VqaTask

    store = write_store_dataset(tmp_path / "data")
    _run(tmp_path, store, "--output_dir", str(tmp_path / "pre"), "--max_steps", "2")
    reset_accelerate_state()
    corpus = synthetic_corpus()
    result = captioning_finetune_run(tmp_path, store, tmp_path / "pre", CAPTION_METRICS, steps=3)
    assert all(np.isfinite(r["loss"]) for r in result.log_history if "loss" in r)
    captioner = AutoModelForImageTextToText.from_pretrained(tmp_path / "cap").eval()
    saved = AutoProcessor.from_pretrained(tmp_path / "cap")
    assert isinstance(captioner, vlhub.TdenForConditionalGeneration) and saved.text_stream == "generation"
    assert captioner.config.label_smoothing == 0.1  # the preset's, as X-modaler's XE captioner
    # The reported scores are those of the saved captioner's own greedy captions.
    references: dict[str, list[str]] = {}
    for image_id, caption in corpus.validation:
        references.setdefault(image_id, []).append(caption)
    images = list(references)
    with torch.no_grad():
        generated = captioner.generate(
            **saved(regions=[corpus.regions[i] for i in images]), max_new_tokens=6, do_sample=False, num_beams=1
        )
    captions = saved.batch_decode(generated)
    assert not any("[CLS]" in c or "[SEP]" in c for c in captions)
    expected = caption_scores(captions, [references[i] for i in images], metrics=CAPTION_METRICS)
    for metric in CAPTION_METRICS:
        assert result.eval_results[f"validation_{metric}"] == pytest.approx(expected[metric])
    assert "validation_baseline_CIDEr" in result.eval_results

    reset_accelerate_state()
    id2label = dict(enumerate(COLOURS))
    model = vlhub.TdenForQuestionAnswering.from_pretrained(
        tmp_path / "pre", id2label=id2label, label2id={v: k for k, v in id2label.items()}
    )
    pretrained = vlhub.TdenForPreTraining.from_pretrained(tmp_path / "pre")
    assert model.config.bidirectional_decoder
    torch.testing.assert_close(
        model.tden.cross_encoder.layer[0].biattention.self.query.weight,
        pretrained.tden.cross_encoder.layer[0].biattention.self.query.weight,
    )
    processor = AutoProcessor.from_pretrained(tmp_path / "pre").for_task("vqa")
    task = VqaTask(
        model,
        processor,
        corpus.regions,
        colour_questions(corpus, corpus.train),
        colour_questions(corpus, corpus.validation),
        "synthetic",
        "colour questions",
        base_model="pre",
    )
    args = VlhubTrainingArguments(
        output_dir=str(tmp_path / "vqa"),
        max_steps=3,
        per_device_train_batch_size=4,
        logging_steps=1,
        learning_rate=1e-3,
    )
    vqa = train(task, args)
    assert all(np.isfinite(r["loss"]) for r in vqa.log_history if "loss" in r)
    assert 0.0 <= vqa.eval_results["validation_vqa_accuracy"] <= 1.0
    assert json.loads((tmp_path / "vqa" / "config.json").read_text())["architectures"] == ["TdenForQuestionAnswering"]


def test_heads_refuse_checkpoints_without_their_parts(tmp_path):
    """A retrieval checkpoint asked to caption and a captioner asked to score pairs, through `finetune.py` and the
    pipelines, fail naming the problem (the conversion tests cover converted folders and trainer-only files)."""
    from transformers import pipeline

    from vlhub.training.cli import finetune_main

    corpus = synthetic_corpus()
    _, processor, _ = _collator(tmp_path, corpus)
    fields = dict(
        vlhub.get_architecture("tden").config_fields("tiny"),
        vocab_size=len(processor.tokenizer),
        region_feature_dim=corpus.sample_regions().feature_dim,
        num_region_labels=4,
    )
    retrieval = vlhub.TdenForImageTextRetrieval(
        vlhub.TdenConfig(**{**fields, "num_decoder_layers": 0, "num_cross_encoder_layers": 0})
    )
    retrieval.save_pretrained(tmp_path / "retrieval")
    processor.save_pretrained(tmp_path / "retrieval")
    captioner = vlhub.TdenForConditionalGeneration(vlhub.TdenConfig(**{**fields, "num_cross_encoder_layers": 0}))
    captioner.save_pretrained(tmp_path / "caption")
    processor.for_task("captioning").save_pretrained(tmp_path / "caption")
    with pytest.raises(ValueError, match="no decoder"):
        finetune_main(
            [
                "--task",
                "captioning",
                "--model_name_or_path",
                str(tmp_path / "retrieval"),
                "--output_dir",
                str(tmp_path / "out"),
            ]
        )
    with pytest.raises(ValueError, match="no decoder"):
        pipeline("image-captioning", model=str(tmp_path / "retrieval"))
    # A captioner's checkpoint starts a retrieval head, as in transformers: the matching poolers new and reported.
    _, info = vlhub.TdenForImageTextRetrieval.from_pretrained(tmp_path / "caption", output_loading_info=True)
    assert info["missing_keys"] and all(key.startswith("similarity.") for key in info["missing_keys"])
    # A captioner cannot rank: refused when the pipeline is built, naming what the folder holds.
    with pytest.raises(
        ValueError,
        match=r"pipeline\('image-text-retrieval'\): .* holds TdenForConditionalGeneration "
        r"\(TDEN's captioning model\), which cannot do image-text-retrieval",
    ):
        pipeline("image-text-retrieval", model=str(tmp_path / "caption"))
