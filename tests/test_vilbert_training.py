"""ViLBERT pre-training through pretrain.py (`--model_type vilbert`) and its objectives' batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vlhub
from tests.training_helpers import reset_accelerate_state, synthetic_corpus, tiny_pretraining_run, write_vocab
from vlhub.training.collators import PretrainingCollator
from vlhub.training.objectives import objectives_for


pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def test_pretrain_py_trains_vilbert_with_its_joint_objective(tmp_path):
    from transformers import AutoModelForPreTraining, AutoProcessor

    result = tiny_pretraining_run(tmp_path, "vilbert")
    assert result.global_step == 3
    logged = [r for r in result.log_history if "mlm_loss" in r]
    assert [r["step"] for r in logged] == [1, 2, 3]
    assert all(np.isfinite(r[k]) for r in logged for k in ("mlm_loss", "region_kl_loss", "alignment_loss"))
    model = AutoModelForPreTraining.from_pretrained(tmp_path / "run")
    processor = AutoProcessor.from_pretrained(tmp_path / "run")
    assert isinstance(model, vlhub.VilbertForPreTraining) and isinstance(processor, vlhub.VilbertProcessor)
    assert "ViLBERT pre-trained on" in (tmp_path / "run" / "README.md").read_text()


def test_joint_batch_masks_words_and_regions_and_swaps_captions(tmp_path):
    from transformers import BertTokenizer

    corpus = synthetic_corpus()
    tokenizer = BertTokenizer(vocab=str(write_vocab(tmp_path)), do_lower_case=True)
    feature_dim = next(iter(corpus.regions.values())).feature_dim
    processor = vlhub.get_architecture("vilbert").build_processor(tokenizer, feature_dim)
    objectives = objectives_for("vilbert")
    collator = PretrainingCollator(
        processor, corpus.regions, objectives, mlm_probability=0.5, region_mask_probability=0.5
    )
    examples = [
        {"image_id": i, "caption": c, "objective": "joint", "seed": (n,)} for n, (i, c) in enumerate(corpus.train[:8])
    ]
    batch = collator(examples)
    clean, selected = collator.encode(examples)
    assert set(batch) >= {"labels", "region_labels", "region_class_targets", "alignment_labels"}
    assert (batch["labels"] >= 0).any() and (batch["region_labels"][:, 0] == 0).all()
    swapped = batch["alignment_labels"] == 1
    assert swapped.any() and (~swapped).any()
    for i, regions in enumerate(selected):
        n = len(regions)
        rows = batch["region_features"][i, 1 : n + 1]
        masked = batch["region_labels"][i, 1 : n + 1].bool()
        if not swapped[i]:  # same image and caption as the clean encoding: unmasked rows untouched
            assert torch.equal(rows[~masked], clean["region_features"][i, 1 : n + 1][~masked])
        torch.testing.assert_close(batch["region_features"][i, 0], rows.sum(0) / n)  # global token after masking
        torch.testing.assert_close(batch["region_class_targets"][i, 1 : n + 1], regions.class_probs)
    twelve_in_one = collator([{**e, "objective": "joint-12in1"} for e in examples])
    mismatched = twelve_in_one["alignment_labels"].bool()
    assert mismatched.any() and (twelve_in_one["labels"][mismatched] == -100).all()
    assert (twelve_in_one["region_labels"][mismatched] == 0).all() and (twelve_in_one["labels"][~mismatched] >= 0).any()
    model = vlhub.VilbertForPreTraining(
        vlhub.VilbertConfig(
            vocab_size=len(tokenizer),
            region_feature_dim=feature_dim,
            num_region_labels=batch["region_class_targets"].shape[-1],
            **vlhub.get_architecture("vilbert").config_fields("tiny"),
        )
    )
    outputs = model(**batch)
    assert torch.isfinite(outputs.loss) and outputs.region_kl_loss > 0


def _tiny_vilbert(tmp_path, corpus, **fields):
    from tests.training_helpers import tiny_tokenizer

    tokenizer = tiny_tokenizer(tmp_path)
    feature_dim = corpus.sample_regions().feature_dim
    processor = vlhub.get_architecture("vilbert").build_processor(tokenizer, feature_dim)
    config = vlhub.VilbertConfig(
        vocab_size=len(tokenizer),
        region_feature_dim=feature_dim,
        **{**vlhub.get_architecture("vilbert").config_fields("tiny"), **fields},
    )
    return processor, config


def test_vqa_and_retrieval_fine_tuning_run_for_vilbert(tmp_path):
    from accelerate.utils import set_seed
    from transformers import pipeline

    from tests.test_training_finetune import colour_questions
    from tests.training_helpers import COLOURS
    from vlhub.training import VlhubTrainingArguments, train
    from vlhub.training.finetuning import RetrievalTask, VqaTask

    corpus = synthetic_corpus()
    processor, config = _tiny_vilbert(tmp_path, corpus, id2label=dict(enumerate(COLOURS)))
    set_seed(0)
    task = VqaTask(
        vlhub.VilbertForQuestionAnswering(config),
        processor,
        corpus.regions,
        colour_questions(corpus, corpus.train),
        colour_questions(corpus, corpus.validation[:8]),
        "synthetic",
        "synthetic colour questions",
    )
    result = train(
        task,
        VlhubTrainingArguments(
            output_dir=str(tmp_path / "vqa"),
            max_steps=4,
            per_device_train_batch_size=8,
            logging_steps=1,
            learning_rate=1e-3,
        ),
    )
    losses = [r["loss"] for r in result.log_history if "loss" in r]
    assert len(losses) == 4 and all(np.isfinite(losses))
    assert 0.0 <= result.eval_results["validation_vqa_accuracy"] <= 1.0
    vqa = pipeline("visual-question-answering", model=str(tmp_path / "vqa"))
    assert vqa(image=corpus.sample_regions(), question="the circle", top_k=1)[0]["answer"] in COLOURS

    reset_accelerate_state()
    processor, config = _tiny_vilbert(tmp_path, corpus)
    task = RetrievalTask(
        vlhub.VilbertForImageTextRetrieval(config),
        processor,
        corpus.regions,
        corpus.train,
        corpus.validation,
        "synthetic",
        "synthetic captions",
        num_sampled=4,
        num_hard=2,
        max_gallery_images=4,
    )
    result = train(
        task,
        VlhubTrainingArguments(
            output_dir=str(tmp_path / "itr"),
            max_steps=2,
            per_device_train_batch_size=4,
            logging_steps=1,
            learning_rate=1e-3,
        ),
    )
    assert all(np.isfinite(r["loss"]) for r in result.log_history if "loss" in r)
    assert 0.0 <= result.eval_results["text_to_image_recall@1"] <= 1.0


class _Crash(RuntimeError):
    pass


def test_vilbert_pretraining_resume_reproduces_the_uninterrupted_losses(tmp_path):
    import json

    from accelerate.utils import set_seed

    from tests.training_helpers import tiny_tokenizer
    from vlhub.training import PretrainingTask, VlhubTrainingArguments, build_pretraining_model, train

    config = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        visual_hidden_size=24,
        visual_num_hidden_layers=2,
        visual_num_attention_heads=2,
        visual_intermediate_size=24,
        bi_hidden_size=16,
        bi_num_attention_heads=2,
        visual_co_attention_layers=[0, 1],
        text_co_attention_layers=[0, 1],
    )

    def task(seed):
        corpus = synthetic_corpus()
        set_seed(seed)
        model, processor = build_pretraining_model(None, config, tiny_tokenizer(tmp_path), corpus, "vilbert")
        return PretrainingTask(model, processor, corpus)

    def log(folder):
        return [json.loads(line) for line in (tmp_path / folder / "log_history.jsonl").read_text().splitlines()]

    common = dict(max_steps=5, per_device_train_batch_size=6, logging_steps=1, save_steps=2, learning_rate=1e-3, seed=3)
    train(task(3), VlhubTrainingArguments(output_dir=str(tmp_path / "a"), **common))

    def crash_after_step_3(state):
        if state.step == 3:
            raise _Crash

    with pytest.raises(_Crash):
        train(task(3), VlhubTrainingArguments(output_dir=str(tmp_path / "b"), **common), callbacks=[crash_after_step_3])
    reset_accelerate_state()
    train(task(99), VlhubTrainingArguments(output_dir=str(tmp_path / "b"), resume_from_checkpoint="latest", **common))
    expected, got = log("a"), log("b")
    assert [r["step"] for r in got] == [r["step"] for r in expected]
    assert [r["step"] for r in expected if "loss" in r] == [1, 2, 3, 4, 5]
    assert all("region_kl_loss" in r and "alignment_loss" in r for r in expected if "loss" in r)
    for want, have in zip(expected, got):
        assert want.keys() == have.keys()
        for key in want:
            assert have[key] == pytest.approx(want[key], rel=1e-6, abs=1e-7), (want["step"], key)


def test_unoverlapped_region_count_follows_the_12in1_loader():
    """The 12-in-1 global-token divisor, worked by hand with the loader's `iou` (pixel boxes, +1 convention)."""
    from vlhub.modeling.vilbert.objectives_vilbert import unoverlapped_region_count

    boxes = torch.tensor([[0.0, 0, 9, 9], [0, 0, 9, 4], [5, 5, 14, 14], [20, 20, 29, 29]])
    # box 1 vs box 0: 50 / 100 = 0.5 > 0.4; box 2 vs box 0: 25 / 175 < 0.4; box 3 apart. A masked box covers itself.
    assert unoverlapped_region_count(boxes, torch.tensor([True, False, False, False])) == 2
    assert unoverlapped_region_count(boxes, torch.tensor([False, False, False, True])) == 3
    assert unoverlapped_region_count(boxes, torch.zeros(4, dtype=torch.bool)) == 4
    assert unoverlapped_region_count(boxes, torch.ones(4, dtype=torch.bool)) == 1  # never 0
    # With +1 these overlap 6 / 12 = 0.5 (> 0.4); without it they would overlap 2 / 6 < 0.4.
    pixels = torch.tensor([[0.0, 0, 2, 2], [1, 0, 3, 2], [10, 10, 12, 12]])
    assert unoverlapped_region_count(pixels, torch.tensor([True, False, False])) == 1


def _collator(tmp_path, corpus, **kwargs):
    from transformers import BertTokenizer

    tokenizer = BertTokenizer(vocab=str(write_vocab(tmp_path)), do_lower_case=True)
    processor = vlhub.get_architecture("vilbert").build_processor(tokenizer, corpus.sample_regions().feature_dim)
    return PretrainingCollator(processor, corpus.regions, objectives_for("vilbert"), **kwargs)


def test_joint_12in1_global_token_uses_the_12in1_divisor(tmp_path):
    from vlhub.modeling.vilbert.objectives_vilbert import unoverlapped_region_count

    corpus = synthetic_corpus(num_images=40)
    collator = _collator(tmp_path, corpus, region_mask_probability=0.6)
    examples = [
        {"image_id": i, "caption": c, "objective": "joint-12in1", "seed": (n,)}
        for n, (i, c) in enumerate(corpus.train[:40])
    ]
    batch = collator(examples)
    _, selected = collator.encode(examples)
    smaller = 0
    for i, regions in enumerate(selected):
        if batch["alignment_labels"][i] == 1:  # mismatched: masked too, but its region labels are cleared
            continue
        n = len(regions)
        masked = batch["region_labels"][i, 1 : n + 1].bool()
        divisor = unoverlapped_region_count(regions.boxes, masked)
        smaller += divisor < n
        torch.testing.assert_close(
            batch["region_features"][i, 0] * divisor, batch["region_features"][i, 1 : n + 1].sum(0)
        )
    assert smaller > 0  # the batch holds examples where the divisors of the two releases differ


def test_alignment_negatives_are_drawn_from_the_whole_caption_table(tmp_path):
    corpus = synthetic_corpus()
    collator = _collator(tmp_path, corpus, pairs=corpus.train)
    table = {}
    for image_id, caption in corpus.train:
        table.setdefault(caption, set()).add(image_id)
    outside_batch = 0
    for seed in range(6):
        examples = [
            {"image_id": i, "caption": c, "objective": "alignment", "seed": (seed, n)}
            for n, (i, c) in enumerate(corpus.train[:2])
        ]
        pairs, labels = _swapped_captions(collator, examples)
        for example, pair, label in zip(examples, pairs, labels):
            if label == 1:
                assert example["image_id"] not in table[pair["caption"]]  # another image's caption, from the table
                outside_batch += pair["caption"] not in {e["caption"] for e in examples}
            else:
                assert pair == example
    assert outside_batch > 0
    # A batch of one example still gets a mismatched caption from the table (the same image, another caption).
    alone = [_swapped_captions(collator, [{**examples[0], "seed": (seed,)}]) for seed in range(6)]
    swapped = [pairs[0] for pairs, labels in alone if labels == [1]]
    assert swapped and all(
        p["image_id"] == examples[0]["image_id"] and p["caption"] != examples[0]["caption"] for p in swapped
    )
    from vlhub.training import PretrainingTask

    task = PretrainingTask(*_tiny_model_and_processor(tmp_path, corpus), corpus)
    assert task.collate_fn.context.other_caption is not None and task.eval_collate_fn.context.other_caption is not None


def _swapped_captions(collator, examples):
    from vlhub.modeling.vilbert.objectives_vilbert import _pairs
    from vlhub.training.sampling import SampleKey, example_rng

    rngs = [example_rng(SampleKey(0, e["objective"], tuple(e["seed"]))) for e in examples]
    pairs, labels = _pairs(collator.context, examples, rngs, negatives=True)
    return pairs, labels.tolist()


def _tiny_model_and_processor(tmp_path, corpus):
    processor, config = _tiny_vilbert(tmp_path, corpus, num_region_labels=corpus.sample_regions().class_probs.shape[1])
    return vlhub.VilbertForPreTraining(config), processor
