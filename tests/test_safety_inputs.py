"""Hostile and unlucky inputs get a clear error naming the item and the problem (issue 10, points 6, 7, 9).

Malicious files (a pickle that would run code, an h5 file that would copy a local file's bytes into the features)
are refused without their payload running; bad values are refused where they enter, not turned into NaN later.
"""

import os
import pickle
import zipfile

import numpy as np
import pytest
import torch
from transformers import pipeline

import vlhub
from vlhub.cli import main
from vlhub.conversion import CheckpointError, convert_uniter
from vlhub.conversion.common import load_torch_state_dict
from vlhub.processing.stores import FeatureFileError, NpzFolderReader, RegionStore, RegionStoreWriter

from .helpers import random_regions, save_tiny, tiny_processor

FLOAT16_MAX = 65504.0


class _Payload:
    """Pickles to a call of os.system that would create the file `path` if it ever ran."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def regions_with(features, image_size=(48, 64)):
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0]]).repeat(len(features), 1)
    return vlhub.RegionFeatures(features=features, boxes=boxes, image_size=image_size)


@pytest.fixture
def vqa_folder(tmp_path, tiny_uniter_config, tiny_vocab):
    tiny_uniter_config.id2label = {0: "yes", 1: "no", 2: "red"}
    tiny_uniter_config.label2id = {v: k for k, v in tiny_uniter_config.id2label.items()}
    save_tiny(tmp_path / "vqa", vlhub.UniterForQuestionAnswering, tiny_uniter_config, tiny_vocab)
    return tmp_path / "vqa"


@pytest.fixture
def itr_folder(tmp_path, tiny_uniter_config, tiny_vocab):
    save_tiny(tmp_path / "itr", vlhub.UniterForImageTextRetrieval, tiny_uniter_config, tiny_vocab)
    return tmp_path / "itr"


# ------------------------------------------------------------------------------- 9: messages, not tracebacks
def test_empty_pipeline_batch_is_a_clear_error(vqa_folder):
    vqa = pipeline("visual-question-answering", model=str(vqa_folder))
    regions = random_regions(3, 16)
    for image, question in (([], []), ([], "what is it ?"), (regions, []), ((), ())):
        with pytest.raises(ValueError, match="empty"):
            vqa(image=image, question=question)


def test_lone_surrogate_in_text_names_the_text(tiny_uniter_config, tiny_vocab, vqa_folder):
    processor = tiny_processor(tiny_vocab, tiny_uniter_config)
    regions = random_regions(3, 16)
    with pytest.raises(ValueError, match=r"text\[1\].*surrogate.*position 4"):
        processor(text=["a cat", "the \ud800 dog"], regions=[regions, regions])
    vqa = pipeline("visual-question-answering", model=str(vqa_folder))
    with pytest.raises(ValueError, match="surrogate"):
        vqa(image=regions, question="a \udc00 cat")


@pytest.mark.parametrize("image_size", [(1e30, 1e30), (int(1e30), 64), (48, 1e300), (2.0**25, 64)])
def test_absurd_image_size_is_refused_at_construction(image_size):
    with pytest.raises(ValueError, match=r"image_size.*at most"):
        regions_with(torch.rand(2, 4), image_size=image_size)


def test_image_size_at_the_limit_still_works(tiny_uniter_config, tiny_vocab):
    # 2**24 pixels: every integer coordinate is still exact in float32
    regions = regions_with(torch.rand(2, 16), image_size=(2**24, 2**24))
    out = tiny_processor(tiny_vocab, tiny_uniter_config)(text="a cat", regions=[regions])
    assert torch.isfinite(out["region_locations"]).all()


def test_boolean_image_size_is_refused():
    with pytest.raises(ValueError, match="image_size"):
        regions_with(torch.rand(2, 4), image_size=(True, True))


def test_batch_errors_name_the_item_at_fault(tiny_uniter_config, tiny_vocab, vqa_folder, itr_folder):
    processor = tiny_processor(tiny_vocab, tiny_uniter_config)
    good = random_regions(3, 16)
    too_many = random_regions(12, 16, scores=False)  # more than max_regions=10 and no scores to select by
    with pytest.raises(ValueError, match=r"regions\[2\].*max_regions=10"):
        processor(text=["a", "a", "a"], regions=[good, good, too_many])
    vqa = pipeline("visual-question-answering", model=str(vqa_folder))
    with pytest.raises(ValueError, match=r"image\[1\].*8-d features") as info:
        vqa(image=[good, random_regions(3, 8)], question=["a cat", "a dog"])
    assert "regions[0]" not in str(info.value)
    with pytest.raises(ValueError, match=r"image\[2\].*max_regions=10"):
        vqa(image=[good, good, too_many], question="what ?")
    with pytest.raises(ValueError, match=r"question\[1\]"):
        vqa(image=[good, good], question=["a cat", "  "])
    with pytest.raises(ValueError, match=r"image\[1\].*no region extractor"):
        vqa(image=[good, torch.rand(3, 16)], question=["a", "b"])
    retrieval = pipeline("image-text-retrieval", model=str(itr_folder))
    with pytest.raises(ValueError, match=r"images\[1\].*8-d features"):
        retrieval(text="a cat", images=[good, random_regions(3, 8)])
    with pytest.raises(ValueError, match=r"texts\[2\].*empty"):
        retrieval(image=good, texts=["a cat", "a dog", ""])


def test_corrupt_shard_is_named(tmp_path):
    with RegionStoreWriter(tmp_path, shard_size=2) as writer:
        for i in range(4):
            writer.add(str(i), random_regions(3, 8, seed=i))
    shard = sorted(tmp_path.glob("shard-*.arrow"))[1]
    data = shard.read_bytes()
    opened_before = RegionStore(tmp_path)
    opened_before["0"]  # maps the first shard only
    shard.write_bytes(data[: len(data) // 2])
    for store in (opened_before, RegionStore(tmp_path)):  # opening reads no shard: the damage shows on reading
        with pytest.raises(ValueError, match=f"{shard.name}.*damaged"):
            store["3"]
        assert store["0"].features.shape == (3, 8)  # the other shard still reads
    with RegionStoreWriter(tmp_path, shard_size=2) as writer:  # a writer does not read shards: it opens
        writer.add("4", random_regions(3, 8, seed=4))
    shard.write_bytes(b"")
    with pytest.raises(ValueError, match=shard.name):
        RegionStore(tmp_path)["2"]


def test_flipped_bytes_in_a_shard_are_an_error_not_different_features(tmp_path):
    images = {str(i): random_regions(3, 8, seed=i) for i in range(4)}
    with RegionStoreWriter(tmp_path, shard_size=4) as writer:
        for image_id, regions in images.items():
            writer.add(image_id, regions)
    shard = next(tmp_path.glob("shard-*.arrow"))
    data = shard.read_bytes()
    outcomes = {"error": 0, "identical": 0, "silently different": 0}
    for position in range(0, len(data), 11):
        damaged = bytearray(data)
        damaged[position] ^= 0x55
        shard.write_bytes(bytes(damaged))
        try:
            store = RegionStore(tmp_path)
            read = {image_id: store[image_id] for image_id in images}
        except ValueError as err:
            assert shard.name in str(err)
            outcomes["error"] += 1
            continue
        same = all(
            torch.equal(getattr(read[i], name), getattr(images[i], name))
            for i in images
            for name in ("features", "boxes", "scores")
        )
        outcomes["identical" if same else "silently different"] += 1
    assert outcomes["silently different"] == 0, outcomes
    assert outcomes["error"] > 0


def test_unsafe_pickle_reaches_the_cli_as_one_line(tmp_path, capsys):
    lmdb = pytest.importorskip("lmdb")
    env = lmdb.open(str(tmp_path / "evil.lmdb"), map_size=1 << 22)
    with env.begin(write=True) as txn:
        txn.put(b"keys", pickle.dumps([b"1"]))
        txn.put(b"1", pickle.dumps(_Payload(tmp_path / "pwned")))
    env.close()
    code = main(
        [
            "import-features",
            str(tmp_path / "evil.lmdb"),
            "--format",
            "vilbert-lmdb",
            "--output",
            str(tmp_path / "store"),
        ]
    )
    err = capsys.readouterr().err
    assert code != 0
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("vlhub ")]  # the rest is tqdm's progress bar
    assert len(errors) == 1 and "refusing to load" in errors[0] and "system" in errors[0]
    assert not (tmp_path / "pwned").exists()


def test_training_texts_are_checked_at_load_time_naming_the_row():
    import datasets

    from vlhub.training.data import caption_pairs
    from vlhub.training.finetuning import VqaDataset

    captions = datasets.Dataset.from_dict({"image_id": ["a", "b", "c"], "caption": ["a cat", "a dog", " "]})
    with pytest.raises(ValueError, match=r"captions.jsonl: the caption of row 2 \(image 'c'\) is empty"):
        caption_pairs(captions, "captions.jsonl")
    surrogate = [{"question": "what \udc80 ?", "image_id": "x", "labels": [0], "scores": [1.0], "answers": ["a"]}]
    with pytest.raises(ValueError, match=r"the question of row 0 \(image 'x'\).*surrogate"):
        VqaDataset.from_rows(surrogate, num_labels=3)


# --------------------------------------------------------------------------------------------- .pt: refused vs corrupt
def test_unsafe_pt_is_reported_as_refused_not_corrupt(tmp_path):
    for legacy in (False, True):
        path = tmp_path / f"evil{int(legacy)}.pt"
        torch.save(
            {"weight": torch.ones(2), "extra": _Payload(tmp_path / "pwned")},
            path,
            _use_new_zipfile_serialization=not legacy,
        )
        with pytest.raises(CheckpointError, match=r"refusing to load.*system") as info:
            load_torch_state_dict(path)
        assert "truncated" not in str(info.value) and path.name in str(info.value)
    assert not (tmp_path / "pwned").exists()
    good = tmp_path / "good.pt"
    torch.save({"weight": torch.ones(64)}, good)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[:300])
    with pytest.raises(CheckpointError, match="truncated, corrupt"):
        load_torch_state_dict(truncated)


def test_truncated_legacy_pt_is_never_reported_as_unsafe(tmp_path):
    # A legacy (non-zip) checkpoint cut inside a pickled global name ("torch._utils._rebuild...") names a
    # global that does not exist: that is damage, not an attack.
    good = tmp_path / "legacy.pt"
    torch.save({"weight": torch.ones(4)}, good, _use_new_zipfile_serialization=False)
    data = good.read_bytes()
    cut = tmp_path / "cut.pt"
    for size in range(1, len(data)):
        cut.write_bytes(data[:size])
        with pytest.raises(CheckpointError) as info:
            load_torch_state_dict(cut)
        assert "refusing" not in str(info.value), size
        assert "truncated" in str(info.value), size


def test_unsafe_pt_through_the_converter_and_cli(tmp_path, tiny_vocab, capsys):
    path = tmp_path / "uniter.pt"
    torch.save({"uniter.embeddings.word_embeddings.weight": torch.zeros(4, 4), "x": _Payload(tmp_path / "pwned")}, path)
    with pytest.raises(CheckpointError, match="refusing to load"):
        convert_uniter(path, tmp_path / "out", tokenizer=tiny_vocab)
    code = main(
        ["convert", "uniter", str(path), "--output-dir", str(tmp_path / "out2"), "--tokenizer", str(tiny_vocab)]
    )
    err = capsys.readouterr().err
    assert code != 0 and "refusing to load" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "pwned").exists()
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


# --------------------------------------------------------------------------------------------- 7: float16 limit
def test_float16_processor_refuses_features_beyond_the_float16_limit(tiny_uniter_config, tiny_vocab):
    processor = tiny_processor(tiny_vocab, tiny_uniter_config)
    features = torch.rand(3, 16)
    features[1, 5] = 70000.0
    with pytest.raises(ValueError, match=r"regions\[1\].*65504") as info:
        processor(text=["a", "a"], regions=[random_regions(3, 16), regions_with(features)])
    assert "float16" in str(info.value)
    features[1, 5] = -1e5
    with pytest.raises(ValueError, match="65504"):
        processor(text="a", regions=[regions_with(features)])
    features[1, 5] = FLOAT16_MAX  # the largest float16 is fine
    out = processor(text="a", regions=[regions_with(features)])
    assert torch.isfinite(out["region_features"]).all() and out["region_features"].max() == FLOAT16_MAX
    processor.feature_extractor.float16_storage = False  # no rounding, no limit
    features[1, 5] = 1e6
    assert processor(text="a", regions=[regions_with(features)])["region_features"].max() == 1e6


def test_float16_features_never_reach_the_model_as_nan(tiny_uniter_config, tiny_vocab, vqa_folder):
    vqa = pipeline("visual-question-answering", model=str(vqa_folder))
    features = torch.rand(3, 16)
    features[0, 0] = 1e5
    with pytest.raises(ValueError, match="65504"):
        vqa(image=regions_with(features), question="what ?")


def test_float16_model_in_a_pipeline_refuses_features_beyond_the_limit(vqa_folder, itr_folder):
    vqa = pipeline("visual-question-answering", model=str(vqa_folder))
    vqa.processor.feature_extractor.float16_storage = False  # the processor no longer rounds: the model does
    vqa.model.half()
    features = torch.rand(3, 16)
    features[2, 3] = 1e5
    with pytest.raises(ValueError, match=r"image\[1\] features.*float16.*65504"):
        vqa(image=[random_regions(3, 16), regions_with(features)], question="what ?")
    retrieval = pipeline("image-text-retrieval", model=str(itr_folder))
    retrieval.processor.feature_extractor.float16_storage = False
    retrieval.model.half()
    with pytest.raises(ValueError, match=r"images\[0\] features.*65504"):
        retrieval(text="a cat", images=[regions_with(features)])


def test_float16_store_refuses_features_beyond_the_limit_at_write_time(tmp_path):
    features = torch.rand(3, 8)
    features[2, 1] = 66000.0
    with RegionStoreWriter(tmp_path / "half", feature_dtype="float16") as writer:
        writer.add("ok", regions_with(torch.rand(3, 8)))
        with pytest.raises(ValueError, match=r"'big'.*65504"):
            writer.add("big", regions_with(features))
    store = RegionStore(tmp_path / "half")
    assert store.ids == ["ok"] and torch.isfinite(store["ok"].features).all()
    with RegionStoreWriter(tmp_path / "full", feature_dtype="float32") as writer:
        writer.add("big", regions_with(features))
    assert RegionStore(tmp_path / "full")["big"].features[2, 1] == 66000.0


# --------------------------------------------------------------------------------------------- 6: HDF5 indirections
try:
    import h5py
except ImportError:  # the h5 tests skip; the rest of this file still runs
    h5py = None
needs_h5py = pytest.mark.skipif(h5py is None, reason="h5py is not installed")


def vlp_files(tmp_path, image_id="COCO_1", num_boxes=2, dim=4):
    rng = np.random.default_rng(0)
    boxes = np.array([[0, 0, 10, 10, 1, 0.9], [5, 5, 20, 20, 2, 0.8]], dtype=np.float32)[:num_boxes]
    with h5py.File(tmp_path / "bbox.h5", "w") as f:
        f[image_id] = boxes
    with h5py.File(tmp_path / "feat.h5", "w") as f:
        f[image_id] = rng.normal(size=(num_boxes, dim)).astype(np.float32)
    return tmp_path / "feat.h5", tmp_path / "bbox.h5"


def secret_file(tmp_path, num_bytes=2 * 4 * 4):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(bytes(range(1, num_bytes + 1)))
    return secret


def reader(features, boxes):
    return vlhub.modeling.unified_vlp.VlpH5Reader(features, boxes, image_sizes={"COCO_1": (30, 30)})


@needs_h5py
def test_vlp_h5_plain_file_still_reads(tmp_path):
    features, boxes = vlp_files(tmp_path)
    assert reader(features, boxes)["COCO_1"].features.shape == (2, 4)


@needs_h5py
@pytest.mark.parametrize("crafted", ["feat", "bbox"])
def test_vlp_h5_refuses_external_storage(tmp_path, crafted):
    features, boxes = vlp_files(tmp_path)
    shape = (2, 4) if crafted == "feat" else (2, 6)
    secret = secret_file(tmp_path, num_bytes=shape[0] * shape[1] * 4)
    path = features if crafted == "feat" else boxes
    with h5py.File(path, "w") as f:  # the raw data "lives" in secret.bin
        f.create_dataset("COCO_1", shape=shape, dtype="<f4", external=[(str(secret), 0, secret.stat().st_size)])
    with h5py.File(path, "r") as f:  # the attack is real: a plain read copies the other file's bytes
        assert f["COCO_1"][()].tobytes() == secret.read_bytes()
    with pytest.raises(FeatureFileError, match=rf"{crafted}\.h5.*'COCO_1'.*external storage.*secret\.bin"):
        reader(features, boxes)["COCO_1"]


@needs_h5py
def test_vlp_h5_refuses_virtual_datasets(tmp_path):
    features, boxes = vlp_files(tmp_path)
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["data"] = np.full((2, 4), 7.0, dtype=np.float32)
    layout = h5py.VirtualLayout(shape=(2, 4), dtype="<f4")
    layout[:] = h5py.VirtualSource(str(tmp_path / "other.h5"), "data", shape=(2, 4))
    with h5py.File(features, "w") as f:
        f.create_virtual_dataset("COCO_1", layout)
    with h5py.File(features, "r") as f:
        assert (f["COCO_1"][()] == 7.0).all()  # a plain read follows the mapping into other.h5
    with pytest.raises(FeatureFileError, match=r"feat\.h5.*'COCO_1'.*virtual"):
        reader(features, boxes)["COCO_1"]


@needs_h5py
@pytest.mark.parametrize("kind", ["soft", "external"])
def test_vlp_h5_refuses_links(tmp_path, kind):
    features, boxes = vlp_files(tmp_path)
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["data"] = np.full((2, 4), 7.0, dtype=np.float32)
    with h5py.File(features, "a") as f:
        f["real"] = f["COCO_1"][()]
        del f["COCO_1"]
        f["COCO_1"] = (
            h5py.SoftLink("/real") if kind == "soft" else h5py.ExternalLink(str(tmp_path / "other.h5"), "/data")
        )
    with h5py.File(features, "r") as f:
        assert f["COCO_1"].shape == (2, 4)  # a plain read follows the link
    with pytest.raises(FeatureFileError, match=rf"feat\.h5.*'COCO_1'.*{kind} link"):
        reader(features, boxes)["COCO_1"]


@needs_h5py
def test_vlp_h5_refuses_a_group_where_a_dataset_belongs(tmp_path):
    features, boxes = vlp_files(tmp_path)
    with h5py.File(features, "w") as f:
        f.create_group("COCO_1")
    with pytest.raises(FeatureFileError, match=r"feat\.h5.*'COCO_1'.*not a dataset"):
        reader(features, boxes)["COCO_1"]


# --------------------------------------------------------------------------------------------- other malicious files
def test_vilbert_lmdb_refusals_and_damage_name_the_lmdb_and_entry(tmp_path):
    lmdb = pytest.importorskip("lmdb")
    from vlhub.modeling.vilbert import VilbertLmdbReader
    from vlhub.utils.safe_pickle import UnsafePickleError

    def write(name, entries):
        env = lmdb.open(str(tmp_path / name), map_size=1 << 22)
        with env.begin(write=True) as txn:
            for key, value in entries.items():
                txn.put(key, value)
        env.close()
        return tmp_path / name

    evil = write("evil.lmdb", {b"keys": pickle.dumps([b"7"]), b"7": pickle.dumps(_Payload(tmp_path / "pwned"))})
    with pytest.raises(UnsafePickleError, match=r"evil\.lmdb \(image 7\).*refusing to load.*system"):
        VilbertLmdbReader(evil)["7"]
    evil_keys = write("evil_keys.lmdb", {b"keys": pickle.dumps(_Payload(tmp_path / "pwned"))})
    with pytest.raises(UnsafePickleError, match=r"evil_keys\.lmdb \(entry `keys`\).*refusing"):
        VilbertLmdbReader(evil_keys)
    damaged = write("damaged.lmdb", {b"keys": pickle.dumps([b"7"]), b"7": pickle.dumps({"a": 1})[:-5]})
    with pytest.raises(FeatureFileError, match=r"damaged\.lmdb \(image 7\).*truncated or corrupt"):
        VilbertLmdbReader(damaged)["7"]
    assert not (tmp_path / "pwned").exists()


def test_npz_with_a_pickled_object_array_is_refused_without_running_it(tmp_path):
    boxes = np.array([[0, 0, 10, 10]], dtype=np.float32)
    payload = np.empty(1, dtype=object)
    payload[0] = _Payload(tmp_path / "pwned")
    (tmp_path / "npz").mkdir()
    np.savez(tmp_path / "npz" / "1.npz", features=payload, boxes=boxes, image_h=[20], image_w=[20], num_boxes=[1])
    with pytest.raises(FeatureFileError, match=r"1\.npz.*without pickle"):
        NpzFolderReader(tmp_path / "npz")["1"]
    assert not (tmp_path / "pwned").exists()


def test_uniter_lmdb_with_pickled_npz_or_object_msgpack_is_refused(tmp_path):
    lmdb = pytest.importorskip("lmdb")
    msgpack = pytest.importorskip("msgpack")
    import io

    payload = np.empty(1, dtype=object)
    payload[0] = _Payload(tmp_path / "pwned")
    buffer = io.BytesIO()
    np.savez_compressed(buffer, features=payload, norm_bb=np.zeros((1, 6), np.float16))
    object_msgpack = msgpack.packb(
        {
            "features": {"nd": True, "type": "|O", "shape": [1], "data": pickle.dumps(_Payload(tmp_path / "pwned"))},
            "norm_bb": {"nd": True, "type": "<f2", "shape": [1, 6], "data": np.zeros((1, 6), np.float16).tobytes()},
        },
        use_bin_type=True,
    )
    env = lmdb.open(str(tmp_path / "db"), map_size=1 << 22)
    with env.begin(write=True) as txn:
        txn.put(b"a.npz", buffer.getvalue())
        txn.put(b"b.npz", object_msgpack)
    env.close()
    db = vlhub.modeling.uniter.UniterLmdbReader(tmp_path / "db")
    with pytest.raises(FeatureFileError, match=r"image a\.npz"):
        db["a.npz"]
    with pytest.raises(FeatureFileError, match=r"image b\.npz"):
        db["b.npz"]
    assert not (tmp_path / "pwned").exists()


def test_npz_with_a_garbage_member_is_named(tmp_path):
    folder = tmp_path / "npz"
    folder.mkdir()
    with zipfile.ZipFile(folder / "1.npz", "w") as archive:
        archive.writestr("features.npy", b"\x93NUMPY garbage")
    with pytest.raises(FeatureFileError, match=r"1\.npz"):
        NpzFolderReader(folder)["1"]
