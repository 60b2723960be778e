"""The originals' region rules on real-size feature files (docs/region-rules.md).

For each architecture: synthetic feature files in the original release's own format with 10, 36, 50, 51, 100 and 101
regions (small feature dims, the real counts) go through the original-format reader, `vlhub import-features`, the
processor with the settings its converter writes, and a tiny model; the regions kept (and the global row built from
them) must be the ones the original data loader keeps, computed here from the file by the original's rule.
"""

from __future__ import annotations

import base64
import json
import logging
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoProcessor

import vlhub
from vlhub.cli import main as vlhub_cli
from vlhub.modeling.uniter.convert_uniter import uniter_region_settings
from vlhub.processing.stores import open_feature_file

from .conftest import fixtures_root
from .training_helpers import tiny_tokenizer

COUNTS = (10, 36, 50, 51, 100, 101)
DIM, CLASSES = 8, 5
HEIGHT, WIDTH = 480, 640


def image_arrays(count: int, seed: int) -> dict:
    """One image's detections as the bottom-up-attention extraction stores them: the most confident first."""
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, [WIDTH / 2, HEIGHT / 2], size=(count, 2))
    wh = rng.uniform(4, [WIDTH / 2, HEIGHT / 2], size=(count, 2))
    cls_prob = rng.dirichlet(np.ones(CLASSES), size=count).astype(np.float32)
    return {
        "features": rng.normal(size=(count, DIM)).astype(np.float32),
        "boxes": np.concatenate([xy, xy + wh], axis=1).astype(np.float32),
        "cls_prob": cls_prob,
        # Confidences from 0.9 down to 0.05: #(conf > 0.2) grows with the count (8 of 10, ... 83 of 101).
        "conf": np.linspace(0.9, 0.05, count).astype(np.float32),
    }


@pytest.fixture(scope="module")
def images() -> dict[str, dict]:
    return {f"img{count:03d}": image_arrays(count, seed=count) for count in COUNTS}


def import_store(tmp_path, format_name: str, source, *options) -> object:
    """The files through `vlhub import-features` into a region store, opened for reading."""
    store = tmp_path / f"store-{format_name}"
    assert vlhub_cli(["import-features", str(source), "--format", format_name, "--output", str(store), *options]) == 0
    return open_feature_file("vlhub", store)


def sources(tmp_path, format_name, source, *options, **reader_options):
    """The original-format reader and the imported store of the same files (imported first: an LMDB can be open
    once per process)."""
    store = import_store(tmp_path, format_name, source, *options)
    return {"reader": open_feature_file(format_name, source, **reader_options), "store": store}


def run_tiny_model(name: str, processor, regions: list, **config_fields) -> None:
    """The processor's inputs for `regions` through a tiny model of the architecture: finite outputs, no error."""
    architecture = vlhub.get_architecture(name)
    fields = {
        **architecture.config_fields("tiny"),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_attention_heads": 2,
        "max_position_embeddings": 128,
        **config_fields,
    }
    torch.manual_seed(0)
    config = architecture.config_class(
        vocab_size=len(processor.tokenizer), region_feature_dim=DIM, **fields, **processor.model_config_fields()
    )
    model = AutoModel.from_config(config).eval()
    inputs = processor(text=["what colour is the cat ?"] * len(regions), regions=regions)
    with torch.no_grad():
        output = model(**inputs)
    assert all(torch.isfinite(t).all() for t in output.values() if isinstance(t, torch.Tensor))


def rows_of(inputs, index: int) -> torch.Tensor:
    return inputs["region_features"][index, : int(inputs["region_attention_mask"][index].sum())]


# --------------------------------------------------------------------------------------------------- TDEN
def write_xmodaler_npz(folder, images):
    folder.mkdir()
    for image_id, a in images.items():
        np.savez(
            folder / f"{image_id}.npz",
            features=a["features"],
            boxes=a["boxes"],
            cls_prob=a["cls_prob"],
            image_h=np.array([HEIGHT]),
            image_w=np.array([WIDTH]),
            num_boxes=np.array([len(a["features"])]),
        )


@pytest.mark.parametrize("max_feat_num", [51, 101])
def test_tden_keeps_the_first_max_feat_num_minus_one_regions_and_averages_them(tmp_path, images, max_feat_num, caplog):
    """X-modaler (`read_np_bbox`, the COCO dataset): `features[0:MAX_FEAT_NUM - 1]`, [IMG] = their mean."""
    write_xmodaler_npz(tmp_path / "npz", images)
    processor = vlhub.TdenProcessor(
        feature_extractor=vlhub.TdenRegionProcessor(
            region_feature_dim=DIM, max_regions=max_feat_num - 1, region_selection="first_n"
        ),
        tokenizer=tiny_tokenizer(tmp_path),
    )
    kept = max_feat_num - 1
    for source in sources(tmp_path, "npz", tmp_path / "npz").values():
        regions = [source[image_id] for image_id in images]
        with caplog.at_level(logging.WARNING, logger="vlhub.processing.processor_base"):
            inputs = processor(text=["a cat"] * len(regions), regions=regions)
            processor(text=["a cat"] * len(regions), regions=regions)  # a second batch: counted, not logged
        for index, a in enumerate(images.values()):
            expected = torch.from_numpy(a["features"][:kept])
            rows = rows_of(inputs, index)
            assert torch.equal(rows[1:], expected)
            torch.testing.assert_close(rows[0], expected.sum(0) / len(expected), rtol=1e-6, atol=1e-6)
        cut = sum(len(a["features"]) > kept for a in images.values())
        cut_messages = [r.message for r in caplog.records if "kept the first" in r.message]
        assert len(cut_messages) == (1 if cut else 0)
        if cut:
            assert (
                cut_messages[0].startswith(f"{cut} of {len(images)} images") and f"the first {kept} " in cut_messages[0]
            )
        assert processor.feature_extractor.regions_cut == 2 * cut
        processor.feature_extractor.regions_cut = 0
        caplog.clear()
    run_tiny_model("tden", processor, regions)


def test_tden_refuse_is_an_error_and_the_setting_is_saved(tmp_path, images):
    region_processor = vlhub.TdenRegionProcessor(region_feature_dim=DIM, region_selection="refuse")
    region_processor.regions_cut = 3
    region_processor.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "preprocessor_config.json").read_text())
    assert saved["region_selection"] == "refuse" and "regions_cut" not in saved
    loaded = vlhub.TdenRegionProcessor.from_pretrained(tmp_path)
    assert loaded.region_selection == "refuse" and loaded.regions_cut == 0
    regions = vlhub.RegionFeatures(images["img051"]["features"], images["img051"]["boxes"], (HEIGHT, WIDTH))
    with pytest.raises(ValueError, match="51 regions .* at most max_regions=50"):
        loaded(regions)
    with pytest.raises(ValueError, match="region_selection must be one of"):
        vlhub.TdenRegionProcessor(region_selection="first")
    # A folder saved before the setting existed loads with the original's rule, no longer refusing.
    del saved["region_selection"]
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(saved))
    assert vlhub.TdenRegionProcessor.from_pretrained(tmp_path).region_selection == "first_n"


# --------------------------------------------------------------------------------------------------- ViLBERT
def write_vilbert_lmdb(path, images):
    import lmdb

    with lmdb.open(str(path), map_size=1 << 26) as env, env.begin(write=True) as txn:
        for image_id, a in images.items():  # the 12-in-1 layout: numpy arrays, no num_boxes
            row = {
                "image_id": image_id,
                "image_h": HEIGHT,
                "image_w": WIDTH,
                "features": a["features"],
                "boxes": a["boxes"],
                "cls_prob": a["cls_prob"],
            }
            txn.put(image_id.encode(), pickle.dumps(row))
        txn.put(b"keys", pickle.dumps([image_id.encode() for image_id in images]))


@pytest.mark.parametrize("max_region_num", [101, 100])  # 12-in-1, beta tasks
def test_vilbert_keeps_the_first_rows_and_a_global_token_over_all_regions(tmp_path, images, max_region_num):
    """`_image_features_reader.py`: g_feat = sum(all features) / num_boxes, prepended; the datasets then keep the first
    `max_region_num` rows."""
    write_vilbert_lmdb(tmp_path / "lmdb", images)
    processor = vlhub.VilbertProcessor(
        feature_extractor=vlhub.VilbertRegionProcessor(
            region_feature_dim=DIM, max_regions=max_region_num - 1, region_selection="first_n"
        ),
        tokenizer=tiny_tokenizer(tmp_path),
    )
    for source in sources(tmp_path, "vilbert-lmdb", tmp_path / "lmdb").values():
        regions = [source[image_id] for image_id in images]
        inputs = processor(text=["a cat"] * len(regions), regions=regions)
        for index, a in enumerate(images.values()):
            every = torch.from_numpy(a["features"])
            rows = rows_of(inputs, index)
            assert torch.equal(rows[1:], every[: max_region_num - 1])
            torch.testing.assert_close(rows[0], every.sum(0) / len(every), rtol=1e-6, atol=1e-6)
    run_tiny_model("vilbert", processor, regions)


def test_vilbert_converter_sets_max_region_num_per_release():
    from vlhub.modeling.vilbert.convert_vilbert import BETA_REGION_ROWS, MULTI_TASK_REGION_ROWS

    assert MULTI_TASK_REGION_ROWS == 101 and set(BETA_REGION_ROWS.values()) == {100}


# --------------------------------------------------------------------------------------------------- UNITER
def write_uniter_lmdb(path, images):
    import io

    import lmdb

    with lmdb.open(str(path), map_size=1 << 26) as env, env.begin(write=True) as txn:
        for image_id, a in images.items():
            norm = a["boxes"] / np.array([WIDTH, HEIGHT, WIDTH, HEIGHT], dtype=np.float32)
            norm_bb = np.concatenate([norm, norm[:, 2:] - norm[:, :2]], axis=1).astype(np.float16)
            buffer = io.BytesIO()
            np.savez_compressed(
                buffer,
                features=a["features"].astype(np.float16),
                norm_bb=norm_bb,
                conf=a["conf"],
                soft_labels=a["cls_prob"],
            )
            txn.put(image_id.encode(), buffer.getvalue())
        txn.put(b"__keys__", json.dumps(list(images)).encode())


@pytest.mark.parametrize(
    "config",
    [{"conf_th": 0.2, "max_bb": 100, "min_bb": 10, "num_bb": 36}, {"conf_th": -1, "num_bb": 100}],
    ids=["train-vqa", "train-refcoco"],
)
def test_uniter_keeps_the_first_nbb_regions_of_the_training_config(tmp_path, images, config):
    """`data/data.py`: nbb = clamp(#(conf > conf_th), min_bb, max_bb) (conf_th -1: num_bb), then `arr[:nbb]`."""
    write_uniter_lmdb(tmp_path / "lmdb", images)
    processor = uniter_processor(tmp_path, config)
    for source in sources(tmp_path, "uniter-lmdb", tmp_path / "lmdb").values():
        regions = [source[image_id] for image_id in images]
        inputs = processor(text=["a cat"] * len(regions), regions=regions)
        for index, a in enumerate(images.values()):
            nbb = config["num_bb"] if config["conf_th"] == -1 else uniter_nbb(a["conf"], config)
            expected = torch.from_numpy(a["features"].astype(np.float16)[:nbb].astype(np.float32))
            assert torch.equal(rows_of(inputs, index), expected)
    run_tiny_model("uniter", processor, regions)


def uniter_processor(tmp_path, config: dict):
    """A UNITER processor with the settings the converter writes for a training config."""
    settings, _ = uniter_region_settings(config, "vqa")
    return vlhub.UniterProcessor(
        feature_extractor=vlhub.UniterRegionProcessor(region_feature_dim=DIM, **settings),
        tokenizer=tiny_tokenizer(tmp_path),
    )


def uniter_nbb(conf: np.ndarray, config: dict) -> int:
    """`compute_num_bb`: clamp(#(conf > conf_th), min_bb, max_bb)."""
    return min(config["max_bb"], max(config["min_bb"], int((conf > config["conf_th"]).sum())))


def shuffled(images: dict[str, dict], seed: int = 7) -> dict[str, dict]:
    """The same detections in another file order: the confidences no longer decrease down the file."""
    rng = np.random.default_rng(seed)
    out = {}
    for image_id, a in images.items():
        order = rng.permutation(len(a["features"]))
        out[image_id] = {name: array[order] for name, array in a.items()}
    return out


def test_uniter_counts_by_confidence_but_keeps_the_files_first_rows(tmp_path, images):
    """`data/data.py` (`compute_num_bb`, `DetectFeatLmdb.get_dump`) on an `all` database whose rows are not in
    confidence order: nbb = clamp(#(conf > conf_th), min_bb, max_bb) over every row, then the first nbb rows of the
    entry, whatever their confidences (not the nbb most confident)."""
    unordered = shuffled(images)
    write_uniter_lmdb(tmp_path / "lmdb", unordered)
    config = {"conf_th": 0.2, "max_bb": 100, "min_bb": 10}
    processor = uniter_processor(tmp_path, config)
    for source in sources(tmp_path, "uniter-lmdb", tmp_path / "lmdb").values():
        regions = [source[image_id] for image_id in unordered]
        inputs = processor(text=["a cat"] * len(regions), regions=regions)
        # A collator selects first, then the processor sees the selected regions: the same rows, not counted again.
        preselected = processor(
            text=["a cat"] * len(regions), regions=[processor.feature_extractor.select(r) for r in regions]
        )
        assert torch.equal(preselected["region_features"], inputs["region_features"])
        differs = 0
        for index, a in enumerate(unordered.values()):
            nbb = uniter_nbb(a["conf"], config)
            expected = torch.from_numpy(a["features"].astype(np.float16)[:nbb].astype(np.float32))
            assert torch.equal(rows_of(inputs, index), expected)
            differs += not np.array_equal(np.sort(np.argsort(-a["conf"], kind="stable")[:nbb]), np.arange(nbb))
        assert differs == len(unordered) - 1  # the test tells the two rules apart (all but the 10 kept whole)
    run_tiny_model("uniter", processor, regions)


def test_count_by_confidence_keeps_the_given_order_and_by_confidence_keeps_its_meaning():
    scores = torch.tensor([0.1, 0.9, 0.05, 0.8, 0.3, 0.01])  # 3 above 0.2, not first
    regions = vlhub.RegionFeatures(
        torch.arange(6.0)[:, None].repeat(1, 4), torch.tensor([[0.0, 0, 2, 2]] * 6), (4, 4), scores=scores
    )
    kept = {}
    for mode in ("count_by_confidence", "by_confidence"):
        selector = vlhub.UniterRegionProcessor(
            region_feature_dim=4, confidence_threshold=0.2, min_regions=2, max_regions=5, region_selection=mode
        )
        kept[mode] = selector.select(regions).features[:, 0].tolist()
    assert kept == {"count_by_confidence": [0.0, 1.0, 2.0], "by_confidence": [1.0, 3.0, 4.0]}
    assert vlhub.UniterRegionProcessor().region_selection == "count_by_confidence"  # UNITER's rule by default
    without_scores = vlhub.RegionFeatures(regions.features, regions.boxes, (4, 4))
    with pytest.raises(ValueError, match="6 regions .* at most max_regions=5"):  # no confidences: refused, as before
        vlhub.UniterRegionProcessor(region_feature_dim=4, min_regions=2, max_regions=5)(without_scores)


def test_uniter_region_settings_follow_the_released_configs():
    assert uniter_region_settings(None, "vqa")[0] == {
        "confidence_threshold": 0.2,
        "min_regions": 10,
        "max_regions": 100,
        "region_selection": "count_by_confidence",
    }
    assert uniter_region_settings(None, "re")[0] == {
        "confidence_threshold": None,
        "min_regions": 1,
        "max_regions": 100,
        "region_selection": "first_n",
    }
    villa = uniter_region_settings({"conf_th": 0.075, "max_bb": 100, "min_bb": 10}, "vqa")[0]
    assert villa["confidence_threshold"] == 0.075


# --------------------------------------------------------------------------------------------------- VL-BERT
def write_vl_bert_json(folder, images, image_box_feature: bool):
    folder.mkdir()
    encode = lambda array: base64.b64encode(np.ascontiguousarray(array, dtype=np.float32).tobytes()).decode()  # noqa: E731
    for image_id, a in images.items():
        record = {
            "image_id": image_id,
            "image_w": WIDTH,
            "image_h": HEIGHT,
            "num_boxes": len(a["features"]),
            "boxes": encode(a["boxes"]),
            "features": encode(a["features"]),
        }
        if image_box_feature:
            record["image_box_feature"] = encode(a["features"][-1:] * 2)
        (folder / f"{image_id}.json").write_text(json.dumps(record))


@pytest.mark.parametrize("image_box_feature", [False, True], ids=["mean", "image_box_feature"])
def test_vl_bert_keeps_every_box_after_the_whole_image_box(tmp_path, images, image_box_feature, caplog):
    """`vqa/data/datasets/vqa.py`: every box of the file, the whole image first, its feature `image_box_feature`
    when the file has one, else the mean of all box features; no limit on the number of boxes."""
    write_vl_bert_json(tmp_path / "json", images, image_box_feature)
    processor = vlhub.VlBertProcessor(
        feature_extractor=vlhub.VlBertRegionProcessor(region_feature_dim=DIM, max_regions=None),
        tokenizer=tiny_tokenizer(tmp_path),
    )
    with caplog.at_level(logging.WARNING, logger="vlhub.processing.stores.shards"):
        found = sources(tmp_path, "vl-bert-json", tmp_path / "json")
    # A region store keeps the whole-image feature too: after an import object 0 is still the file's feature.
    assert "were not imported" not in caplog.text
    for source in found.values():
        regions = [source[image_id] for image_id in images]
        inputs = processor(text=["a cat"] * len(regions), regions=regions)
        for index, a in enumerate(images.values()):
            every = torch.from_numpy(a["features"])
            rows = rows_of(inputs, index)
            assert torch.equal(rows[1:], every)
            whole = every[-1] * 2 if image_box_feature else every.mean(0)
            torch.testing.assert_close(rows[0], whole, rtol=1e-6, atol=1e-6)
    run_tiny_model("vl_bert", processor, regions, geometry_embedding_dim=4)


def write_vl_bert_cc_json(folder, images):
    """Conceptual Captions frcnn json: boxes, features and the detector's class scores (`classes`)."""
    folder.mkdir()
    encode = lambda array: base64.b64encode(np.ascontiguousarray(array, dtype=np.float32).tobytes()).decode()  # noqa: E731
    for image_id, a in images.items():
        (folder / f"{image_id}.json").write_text(
            json.dumps(
                {
                    "image_id": image_id,
                    "image_w": WIDTH,
                    "image_h": HEIGHT,
                    "num_boxes": len(a["features"]),
                    "boxes": encode(a["boxes"]),
                    "features": encode(a["features"]),
                    "classes": encode(a["cls_prob"]),
                    "image_box_feature": encode(a["features"][:1] * 3),
                }
            )
        )  # unused by the pre-training loader


def conceptual_captions_rule(a: dict, text: list[int], seq_len: int):
    """`pretrain/data/datasets/conceptual_captions.py` on one image and its token ids ([CLS] ... [SEP]): boxes by
    largest class score (argsort reversed), the whole image first with the mean of every box's feature, then
    text and boxes cut together to seq_len. Returns (token ids, box features kept, whole-image feature)."""
    inds = np.argsort(a["cls_prob"].max(axis=1))[::-1]
    features = torch.as_tensor(a["features"][inds])
    whole = features.mean(dim=0)
    boxes = 1 + len(features)
    if len(text) + boxes > seq_len:
        text_keep, box_keep = len(text), boxes
        while text_keep + box_keep > seq_len and text_keep > 0 and box_keep > 0:
            if box_keep > text_keep:
                box_keep -= 1
            else:
                text_keep -= 1
        text = text[: text_keep - 1] + [text[-1]]
        boxes = box_keep
    return text, features[: boxes - 1], whole


@pytest.mark.parametrize("seq_len", [64, 40])
def test_vl_bert_conceptual_captions_cuts_text_and_objects_together(tmp_path, images, seq_len, caplog):
    """The pre-training rule, set by the converter from a pre-training YAML: the kept tokens and boxes (and object
    0) equal the original loader's, for short captions beside many boxes and long captions beside few."""
    write_vl_bert_cc_json(tmp_path / "json", images)
    tokenizer = tiny_tokenizer(tmp_path)
    processor = vlhub.VlBertProcessor(
        feature_extractor=vlhub.VlBertRegionProcessor(
            region_feature_dim=DIM, max_regions=None, sort_by_class_score=True
        ),
        tokenizer=tokenizer,
        max_text_and_objects=seq_len,
    )
    words = "what colour is the cat on the table".split()
    captions = [" ".join(words[: 2 + 3 * i] * (1 + 10 * (i % 2))) for i in range(len(images))]  # 2 to 187 words
    for source in sources(tmp_path, "vl-bert-json", tmp_path / "json").values():
        regions = [source[image_id] for image_id in images]
        with caplog.at_level(logging.WARNING, logger="vlhub.modeling.vl_bert.processing_vl_bert"):
            inputs = processor(text=captions, regions=regions)
        cut_text = cut_objects = 0
        for index, (a, caption) in enumerate(zip(images.values(), captions)):
            text = tokenizer(caption)["input_ids"]
            tokens, kept, whole = conceptual_captions_rule(a, text, seq_len)
            length = int(inputs["attention_mask"][index].sum())
            assert inputs["input_ids"][index, :length].tolist() == tokens
            rows = rows_of(inputs, index)
            assert torch.equal(rows[1:], kept)
            torch.testing.assert_close(rows[0], whole, rtol=1e-6, atol=1e-6)
            cut_text += len(tokens) < len(text)
            cut_objects += len(kept) < len(a["features"])
        assert cut_text and cut_objects  # both sides of the rule were exercised
    assert caplog.text.count("cut from the longer") == 1  # said once, not per batch
    run_tiny_model("vl_bert", processor, regions, geometry_embedding_dim=4)


def test_vl_bert_pretraining_masks_objects_before_the_cut(tmp_path, images):
    """MVRC (`random_mask_region` before the cut): object 0 is the mean of the unmasked boxes among *all* of them,
    the cut ones too; the class targets are those of the kept boxes."""
    from vlhub.modeling.vl_bert.objectives_vl_bert import VL_BERT_OBJECTIVES
    from vlhub.training.objectives import ObjectiveContext

    tokenizer = tiny_tokenizer(tmp_path)
    processor = vlhub.VlBertProcessor(
        feature_extractor=vlhub.VlBertRegionProcessor(
            region_feature_dim=DIM, max_regions=None, sort_by_class_score=True
        ),
        tokenizer=tokenizer,
        max_text_and_objects=64,
    )
    regions = {
        image_id: vlhub.RegionFeatures(a["features"], a["boxes"], (HEIGHT, WIDTH), class_probs=a["cls_prob"])
        for image_id, a in images.items()
    }

    def encode(examples):  # as the pre-training collator: select, then the processor
        selected = [processor.feature_extractor.select(regions[e["image_id"]]) for e in examples]
        return dict(processor(text=[e["caption"] for e in examples], regions=selected)), selected

    context = ObjectiveContext(
        tokenizer=tokenizer,
        random_token_ids=torch.arange(5, len(tokenizer)),
        mlm_probability=0.15,
        region_mask_probability=0.5,
        itm_negative_probability=0.0,
        encode=encode,
        other_image=None,
    )
    mvrc = next(o for o in VL_BERT_OBJECTIVES if o.name == "mvrc")
    examples = [{"image_id": image_id, "caption": "a red cat"} for image_id in images]
    batch = mvrc.build(context, examples, [np.random.default_rng(seed) for seed in range(len(examples))])
    for row, a in enumerate(images.values()):
        _, kept, _ = conceptual_captions_rule(a, tokenizer("a red cat")["input_ids"], 64)
        ordered = torch.as_tensor(a["features"][np.argsort(a["cls_prob"].max(axis=1))[::-1]])
        rng = np.random.default_rng(row)  # the original's draws: one per box, in order, before the cut
        draws = np.array([rng.random() for _ in range(len(ordered))])
        masked = (draws < 0.5) & (draws / 0.5 < 0.9)
        unmasked = torch.from_numpy(~masked)
        expected = (ordered * unmasked[:, None]).sum(0) / (unmasked.sum() + 1e-5)
        torch.testing.assert_close(batch["region_features"][row, 0], expected, rtol=1e-5, atol=1e-6)
        count = len(kept)
        assert torch.equal(batch["region_masks"][row, 1 : count + 1], torch.from_numpy(masked[:count]))
        chosen = torch.from_numpy(draws[:count] < 0.5)
        labels = torch.as_tensor(a["cls_prob"][np.argsort(a["cls_prob"].max(axis=1))[::-1]][:count])
        torch.testing.assert_close(batch["region_class_targets"][row, 1 : count + 1], labels * chosen[:, None])


# --------------------------------------------------------------------------------------------------- Unified VLP
def write_vlp_h5(folder, images):
    import h5py

    folder.mkdir()
    with (
        h5py.File(folder / "feat.h5", "w") as feat,
        h5py.File(folder / "cls.h5", "w") as cls,
        h5py.File(folder / "bbox.h5", "w") as bbox,
    ):
        for image_id, a in images.items():
            feat[image_id] = a["features"]
            cls[image_id] = a["cls_prob"]
            class_index = a["cls_prob"][:, 1:].argmax(1)[:, None].astype(np.float32) + 1
            bbox[image_id] = np.concatenate([a["boxes"], class_index, a["conf"][:, None]], axis=1)


def test_unified_vlp_fills_its_100_slots(tmp_path, images):
    """`seq2seq_loader.py` takes the file's 100 regions as they are (the extraction kept the 100 most confident);
    vlhub pads an image with fewer into masked slots and keeps the 100 most confident of more."""
    write_vlp_h5(tmp_path / "h5", images)
    folder = tmp_path / "h5"
    processor = vlhub.UnifiedVlpProcessor(
        feature_extractor=vlhub.UnifiedVlpRegionProcessor(
            region_feature_dim=DIM, num_classes=CLASSES, max_regions=100, min_regions=100
        ),
        tokenizer=tiny_tokenizer(tmp_path),
    )
    found = sources(
        tmp_path,
        "vlp-h5",
        folder / "feat.h5",
        "--boxes",
        str(folder / "bbox.h5"),
        "--class-probs",
        str(folder / "cls.h5"),
        "--image-size-from-boxes",
        boxes=folder / "bbox.h5",
        class_probs=folder / "cls.h5",
        image_size_from_boxes=True,
    )
    for source in found.values():
        regions = [source[image_id] for image_id in images]
        inputs = processor(text=["a cat"] * len(regions), regions=regions)
        assert inputs["region_features"].shape[1] == 100
        for index, a in enumerate(images.values()):
            count = min(len(a["features"]), 100)
            most_confident = np.argsort(-a["conf"], kind="stable")[:count]
            assert torch.equal(rows_of(inputs, index), torch.from_numpy(a["features"][most_confident]))
            assert inputs["region_features"][index, count:].abs().sum() == 0
    run_tiny_model(
        "unified_vlp", processor, regions, num_regions=100, region_location_dim=6 + CLASSES, max_position_embeddings=160
    )


# --------------------------------------------------------------------------------------------------- converters
# The converters write these settings from the original configs; the fixtures' release files are found by pattern.
ORIGINALS = fixtures_root()


def converted_region_processor(folder):
    return AutoProcessor.from_pretrained(folder)


def _skip_without(architecture: str):
    folder = ORIGINALS / architecture / "original"
    return pytest.mark.skipif(not folder.is_dir(), reason=f"no {architecture} fixture at {folder}")


@_skip_without("tden")
def test_tden_converter_keeps_the_first_max_feat_num_minus_one(tmp_path):
    import yaml

    from vlhub.modeling.tden.convert_tden import convert_tden

    original = ORIGINALS / "tden" / "original"
    vocab = next(original.rglob("vocab*.txt"))
    configs = sorted(original.glob("*/config.yaml"))
    assert configs
    for index, config in enumerate(configs):
        checkpoint = next(config.parent.glob("*.pth"))
        convert_tden(checkpoint, tmp_path / str(index), config=config, tokenizer=vocab)
        regions = converted_region_processor(tmp_path / str(index)).feature_extractor
        max_feat_num = yaml.safe_load(config.read_text())["DATALOADER"]["MAX_FEAT_NUM"]
        assert (regions.region_selection, regions.max_regions) == ("first_n", max_feat_num - 1), config


@_skip_without("vilbert")
def test_vilbert_converter_keeps_max_region_num_rows_of_the_release(tmp_path):
    from vlhub.modeling.vilbert.convert_vilbert import convert_vilbert

    original = ORIGINALS / "vilbert" / "original"
    config = next(original.glob("*.json"))
    size = json.loads(config.read_text())["vocab_size"]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(size - 5)]))
    checkpoints = sorted(original.rglob("*.bin"))
    assert checkpoints
    for index, checkpoint in enumerate(checkpoints):
        convert_vilbert(checkpoint, tmp_path / str(index), config=config, tokenizer=vocab)
        regions = converted_region_processor(tmp_path / str(index)).feature_extractor
        head = AutoConfig.from_pretrained(tmp_path / str(index)).architectures[0]
        beta_task = "beta" in str(checkpoint.relative_to(original)) and "PreTraining" not in head
        # max_regions counts regions, the global token on top: max_region_num - 1
        assert (regions.region_selection, regions.max_regions) == ("first_n", 99 if beta_task else 100), checkpoint


@_skip_without("uniter")
def test_uniter_converter_uses_the_training_configs_region_and_text_limits(tmp_path):
    from vlhub.modeling.uniter.convert_uniter import convert_uniter

    original = ORIGINALS / "uniter" / "original"
    config = next(c for c in map(json.loads, map(Path.read_text, original.glob("*.json"))) if "hidden_size" in c)
    checkpoints = sorted(original.glob("*.pt"))
    assert checkpoints
    vocab = tmp_path / "vocab.txt"
    vocab.write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(config["vocab_size"] - 5)])
    )
    train_vqa = {**config, "max_txt_len": 40, "conf_th": 0.075, "max_bb": 100, "min_bb": 10, "num_bb": 36}
    for index, checkpoint in enumerate(checkpoints):
        for name, given in (("model", config), ("train", train_vqa)):
            folder = tmp_path / f"{index}-{name}"
            convert_uniter(
                checkpoint, folder, config=given, tokenizer=vocab, answers=next(original.glob("ans2label*.json"), None)
            )
            processor = converted_region_processor(folder)
            regions = processor.feature_extractor
            head = AutoConfig.from_pretrained(folder).architectures[0]
            if "ReferringExpression" in head and name == "model":
                expected = ("first_n", None, 100)
            else:
                expected = ("count_by_confidence", 0.075 if name == "train" else 0.2, 100)
            assert (regions.region_selection, regions.confidence_threshold, regions.max_regions) == expected
            assert processor.max_text_length == (42 if name == "train" else 62)
            assert not hasattr(vlhub.UniterConfig.from_pretrained(folder), "conf_th")


@_skip_without("vl_bert")
def test_vl_bert_converter_sets_the_conceptual_captions_rule_from_a_pretraining_config(tmp_path):
    from vlhub.modeling.vl_bert.convert_vl_bert import convert_vl_bert

    original = ORIGINALS / "vl_bert" / "original"
    convert_vl_bert(
        next(original.glob("*prec*.model")),
        tmp_path / "pretrain",
        config=next((original / "cfgs" / "pretrain").glob("*.yaml")),
        task="pretraining",
        tokenizer=next(p.parent for p in original.rglob("vocab.txt")),
    )
    processor = converted_region_processor(tmp_path / "pretrain")
    # The fixture's YAML gives the conceptual_captions entry no SEQ_LEN: the dataset's default, 64.
    assert processor.max_text_and_objects == 64 and processor.feature_extractor.sort_by_class_score
    fine_tuning = processor.for_task("vqa")
    assert fine_tuning.max_text_and_objects is None and not fine_tuning.feature_extractor.sort_by_class_score
    assert processor.feature_extractor.sort_by_class_score  # for_task changed a copy


@_skip_without("vl_bert")
def test_vl_bert_converter_sets_no_region_limit(tmp_path):
    from vlhub.modeling.vl_bert.convert_vl_bert import convert_vl_bert

    original = ORIGINALS / "vl_bert" / "original"
    checkpoint = next(original.glob("*vqa*.model"))
    convert_vl_bert(
        checkpoint,
        tmp_path / "vqa",
        config=next((original / "cfgs" / "vqa").glob("*.yaml")),
        tokenizer=next(p.parent for p in original.rglob("vocab.txt")),
        answers=next(original.glob("answers*.txt")),
    )
    processor = converted_region_processor(tmp_path / "vqa")
    regions = processor.feature_extractor
    assert regions.max_regions is None and regions.confidence_threshold is None
    assert processor.max_text_and_objects is None and not regions.sort_by_class_score  # the pre-training rule only


@_skip_without("unified_vlp")
def test_unified_vlp_converter_takes_the_files_rows_as_stored(tmp_path, images):
    """`seq2seq_loader.py` feeds the file's 100 rows in their stored order (each slot has its own position): the
    converted processor keeps that order, whatever the confidences, pads fewer and keeps the first 100 of more."""
    from vlhub.modeling.unified_vlp.convert_unified_vlp import convert_unified_vlp

    from .release_files import unified_vlp_files

    files = unified_vlp_files(ORIGINALS / "unified_vlp" / "original")
    convert_unified_vlp(
        files["checkpoints"]["img2txt"], tmp_path / "vlp", config=files["config"], tokenizer=files["vocab"]
    )
    converted = converted_region_processor(tmp_path / "vlp").feature_extractor
    settings = {
        name: getattr(converted, name)
        for name in ("region_selection", "confidence_threshold", "min_regions", "max_regions")
    }
    assert settings == {
        "region_selection": "first_n",
        "confidence_threshold": None,
        "min_regions": 100,
        "max_regions": 100,
    }
    region_processor = vlhub.UnifiedVlpRegionProcessor(region_feature_dim=DIM, num_classes=CLASSES, **settings)
    unordered = shuffled(images)
    regions = [
        vlhub.RegionFeatures(a["features"], a["boxes"], (HEIGHT, WIDTH), class_probs=a["cls_prob"], scores=a["conf"])
        for a in unordered.values()
    ]
    inputs = region_processor(regions)
    for index, a in enumerate(unordered.values()):
        count = min(len(a["features"]), 100)
        assert torch.equal(rows_of(inputs, index), torch.from_numpy(a["features"][:count]))
    assert region_processor.regions_cut == 1  # the 101-region image, where the original fails
