"""Self-critical sequence training (`finetune.py --task captioning --scst`): the CIDEr-D reward and the loss against
hand-worked values, the captioning hook against decoding, reproducible sampling, exact resumption, clear errors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import vlhub
from tests.test_training_cli import write_store_dataset
from tests.training_helpers import (
    assert_resume_reproduces,
    logged_losses,
    reset_accelerate_state,
    synthetic_corpus,
    tiny_tokenizer,
)
from vlhub.evaluation.captions import CiderD, caption_words
from vlhub.training.captioning import (
    PromptCollator,
    SelfCriticalCaptioningTask,
    caption_token_mask,
    check_can_caption,
    self_critical_loss,
)
from vlhub.training.sampling import SampleKey

pytest.importorskip("pycocoevalcap")


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    yield
    reset_accelerate_state()


# ---------------------------------------------------------------------------------------------------- reward
def test_caption_words_follow_the_ptb_tokenization():
    assert caption_words("A man's T-shirt, isn't (really) \"red\".") == [
        "a",
        "man",
        "'s",
        "t-shirt",
        "is",
        "n't",
        "really",
        "red",
    ]
    assert caption_words("Two dogs... 3.5 metres; ok?") == ["two", "dogs", "3.5", "metres", "ok"]


def test_cider_d_reward_against_hand_worked_values():
    # Training references: A = "a red circle", B = "a blue square" (one each). Two documents, so idf(g) =
    # log 2 - log(max(1, df(g))): "a" (in both) weighs 0, every other seen n-gram log 2, an unseen one log 2 as well.
    reward = CiderD({"A": ["a red circle"], "B": ["A blue square."]})
    scores = reward(["a red circle", "A red square", "red circle", "", "a blue square"], ["A", "A", "A", "A", "B"])
    # Identical caption: cosine 1 for n = 1, 2, 3; no 4-grams (0); no length penalty: 10 * 3/4.
    assert scores[0] == pytest.approx(7.5, abs=1e-9)
    # "a red square" vs "a red circle": n=1 vectors (red, square) vs (red, circle) with equal weights -> 1/2;
    # n=2 ("a red", "red square") vs ("a red", "red circle") -> 1/2; n=3 -> 0; n=4 -> 0.  10 * 1/4.
    assert scores[1] == pytest.approx(2.5, abs=1e-9)
    # "red circle" (2 words) vs "a red circle" (3): n=1 cosine 1 ("a" weighs 0); n=2 "red circle" vs
    # ("a red", "red circle") -> 1/sqrt(2); length penalty exp(-(2-3)^2 / (2 * 6^2)).
    assert scores[2] == pytest.approx(10 * (1 + 1 / math.sqrt(2)) / 4 * math.exp(-1 / 72), abs=1e-9)
    assert scores[3] == 0.0 and scores[4] == pytest.approx(7.5, abs=1e-9)
    # The document frequencies are the training corpus', not the batch's: scored alone (one image in the batch,
    # where pycocoevalcap's corpus mode would give every n-gram idf 0), the caption keeps its 7.5.
    assert reward(["a red circle"], ["A"])[0] == pytest.approx(7.5, abs=1e-9)
    # The self-critical reward of sampling "a red square" when greedy decoding says "a red circle".
    assert reward(["a red square"], ["A"])[0] - reward(["a red circle"], ["A"])[0] == pytest.approx(-5.0, abs=1e-9)
    with pytest.raises(KeyError, match="'C'"):
        reward(["a red circle"], ["C"])
    with pytest.raises(ValueError, match="non-empty"):
        CiderD({"A": []})


def test_loss_weighs_the_words_up_to_the_end_token():
    # stop ids: [SEP] = 3 and [PAD] = 0. Row 0 ends at its [SEP] (3 tokens), row 1 at a sampled [PAD] (2 tokens),
    # row 2 never ends (all 4 tokens).
    captions = torch.tensor([[7, 8, 3, 0], [9, 0, 5, 3], [5, 6, 7, 8]])
    mask = caption_token_mask(captions, [3, 0])
    assert mask.tolist() == [[True, True, True, False], [True, True, False, False], [True, True, True, True]]
    log_probs = torch.tensor([[-1.0, -2.0, -0.5, -9.0], [-0.25, -1.0, -9.0, -9.0], [-1.0, -1.0, -1.0, -1.0]])
    advantages = torch.tensor([2.0, -1.0, 0.5])
    # -(2 * (-3.5) + (-1) * (-1.25) + 0.5 * (-4)) / 9 = -(-7 + 1.25 - 2) / 9
    assert self_critical_loss(log_probs, mask, advantages).item() == pytest.approx(7.75 / 9)


# ---------------------------------------------------------------------------------------------------- the hook
def _tiny_captioner(tmp_path, seed=0):
    from vlhub.training.pretraining import build_pretraining_model

    corpus = synthetic_corpus()
    torch.manual_seed(seed)
    pretraining, processor = build_pretraining_model(
        None, "tiny", tiny_tokenizer(tmp_path), corpus, model_type="unified_vlp"
    )
    return vlhub.UnifiedVlpForConditionalGeneration(pretraining.config), processor, corpus


def check_scoring_hook(model, prompt: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """`model.caption_scoring_inputs` scores sampled captions (of different lengths) with the log-probabilities that
    decoding gave them, with eager and sdpa attention. Returns the captions and their mask."""
    model.eval()
    torch.manual_seed(1)
    out = model.generate(
        **prompt, max_new_tokens=7, do_sample=True, top_k=0, output_logits=True, return_dict_in_generate=True
    )
    captions = out.sequences[:, prompt["input_ids"].shape[1] :]
    mask = caption_token_mask(captions, [model.config.eos_token_id, model.config.pad_token_id])
    assert len(set(mask.sum(1).tolist())) > 1  # captions of different lengths, padding after the shorter ones
    decoded = torch.stack(out.logits, 1).log_softmax(-1).gather(-1, captions[..., None]).squeeze(-1)
    for implementation in ("eager", "sdpa"):
        model.config._attn_implementation = implementation
        with torch.no_grad():
            logits = model(**model.caption_scoring_inputs(prompt, captions, mask)).logits
        assert logits.shape[:2] == captions.shape
        scored = logits.log_softmax(-1).gather(-1, captions[..., None]).squeeze(-1)
        torch.testing.assert_close(scored[mask], decoded[mask], atol=1e-5, rtol=0)
    return captions, mask


def test_the_vlp_scoring_hook_gives_the_decoders_log_probabilities(tmp_path):
    model, processor, corpus = _tiny_captioner(tmp_path)
    images = list(corpus.regions)[:6]
    check_scoring_hook(model, dict(processor(regions=[corpus.regions[i] for i in images], return_tensors="pt")))


# ---------------------------------------------------------------------------------------------------- the task
def _task(tmp_path, model=None, **kwargs):
    captioner, processor, corpus = _tiny_captioner(tmp_path)
    return SelfCriticalCaptioningTask(
        model or captioner,
        processor,
        corpus.regions,
        corpus.train,
        None,
        "synthetic",
        "synthetic captions",
        max_new_tokens=8,
        **kwargs,
    ), corpus


def test_sampling_is_a_function_of_the_batch_seeds_only(tmp_path):
    task, _ = _task(tmp_path, num_samples=2)
    keys = [SampleKey(i, "scst", (0, 0, i, 2)) for i in range(4)]
    batch = task.collate_fn([task.train_dataset[k] for k in keys])
    again = task.collate_fn([task.train_dataset[k] for k in keys])
    assert int(batch["sample_seed"]) == int(again["sample_seed"])
    other = task.collate_fn([task.train_dataset[SampleKey(k.index, "scst", (1, 0, k.index, 2))] for k in keys])
    assert int(other["sample_seed"]) != int(batch["sample_seed"])
    model = task.model.train()
    results = []
    for global_seed, source in ((0, batch), (123, again), (0, other)):
        torch.manual_seed(global_seed)  # the global state drives dropout only
        loss, parts = task.training_step(model, dict(source))
        assert torch.isfinite(loss) and set(parts) == {"reward", "baseline_reward", "scst_loss"}
        results.append((parts["reward"].item(), parts["baseline_reward"].item()))
    assert results[0] == results[1]  # same seeds, another global state: the same samples, the same rewards
    assert results[0][1] == results[2][1] and results[0][0] != results[2][0]  # greedy the same, samples not


def scst_run(store, source, *extra, callbacks=()):
    """`finetune.py --task captioning --scst` from `source` on the region store dataset `store`: 4 steps of 4
    images, captions of at most 8 tokens, a checkpoint every 2 steps."""
    from vlhub.training.cli import finetune_main

    return finetune_main(
        [
            "--task",
            "captioning",
            "--scst",
            "--model_name_or_path",
            str(source),
            "--dataset",
            str(store / "captions.jsonl"),
            "--region_store",
            str(store),
            "--max_caption_tokens",
            "8",
            "--max_steps",
            "4",
            "--per_device_train_batch_size",
            "4",
            "--logging_steps",
            "1",
            "--save_steps",
            "2",
            "--learning_rate",
            "1e-3",
            "--seed",
            "5",
            *extra,
        ],
        callbacks=callbacks,
    )


def check_scst_training(run, straight: Path, resumed: Path) -> None:
    """`run(*extra, callbacks=())` (an `scst_run`) into `straight` takes its 4 steps, logs the reward, the greedy
    baseline's reward and the loss at each, writes a model card saying how it trained, and, crashed after step 3 and
    resumed into `resumed`, logs exactly the same."""
    assert run("--output_dir", str(straight)).global_step == 4
    logged = logged_losses(straight)
    assert sorted(logged) == [1, 2, 3, 4]
    for row in logged.values():
        assert {"reward", "baseline_reward", "scst_loss"} <= set(row) and row["scst_loss"] == row["loss"]
        assert row["reward"] >= 0 and row["baseline_reward"] >= 0
    assert "self-critical" in (straight / "README.md").read_text()
    assert_resume_reproduces(run, straight, resumed, crash_step=3, keys=("loss", "reward", "baseline_reward"))


def test_finetune_py_scst_trains_a_tiny_vlp_and_resumes_exactly(tmp_path):
    model, processor, _ = _tiny_captioner(tmp_path)
    model.save_pretrained(tmp_path / "captioner")
    processor.save_pretrained(tmp_path / "captioner")
    store = write_store_dataset(tmp_path / "data")
    check_scst_training(
        lambda *extra, callbacks=(): scst_run(store, tmp_path / "captioner", *extra, callbacks=callbacks),
        tmp_path / "a",
        tmp_path / "b",
    )
    trained = vlhub.UnifiedVlpForConditionalGeneration.from_pretrained(tmp_path / "a")
    assert not torch.equal(trained.cls.predictions.bias, model.cls.predictions.bias)  # it trained


def test_scst_refuses_models_that_cannot_caption_and_other_tasks(tmp_path):
    from vlhub.training.cli import finetune_main

    captioner, processor, corpus = _tiny_captioner(tmp_path)
    vqa = vlhub.UnifiedVlpForQuestionAnswering(captioner.config)
    with pytest.raises(
        ValueError, match="UnifiedVlpForQuestionAnswering cannot be trained as a captioner.*caption_scoring_inputs"
    ):
        check_can_caption(vqa)
    # A VQA checkpoint loaded into the captioning class: its masked-LM head was not kept.
    vqa.save_pretrained(tmp_path / "vqa")
    loaded = vlhub.UnifiedVlpForConditionalGeneration.from_pretrained(tmp_path / "vqa")
    with pytest.raises(ValueError, match="cannot generate captions"):
        SelfCriticalCaptioningTask(loaded, processor, corpus.regions, corpus.train, None, "s", "s")
    with pytest.raises(ValueError, match="num_samples"):
        _task(tmp_path, num_samples=0)
    with pytest.raises(SystemExit, match="--scst is self-critical training of a captioner.*--task vqa"):
        finetune_main(["--task", "vqa", "--scst", "--model_name_or_path", str(tmp_path / "vqa")])
    processor.save_pretrained(tmp_path / "vqa")
    store = write_store_dataset(tmp_path / "data")
    with pytest.raises(SystemExit, match="--scst: .*cannot generate captions"):
        scst_run(store, tmp_path / "vqa", "--output_dir", str(tmp_path / "c"))


def test_prompt_collator_names_a_missing_image(tmp_path):
    _, processor, corpus = _tiny_captioner(tmp_path)
    collator = PromptCollator(processor, {}, ["img000"])
    with pytest.raises(KeyError, match="img000"):
        collator([{"index": 0, "seed": (0,)}])
    assert np.isfinite(
        float(PromptCollator(processor, corpus.regions, ["img000"])([{"index": 0, "seed": (0,)}])["sample_seed"])
    )
