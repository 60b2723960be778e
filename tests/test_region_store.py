"""vlhub's own region store: round trip, resume, atomic shards, layout checks, datasets views."""

import json

import numpy as np
import pytest
import torch

import vlhub
from vlhub.processing.stores import RegionStore, RegionStoreWriter

from .helpers import random_regions


def with_probs(regions, num_classes=5, num_attributes=3, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return vlhub.RegionFeatures(
        features=regions.features,
        boxes=regions.boxes,
        image_size=regions.image_size,
        scores=regions.scores,
        class_probs=torch.rand(len(regions), num_classes, generator=generator),
        attribute_probs=torch.rand(len(regions), num_attributes, generator=generator),
    )


def assert_same_regions(a, b, atol=0.0):
    assert a.image_size == b.image_size
    for name in ("features", "boxes", "scores", "class_probs", "attribute_probs"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            torch.testing.assert_close(x, y, atol=atol, rtol=0, msg=name)


def test_store_round_trip_keeps_every_field_and_order(tmp_path):
    images = {f"img{i}": with_probs(random_regions(3 + i, 8, seed=i), seed=i) for i in range(7)}
    with RegionStoreWriter(tmp_path, shard_size=3, row_group_size=2) as writer:
        for image_id, regions in images.items():
            writer.add(image_id, regions)
    assert len(writer.written_shards) == 3  # 3 + 3 + 1
    store = RegionStore(tmp_path)
    assert store.ids == list(images) and len(store) == 7 and "img6" in store and "nope" not in store
    for image_id, regions in reversed(list(images.items())):  # random access across row groups and shards
        loaded = store[image_id]
        assert_same_regions(loaded, regions)
        assert loaded.metadata["image_id"] == image_id
    with pytest.raises(KeyError, match="nope"):
        store["nope"]


def test_store_float16_features(tmp_path):
    regions = random_regions(4, 8, seed=1)
    with RegionStoreWriter(tmp_path, feature_dtype="float16") as writer:
        writer.add("a", regions)
    loaded = RegionStore(tmp_path)["a"]
    assert loaded.features.dtype == torch.float32
    torch.testing.assert_close(loaded.features, regions.features.half().float(), atol=0, rtol=0)
    with pytest.raises(ValueError, match="float16"):
        RegionStoreWriter(tmp_path, feature_dtype="float32")


def test_store_refuses_duplicates_and_other_layouts(tmp_path):
    with RegionStoreWriter(tmp_path, shard_size=10) as writer:
        writer.add("a", random_regions(3, 8))
        with pytest.raises(ValueError, match="already in the store"):
            writer.add("a", random_regions(3, 8))
        with pytest.raises(ValueError, match="feature_dim=8.*feature_dim=9"):
            writer.add("b", random_regions(3, 9))
        with pytest.raises(ValueError, match="has_scores"):
            writer.add("c", random_regions(3, 8, scores=False))
        with pytest.raises(ValueError, match="image_id"):
            writer.add("", random_regions(3, 8))
        with pytest.raises(TypeError, match="RegionFeatures"):
            writer.add("d", {"features": np.zeros((3, 8))})


def test_store_resumes_without_redoing_or_losing(tmp_path):
    images = {f"img{i}": random_regions(2 + i % 3, 8, seed=i) for i in range(5)}

    class Interrupted(Exception):
        pass

    with pytest.raises(Interrupted):
        with RegionStoreWriter(tmp_path, shard_size=2) as writer:
            for i, (image_id, regions) in enumerate(images.items()):
                if i == 3:
                    raise Interrupted  # the queued image 2 is still written on exit
                writer.add(image_id, regions)
    reopened = RegionStoreWriter(tmp_path, shard_size=2)
    assert reopened.completed_ids == {"img0", "img1", "img2"}
    with reopened:
        for image_id, regions in images.items():
            if image_id not in reopened.completed_ids:
                reopened.add(image_id, regions)
    store = RegionStore(tmp_path)
    assert sorted(store.ids) == sorted(images)
    for image_id, regions in images.items():
        assert_same_regions(store[image_id], regions)


def test_interrupted_shard_write_never_reads_as_complete(tmp_path, monkeypatch):
    with RegionStoreWriter(tmp_path, shard_size=2) as writer:
        writer.add("a", random_regions(2, 8))
        writer.add("b", random_regions(2, 8))

    def crash(*args, **kwargs):
        raise OSError("disk full")

    writer = RegionStoreWriter(tmp_path, shard_size=2)
    writer.add("c", random_regions(2, 8))
    monkeypatch.setattr(RegionStoreWriter, "_record_batch", crash)
    with pytest.raises(OSError, match="disk full"):
        writer.add("d", random_regions(2, 8))
    monkeypatch.undo()
    # Only the lock files beside the store: no partial shard, no temporary file.
    visible = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".lock-"))
    assert visible == ["index.sqlite", "shard-p00000-00000.arrow", "store.json"]
    assert RegionStore(tmp_path).ids == ["a", "b"]


def test_store_processes_write_their_own_shards(tmp_path):
    for process in (0, 1):
        with RegionStoreWriter(tmp_path, shard_size=1, process_index=process) as writer:
            writer.add(f"p{process}", random_regions(2, 8, seed=process))
    assert [p.name for p in RegionStore(tmp_path).shard_files] == [
        "shard-p00000-00000.arrow",
        "shard-p00001-00000.arrow",
    ]


def test_store_datasets_views(tmp_path):
    images = {f"img{i}": with_probs(random_regions(3, 8, seed=i)) for i in range(3)}
    with RegionStoreWriter(tmp_path, shard_size=2) as writer:
        for image_id, regions in images.items():
            writer.add(image_id, regions)
    dataset = RegionStore(tmp_path).dataset.with_format("numpy")
    assert dataset["image_id"][:].tolist() == list(images)
    np.testing.assert_array_equal(dataset[1]["features"], images["img1"].features.numpy())
    streamed = list(RegionStore.streaming_dataset(tmp_path))
    assert [row["image_id"] for row in streamed] == list(images)
    np.testing.assert_allclose(np.asarray(streamed[2]["class_probs"]), images["img2"].class_probs.numpy())


def test_not_a_store(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a vlhub region store"):
        RegionStore(tmp_path)
    (tmp_path / "store.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="does not describe a vlhub region store"):
        RegionStore(tmp_path)


def test_a_version_1_store_still_reads_and_upgrades_with_one_command(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from vlhub.cli import main as vlhub_main

    old = tmp_path / "old"
    old.mkdir()
    images = {f"img{i}": random_regions(2 + i, 8, seed=i) for i in range(3)}
    # Format version 1, as vlhub wrote it before: Parquet shards of list<list<float>> columns, no id index.
    (old / "store.json").write_text(
        json.dumps(
            {
                "format": "vlhub-region-store",
                "version": 1,
                "layout": {
                    "feature_dim": 8,
                    "feature_dtype": "float32",
                    "has_scores": True,
                    "num_classes": None,
                    "num_attributes": None,
                },
            }
        )
    )
    table = pa.table(
        {
            "image_id": list(images),
            "features": [r.features.numpy().tolist() for r in images.values()],
            "boxes": [r.boxes.numpy().tolist() for r in images.values()],
            "image_size": [[float(v) for v in r.image_size] for r in images.values()],
            "scores": [r.scores.numpy().tolist() for r in images.values()],
        }
    )
    pq.write_table(table, old / "shard-p00000-00000.parquet", row_group_size=2)
    with pytest.warns(UserWarning, match="version-1 region store"):
        legacy = RegionStore(old)
    assert legacy.ids == list(images)
    for image_id, regions in images.items():
        assert_same_regions(legacy[image_id], regions)

    with pytest.warns(UserWarning, match="version-1"):
        assert vlhub_main(["import-features", str(old), "--format", "vlhub", "--output", str(tmp_path / "new")]) == 0
    upgraded = RegionStore(tmp_path / "new")
    assert upgraded.version == 2 and upgraded.ids == list(images)
    for image_id, regions in images.items():
        assert_same_regions(upgraded[image_id], regions)
    with pytest.raises(ValueError, match="format version 1.*import-features --format vlhub"):
        RegionStoreWriter(old)


def test_a_store_with_more_shards_than_it_keeps_open_reopens_them(tmp_path):
    images = {f"img{i}": random_regions(3, 8, seed=i) for i in range(6)}
    with RegionStoreWriter(tmp_path, shard_size=2) as writer:
        for image_id, regions in images.items():
            writer.add(image_id, regions)
    store = RegionStore(tmp_path, max_open_shards=1)
    for image_id in ["img0", "img5", "img2", "img0"]:  # every read in another shard than the one open
        assert_same_regions(store[image_id], images[image_id])
        assert len(store._shards) == 1
    with pytest.raises(ValueError, match="max_open_shards must be at least 1"):
        RegionStore(tmp_path, max_open_shards=0)


def test_the_default_number_of_open_shards_follows_the_open_file_limit(monkeypatch):
    from vlhub.processing.stores import shards

    monkeypatch.setattr(shards, "open_file_limit", lambda: 1024)
    assert shards._default_open_shards() == 256
    monkeypatch.setattr(shards, "open_file_limit", lambda: 1 << 20)
    assert shards._default_open_shards() == 1 << 18
    monkeypatch.setattr(shards, "open_file_limit", lambda: 20)
    assert shards._default_open_shards() == 16


def test_a_float16_store_marks_its_features_so_uniter_does_not_round_them_again(tmp_path):
    from vlhub.modeling.uniter.processing_uniter import UniterRegionProcessor
    from vlhub.processing.regions import FLOAT16_FEATURES

    regions = random_regions(12, 8, seed=4)
    for dtype, marked in (("float16", True), ("float32", False)):
        with RegionStoreWriter(tmp_path / dtype, feature_dtype=dtype) as writer:
            writer.add("img", regions)
        loaded = RegionStore(tmp_path / dtype)["img"]
        assert bool(loaded.metadata.get(FLOAT16_FEATURES)) is marked
        processor = UniterRegionProcessor(region_feature_dim=8, min_regions=1)
        selected = processor.select(loaded)
        assert bool(selected.metadata.get(FLOAT16_FEATURES)) is marked  # selection keeps the mark
        # Either way UNITER sees the float16-rounded features of the selected regions, as its feature files hold them.
        expected = regions.select(torch.sort(regions.scores, descending=True, stable=True).indices[: len(selected)])
        encoded = processor([loaded])["region_features"][0]
        torch.testing.assert_close(encoded, expected.features.half().float(), atol=0, rtol=0)


@pytest.mark.parametrize("feature_dtype", ["float16", "float32"])
def test_reads_by_id_equal_the_arrow_row_decoding_bit_for_bit(tmp_path, feature_dtype):
    """`store[id]` reads rows through numpy views made once per shard; what it returns is what decoding a one-row
    Arrow slice of the shard (the streamed path, `decode_row`) gives, for every row of every record batch."""
    import pyarrow as pa

    images = {f"img{i}": with_probs(random_regions(1 + i % 5, 8, seed=i), seed=i) for i in range(11)}
    images["whole"] = random_regions(4, 8, seed=20)  # no class or attribute probabilities: other layout, own store
    with RegionStoreWriter(tmp_path / "a", shard_size=5, row_group_size=2, feature_dtype=feature_dtype) as writer:
        for image_id, regions in images.items():
            if image_id != "whole":
                writer.add(image_id, regions)
    with RegionStoreWriter(tmp_path / "b", feature_dtype=feature_dtype) as writer:
        writer.add("whole", images["whole"])
    for folder in (tmp_path / "a", tmp_path / "b"):
        store = RegionStore(folder)
        for shard in store.shard_files:
            table = pa.ipc.open_file(pa.memory_map(str(shard))).read_all()
            for row in range(table.num_rows):
                expected = store.decode_row(table.slice(row, 1), shard.name)
                read = store[expected.metadata["image_id"]]
                assert read.image_size == expected.image_size and read.metadata == expected.metadata
                assert [type(v) for v in read.image_size] == [type(v) for v in expected.image_size]
                for name in ("features", "boxes", "scores", "class_probs", "attribute_probs"):
                    x, y = getattr(read, name), getattr(expected, name)
                    assert (x is None) == (y is None), name
                    if x is not None:
                        assert x.dtype == y.dtype == torch.float32 and x.shape == y.shape and torch.equal(x, y), name
                        assert x.is_contiguous()
                assert_same_regions(
                    read, images[expected.metadata["image_id"]], atol=1e-2 if feature_dtype == "float16" else 0.0
                )


def with_image_box_feature(regions, offset: float):
    """`regions` with a whole-image feature in its metadata, as the `vl-bert-json` reader gives it."""
    regions.metadata["image_box_feature"] = np.arange(regions.feature_dim, dtype=np.float32) - offset
    return regions


@pytest.mark.parametrize("feature_dtype", ["float32", "float16"])
def test_the_whole_image_feature_is_kept_per_image(tmp_path, feature_dtype):
    """VL-BERT's `image_box_feature`: stored with each image that has one (null for one without), read back into
    metadata as the reader gives it; by id, as Arrow rows, and through `datasets`."""
    images = {
        "a": with_image_box_feature(random_regions(3, 8, seed=1), 50.0),
        "b": random_regions(2, 8, seed=2),
        "c": with_image_box_feature(random_regions(4, 8, seed=3), 0.25),
    }
    with RegionStoreWriter(tmp_path, shard_size=2, feature_dtype=feature_dtype) as writer:
        for image_id, regions in images.items():
            writer.add(image_id, regions)
    assert json.loads((tmp_path / "store.json").read_text())["layout"]["has_image_box_feature"] is True
    store = RegionStore(tmp_path)
    streamed = [store.decode_row(row) for row in store.streaming_dataset(tmp_path).with_format("arrow").iter(1)]
    for index, (image_id, regions) in enumerate(images.items()):
        for loaded in (store[image_id], streamed[index]):
            if "image_box_feature" in regions.metadata:
                expected = regions.metadata["image_box_feature"].astype(feature_dtype).astype(np.float32)
                got = loaded.metadata["image_box_feature"]
                assert got.dtype == np.float32 and got.shape == (8,)
                np.testing.assert_array_equal(got, expected)
            else:
                assert "image_box_feature" not in loaded.metadata
    rows = store.dataset
    assert rows[1]["image_box_feature"] is None and rows[0]["image_box_feature"] == list(np.arange(8.0) - 50)


def test_a_store_without_whole_image_features_keeps_the_earlier_layout(tmp_path):
    """A store none of whose images has one is written as before (readable by earlier vlhub), and one written
    before, whose store.json does not know the field, reads as before."""
    with RegionStoreWriter(tmp_path) as writer:
        writer.add("a", random_regions(3, 8, seed=1))
    layout = json.loads((tmp_path / "store.json").read_text())["layout"]
    assert set(layout) == {"feature_dim", "feature_dtype", "has_scores", "num_classes", "num_attributes"}
    assert "image_box_feature" not in RegionStore(tmp_path)["a"].metadata
    # Its first image had none: a later image's whole-image feature is not kept; the import names it in a warning.
    with RegionStoreWriter(tmp_path) as writer:
        writer.add("b", with_image_box_feature(random_regions(3, 8, seed=2), 1.0))
    assert "image_box_feature" not in RegionStore(tmp_path)["b"].metadata


def test_a_bad_whole_image_feature_is_refused_and_a_damaged_one_detected(tmp_path):
    with RegionStoreWriter(tmp_path / "bad", feature_dtype="float16") as writer:
        writer.add("a", with_image_box_feature(random_regions(3, 8, seed=1), 0.0))
        for bad, message in (
            (np.zeros(5), "has 5 values; the store's features have 8"),
            (np.full(8, np.nan), "NaN or infinite"),
            (np.full(8, 1e6), "float16"),
        ):
            regions = random_regions(3, 8, seed=2)
            regions.metadata["image_box_feature"] = bad
            with pytest.raises(ValueError, match=message):
                writer.add("b", regions)
    with RegionStoreWriter(tmp_path / "flip") as writer:
        writer.add("a", with_image_box_feature(random_regions(3, 8, seed=1), 1000.0))
    shard = next((tmp_path / "flip").glob("shard-*.arrow"))
    data = shard.read_bytes()
    stored = np.float32(7 - 1000.0).tobytes()  # the feature's last value, found in the shard's bytes
    position = data.index(stored)
    shard.write_bytes(data[:position] + bytes([data[position] ^ 0x55]) + data[position + 1 :])
    with pytest.raises(ValueError, match=f"{shard.name} is damaged"):
        RegionStore(tmp_path / "flip")["a"]


def test_a_store_records_its_source_and_refuses_another_one(tmp_path, caplog):
    from vlhub.processing.stores import StoreSourceMismatchError, check_store_source, recorded_source

    source = {"extractor": "sha256:aa", "dtype": "bfloat16", "calibration_images": ("img0", "img1")}
    check_store_source(tmp_path / "store", source)  # no store yet: anything goes
    with RegionStoreWriter(tmp_path / "store", shard_size=2, source=source) as writer:
        writer.add("a", random_regions(3, 8))
    as_saved = {**source, "calibration_images": ["img0", "img1"]}  # JSON: a tuple reads back as a list
    assert recorded_source(tmp_path / "store") == RegionStore(tmp_path / "store").source == as_saved
    with RegionStoreWriter(tmp_path / "store", source=source) as writer:  # the same source continues it
        writer.add("b", random_regions(3, 8, seed=1))
    other = {**source, "dtype": "float32"}
    with pytest.raises(StoreSourceMismatchError, match="dtype: the store has 'bfloat16', the new features 'float32'"):
        RegionStoreWriter(tmp_path / "store", source=other)
    with pytest.raises(StoreSourceMismatchError, match="extractor: the store has 'sha256:aa', the new features None"):
        check_store_source(tmp_path / "store", {"dtype": "bfloat16", "calibration_images": ["img0", "img1"]})
    with RegionStoreWriter(tmp_path / "store") as writer:  # a writer that states no source is not checked
        writer.add("c", random_regions(3, 8, seed=2))
    assert sorted(RegionStore(tmp_path / "store").ids) == ["a", "b", "c"]
    assert recorded_source(tmp_path / "store") == as_saved

    # A store written without a source cannot be checked: continued with a warning, and still records none.
    with RegionStoreWriter(tmp_path / "unsourced") as writer:
        writer.add("a", random_regions(3, 8))
    with caplog.at_level("WARNING", logger="vlhub.processing.stores.shards"):
        with RegionStoreWriter(tmp_path / "unsourced", source=source) as writer:
            writer.add("b", random_regions(3, 8, seed=1))
    assert any("records no source" in record.message for record in caplog.records)
    assert recorded_source(tmp_path / "unsourced") is None
    assert "source" not in json.loads((tmp_path / "unsourced" / "store.json").read_text())

    with pytest.raises(ValueError, match="JSON values only"):
        RegionStoreWriter(tmp_path / "bad", source={"dtype": torch.float32})
    with pytest.raises(TypeError, match="string keys"):
        RegionStoreWriter(tmp_path / "bad", source={1: "x"})
