"""Readers of the original projects' feature files, each on a small file written the way that project wrote it."""

import base64
import csv
import io
import json
import os
import pickle

import numpy as np
import pytest

from vlhub.processing.stores import BUTD_TSV_FIELDS, ButdTsvReader, FeatureFileError, NpzFolderReader
from vlhub.modeling.unified_vlp import VlpH5Reader
from vlhub.modeling.uniter import UniterLmdbReader
from vlhub.modeling.vilbert import VilbertLmdbReader
from vlhub.modeling.vl_bert import VlBertJsonReader
from vlhub.utils.safe_pickle import UnsafePickleError, safe_loads

lmdb = pytest.importorskip("lmdb")
h5py = pytest.importorskip("h5py")
msgpack = pytest.importorskip("msgpack")

HEIGHT, WIDTH = 60, 80


def detections(num_boxes, seed, dim=6, classes=5):
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 30, size=(num_boxes, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(1, 25, size=(num_boxes, 2))], axis=1).astype(np.float32)
    probs = rng.dirichlet(np.ones(classes), size=num_boxes).astype(np.float32)
    return {
        "boxes": boxes,
        "features": rng.normal(size=(num_boxes, dim)).astype(np.float32),
        "cls_prob": probs,
        "conf": probs[:, 1:].max(axis=1),
    }


def b64(array) -> str:
    return base64.b64encode(np.ascontiguousarray(array).tobytes()).decode("ascii")


def test_butd_tsv(tmp_path):
    path = tmp_path / "features.tsv"
    images = {"101": detections(3, 0), "7": detections(5, 1)}
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, delimiter="\t", fieldnames=list(BUTD_TSV_FIELDS))
        for image_id, d in images.items():
            writer.writerow(
                {
                    "image_id": image_id,
                    "image_w": WIDTH,
                    "image_h": HEIGHT,
                    "num_boxes": len(d["boxes"]),
                    "boxes": b64(d["boxes"]),
                    "features": b64(d["features"]),
                }
            )
    reader = ButdTsvReader(path)
    assert reader.ids == ["101", "7"] and len(reader) == 2
    regions = reader["7"]
    assert regions.image_size == (HEIGHT, WIDTH)
    np.testing.assert_array_equal(regions.features.numpy(), images["7"]["features"])
    np.testing.assert_array_equal(regions.boxes.numpy(), images["7"]["boxes"])
    assert regions.class_probs is None and regions.metadata["image_id"] == "7"
    with pytest.raises(KeyError, match="42"):
        reader["42"]


def test_butd_tsv_with_class_probs_and_bad_rows(tmp_path):
    d = detections(4, 2)
    path = tmp_path / "f.tsv"
    row = ["5", str(WIDTH), str(HEIGHT), "4", b64(d["boxes"]), b64(d["features"]), b64(d["cls_prob"])]
    bad = ["6", str(WIDTH), str(HEIGHT), "3", b64(d["boxes"]), b64(d["features"])]  # 4 boxes stored, 3 claimed
    path.write_text("\t".join(row) + "\n" + "\t".join(bad) + "\n")
    reader = ButdTsvReader(path)
    np.testing.assert_array_equal(reader["5"].class_probs.numpy(), d["cls_prob"])
    with pytest.raises(FeatureFileError, match="image 6.*boxes"):
        reader["6"]


def test_lxmert_tsv(tmp_path):
    d = detections(3, 3)
    ids, attrs = np.array([4, 0, 2], dtype=np.int64), np.array([1, 1, 0], dtype=np.int64)
    row = [
        "COCO_1",
        str(HEIGHT),
        str(WIDTH),
        b64(ids),
        b64(d["conf"]),
        b64(attrs),
        b64(d["conf"] / 2),
        "3",
        b64(d["boxes"]),
        b64(d["features"]),
    ]
    path = tmp_path / "obj36.tsv"
    path.write_text("\t".join(row) + "\n")
    regions = ButdTsvReader(path, fields="lxmert")["COCO_1"]
    assert regions.image_size == (HEIGHT, WIDTH)
    np.testing.assert_array_equal(regions.scores.numpy(), d["conf"])
    np.testing.assert_array_equal(regions.metadata["objects_id"], ids)
    np.testing.assert_array_equal(regions.metadata["attrs_id"], attrs)
    with pytest.raises(FeatureFileError, match="10 tab-separated columns.*pass fields="):
        ButdTsvReader(path)["COCO_1"]


def write_lmdb(path, entries: dict[bytes, bytes]):
    env = lmdb.open(str(path), map_size=1 << 24)
    with env.begin(write=True) as txn:
        for key, value in entries.items():
            txn.put(key, value)
    env.close()


def uniter_npz(d):
    w, h = WIDTH, HEIGHT
    b = d["boxes"]
    norm_bb = np.stack(
        [b[:, 0] / w, b[:, 1] / h, b[:, 2] / w, b[:, 3] / h, (b[:, 2] - b[:, 0]) / w, (b[:, 3] - b[:, 1]) / h], axis=1
    )
    return {
        "features": d["features"].astype(np.float16),
        "norm_bb": norm_bb.astype(np.float16),
        "conf": d["conf"][:, None].astype(np.float16),
        "soft_labels": d["cls_prob"].astype(np.float16),
    }


def test_uniter_lmdb_compressed_and_msgpack(tmp_path):
    a, b = detections(3, 4), detections(4, 5)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **uniter_npz(a))

    def msgpack_numpy(obj):  # msgpack-numpy's wire form of an ndarray
        return {b"nd": True, b"type": obj.dtype.str, b"shape": obj.shape, b"data": obj.tobytes()}

    packed = msgpack.packb(uniter_npz(b), default=msgpack_numpy, use_bin_type=True)
    keys = ["coco_val2014_000000000001.npz", "coco_val2014_000000000002.npz"]
    write_lmdb(
        tmp_path / "img_db",
        {keys[0].encode(): buffer.getvalue(), keys[1].encode(): packed, b"__keys__": json.dumps(keys).encode()},
    )
    reader = UniterLmdbReader(tmp_path / "img_db")
    assert reader.ids == keys
    for key, d in zip(keys, (a, b)):
        regions = reader[key]
        stored = uniter_npz(d)
        assert regions.image_size == (1, 1)
        np.testing.assert_array_equal(regions.features.numpy(), stored["features"].astype(np.float32))
        np.testing.assert_array_equal(regions.normalized_boxes().numpy(), stored["norm_bb"][:, :4].astype(np.float32))
        np.testing.assert_array_equal(regions.scores.numpy(), stored["conf"][:, 0].astype(np.float32))
        np.testing.assert_array_equal(regions.class_probs.numpy(), stored["soft_labels"].astype(np.float32))


def test_uniter_lmdb_missing_field(tmp_path):
    buffer = io.BytesIO()
    np.savez_compressed(buffer, features=np.zeros((2, 4), np.float16))
    write_lmdb(tmp_path / "db", {b"x.npz": buffer.getvalue()})
    with pytest.raises(FeatureFileError, match="missing field 'norm_bb'"):
        UniterLmdbReader(tmp_path / "db")["x.npz"]


def test_vilbert_lmdb_beta_multitask_and_cc(tmp_path):
    beta, mt, cc = detections(3, 6), detections(5, 7), detections(2, 8)
    rows = {
        b"11": pickle.dumps(
            {
                "image_id": 11,
                "image_w": WIDTH,
                "image_h": HEIGHT,
                "num_boxes": 3,
                "boxes": b64(beta["boxes"]),
                "features": b64(beta["features"]),
            },
            protocol=2,
        ),
        b"12": pickle.dumps(
            {
                "image_id": 12,
                "image_w": WIDTH,
                "image_h": HEIGHT,
                "num_boxes": 5,
                "boxes": mt["boxes"],
                "features": mt["features"],
                "cls_prob": mt["cls_prob"],
            }
        ),
        b"13": pickle.dumps(
            [b64(cc["features"]), b64(cc["cls_prob"]), b64(cc["boxes"]), 2, HEIGHT, WIDTH, "13", "a caption"]
        ),
        b"keys": pickle.dumps([b"11", b"12", b"13"]),
    }
    write_lmdb(tmp_path / "vilbert.lmdb", rows)
    reader = VilbertLmdbReader(tmp_path / "vilbert.lmdb")
    assert reader.ids == ["11", "12", "13"]
    np.testing.assert_array_equal(reader["11"].features.numpy(), beta["features"])
    np.testing.assert_array_equal(reader["12"].boxes.numpy(), mt["boxes"])
    np.testing.assert_array_equal(reader["12"].class_probs.numpy(), mt["cls_prob"])
    np.testing.assert_array_equal(reader["13"].class_probs.numpy(), cc["cls_prob"])
    assert reader["13"].image_size == (HEIGHT, WIDTH)


def test_vilbert_lmdb_refuses_code_in_pickles(tmp_path):
    class Exploit:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    write_lmdb(tmp_path / "evil.lmdb", {b"keys": pickle.dumps([b"1"]), b"1": pickle.dumps(Exploit())})
    with pytest.raises(UnsafePickleError, match="system"):
        VilbertLmdbReader(tmp_path / "evil.lmdb")["1"]
    assert safe_loads(pickle.dumps({"a": np.arange(3)}))["a"].tolist() == [0, 1, 2]


def test_vlp_h5_shards(tmp_path):
    images = {"COCO_val2014_000000000123": detections(4, 9), "COCO_val2014_000000000456": detections(4, 10)}
    for image_id, d in images.items():
        shard = image_id[-3:]
        with h5py.File(tmp_path / f"coco_feat{shard}.h5", "w") as f:
            f[image_id] = d["features"]
        with h5py.File(tmp_path / f"coco_cls{shard}.h5", "w") as f:
            f[image_id] = d["cls_prob"]
    with h5py.File(tmp_path / "coco_bbox.h5", "w") as f:
        for image_id, d in images.items():
            class_idx = d["cls_prob"][:, 1:].argmax(1) + 1
            f[image_id] = np.concatenate([d["boxes"], class_idx[:, None], d["conf"][:, None]], axis=1)
    with pytest.raises(ValueError, match="image sizes"):
        VlpH5Reader(tmp_path / "coco_feat{shard}.h5", tmp_path / "coco_bbox.h5")
    sizes = {image_id: (HEIGHT, WIDTH) for image_id in images}
    reader = VlpH5Reader(
        tmp_path / "coco_feat{shard}.h5",
        tmp_path / "coco_bbox.h5",
        class_probs=tmp_path / "coco_cls{shard}.h5",
        image_sizes=sizes,
    )
    d = images["COCO_val2014_000000000456"]
    regions = reader["COCO_val2014_000000000456"]
    np.testing.assert_array_equal(regions.features.numpy(), d["features"])
    np.testing.assert_array_equal(regions.class_probs.numpy(), d["cls_prob"])
    np.testing.assert_array_equal(regions.scores.numpy(), d["conf"])
    np.testing.assert_array_equal(regions.metadata["class_ids"], d["cls_prob"][:, 1:].argmax(1) + 1)
    inferred = VlpH5Reader(tmp_path / "coco_feat{shard}.h5", tmp_path / "coco_bbox.h5", image_size_from_boxes=True)
    regions = inferred["COCO_val2014_000000000123"]
    assert regions.metadata["image_size_from_boxes"]
    boxes = images["COCO_val2014_000000000123"]["boxes"]
    assert regions.image_size == pytest.approx((boxes[:, 3].max(), boxes[:, 2].max()))


def test_npz_folder(tmp_path):
    d = detections(3, 11)
    np.savez(
        tmp_path / "391895.npz",
        features=d["features"],
        boxes=d["boxes"],
        cls_prob=d["cls_prob"],
        image_h=[HEIGHT],
        image_w=[WIDTH],
        num_boxes=[3],
        image_id=["391895"],
    )
    np.savez(tmp_path / "bad.npz", features=d["features"], image_h=[HEIGHT], image_w=[WIDTH], num_boxes=[3])
    (tmp_path / "broken.npz").write_bytes(b"PK\x03\x04 not really a zip")
    reader = NpzFolderReader(tmp_path)
    assert reader.ids == ["391895", "bad", "broken"]
    regions = reader["391895"]
    np.testing.assert_array_equal(regions.class_probs.numpy(), d["cls_prob"])
    assert regions.image_size == (HEIGHT, WIDTH)
    with pytest.raises(FeatureFileError, match="missing field 'boxes'"):
        reader["bad"]
    with pytest.raises(FeatureFileError, match="broken.npz"):
        reader["broken"]


def test_vl_bert_json_folder(tmp_path):
    # As VL-BERT's loader reads them: base64 of raw float32 (base64.encodebytes, with its line breaks).
    def b64(array):
        return base64.encodebytes(np.ascontiguousarray(array, dtype=np.float32).tobytes()).decode()

    d = detections(3, 13)
    image_box_feature = np.arange(6, dtype=np.float32).reshape(1, 6) - 50
    record = {
        "image_id": 42,
        "image_w": WIDTH,
        "image_h": HEIGHT,
        "num_boxes": 3,
        "boxes": b64(d["boxes"]),
        "features": b64(d["features"]),
    }
    (tmp_path / "42.json").write_text(
        json.dumps({**record, "image_box_feature": b64(image_box_feature), "classes": b64(d["cls_prob"])})
    )
    (tmp_path / "43.json").write_text(json.dumps(record))
    (tmp_path / "44.json").write_text(json.dumps({**record, "image_box_feature": b64(np.zeros(5))}))
    (tmp_path / "45.json").write_text("{not json")
    reader = VlBertJsonReader(tmp_path)
    assert reader.ids == ["42", "43", "44", "45"]
    from vlhub.processing.stores import FEATURE_FORMATS, open_feature_file

    # VL-BERT registers its format with the shared feature-file registry (nothing in the stores names it).
    assert "vl-bert-json" in FEATURE_FORMATS and isinstance(
        open_feature_file("vl-bert-json", tmp_path), VlBertJsonReader
    )
    regions = reader["42"]
    np.testing.assert_array_equal(regions.features.numpy(), d["features"])
    np.testing.assert_array_equal(regions.boxes.numpy(), d["boxes"])
    np.testing.assert_array_equal(regions.class_probs.numpy(), d["cls_prob"])
    np.testing.assert_array_equal(regions.metadata["image_box_feature"], image_box_feature[0])
    assert regions.image_size == (HEIGHT, WIDTH)
    assert "image_box_feature" not in reader["43"].metadata
    with pytest.raises(FeatureFileError, match="44.json: image_box_feature has 5 values"):
        reader["44"]
    with pytest.raises(FeatureFileError, match="45.json: not a readable json"):
        reader["45"]


def test_boxes_outside_image_are_reported_with_the_file(tmp_path):
    d = detections(2, 12)
    np.savez(
        tmp_path / "1.npz",
        features=d["features"],
        boxes=d["boxes"] * 10,
        image_h=[HEIGHT],
        image_w=[WIDTH],
        num_boxes=[2],
    )
    with pytest.raises(FeatureFileError, match="1.npz.*inside the image"):
        NpzFolderReader(tmp_path)["1"]


def test_import_features_cli_into_a_store(tmp_path):
    from vlhub.cli import main
    from vlhub.processing.stores import RegionStore

    images = {"391895": detections(3, 13), "42": detections(4, 14)}
    folder = tmp_path / "npz"
    folder.mkdir()
    for image_id, d in images.items():
        np.savez(
            folder / f"{image_id}.npz",
            features=d["features"],
            boxes=d["boxes"],
            cls_prob=d["cls_prob"],
            image_h=[HEIGHT],
            image_w=[WIDTH],
            num_boxes=[len(d["boxes"])],
        )
    assert main(["import-features", str(folder), "--format", "npz", "--output", str(tmp_path / "store")]) == 0
    assert main(["import-features", str(folder), "--format", "npz", "--output", str(tmp_path / "store")]) == 0
    store = RegionStore(tmp_path / "store")
    assert sorted(store.ids) == sorted(images)
    np.testing.assert_array_equal(store["42"].class_probs.numpy(), images["42"]["cls_prob"])
    assert main(["import-features", str(folder), "--format", "vlp-h5", "--output", str(tmp_path / "s2")]) == 2
    # The store records the format it was imported from; a copy keeps it; another format is refused.
    assert store.source == {"imported_from": "npz"}
    assert (
        main(["import-features", str(tmp_path / "store"), "--format", "vlhub", "--output", str(tmp_path / "copy")]) == 0
    )
    assert RegionStore(tmp_path / "copy").source == {"imported_from": "npz"}
    from vlhub.processing.stores import StoreSourceMismatchError, import_features

    with pytest.raises(
        StoreSourceMismatchError, match="imported_from: the store has 'npz', the new features 'butd-tsv'"
    ):
        import_features({"7": store["42"]}, tmp_path / "store", source={"imported_from": "butd-tsv"}, progress=False)


def test_each_architecture_registers_its_format_for_a_bare_import_of_the_stores(tmp_path):
    # A fresh interpreter that imports only the shared module: Python imports the `vlhub` package first, which
    # imports every architecture package, so each format is registered before open_feature_file can be called.
    from .fresh_interpreter import run_python

    out = run_python(
        "from vlhub.processing.stores.original import FEATURE_FORMATS, open_feature_file\n"
        "for name in ('uniter-lmdb', 'vilbert-lmdb', 'vlp-h5', 'vl-bert-json'):\n"
        "    assert name in FEATURE_FORMATS, name\n"
        "try:\n"
        f"    open_feature_file('vilbert-lmdb', {str(tmp_path / 'missing.lmdb')!r})\n"
        "except FileNotFoundError as err:\n"
        "    print('opened by', type(err).__name__, err)\n"
    )
    assert f"no LMDB at {tmp_path / 'missing.lmdb'}" in out


def test_the_architectures_readers_still_import_from_the_stores_with_a_warning():
    import vlhub.processing.stores as stores

    for name, reader in (
        ("UniterLmdbReader", UniterLmdbReader),
        ("VilbertLmdbReader", VilbertLmdbReader),
        ("VlpH5Reader", VlpH5Reader),
        ("VlBertJsonReader", VlBertJsonReader),
    ):
        with pytest.warns(
            FutureWarning,
            match=rf"{name} lives with its architecture now: import it from "
            rf"{reader.__module__.rpartition('.')[0]}",
        ):
            assert getattr(stores, name) is reader
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchReader'"):
        stores.NoSuchReader
