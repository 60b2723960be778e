"""VL-BERT's pre-training objectives (whole-word MLM with visual clues, MVRC, the text-only half) and
`pretrain.py --model_type vl_bert` on user data: runs, logs every loss, resumes exactly."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from transformers import AutoModelForPreTraining, BertTokenizer

import vlhub
from tests.test_training_cli import write_store_dataset
from tests.training_helpers import crash_then_resume, logged_losses, reset_accelerate_state, write_vocab
from vlhub.modeling.vl_bert.objectives_vl_bert import VL_BERT_OBJECTIVES, mask_objects, whole_word_mask
from vlhub.training.cli import pretrain_main
from vlhub.training.objectives import ObjectiveContext


pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def _tokenizer(tmp_path):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "red", "circle", "tri", "##ang", "##le", "a", "blue"]
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(words) + "\n")
    return BertTokenizer(vocab=str(path), do_lower_case=True)


def test_whole_word_masking_masks_every_piece_of_a_chosen_word(tmp_path):
    tok = _tokenizer(tmp_path)
    ids = torch.tensor([tok.convert_tokens_to_ids(["[CLS]", "a", "tri", "##ang", "##le", "red", "[SEP]", "[PAD]"])])
    mask = (ids != 0).long()
    seen_words = set()
    for seed in range(200):
        corrupted, labels = whole_word_mask(ids, mask, tok, torch.tensor([5, 6]), [np.random.default_rng(seed)], 0.5)
        chosen = (labels[0] >= 0).tolist()
        assert chosen[2] == chosen[3] == chosen[4]  # "triangle" is one word
        assert not chosen[0] and not chosen[6] and not chosen[7]  # specials and padding are never chosen
        assert torch.equal(labels[0][labels[0] >= 0], ids[0][labels[0] >= 0])
        if chosen[2] and corrupted[0, 2] == tok.mask_token_id:
            assert (corrupted[0, 2:5] == tok.mask_token_id).all()
        seen_words.add(tuple(chosen))
    assert len(seen_words) > 4


def test_mvrc_never_chooses_the_whole_image_and_keeps_a_tenth():
    real = torch.ones(1, 2001, dtype=torch.long)
    masked, chosen = mask_objects(real, [np.random.default_rng(0)], 0.15)
    assert not chosen[0, 0] and not masked[0, 0]
    assert bool((masked <= chosen).all())
    fraction = chosen[0, 1:].float().mean().item()
    assert 0.12 < fraction < 0.18
    kept = (chosen & ~masked).sum().item() / chosen.sum().item()
    assert 0.05 < kept < 0.16


def test_objective_batch_has_image_rows_then_text_only_rows(tmp_path):
    tok = _tokenizer(tmp_path)
    processor = vlhub.VlBertProcessor(
        feature_extractor=vlhub.VlBertRegionProcessor(region_feature_dim=4), tokenizer=tok
    )
    g = torch.Generator().manual_seed(0)
    regions = {
        name: vlhub.RegionFeatures(
            features=torch.rand(n, 4, generator=g),
            boxes=torch.tensor([[0.0, 0, 5, 5]] * n),
            image_size=(10, 10),
            class_probs=torch.softmax(torch.rand(n, 3, generator=g), 1),
        )
        for name, n in (("x", 3), ("y", 5))
    }

    def encode(examples):
        selected = [regions[e["image_id"]] for e in examples]
        return dict(processor(text=[e["caption"] for e in examples], regions=selected)), selected

    context = ObjectiveContext(
        tokenizer=tok,
        random_token_ids=torch.tensor([5, 6]),
        mlm_probability=0.5,
        region_mask_probability=0.5,
        itm_negative_probability=0.5,
        encode=encode,
        other_image=None,
    )
    examples = [{"image_id": "x", "caption": "a red triangle"}, {"image_id": "y", "caption": "blue circle"}]
    objective = {o.name: o for o in VL_BERT_OBJECTIVES}["mlm-mvrc"]
    batch = objective.build(context, examples, [np.random.default_rng(s) for s in (1, 2)])
    assert batch["input_ids"].shape[0] == 4 and batch["region_features"].shape[0] == 4
    assert batch["region_attention_mask"][2:].sum() == 0 and batch["region_attention_mask"][:2].sum() == 4 + 6
    # Text-only rows: word pieces without [CLS]/[SEP].
    assert tok.cls_token_id not in batch["input_ids"][2:] and tok.sep_token_id not in batch["input_ids"][2:]
    assert batch["input_ids"][0, 0] == tok.cls_token_id
    # MVRC targets: the class distribution of every chosen object; object 0 never.
    labelled = batch["region_class_targets"].sum(-1) > 0
    assert not labelled[:, 0].any() and bool((batch["region_masks"] <= labelled).all())
    # The whole-image feature is the mean of the unmasked regions.
    for row, name in enumerate(("x", "y")):
        n = len(regions[name])
        kept = ~batch["region_masks"][row, 1 : n + 1]
        expected = regions[name].features[kept].sum(0) / (kept.sum() + 1e-5)
        torch.testing.assert_close(batch["region_features"][row, 0], expected)
    torch.manual_seed(0)
    model = vlhub.VlBertForPreTraining(
        vlhub.VlBertConfig(
            vocab_size=len(tok),
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            region_feature_dim=4,
            geometry_embedding_dim=2,
            num_region_labels=3,
            mask_token_id=4,
            max_position_embeddings=32,
        )
    )
    out = model(**batch)
    assert torch.isfinite(out.loss) and out.text_only_mlm_loss is not None


def _run(tmp_path, folder, *extra, callbacks=()):
    return pretrain_main(
        [
            "--model_type",
            "vl_bert",
            "--dataset",
            str(folder),
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


def test_pretrain_py_trains_vl_bert_and_resumes_exactly(tmp_path):
    store = write_store_dataset(tmp_path / "data")
    straight = _run(tmp_path, store, "--output_dir", str(tmp_path / "a"))
    assert straight.global_step == 4
    logged = [r for r in straight.log_history if "loss" in r]
    assert all({"mlm_loss", "text_only_mlm_loss", "mvrc_loss"} <= r.keys() for r in logged)
    assert "mlm-mvrc:1" in (tmp_path / "a" / "README.md").read_text()
    model = AutoModelForPreTraining.from_pretrained(tmp_path / "a")
    assert isinstance(model, vlhub.VlBertForPreTraining)

    crash_then_resume(
        lambda *extra, callbacks=(): _run(
            tmp_path, store, "--output_dir", str(tmp_path / "b"), *extra, callbacks=callbacks
        ),
        crash_step=3,
    )
    expected, got = logged_losses(tmp_path / "a"), logged_losses(tmp_path / "b")
    assert sorted(got) == sorted(expected) == [1, 2, 3, 4]
    for step in expected:
        for key in ("loss", "mlm_loss", "text_only_mlm_loss", "mvrc_loss"):
            assert got[step][key] == pytest.approx(expected[step][key], abs=1e-5), (step, key)


@pytest.mark.slow  # builds the shapes world (minutes on a shared 2-core machine)
def test_finetune_py_vqa_from_a_vl_bert_pretraining_run(tmp_path, monkeypatch):
    """pretrain.py → finetune.py --task vqa on the shapes world: the VQA processor gets the answer slot, the answer
    head's transform starts from the pre-trained MLM transform, and the run is evaluated."""
    from transformers import AutoProcessor

    from vlhub.training.cli import finetune_main
    from vlhub.training.finetuning import load_pretraining_state

    pretrain_main(
        [
            "--model_type",
            "vl_bert",
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
    started = {}
    original_init = vlhub.VlBertForQuestionAnswering.initialize_from_pretraining

    def spy(self, state_dict):
        initialised = original_init(self, state_dict)
        started["dense"] = self.vqa_head[0].dense.weight.detach().clone()
        return initialised

    monkeypatch.setattr(vlhub.VlBertForQuestionAnswering, "initialize_from_pretraining", spy)
    result = finetune_main(
        [
            "--model_name_or_path",
            str(tmp_path / "pre"),
            "--max_steps",
            "2",
            "--per_device_train_batch_size",
            "4",
            "--logging_steps",
            "1",
            "--output_dir",
            str(tmp_path / "vqa"),
        ]
    )
    assert result.global_step == 2
    pretrained = load_pretraining_state(str(tmp_path / "pre"))
    assert torch.equal(started["dense"], pretrained["cls.predictions.transform.dense.weight"])
    processor = AutoProcessor.from_pretrained(tmp_path / "vqa")
    assert isinstance(processor, vlhub.VlBertProcessor) and processor.answer_slot
    assert any("eval_test_vqa_accuracy" in r for r in result.log_history)


def test_training_refuses_e2e_models_with_a_reason(tmp_path):
    # pretrain.py / finetune.py feed precomputed region features; an e2e VL-BERT computes them from pixels.
    from vlhub.training.cli import finetune_main

    config = tmp_path / "e2e.json"
    config.write_text('{"image_feature_precomputed": false, "backbone_res2_channels": 2, "region_feature_dim": 16}')
    with pytest.raises(SystemExit, match=r"pretrain.py: .*e2e\.json is an 'e2e' model .*e2e training is not supported"):
        _run(tmp_path, tmp_path / "unused", "--output_dir", str(tmp_path / "out"), "--config_name", str(config))
    folder = tmp_path / "e2e-model"
    e2e_config = vlhub.VlBertConfig(image_feature_precomputed=False, backbone_res2_channels=2, region_feature_dim=16)
    e2e_config.save_pretrained(folder)
    with pytest.raises(SystemExit, match=r"finetune.py: .*e2e-model is an 'e2e' model"):
        finetune_main(["--model_name_or_path", str(folder), "--task", "vqa", "--output_dir", str(tmp_path / "ft")])
    assert not (tmp_path / "out").exists() and not (tmp_path / "ft").exists()
