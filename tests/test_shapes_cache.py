"""The shapes world's cache (vlhub.training.data): its key is computed without drawing a scene yet changes with
everything the world, its texts and its region features are made from; a saved world reads back exactly; one process
draws and the others wait for it and read."""

from __future__ import annotations

import shutil
import threading

import numpy as np
import pytest
import torch

import vlhub.data
import vlhub.processing.stores.shards as shards
import vlhub.training.data as training_data
from vlhub.data import ShapesRegionExtractor, ShapesWorld
from vlhub.training.data import cached_shapes_world, shapes_region_store, shapes_store_key

SMALL = dict(seed=3, num_train=12, num_validation=3, num_test=2, image_size=48)


def test_the_key_is_computed_without_drawing_the_world():
    world = ShapesWorld(seed=0)  # the default world: drawing it takes seconds
    assert shapes_store_key(world) == shapes_store_key(ShapesWorld(seed=0))
    assert "_examples" not in world.__dict__


@pytest.mark.parametrize(
    "setting, value",
    [
        ("seed", 4),
        ("num_train", 13),
        ("num_validation", 4),
        ("num_test", 3),
        ("image_size", 64),
        ("min_objects", 2),
        ("max_objects", 3),
        ("captions_per_image", 4),
        ("questions_per_image", 5),
    ],
)
def test_the_key_follows_every_setting_of_the_world(setting, value):
    assert shapes_store_key(ShapesWorld(**{**SMALL, setting: value})) != shapes_store_key(ShapesWorld(**SMALL))


def test_the_key_follows_the_shapes_sources_byte_for_byte(tmp_path, monkeypatch):
    key = shapes_store_key(ShapesWorld(**SMALL))
    copy = tmp_path / "data"
    shutil.copytree(training_data._SHAPES_SOURCES, copy)
    monkeypatch.setattr(training_data, "_SHAPES_SOURCES", copy)
    assert shapes_store_key(ShapesWorld(**SMALL)) == key  # the contents count, not where they are
    sources = sorted(copy.glob("shapes*.py"))
    assert {p.name for p in sources} >= {"shapes.py", "shapes_scene.py", "shapes_language.py", "shapes_features.py"}
    for source in sources:
        original = source.read_text()
        source.write_text(original.replace("\n", "\n\n", 1))  # one byte more in one file
        assert shapes_store_key(ShapesWorld(**SMALL)) != key, source.name
        source.write_text(original)
    (copy / "shapes_new_part.py").write_text("")  # a new file the world may import
    assert shapes_store_key(ShapesWorld(**SMALL)) != key


def test_the_key_follows_the_libraries_the_extractor_and_the_store_format(monkeypatch):
    key = shapes_store_key(ShapesWorld(**SMALL))
    changes = [
        (np, "__version__", "0.0.1"),
        (torch, "__version__", "0.0.1"),
        (shards, "STORE_VERSION", shards.STORE_VERSION + 1),
    ]
    for module, name, value in changes:
        with monkeypatch.context() as patch:
            patch.setattr(module, name, value)
            assert shapes_store_key(ShapesWorld(**SMALL)) != key, name

    class OtherExtractor(ShapesRegionExtractor):
        def __init__(self, **kwargs):
            super().__init__(**{"projection_seed": 12345, **kwargs})

    monkeypatch.setattr(vlhub.data, "ShapesRegionExtractor", OtherExtractor)
    assert shapes_store_key(ShapesWorld(**SMALL)) != key


def _assert_same_world(loaded: ShapesWorld, drawn: ShapesWorld):
    assert loaded.settings == drawn.settings
    for split in vlhub.data.SPLITS:
        pairs = list(zip(loaded._examples[split], drawn._examples[split], strict=True))
        for got, want in pairs:
            assert got.image_id == want.image_id
            assert got.scene.image.dtype == want.scene.image.dtype
            assert np.array_equal(got.scene.image, want.scene.image), got.image_id
            assert got.scene.objects == want.scene.objects
            assert got.captions == want.captions and got.questions == want.questions
        for kind in ("captions", "vqa", "multiple_choice"):
            assert getattr(loaded, kind)()[split].to_list() == getattr(drawn, kind)()[split].to_list(), kind


def test_a_saved_world_reads_back_exactly(tmp_path):
    drawn = ShapesWorld(**SMALL)
    drawn.save(tmp_path / "world.safetensors")
    assert [p.name for p in tmp_path.iterdir()] == ["world.safetensors"]  # no temporary file left
    _assert_same_world(ShapesWorld.load(tmp_path / "world.safetensors"), drawn)


def test_loading_refuses_what_save_did_not_write(tmp_path):
    from safetensors.numpy import save_file

    save_file({"images": np.zeros((1, 2, 2, 3), np.uint8)}, tmp_path / "other.safetensors")
    with pytest.raises(ValueError, match="is not a shapes world written by ShapesWorld.save"):
        ShapesWorld.load(tmp_path / "other.safetensors")
    world = ShapesWorld(**SMALL)
    world.save(tmp_path / "world.safetensors")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "world.safetensors"), framework="np") as handle:
        metadata, images = handle.metadata(), handle.get_tensor("images")
    save_file({"images": images[:-1]}, tmp_path / "short.safetensors", metadata=metadata)
    with pytest.raises(ValueError, match="holds 17 examples and images of shape \\(16, 48, 48, 3\\)"):
        ShapesWorld.load(tmp_path / "short.safetensors")


def test_the_cache_draws_a_world_once_and_then_reads_it(tmp_path, monkeypatch):
    drawn = ShapesWorld(**SMALL)
    assert cached_shapes_world(drawn, tmp_path) is drawn
    name = f"shapes-seed3-{shapes_store_key(drawn)}"
    assert (tmp_path / f"{name}.world.safetensors").is_file()

    def no_drawing(*args):
        raise AssertionError("the cached world was drawn again")

    monkeypatch.setattr(ShapesWorld, "_example", no_drawing)
    _assert_same_world(cached_shapes_world(ShapesWorld(**SMALL), tmp_path), drawn)


def test_a_process_waits_for_the_one_drawing_the_world(tmp_path):
    from filelock import FileLock

    world = ShapesWorld(**SMALL)
    name = f"shapes-seed3-{shapes_store_key(world)}"
    results = []
    with FileLock(tmp_path / f"{name}.lock"):  # another process drawing it
        waiting = threading.Thread(target=lambda: results.append(cached_shapes_world(ShapesWorld(**SMALL), tmp_path)))
        waiting.start()
        waiting.join(timeout=1.0)
        assert waiting.is_alive() and not results and not (tmp_path / f"{name}.world.safetensors").exists()
        world.save(tmp_path / f"{name}.world.safetensors")
    waiting.join()
    _assert_same_world(results[0], world)
    assert "_examples" in results[0].__dict__ and results[0] is not world


def test_the_region_store_is_written_once_then_reused(tmp_path, monkeypatch):
    world = ShapesWorld(**SMALL)
    store = shapes_region_store(world, tmp_path / "regions")
    assert sorted(store) == sorted(e.image_id for split in vlhub.data.SPLITS for e in world._examples[split])

    def no_writing(*args, **kwargs):
        raise AssertionError("the finished store was written again")

    monkeypatch.setattr(ShapesWorld, "write_region_store", no_writing)
    again = shapes_region_store(world, tmp_path / "regions")
    first = next(iter(store))
    assert torch.equal(again[first].features, store[first].features)
