"""TDEN fine-tuning beyond XE captioning and VQA: self-critical captioning (the `caption_scoring_inputs` hook against
decoding, `finetune.py --task captioning --scst` with exact resumption), retrieval with the original's in-batch
hardest-negative triplet loss (`finetune.py --task retrieval`, the retrieval pipeline on the result) and the VQA loss
against the original's formula."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import vlhub
from tests.test_scst import check_scoring_hook, check_scst_training, scst_run
from tests.test_training_cli import write_store_dataset
from tests.training_helpers import assert_resume_reproduces, synthetic_corpus, tiny_tokenizer
from vlhub.registry import Architecture
from vlhub.training.pretraining import build_pretraining_model

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def _tiny(tmp_path, head, seed=0, **overrides):
    """A tiny TDEN `head` (a class) for the synthetic corpus, with the pre-training run's processor."""
    corpus = synthetic_corpus()
    torch.manual_seed(seed)
    pretraining, processor = build_pretraining_model(None, "tiny", tiny_tokenizer(tmp_path), corpus, model_type="tden")
    config = pretraining.config
    for key, value in overrides.items():
        setattr(config, key, value)
    return head(config), processor, corpus


# ---------------------------------------------------------------------------------------------------- SCST
def test_the_tden_scoring_hook_gives_the_decoders_log_probabilities(tmp_path):
    model, processor, corpus = _tiny(tmp_path, vlhub.TdenForConditionalGeneration)
    images = list(corpus.regions)[:6]
    prompt = dict(processor.for_task("captioning")(regions=[corpus.regions[i] for i in images], return_tensors="pt"))
    captions, mask = check_scoring_hook(model, prompt)
    # Explicit generation token types give the same scores; bad captions are named.
    typed = dict(prompt, token_type_ids=torch.ones_like(prompt["input_ids"]))
    with torch.no_grad():
        plain = model(**model.caption_scoring_inputs(prompt, captions, mask)).logits
        again = model(**model.caption_scoring_inputs(typed, captions, mask)).logits
    torch.testing.assert_close(again, plain)
    with pytest.raises(ValueError, match="caption_ids must be"):
        model.caption_scoring_inputs(prompt, captions[:2], mask[:2])
    with pytest.raises(ValueError, match="caption_mask must have"):
        model.caption_scoring_inputs(prompt, captions, mask[:, :2])
    with pytest.raises(ValueError, match="positions"):
        model.caption_scoring_inputs(prompt, captions.repeat(1, 20), None)


# ~5 s: the full suite runs it; the fast loop keeps tests/test_scst.py's run of finetune.py --task scst (unified_vlp,
# training and exact resume) and this file's cheaper checks of TDEN's caption scoring.
@pytest.mark.slow
def test_finetune_py_scst_trains_a_tiny_tden_and_resumes_exactly(tmp_path):
    model, processor, _ = _tiny(tmp_path, vlhub.TdenForConditionalGeneration)
    model.save_pretrained(tmp_path / "captioner")
    processor.for_task("captioning").save_pretrained(tmp_path / "captioner")
    store = write_store_dataset(tmp_path / "data")

    def run(*extra, callbacks=()):
        return scst_run(store, tmp_path / "captioner", "--caption_metrics", "CIDEr", *extra, callbacks=callbacks)

    check_scst_training(run, tmp_path / "a", tmp_path / "b")
    trained = vlhub.TdenForConditionalGeneration.from_pretrained(tmp_path / "a")
    assert not torch.equal(trained.lm_head.decoder.bias, model.lm_head.decoder.bias)  # it trained


# ---------------------------------------------------------------------------------------------------- VQA loss
def test_vqa_loss_is_the_originals_bce_summed_over_answers_on_both_branches(tmp_path):
    # X-modaler: BCEWithLogitsLoss(reduction="mean") * num_labels on the understanding and on the generation logits,
    # summed; written out here per element: -[y log s(x) + (1 - y) log(1 - s(x))], summed over the answers, averaged
    # over the questions.
    model, processor, corpus = _tiny(tmp_path, vlhub.TdenForQuestionAnswering, bidirectional_decoder=True, num_labels=5)
    model.eval()
    pairs = corpus.train[:3]
    batch = processor(text=[c for _, c in pairs], regions=[corpus.regions[i] for i, _ in pairs], return_tensors="pt")
    labels = torch.tensor([[1.0, 0.3, 0, 0, 0], [0, 0, 0.6, 0.9, 0], [0, 0, 0, 0, 0]])
    with torch.no_grad():
        out = model(**batch, labels=labels)

    def by_hand(logits):
        return -(labels * F.logsigmoid(logits) + (1 - labels) * F.logsigmoid(-logits)).sum(1).mean()

    torch.testing.assert_close(out.loss, by_hand(out.understanding_logits) + by_hand(out.generation_logits))
    with pytest.raises(ValueError, match=r"labels must be soft scores of the logits' shape \(3, 5\)"):
        model(**batch, labels=labels[:, :4])


# ---------------------------------------------------------------------------------------------------- retrieval
def test_retrieval_task_follows_the_heads_negatives(tmp_path):
    from vlhub.training.finetuning import InBatchRetrievalTask, RetrievalTask, retrieval_task

    model, processor, corpus = _tiny(tmp_path, vlhub.TdenForImageTextRetrieval)
    args = (processor, corpus.regions, corpus.train, corpus.validation, "synthetic", "synthetic captions")
    task = retrieval_task(model, *args, num_sampled=5, num_hard=9)  # sampled-negative settings do not apply
    assert type(task) is InBatchRetrievalTask and "hardest in the batch" in task.hyperparameters()["negatives"]
    assert "in-batch" in task.card_info().summary
    with pytest.raises(ValueError, match="at least 2 pairs"):
        task.train_sampler(1, 1, 0)
    with pytest.raises(TypeError, match="takes no num_hard"):
        InBatchRetrievalTask(model, *args, num_hard=2)
    with pytest.raises(TypeError, match="takes no test split"):  # it evaluates over the validation gallery
        retrieval_task(model, *args, test=corpus.validation)
    with pytest.warns(FutureWarning) as replaced:  # the keyword names before FinetuningTask's
        renamed = InBatchRetrievalTask(
            model,
            processor,
            corpus.regions,
            train_pairs=corpus.train,
            validation_pairs=corpus.validation,
            dataset_name="s",
            dataset_description="s",
        )
    messages = [str(warning.message) for warning in replaced]
    assert any("train_pairs= is replaced by train=" in m for m in messages), messages
    assert any("validation_pairs= is replaced by validation=" in m for m in messages), messages
    assert renamed.train == corpus.train and renamed.validation == list(corpus.validation)

    class SampledHead(torch.nn.Module):  # an architecture that declares nothing trains on sampled hard negatives
        config = vlhub.UniterConfig()

    assert type(retrieval_task(SampledHead(), *args, num_sampled=5, num_hard=2)) is RetrievalTask
    with pytest.raises(ValueError, match="hard negatives"):
        retrieval_task(SampledHead(), *args, num_sampled=2, num_hard=3)
    odd = dict(name="Odd", package="odd", config="C", processor="P", region_processor="R")
    with pytest.raises(ValueError, match="architecture 'odd' .*retrieval_negatives 'everything' is none of"):
        Architecture(model_type="odd", retrieval_negatives="everything", **odd)


def test_in_batch_retrieval_step_is_the_hardest_negative_hinge_without_same_image_pairs(tmp_path):
    from vlhub.training.finetuning import InBatchRetrievalTask

    model, processor, corpus = _tiny(
        tmp_path, vlhub.TdenForImageTextRetrieval, num_cross_encoder_layers=0, num_decoder_layers=0
    )
    task = InBatchRetrievalTask(model, processor, corpus.regions, corpus.train, corpus.validation, "s", "s")
    images = list(corpus.regions)
    second = next(c for i, c in corpus.train if i == images[0] and c != corpus.train[0][1])
    examples = [
        {"image_id": images[0], "caption": corpus.train[0][1]},
        {"image_id": images[1], "caption": "a red circle"},
        {"image_id": images[0], "caption": second},
        {"image_id": images[2], "caption": "two blue squares"},
    ]
    batch = task.collate_fn(examples)
    assert batch["image_ids"].tolist() == [0, 1, 0, 2]  # the two captions of the first image share an id
    plain = processor(text=[e["caption"] for e in examples], regions=[corpus.regions[e["image_id"]] for e in examples])
    assert all(torch.equal(batch[k], plain[k]) for k in plain)
    model.eval()  # BatchNorm's running statistics and no dropout: the same scores twice
    with torch.no_grad():
        loss, _ = task.training_step(model, dict(batch))
        sim = model(**plain).logits_per_text
    margin, same = model.config.ranking_margin, batch["image_ids"]
    total = 0.0
    for i in range(4):  # sentence i against every other image, image i against every other sentence
        negatives = [j for j in range(4) if same[j] != same[i]]
        total += max(max(0.0, margin + sim[i, j].item() - sim[i, i].item()) for j in negatives)
        total += max(max(0.0, margin + sim[j, i].item() - sim[i, i].item()) for j in negatives)
    assert loss.item() == pytest.approx(total / 4, abs=1e-6)


def _retrieval_run(store, source, *extra, callbacks=()):
    from vlhub.training.cli import finetune_main

    return finetune_main(
        [
            "--task",
            "retrieval",
            "--model_name_or_path",
            str(source),
            "--dataset",
            str(store / "captions.jsonl"),
            "--region_store",
            str(store),
            "--max_steps",
            "4",
            "--per_device_train_batch_size",
            "6",
            "--logging_steps",
            "1",
            "--save_steps",
            "2",
            "--learning_rate",
            "1e-3",
            "--seed",
            "3",
            "--max_gallery_images",
            "8",
            *extra,
        ],
        callbacks=callbacks,
    )


def test_finetune_py_retrieval_from_a_tden_pretraining_model_resumes_and_serves_the_pipeline(tmp_path):
    from transformers import pipeline

    pretraining, processor, corpus = _tiny(tmp_path, vlhub.TdenForPreTraining)
    pretraining.save_pretrained(tmp_path / "pre")
    processor.save_pretrained(tmp_path / "pre")
    # The retrieval head starts from the pre-trained image-sentence matching head, without the parts it never runs.
    start = vlhub.TdenForImageTextRetrieval.from_pretrained(tmp_path / "pre")
    assert start.tden.cross_encoder is None and start.tden.decoder is None
    torch.testing.assert_close(start.similarity.state_dict(), pretraining.similarity.state_dict())
    store = write_store_dataset(tmp_path / "data")
    result = _retrieval_run(store, tmp_path / "pre", "--output_dir", str(tmp_path / "a"))
    assert result.global_step == 4 and all(
        0.0 <= result.eval_results[f"text_to_image_recall@{k}"] <= 1.0 for k in (1, 5, 10)
    )
    assert "in-batch ranking loss" in (tmp_path / "a" / "README.md").read_text()
    assert_resume_reproduces(
        lambda *extra, callbacks=(): _retrieval_run(store, tmp_path / "pre", *extra, callbacks=callbacks),
        tmp_path / "a",
        tmp_path / "b",
        crash_step=3,
    )
    trained = vlhub.TdenForImageTextRetrieval.from_pretrained(tmp_path / "a").eval()
    assert trained.config.num_cross_encoder_layers == 0 and trained.config.num_decoder_layers == 0
    assert not torch.equal(trained.similarity.t_pooler.embed.weight, start.similarity.t_pooler.embed.weight)
    ranker = pipeline("image-text-retrieval", model=str(tmp_path / "a"))
    image_id = corpus.train[0][0]
    texts = [c for _, c in corpus.train[:5]]
    ranked = ranker(image=corpus.regions[image_id], texts=texts)
    batch = processor(text=texts, regions=[corpus.regions[image_id]] * len(texts))
    with torch.no_grad():
        logits = trained(**batch).logits[:, 0]
    assert [r["text"] for r in ranked] == [texts[i] for i in logits.argsort(descending=True).tolist()]
    torch.testing.assert_close(torch.tensor([r["logit"] for r in ranked]), logits.sort(descending=True).values)


def test_two_tower_gallery_scores_encode_each_side_once_and_equal_every_pair_cross_encoded(tmp_path):
    from accelerate import Accelerator

    from vlhub.training import VlhubTrainingArguments
    from vlhub.training.finetuning import InBatchRetrievalTask, RetrievalTask

    model, processor, corpus = _tiny(
        tmp_path, vlhub.TdenForImageTextRetrieval, num_cross_encoder_layers=0, num_decoder_layers=0
    )
    model.eval()
    common = (model, processor, corpus.regions, corpus.train, corpus.validation, "s", "s")
    images = sorted({i for i, _ in corpus.validation})[:5]
    texts = [pair for pair in corpus.validation if pair[0] in images][:7]
    accelerator = Accelerator(cpu=True)
    args = VlhubTrainingArguments(output_dir=str(tmp_path / "run"), per_device_eval_batch_size=4)
    calls = []
    model.register_forward_hook(lambda module, inputs, outputs: calls.append(1))
    with torch.no_grad():
        fast = InBatchRetrievalTask(*common).gallery_scores(accelerator, model, args, texts, images)
        encodings = len(calls)
        every_pair = RetrievalTask(*common).gallery_scores(accelerator, model, args, texts, images)
    assert fast.shape == every_pair.shape == (len(texts), len(images))
    assert encodings == 1  # max(7, 5) = 7 pairs fit one evaluation batch (at least 64)
    torch.testing.assert_close(torch.from_numpy(fast), torch.from_numpy(every_pair), atol=1e-5, rtol=1e-5)
