import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMultipleChoice,
    AutoModelForPreTraining,
    AutoModelForVisualQuestionAnswering,
)

import vlhub
from vlhub import (
    UniterForImageTextRetrieval,
    UniterForMultipleChoice,
    UniterForPreTraining,
    UniterForQuestionAnswering,
    UniterForReferringExpression,
    UniterForVisualEntailment,
    UniterForVisualReasoning,
    UniterModel,
)

from .helpers import random_regions, tiny_processor


@pytest.fixture
def batch(tiny_uniter_config, tiny_vocab):
    processor = tiny_processor(tiny_vocab, tiny_uniter_config)
    regions = [random_regions(4, 16, seed=1), random_regions(7, 16, seed=2)]
    return processor(text=["what colour is the cat ?", "a dog"], regions=regions)


def test_save_load_is_exact_and_auto_classes_resolve(tmp_path, tiny_uniter_config, batch):
    torch.manual_seed(0)
    model = UniterForPreTraining(tiny_uniter_config).eval()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    assert isinstance(AutoConfig.from_pretrained(tmp_path), vlhub.UniterConfig)
    loaded = AutoModelForPreTraining.from_pretrained(tmp_path).eval()
    assert type(loaded) is UniterForPreTraining
    # tied weights survive the round trip
    assert (
        loaded.cls.predictions.decoder.weight.data_ptr() == loaded.uniter.embeddings.word_embeddings.weight.data_ptr()
    )
    with torch.no_grad():
        a, b = model(**batch, objective="mlm"), loaded(**batch, objective="mlm")
    assert torch.equal(a.last_hidden_state, b.last_hidden_state)
    assert torch.equal(a.mlm_logits, b.mlm_logits) and torch.equal(a.itm_logits, b.itm_logits)
    backbone = AutoModel.from_pretrained(tmp_path).eval()
    assert type(backbone) is UniterModel
    with torch.no_grad():
        assert torch.equal(backbone(**batch).pooler_output, a.pooler_output)


def test_eager_and_sdpa_agree(tiny_uniter_config, batch):
    torch.manual_seed(0)
    eager_config = vlhub.UniterConfig(**tiny_uniter_config.to_dict())
    eager_config._attn_implementation = "eager"
    eager = UniterModel(eager_config).eval()
    sdpa_config = vlhub.UniterConfig(**tiny_uniter_config.to_dict())
    sdpa_config._attn_implementation = "sdpa"
    sdpa = UniterModel(sdpa_config).eval()
    sdpa.load_state_dict(eager.state_dict())
    assert eager.config._attn_implementation == "eager" and sdpa.config._attn_implementation == "sdpa"
    with torch.no_grad():
        a, b = eager(**batch), sdpa(**batch)
    real = torch.cat([batch["attention_mask"], batch["region_attention_mask"]], 1).bool()
    assert (a.last_hidden_state[real] - b.last_hidden_state[real]).abs().max() < 1e-5


def test_outputs_hidden_states_and_attentions(tiny_uniter_config, batch):
    tiny_uniter_config._attn_implementation = "eager"  # sdpa does not return attention weights
    model = UniterModel(tiny_uniter_config).eval()
    out = model(**batch, output_hidden_states=True, output_attentions=True)
    length = batch["input_ids"].shape[1] + batch["region_features"].shape[1]
    assert out.last_hidden_state.shape == (2, length, 32) and out.pooler_output.shape == (2, 32)
    assert len(out.hidden_states) == tiny_uniter_config.num_hidden_layers + 1
    assert len(out.attentions) == tiny_uniter_config.num_hidden_layers
    assert out.attentions[0].shape == (2, 4, length, length)
    # padded regions receive no attention
    padded = ~batch["region_attention_mask"].bool()
    assert (
        out.attentions[0][..., batch["input_ids"].shape[1] :][padded[:, None, None, :].expand(-1, 4, length, -1)]
        .abs()
        .max()
        < 1e-6
    )


def test_text_only_and_image_only(tiny_uniter_config, batch):
    model = UniterModel(tiny_uniter_config).eval()
    text_only = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    assert text_only.last_hidden_state.shape[1] == batch["input_ids"].shape[1]
    image_only = model(
        region_features=batch["region_features"],
        region_locations=batch["region_locations"],
        region_attention_mask=batch["region_attention_mask"],
    )
    assert image_only.last_hidden_state.shape[1] == batch["region_features"].shape[1]


def test_pretraining_objectives_losses_and_gradients(tiny_uniter_config, batch):
    torch.manual_seed(0)
    model = UniterForPreTraining(tiny_uniter_config).train()
    labels = torch.full_like(batch["input_ids"], -100)
    labels[0, 2] = 7
    region_masks = torch.zeros_like(batch["region_attention_mask"], dtype=torch.bool)
    region_masks[0, 1] = region_masks[1, 3] = True
    class_targets = torch.softmax(torch.rand(2, 11), -1)
    out = model(
        **batch,
        labels=labels,
        region_masks=region_masks,
        region_feature_targets=torch.rand(2, 16),
        region_class_targets=class_targets,
        itm_labels=torch.tensor([1, 0]),
        objective=None,
    )
    for name in ("mlm_loss", "mrfr_loss", "mrc_kl_loss", "itm_loss"):
        assert torch.isfinite(getattr(out, name)), name
    assert (
        out.mlm_logits.shape == (1, 120) and out.mrfr_predictions.shape == (2, 16) and out.mrc_logits.shape == (2, 11)
    )
    out.loss.backward()
    assert model.uniter.img_embeddings.mask_embedding.weight.grad[1].abs().sum() > 0  # masked regions used row 1
    assert model.uniter.img_embeddings.mask_embedding.weight.grad[0].abs().sum() == 0
    wra = model(**batch, itm_labels=torch.tensor([1, 0]), objective="itm-wra")
    assert wra.wra_distance.shape == (2,) and torch.isfinite(wra.wra_loss)
    assert torch.allclose(wra.loss, wra.itm_loss + 0.1 * wra.wra_loss)
    with pytest.raises(ValueError, match="objective must be one of"):
        model(**batch, objective="nsp")
    with pytest.raises(ValueError, match="one row per masked region"):
        model(**batch, region_masks=region_masks, region_feature_targets=torch.rand(3, 16), objective="mrfr")
    with pytest.raises(ValueError, match="need region_masks"):
        model(**batch, region_feature_targets=torch.rand(2, 16))
    with pytest.raises(ValueError, match="belong to the region objectives .*not objective='itm'"):
        model(**batch, region_masks=region_masks, region_class_targets=class_targets, objective="itm")


def test_in_batch_contrastive_loss_by_hand():
    import math

    from vlhub.modeling.layers import in_batch_contrastive_loss

    text = torch.tensor([[3.0, 0.0], [0.0, 2.0]])  # normalised: the unit vectors
    image = torch.tensor([[1.0, 0.0], [1.0, 1.0]])  # normalised: (1, 0) and (0.7071, 0.7071)
    loss, logits = in_batch_contrastive_loss(text, image, temperature=0.5)
    c = math.sqrt(0.5) / 0.5
    assert torch.allclose(logits, torch.tensor([[2.0, c], [0.0, c]]))
    # text -> image rows: [2, c] (target 0), [0, c] (target 1); image -> text columns: [2, 0] (0), [c, c] (1)
    by_hand = (
        -math.log(math.exp(2) / (math.exp(2) + math.exp(c)))
        - math.log(math.exp(c) / (1 + math.exp(c)))
        - math.log(math.exp(2) / (math.exp(2) + 1))
        - math.log(0.5)
    ) / 4
    assert loss.item() == pytest.approx(by_hand, rel=1e-6)
    # Two captions of one image are not each other's negatives: with one group nothing is left to contrast.
    same, _ = in_batch_contrastive_loss(text, image, temperature=0.5, group_ids=torch.tensor([4, 4]))
    assert same.item() == pytest.approx(0.0, abs=1e-7)
    with pytest.raises(ValueError, match="temperature must be positive"):
        in_batch_contrastive_loss(text, image, temperature=0.0)
    with pytest.raises(ValueError, match=r"both be \(batch, dim\)"):
        in_batch_contrastive_loss(text, image[:1], temperature=0.1)
    with pytest.raises(ValueError, match="group ids must have shape"):
        in_batch_contrastive_loss(text, image, temperature=0.1, group_ids=torch.tensor([0, 1, 2]))


def test_itc_contrasts_the_text_alone_with_the_image_alone(tiny_uniter_config, batch):
    torch.manual_seed(0)
    model = UniterForPreTraining(tiny_uniter_config).eval()
    with torch.no_grad():
        out = model(**batch, objective="itc")
        assert out.itc_logits.shape == (2, 2) and torch.isfinite(out.itc_loss) and torch.equal(out.loss, out.itc_loss)
        # The image side sees the regions after a lone [CLS] (not the caption): other words leave it unchanged ...
        changed_words = dict(batch, input_ids=batch["input_ids"].clone())
        changed_words["input_ids"][:, 1:][batch["attention_mask"][:, 1:].bool()] = 5
        other = model(**changed_words, objective="itc")
        assert torch.allclose(other.pooler_output, out.pooler_output)
        # ... and the text side does not see the regions: swapping the two images swaps the logits' columns.
        swapped = dict(
            batch, **{k: batch[k].flip(0) for k in ("region_features", "region_locations", "region_attention_mask")}
        )
        assert torch.allclose(model(**swapped, objective="itc").itc_logits, out.itc_logits.flip(1), atol=1e-6)
    with pytest.raises(ValueError, match="needs both text"):
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], objective="itc")
    with pytest.raises(ValueError, match="itm_labels belong to other objectives"):
        model(**batch, itm_labels=torch.tensor([1, 0]), objective="itc")
    with pytest.raises(ValueError, match="itc_image_ids belong to"):
        model(**batch, itc_image_ids=torch.tensor([0, 1]), objective="itm")


def test_downstream_heads(tiny_uniter_config, batch):
    config = tiny_uniter_config
    config.id2label = {i: f"answer{i}" for i in range(5)}
    config.label2id = {v: k for k, v in config.id2label.items()}
    vqa = UniterForQuestionAnswering(config)
    out = vqa(**batch, labels=torch.rand(2, 5))
    assert out.logits.shape == (2, 5) and out.loss.ndim == 0
    with pytest.raises(ValueError, match="soft scores"):
        vqa(**batch, labels=torch.tensor([1, 2]))
    ve = UniterForVisualEntailment(vlhub.UniterConfig(**{**config.to_dict(), "id2label": None, "label2id": None}))
    assert ve.config.num_labels == 3 and ve(**batch, labels=torch.tensor([0, 2])).logits.shape == (2, 3)
    retrieval = UniterForImageTextRetrieval(config)
    itm = torch.nn.Linear(config.hidden_size, 2)
    retrieval.init_rank_output_from_itm(itm.weight, itm.bias)
    assert torch.equal(retrieval.rank_output.weight[0], itm.weight[1])
    assert retrieval(**batch).logits.shape == (2, 1)
    assert retrieval(**batch, num_negatives=1).loss >= 0
    with pytest.raises(ValueError, match="whole groups"):
        retrieval(**batch, num_negatives=2)
    re = UniterForReferringExpression(config)
    re_out = re(**batch, labels=torch.tensor([0, 3]))
    assert re_out.logits.shape == batch["region_attention_mask"].shape
    assert (re_out.logits[batch["region_attention_mask"] == 0] == -10000).all()


@pytest.mark.parametrize("head", ["paired", "paired-attn"])
def test_nlvr2_heads(tmp_path, tiny_uniter_config, batch, head):
    config = vlhub.UniterConfig(**{**tiny_uniter_config.to_dict(), "type_vocab_size": 3, "nlvr2_head": head})
    model = UniterForVisualReasoning(config).eval()
    two_images = {
        "input_ids": batch["input_ids"],
        "attention_mask": batch["attention_mask"],
        "region_features": torch.stack([batch["region_features"]] * 2, 1),
        "region_locations": torch.stack([batch["region_locations"]] * 2, 1),
        "region_attention_mask": torch.stack([batch["region_attention_mask"]] * 2, 1),
    }
    out = model(**two_images, labels=torch.tensor([0, 1]))
    assert out.logits.shape == (2, 2) and torch.isfinite(out.loss)
    with pytest.raises(ValueError, match="two images"):
        model(**batch)
    # a backbone-only checkpoint gives the head freshly initialised (finite) parameters
    vlhub.UniterModel(config).save_pretrained(tmp_path)
    fresh = UniterForVisualReasoning.from_pretrained(tmp_path)
    assert all(torch.isfinite(p).all() for p in fresh.parameters())
    if head == "paired-attn":
        assert fresh.attn1.in_proj_weight.abs().max() < 1


def test_multiple_choice(tmp_path, tiny_uniter_config, batch):
    model = UniterForMultipleChoice(tiny_uniter_config).eval()
    choices = {
        "input_ids": torch.stack([batch["input_ids"]] * 3, 1),
        "attention_mask": torch.stack([batch["attention_mask"]] * 3, 1),
        "region_features": batch["region_features"],
        "region_locations": batch["region_locations"],
        "region_attention_mask": batch["region_attention_mask"],
    }
    out = model(**choices, labels=torch.tensor([2, 0]))
    assert out.logits.shape == (2, 3) and out.pair_logits.shape == (2, 3, 2)
    model.save_pretrained(tmp_path)
    assert type(AutoModelForMultipleChoice.from_pretrained(tmp_path)) is UniterForMultipleChoice


def test_vqa_auto_class(tmp_path, tiny_uniter_config):
    tiny_uniter_config.id2label = {0: "yes", 1: "no"}
    UniterForQuestionAnswering(tiny_uniter_config).save_pretrained(tmp_path)
    model = AutoModelForVisualQuestionAnswering.from_pretrained(tmp_path)
    assert type(model) is UniterForQuestionAnswering and model.config.id2label[1] == "no"
    assert vlhub.model_class_for(model.config) is UniterForQuestionAnswering


def test_model_bad_inputs(tiny_uniter_config, batch):
    model = UniterModel(tiny_uniter_config).eval()
    with pytest.raises(ValueError, match="without region_locations"):
        model(input_ids=batch["input_ids"], region_features=batch["region_features"])
    with pytest.raises(ValueError, match=r"region_features must have shape \(batch, num_regions, 16\)"):
        model(input_ids=batch["input_ids"], region_features=torch.rand(2, 3, 8), region_locations=torch.rand(2, 3, 7))
    with pytest.raises(ValueError, match="region_locations must have shape"):
        model(input_ids=batch["input_ids"], region_features=torch.rand(2, 3, 16), region_locations=torch.rand(2, 3, 4))
    with pytest.raises(ValueError, match="exceeds the model's 64 position embeddings"):
        model(input_ids=torch.ones(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="neither"):
        model()
    with pytest.raises(ValueError, match="no region_attention_mask"):
        model(
            input_ids=batch["input_ids"],
            region_features=batch["region_features"],
            region_locations=batch["region_locations"],
        )
    with pytest.raises(ValueError, match="differ in size"):
        model(
            input_ids=batch["input_ids"][:1],
            region_features=batch["region_features"],
            region_locations=batch["region_locations"],
            region_attention_mask=batch["region_attention_mask"],
        )
    # The region mask's shape is checked before the mask meets the text mask (the shared check_region_layout).
    with pytest.raises(ValueError, match=r"region_attention_mask must have shape \(2, 3\)"):
        model(
            input_ids=batch["input_ids"],
            region_features=torch.rand(2, 3, 16),
            region_locations=torch.rand(2, 3, 7),
            region_attention_mask=torch.ones(2, 4),
        )


def test_itm_head_learns_a_cross_modal_matching_task():
    """Gradients reach both modalities: the pair is a match iff the word agrees with the sign of the regions, which
    no single modality can tell (XOR), so ITM accuracy rises only through cross-modal attention."""
    from vlhub import UniterConfig, UniterForPreTraining

    torch.manual_seed(0)
    config = UniterConfig(
        vocab_size=20,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=16,
        region_feature_dim=8,
        num_region_labels=5,
    )
    model = UniterForPreTraining(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)

    def batch(size=32, regions=3):
        word, sign = torch.randint(0, 2, (2, size), generator=generator)
        input_ids = torch.stack([torch.full((size,), 2), 5 + word, torch.full((size,), 3)], dim=1)
        features = (sign.float() * 2 - 1)[:, None, None] + 0.1 * torch.randn(size, regions, 8, generator=generator)
        return dict(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            region_features=features,
            region_locations=torch.rand(size, regions, 7, generator=generator),
            region_attention_mask=torch.ones(size, regions, dtype=torch.long),
            itm_labels=(word == sign).long(),
        )

    for _ in range(150):
        loss = model(**batch(), objective="itm").loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        held_out = batch(256)
        accuracy = (model(**held_out, objective="itm").itm_logits.argmax(-1) == held_out["itm_labels"]).float().mean()
    assert accuracy > 0.95
