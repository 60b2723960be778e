"""The e2e release: no tiny fixture of the original exists (its CNN cannot be made small), so

- the key map is proven on the release's exact key layout (ResNet-101 base: 901 entries, built here from the spec's
  description of `vl-bert-base-e2e.model`) against a base-size model on the meta device, and
- the visual path (pixels + boxes → object embeddings) is proven against a plain reference computation written here
  from the spec (torchvision-style ResNet with the stride in the 1x1 convs and eval BatchNorm, legacy 14x14 RoIAlign
  at 1/16 with one sample per bin, res5 with stride 1 and dilation 2, 14x14 average pool, then the geometry-first
  projection), on a narrow ResNet in the release's key layout converted by `vlhub convert vl_bert`.
"""

import re

import pytest
import torch
import torch.nn.functional as F
from torchvision.ops import roi_align

import vlhub
from vlhub.modeling.vl_bert.convert_vl_bert import convert_vl_bert, vl_bert_key_map

from .conftest import fixtures_root
from .release_files import vl_bert_files

BLOCKS = {50: (3, 4, 6), 101: (3, 4, 23)}


def resnet_keys(prefix: str, blocks=(3, 4, 23), stem=64, width=64, with_head_copy=True) -> dict[str, tuple]:
    """`{key: shape}` of the original `image_feature_extractor` CNN (torchvision ResNet names, BatchNorm with
    `num_batches_tracked`), `width` = planes of layer1 (channels ×4 at each block output)."""
    keys: dict[str, tuple] = {}

    def bn(name, channels):
        for field in ("weight", "bias", "running_mean", "running_var"):
            keys[f"{name}.{field}"] = (channels,)
        keys[f"{name}.num_batches_tracked"] = ()

    def layer(name, count, inplanes, planes):
        for i in range(count):
            block = f"{name}.{i}"
            keys[f"{block}.conv1.weight"] = (planes, inplanes if i == 0 else planes * 4, 1, 1)
            bn(f"{block}.bn1", planes)
            keys[f"{block}.conv2.weight"] = (planes, planes, 3, 3)
            bn(f"{block}.bn2", planes)
            keys[f"{block}.conv3.weight"] = (planes * 4, planes, 1, 1)
            bn(f"{block}.bn3", planes * 4)
            if i == 0:
                keys[f"{block}.downsample.0.weight"] = (planes * 4, inplanes, 1, 1)
                bn(f"{block}.downsample.1", planes * 4)

    keys[f"{prefix}backbone.conv1.weight"] = (stem, 3, 7, 7)
    bn(f"{prefix}backbone.bn1", stem)
    inplanes = stem
    for index, count in enumerate(blocks):
        planes = width * 2**index
        layer(f"{prefix}backbone.layer{index + 1}", count, inplanes, planes)
        inplanes = planes * 4
    layer(f"{prefix}roi_head_feature_extractor", 3, inplanes, width * 8)
    if with_head_copy:
        for key, shape in list(keys.items()):
            if key.startswith(f"{prefix}roi_head_feature_extractor."):
                keys[key.replace("roi_head_feature_extractor.", "head.0.")] = shape
    return keys


def pretraining_keys(hidden=768, layers=12, vocab=30522, intermediate=3072, appearance=2048) -> dict[str, tuple]:
    """The non-CNN keys of `vl-bert-base-e2e.model` (spec §6)."""
    keys = {
        "image_feature_extractor.obj_downsample.1.weight": (hidden, 2048 + appearance),
        "image_feature_extractor.obj_downsample.1.bias": (hidden,),
        "object_linguistic_embeddings.weight": (1, hidden),
        "object_mask_word_embedding.weight": (1, hidden),
        "aux_text_visual_embedding.weight": (1, hidden),
        "vlbert.word_embeddings.weight": (vocab, hidden),
        "vlbert.end_embedding.weight": (1, hidden),
        "vlbert.position_embeddings.weight": (512, hidden),
        "vlbert.token_type_embeddings.weight": (3, hidden),
    }
    for name in ("embedding_LayerNorm", "visual_ln_text", "visual_ln_object"):
        keys[f"vlbert.{name}.weight"] = keys[f"vlbert.{name}.bias"] = (hidden,)
    for i in range(layers):
        p = f"vlbert.encoder.layer.{i}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            keys[p + name + ".weight"], keys[p + name + ".bias"] = (hidden, hidden), (hidden,)
        keys[p + "intermediate.dense.weight"], keys[p + "intermediate.dense.bias"] = (
            (intermediate, hidden),
            (intermediate,),
        )
        keys[p + "output.dense.weight"], keys[p + "output.dense.bias"] = (hidden, intermediate), (hidden,)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            keys[p + name + ".weight"] = keys[p + name + ".bias"] = (hidden,)
    keys["vlbert.mlm_head.predictions.bias"] = (vocab,)
    keys["vlbert.mlm_head.predictions.transform.dense.weight"] = (hidden, hidden)
    keys["vlbert.mlm_head.predictions.transform.dense.bias"] = (hidden,)
    keys["vlbert.mlm_head.predictions.transform.LayerNorm.weight"] = (hidden,)
    keys["vlbert.mlm_head.predictions.transform.LayerNorm.bias"] = (hidden,)
    keys["vlbert.mlm_head.predictions.decoder.weight"] = (vocab, hidden)
    keys["vlbert.mvrc_head.transform.dense.weight"] = (hidden, hidden)
    keys["vlbert.mvrc_head.transform.dense.bias"] = (hidden,)
    keys["vlbert.mvrc_head.region_cls_pred.weight"] = (1601, hidden)
    keys["vlbert.mvrc_head.region_cls_pred.bias"] = (1601,)
    return keys


def test_vl_bert_e2e_key_map_covers_the_base_release_layout():
    source = {**resnet_keys("image_feature_extractor."), **pretraining_keys()}
    assert len(source) == 901  # spec §6: vl-bert-base-e2e.model has 901 state_dict entries
    assert sum(k.startswith("image_feature_extractor.backbone.") for k in source) == 564
    with torch.device("meta"):
        model = vlhub.VlBertForPreTraining(vlhub.VlBertConfig(image_feature_precomputed=False))
    targets = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    key_map = vl_bert_key_map("pretraining", "pretraining", source.keys())
    used, dropped, tied = {}, {}, {}
    for key, shape in source.items():
        target = key_map.rename(key)
        reason = key_map.drop_reason(target)
        if reason is not None:
            dropped[key] = reason
        elif target in key_map.ties:
            tied[key] = key_map.ties[target]
            assert targets[key_map.ties[target]] == shape, key
        elif target in model._tied_weights_keys:
            tied[key] = model._tied_weights_keys[target]
        else:
            assert target in targets, f"{key} → {target}: no such parameter"
            assert targets[target] == shape, f"{key} → {target}: {targets[target]} vs {shape}"
            assert target not in used.values(), f"two keys map to {target}"
            used[key] = target
    assert len(dropped) == 104 + 10 and all("BatchNorm" in r for r in dropped.values())
    assert len(tied) == 60 - 10 + 1  # head.0 copies (their counters are dropped) and the tied MLM decoder
    assert all(k.startswith("image_feature_extractor.head.0.") for k in tied if "decoder" not in k)
    # Every parameter and buffer of the model is filled from the release.
    assert set(used.values()) == set(targets) - set(model._tied_weights_keys)


# ------------------------------------------------------------------------------------------ the visual path
def _reference_cnn(state: dict, prefix: str, pixels: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """The spec's e2e appearance features, computed plainly from the original-layout state dict."""

    def bn(x, name):
        return F.batch_norm(
            x,
            state[f"{name}.running_mean"],
            state[f"{name}.running_var"],
            state[f"{name}.weight"],
            state[f"{name}.bias"],
            training=False,
            eps=1e-5,
        )

    def block(x, name, stride, dilation):
        out = F.relu(bn(F.conv2d(x, state[f"{name}.conv1.weight"], stride=stride), f"{name}.bn1"))  # stride in 1x1
        out = F.relu(
            bn(F.conv2d(out, state[f"{name}.conv2.weight"], padding=dilation, dilation=dilation), f"{name}.bn2")
        )
        out = bn(F.conv2d(out, state[f"{name}.conv3.weight"]), f"{name}.bn3")
        if f"{name}.downsample.0.weight" in state:
            x = bn(F.conv2d(x, state[f"{name}.downsample.0.weight"], stride=stride), f"{name}.downsample.1")
        return F.relu(out + x)

    def layer(x, name, stride, dilation=1):
        count = 1 + max(int(k[len(name) + 1 :].split(".")[0]) for k in state if k.startswith(name + "."))
        for i in range(count):
            x = block(x, f"{name}.{i}", stride if i == 0 else 1, dilation)
        return x

    x = F.relu(
        bn(F.conv2d(pixels, state[f"{prefix}backbone.conv1.weight"], stride=2, padding=3), f"{prefix}backbone.bn1")
    )
    x = F.max_pool2d(x, 3, stride=2, padding=1)
    x = layer(x, f"{prefix}backbone.layer1", 1)
    x = layer(x, f"{prefix}backbone.layer2", 2)
    x = layer(x, f"{prefix}backbone.layer3", 2)
    rois = torch.cat(
        [torch.arange(boxes.shape[0]).repeat_interleave(boxes.shape[1])[:, None].float(), boxes.reshape(-1, 4)], 1
    )
    pooled = roi_align(x, rois, (14, 14), spatial_scale=1 / 16, sampling_ratio=1, aligned=False)
    out = layer(pooled, f"{prefix}roi_head_feature_extractor", 1, dilation=2)
    return F.avg_pool2d(out, 14).flatten(1).view(*boxes.shape[:2], -1)


def _reference_geometry(locations):
    positions = locations * 100
    frequencies = 1000 ** (torch.arange(256, dtype=torch.float32) / 256)
    angles = positions[..., None] / frequencies
    return torch.cat([angles.sin(), angles.cos()], -1).flatten(-2)


@pytest.fixture(scope="module")
def tiny_e2e(tmp_path_factory):
    """A narrow ResNet-50 e2e checkpoint in the release's container and key layout, converted."""
    original = fixtures_root() / "vl_bert" / "original"
    if not original.is_dir():
        pytest.skip("no VL-BERT fixture (its tiny transformer and tokenizer are reused here)")
    g = torch.Generator().manual_seed(0)
    files = vl_bert_files(original)
    prec = torch.load(files["checkpoints"]["pretrain"], weights_only=True)["state_dict"]
    cnn = resnet_keys("image_feature_extractor.", blocks=BLOCKS[50], stem=8, width=4, with_head_copy=False)
    state = {}
    for key, shape in cnn.items():
        if key.endswith("num_batches_tracked"):
            state[key] = torch.tensor(7)
        elif key.endswith("running_var"):
            state[key] = torch.rand(shape, generator=g) + 0.5
        elif key.endswith(("bn1.weight", "bn2.weight", "bn3.weight", "downsample.1.weight")):
            state[key] = 1 + 0.1 * torch.randn(shape, generator=g)
        else:
            state[key] = (0.3 if len(shape) == 4 else 0.1) * torch.randn(shape, generator=g)
    for key, value in list(state.items()):
        if key.startswith("image_feature_extractor.roi_head_feature_extractor."):
            state[key.replace("roi_head_feature_extractor.", "head.0.")] = value  # saved twice, as the original
    appearance = 4 * 8 * 4
    for key, value in prec.items():
        key = key[len("module.") :]
        if key == "object_mask_visual_embedding.weight":
            continue  # e2e masks pixels instead
        if key == "image_feature_extractor.obj_downsample.1.weight":
            value = 0.05 * torch.randn(value.shape[0], 2048 + appearance, generator=g)
        state[key] = value
    state["vlbert.mlm_head.predictions.decoder.weight"] = state["vlbert.word_embeddings.weight"]
    work = tmp_path_factory.mktemp("vl_bert_e2e")
    torch.save(
        {"state_dict": {f"module.{k}": v.half() if v.is_floating_point() else v for k, v in state.items()}},
        work / "tiny-e2e.model",
    )
    yaml = files["configs"]["pretrain"].read_text()
    (work / "e2e.yaml").write_text(yaml.replace("IMAGE_FEAT_PRECOMPUTED: true", "IMAGE_FEAT_PRECOMPUTED: false"))
    report = convert_vl_bert(work / "tiny-e2e.model", work / "out", config=work / "e2e.yaml", tokenizer=files["bert"])
    state = {k: v.half().float() if v.is_floating_point() else v for k, v in state.items()}
    return state, report, work / "out"


def test_vl_bert_e2e_conversion_accounts_for_every_key(tiny_e2e):
    state, report, folder = tiny_e2e
    assert not report.initialized
    assert set(report.used.values()) | set(report.dropped) == set(state)
    head_copies = [k for k in report.dropped if k.startswith("image_feature_extractor.head.0.")]
    assert head_copies and all(
        "tied to vl_bert.visual_embeddings.image_encoder.res5." in report.dropped[k] or "BatchNorm" in report.dropped[k]
        for k in head_copies
    )
    config = vlhub.VlBertConfig.from_pretrained(folder)
    assert not config.image_feature_precomputed and config.backbone_depth == 50 and config.region_feature_dim == 128


def test_vl_bert_e2e_visual_path_matches_the_reference(tiny_e2e):
    state, _, folder = tiny_e2e
    model = vlhub.VlBertForPreTraining.from_pretrained(folder).eval()
    g = torch.Generator().manual_seed(1)
    pixels = 50 * torch.randn(2, 3, 64, 80, generator=g)
    boxes = torch.tensor(
        [
            [[0.0, 0.0, 79.0, 63.0], [10.0, 5.0, 40.0, 30.0], [33.5, 20.25, 70.0, 60.0]],
            [[0.0, 0.0, 79.0, 63.0], [3.0, 40.0, 20.0, 63.0], [50.0, 1.0, 78.0, 22.5]],
        ]
    )
    locations = torch.stack(
        [
            (boxes[..., 0] + boxes[..., 2]) / 2 / 80,
            (boxes[..., 1] + boxes[..., 3]) / 2 / 64,
            (boxes[..., 2] - boxes[..., 0]) / 80,
            (boxes[..., 3] - boxes[..., 1]) / 64,
        ],
        -1,
    )
    ids = torch.tensor([[101, 345, 459, 102], [101, 476, 102, 0]])
    inputs = dict(
        input_ids=ids,
        attention_mask=(ids > 0).long(),
        pixel_values=pixels,
        region_boxes=boxes,
        region_locations=locations,
        region_attention_mask=torch.ones(2, 3, dtype=torch.long),
    )

    def reference(pixel_values):
        appearance = _reference_cnn(state, "image_feature_extractor.", pixel_values, boxes)
        projected = torch.cat([_reference_geometry(locations), appearance], -1)
        weight, bias = (
            state["image_feature_extractor.obj_downsample.1.weight"],
            state["image_feature_extractor.obj_downsample.1.bias"],
        )
        return F.relu(F.linear(projected, weight, bias))

    with torch.no_grad():
        out = model.vl_bert(**inputs)
        torch.testing.assert_close(out.region_embeddings, reference(pixels), atol=1e-4, rtol=1e-4)
        # MVRC in e2e: the masked box's pixels (int-truncated, ends included) become 0 before the CNN.
        region_masks = torch.tensor([[False, False, True], [False, True, False]])
        masked = model.vl_bert(**inputs, region_masks=region_masks)
        zeroed = pixels.clone()
        zeroed[0, :, 20:61, 33:71] = 0
        zeroed[1, :, 40:64, 3:21] = 0
        torch.testing.assert_close(masked.region_embeddings, reference(zeroed), atol=1e-4, rtol=1e-4)
        # The whole pre-training model runs on pixels.
        assert model(**inputs).mvrc_logits.shape == (2, 3, 1601)


def test_vl_bert_e2e_and_prec_inputs_are_not_mixed_up(tiny_e2e):
    _, _, folder = tiny_e2e
    e2e = vlhub.VlBertModel.from_pretrained(folder)
    ids = torch.tensor([[101, 345, 102]])
    with pytest.raises(ValueError, match="'e2e' VL-BERT.*not precomputed region_features"):
        e2e(input_ids=ids, region_features=torch.rand(1, 2, 128), region_locations=torch.rand(1, 2, 4))
    with pytest.raises(ValueError, match="needs both pixel_values"):
        e2e(input_ids=ids, pixel_values=torch.rand(1, 3, 32, 32), region_locations=torch.rand(1, 2, 4))
    prec = vlhub.VlBertModel(
        vlhub.VlBertConfig(
            vocab_size=512,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            region_feature_dim=8,
        )
    )
    with pytest.raises(ValueError, match="'prec' VL-BERT.*not pixel_values"):
        prec(
            input_ids=ids,
            pixel_values=torch.rand(1, 3, 32, 32),
            region_boxes=torch.rand(1, 2, 4),
            region_locations=torch.rand(1, 2, 4),
        )


def test_spec_key_families_are_what_the_renames_expect():
    keys = resnet_keys("image_feature_extractor.")
    assert sum(k.startswith("image_feature_extractor.roi_head_feature_extractor.") for k in keys) == 60
    assert sum(k.startswith("image_feature_extractor.head.0.") for k in keys) == 60
    assert (
        len(
            {
                re.sub(r"\.(weight|bias|running_mean|running_var|num_batches_tracked)$", "", k)
                for k in keys
                if ".bn" in k or "downsample.1" in k
            }
        )
        == 114
    )  # 104 BatchNorms + 10 head.0 copies


def test_vl_bert_e2e_processor_prepares_pixels_and_boxes_like_the_original(tiny_e2e, tmp_path):
    import numpy as np
    from PIL import Image
    from transformers import AutoProcessor

    from .helpers import write_test_image

    _, _, folder = tiny_e2e
    processor = AutoProcessor.from_pretrained(folder)
    assert isinstance(processor, vlhub.VlBertProcessor) and not processor.image_feature_precomputed
    processor.feature_extractor.min_size, processor.feature_extractor.max_size = 48, 80
    images = [
        write_test_image(tmp_path / "a.png", height=40, width=56, seed=1),
        write_test_image(tmp_path / "b.png", height=64, width=32, seed=2),
    ]
    boxes = [torch.tensor([[2.0, 3.0, 30.0, 39.0], [10.0, 0.0, 55.0, 20.0]]), torch.tensor([[4.0, 8.0, 31.0, 60.0]])]
    out = processor(text=["w345 w459", "w476"], images=[str(i) for i in images], boxes=boxes)
    # 56 x 40 → 67 x 48 (short side 48); 32 x 64 → 40 x 80 (long side capped at 80); padded to 67 x 80.
    assert out["pixel_values"].shape == (2, 3, 80, 67) and out["region_attention_mask"].tolist() == [
        [1, 1, 1],
        [1, 1, 0],
    ]
    for i, (path, size) in enumerate(zip(images, [(67, 48), (40, 80)])):
        rgb = Image.open(path).convert("RGB").resize(size, Image.BILINEAR)
        bgr = torch.from_numpy(np.asarray(rgb, dtype=np.float32)).permute(2, 0, 1)[[2, 1, 0]]
        expected = bgr - torch.tensor([102.9801, 115.9465, 122.7717]).view(3, 1, 1)
        torch.testing.assert_close(out["pixel_values"][i, :, : size[1], : size[0]], expected, atol=1e-4, rtol=0)
        assert (
            out["pixel_values"][i, :, size[1] :].abs().sum() == 0
            and out["pixel_values"][i, :, :, size[0] :].abs().sum() == 0
        )
    sx, sy = 67 / 56, 48 / 40
    torch.testing.assert_close(
        out["region_boxes"][0],
        torch.tensor(
            [[0.0, 0.0, 55 * sx, 39 * sy], [2 * sx, 3 * sy, 30 * sx, 39 * sy], [10 * sx, 0.0, 55 * sx, 20 * sy]]
        ),
    )
    torch.testing.assert_close(
        out["region_locations"][0, 1],
        torch.tensor([(32 * sx) / 2 / 67, (42 * sy) / 2 / 48, 28 * sx / 67, 36 * sy / 48]),
    )
    model = vlhub.VlBertForPreTraining.from_pretrained(folder).eval()
    with torch.no_grad():
        logits = model(**out).mvrc_logits
    assert logits.shape == (2, 3, 1601) and torch.isfinite(logits).all()
    with pytest.raises(ValueError, match="'e2e' VL-BERT processor: it takes images="):
        processor(
            text=["w345"],
            regions=[
                vlhub.RegionFeatures(features=torch.rand(2, 128), boxes=boxes[1].repeat(2, 1), image_size=(64, 32))
            ],
        )
    with pytest.raises(ValueError, match="pass boxes="):
        processor(text=["w345"], images=[str(images[0])])
