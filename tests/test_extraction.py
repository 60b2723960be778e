"""`vlhub extract`: images → region store with the detector; resume, bad images, id rules, CLI."""

import json

import pytest
import torch

from vlhub.processing.extraction import collect_images, extract_to_store
from vlhub.processing.stores import RegionStore

from .helpers import tiny_detector, write_test_image


@pytest.fixture
def image_folder(tmp_path):
    folder = tmp_path / "images"
    (folder / "sub").mkdir(parents=True)
    for i in range(3):
        write_test_image(folder / f"img{i}.png", seed=i)
    write_test_image(folder / "sub" / "img3.jpg", seed=3)
    (folder / "notes.txt").write_text("not an image")
    return folder


def test_collect_images_ids_and_errors(image_folder, tmp_path):
    images = collect_images([image_folder])
    assert sorted(images) == ["img0", "img1", "img2", "sub/img3"]
    listing = tmp_path / "list.txt"
    listing.write_text("images/img0.png\n\nimages/sub/img3.jpg\n")
    assert sorted(collect_images([listing])) == ["img0", "img3"]
    with pytest.raises(ValueError, match="would get the id 'img0'"):
        write_test_image(tmp_path / "img0.jpg")
        collect_images([image_folder / "img0.png", tmp_path / "img0.jpg"])
    with pytest.raises(FileNotFoundError, match="missing.png"):
        collect_images([tmp_path / "missing.png"])
    listing.write_text("images/none.png\n")
    with pytest.raises(FileNotFoundError, match="line 1"):
        collect_images([listing])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no image files"):
        collect_images([tmp_path / "empty"])


def test_extract_writes_what_the_extractor_returns_and_resumes(image_folder, tmp_path):
    extractor = tiny_detector().eval()
    images = collect_images([image_folder])
    first = dict(list(images.items())[:2])
    summary = extract_to_store(extractor, first, tmp_path / "store", batch_size=2, shard_size=1, progress=False)
    assert (summary.total, summary.already_stored, summary.extracted) == (2, 0, 2)
    summary = extract_to_store(extractor, images, tmp_path / "store", batch_size=2, shard_size=1, progress=False)
    assert (summary.total, summary.already_stored, summary.extracted) == (4, 2, 2)  # only the missing two
    store = RegionStore(tmp_path / "store")
    assert sorted(store.ids) == sorted(images)
    with torch.inference_mode():
        direct = extractor([str(images["sub/img3"])])[0]
    stored = store["sub/img3"]
    torch.testing.assert_close(stored.features, direct.features, atol=0, rtol=0)
    torch.testing.assert_close(stored.boxes, direct.boxes, atol=0, rtol=0)
    torch.testing.assert_close(stored.class_probs, direct.class_probs, atol=0, rtol=0)
    assert stored.image_size == direct.image_size


def test_bad_images_stop_the_run_or_are_recorded(image_folder, tmp_path):
    (image_folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    images = collect_images([image_folder])
    with pytest.raises(RuntimeError, match="broken.png"):
        extract_to_store(tiny_detector().eval(), images, tmp_path / "a", batch_size=2, progress=False)
    summary = extract_to_store(
        tiny_detector().eval(), images, tmp_path / "b", batch_size=2, skip_errors=True, progress=False
    )
    assert summary.extracted == 4 and [f["image_id"] for f in summary.failed] == ["broken"]
    failures = [json.loads(line) for line in (tmp_path / "b" / "failed.jsonl").read_text().splitlines()]
    assert failures[0]["path"].endswith("broken.png") and failures[0]["error"]
    assert "broken" not in RegionStore(tmp_path / "b")


def test_vlhub_extract_cli(image_folder, tmp_path, capsys):
    from vlhub.cli import main

    tiny_detector().save_pretrained(tmp_path / "detector")
    args = ["extract", str(image_folder), "--extractor", str(tmp_path / "detector"), "--output", str(tmp_path / "s")]
    assert main(args + ["--batch-size", "2", "--feature-dtype", "float16"]) == 0
    assert "4 extracted" in capsys.readouterr().out
    assert main(args + ["--feature-dtype", "float16"]) == 0
    assert "4 already stored, 0 extracted" in capsys.readouterr().out
    assert len(RegionStore(tmp_path / "s")) == 4


@pytest.mark.slow
def test_two_processes_split_the_images_through_accelerate(image_folder, tmp_path):
    """`vlhub.extract` in the two processes of a distributed run (forked from preloaded code as
    `accelerate launch --num_processes 2 -m vlhub.extract` starts them: tests/process_group.py)."""
    import os

    from tests.process_group import run_processes

    tiny_detector().save_pretrained(tmp_path / "detector")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    arguments = [str(image_folder), "--extractor", str(tmp_path / "detector"), "--output", str(tmp_path / "store")]
    for process in run_processes("-m vlhub.extract", arguments, env, cwd=tmp_path):
        assert process.returncode == 0, process.stderr[-3000:]
    store = RegionStore(tmp_path / "store")
    assert sorted(store.ids) == ["img0", "img1", "img2", "sub/img3"]
    # each process wrote its own shard series: the work really was split
    assert {p.name.split("-")[1] for p in store.shard_files} == {"p00000", "p00001"}


@pytest.mark.parametrize("quantize", [False, True])
def test_decode_threads_and_batches_write_the_store_one_at_a_time_extraction_writes(image_folder, tmp_path, quantize):
    # Decoding in threads ahead of the detector, and 3 images per detector call, against the plain way (paths, one
    # image per call): the same shard files, byte for byte.
    images = collect_images([image_folder])
    extractor = tiny_detector(seed=5).eval()
    if quantize:
        extractor.quantize([str(images["img0"])])
    plain = extract_to_store(extractor, images, tmp_path / "plain", batch_size=1, shard_size=2, progress=False)
    threaded = extract_to_store(
        extractor,
        images,
        tmp_path / "threaded",
        batch_size=3,
        shard_size=2,
        progress=False,
        decode=extractor.load_image,
        decode_workers=2,
    )
    assert plain.extracted == threaded.extracted == 4
    plain_store, threaded_store = RegionStore(tmp_path / "plain"), RegionStore(tmp_path / "threaded")
    assert [p.name for p in plain_store.shard_files] == [p.name for p in threaded_store.shard_files]
    for ours, theirs in zip(plain_store.shard_files, threaded_store.shard_files):
        assert ours.read_bytes() == theirs.read_bytes(), ours.name


def test_decode_errors_name_the_file_and_are_skipped(image_folder, tmp_path):
    (image_folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    images = collect_images([image_folder])
    extractor = tiny_detector().eval()
    options = dict(batch_size=2, progress=False, decode=extractor.load_image, decode_workers=2)
    with pytest.raises(RuntimeError, match="broken.png"):
        extract_to_store(extractor, images, tmp_path / "a", **options)
    summary = extract_to_store(extractor, images, tmp_path / "b", skip_errors=True, **options)
    assert summary.extracted == 4 and [f["image_id"] for f in summary.failed] == ["broken"]
    assert "cannot read the image" in summary.failed[0]["error"]
    with pytest.raises(ValueError, match="decode_workers"):
        extract_to_store(extractor, images, tmp_path / "c", decode_workers=-1, progress=False)


def test_vlhub_extract_cli_detector_speed_settings(image_folder, tmp_path, capsys):
    from vlhub.cli import main

    tiny_detector().save_pretrained(tmp_path / "detector")
    args = ["extract", str(image_folder), "--extractor", str(tmp_path / "detector")]
    int8 = args + ["--output", str(tmp_path / "int8"), "--quantize", "int8", "--calibration-images", "2"]
    assert main(int8 + ["--batch-size", "2", "--decode-workers", "1"]) == 0
    assert "4 extracted" in capsys.readouterr().out
    assert main(args + ["--output", str(tmp_path / "fp32"), "--dtype", "float32", "--decode-workers", "0"]) == 0
    assert len(RegionStore(tmp_path / "int8")) == len(RegionStore(tmp_path / "fp32")) == 4
    assert main(int8 + ["--dtype", "bfloat16"]) == 2
    assert "drop --dtype bfloat16" in capsys.readouterr().err
    assert main(int8 + ["--calibration-images", "0"]) == 2
    assert "--calibration-images must be a positive integer (at least 1), got 0" in capsys.readouterr().err


def test_vlhub_extract_records_its_source_and_auto_follows_the_store_or_the_machine(image_folder, tmp_path, capsys):
    from vlhub.cli import main
    from vlhub.processing.region_extractors import region_extractor_fingerprint
    from vlhub.processing.stores import recorded_source
    from vlhub.utils import precision

    tiny_detector().save_pretrained(tmp_path / "detector")
    tiny_detector(seed=1).save_pretrained(tmp_path / "other_detector")
    first_two = [str(image_folder / "img0.png"), str(image_folder / "img1.png")]

    def extract(images, *options, extractor="detector", output="store"):
        arguments = ["extract", *images, "--extractor", str(tmp_path / extractor), "--output", str(tmp_path / output)]
        return main(arguments + ["--decode-workers", "0", *options])

    # auto: bfloat16 where bf16 products are measured fast (stood in for here), recorded with the folder's fingerprint
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(precision, "bf16_is_fast", lambda device: True)
        assert extract(first_two) == 0
    out = capsys.readouterr().out
    assert "the detector runs in bfloat16 (--dtype auto: bf16 products are fast on cpu)" in out
    assert "(detector in bfloat16)" in out
    recorded = recorded_source(tmp_path / "store")
    assert recorded == {
        "region_extractor_type": "bottom_up_attention",
        "extractor": region_extractor_fingerprint(tmp_path / "detector"),
        "dtype": "bfloat16",
        "quantize": None,
        "calibration_images": None,
    }
    # Continued on a machine where bf16 is slow, auto keeps the store's bfloat16 rather than mixing dtypes.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(precision, "bf16_is_fast", lambda device: False)
        assert extract([str(image_folder)]) == 0
        out = capsys.readouterr().out
        assert "bfloat16 (--dtype auto: the dtype the store was written in)" in out
        assert "2 already stored, 2 extracted" in out
        assert extract([str(image_folder)], output="new_store") == 0
    assert recorded_source(tmp_path / "new_store")["dtype"] == "float32"
    assert recorded_source(tmp_path / "store") == recorded and len(RegionStore(tmp_path / "store")) == 4

    # Another dtype, detector or calibration than the store records: refused before any work, naming what differs.
    (tmp_path / "more").mkdir()
    write_test_image(tmp_path / "more" / "img9.png", seed=9)
    more = [str(image_folder), str(tmp_path / "more")]
    assert extract(more, "--dtype", "float32") == 2
    assert "dtype: the store has 'bfloat16', the new features 'float32'" in capsys.readouterr().err
    assert extract(more, extractor="other_detector") == 2
    assert "extractor: the store has 'sha256:" in capsys.readouterr().err
    assert extract(first_two, "--quantize", "int8", "--calibration-images", "1", output="int8") == 0
    capsys.readouterr()
    assert extract(more, "--quantize", "int8", "--calibration-images", "2", output="int8") == 2
    error = capsys.readouterr().err
    assert "calibration_images: the store has ['img0'], the new features ['img0', 'img1']" in error
    assert extract([str(tmp_path / "more")], "--quantize", "int8", output="int8") == 2
    assert "calibrated on the images ['img0'], which are not among the images given" in capsys.readouterr().err
    assert len(RegionStore(tmp_path / "store")) == 4 and len(RegionStore(tmp_path / "int8")) == 2
    # Continued with int8 and no count, it calibrates on the images the store was calibrated on.
    assert extract(more, "--quantize", "int8", output="int8") == 0
    assert "calibrated on 1 image" in capsys.readouterr().out and len(RegionStore(tmp_path / "int8")) == 5


def test_vlhub_store_info_says_what_a_store_holds(image_folder, tmp_path, capsys):
    from vlhub.cli import main
    from vlhub.processing.region_extractors import region_extractor_fingerprint

    tiny_detector().save_pretrained(tmp_path / "detector")
    store = str(tmp_path / "store")
    assert main(["extract", str(image_folder), "--extractor", str(tmp_path / "detector"), "--output", store]) == 0
    capsys.readouterr()
    assert main(["store-info", store]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"region store {store} (format version 2): 4 images in 1 shards, ")
    assert lines[1].startswith("layout: feature_dim=16, feature_dtype=float32, has_scores=True")
    assert lines[2].startswith("source: region_extractor_type=bottom_up_attention, extractor=sha256:")
    assert main(["store-info", store, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["images"], summary["shards"], summary["format_version"]) == (4, 1, 2) and summary["bytes"] > 0
    assert summary["source"]["extractor"] == region_extractor_fingerprint(tmp_path / "detector")
    assert summary["layout"]["feature_dim"] == 16
    assert main(["store-info", str(tmp_path / "detector")]) == 2
    assert "not a vlhub region store" in capsys.readouterr().err
    from vlhub.processing.stores import RegionStoreWriter

    with RegionStoreWriter(tmp_path / "unsourced") as writer:
        writer.add("a", RegionStore(store)["img0"])
    assert main(["store-info", str(tmp_path / "unsourced")]) == 0
    assert "source: not recorded" in capsys.readouterr().out
