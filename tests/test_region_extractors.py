"""Region extractors by registry: `region_extractor_type` in config.json picks the class, for the processor's
`from_pretrained` and for `vlhub extract` alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoProcessor

import vlhub
from vlhub.processing import region_extractors
from vlhub.processing.region_extractors import (
    REGION_EXTRACTOR_FOLDER,
    load_region_extractor,
    register_region_extractor,
    registered_region_extractor_types,
)

from .helpers import tiny_detector, tiny_processor

TOY_TYPE = "toy_grid"


class ToyRegionExtractor:
    """A region extractor of another kind: a fixed 2×2 grid of boxes, features filled with the image's mean."""

    def __init__(self, feature_dim: int = 16, scale: float = 1.0):
        self.feature_dim, self.scale = feature_dim, scale

    def __call__(self, images):
        single = not isinstance(images, list)
        results = []
        for image in [images] if single else images:
            height, width = image.shape[-2:]
            boxes = torch.tensor(
                [
                    [0, 0, width / 2, height / 2],
                    [width / 2, 0, width, height / 2],
                    [0, height / 2, width / 2, height],
                    [width / 2, height / 2, width, height],
                ]
            )
            features = torch.full((4, self.feature_dim), float(image.mean()) * self.scale)
            results.append(vlhub.RegionFeatures(features, boxes, (height, width), scores=torch.ones(4)))
        return results[0] if single else results

    def save_pretrained(self, directory):
        Path(directory).mkdir(parents=True, exist_ok=True)
        settings = {"region_extractor_type": TOY_TYPE, "feature_dim": self.feature_dim, "scale": self.scale}
        (Path(directory) / "config.json").write_text(json.dumps(settings))

    @classmethod
    def from_pretrained(cls, directory):
        settings = json.loads((Path(directory) / "config.json").read_text())
        assert settings.pop("region_extractor_type") == TOY_TYPE
        return cls(**settings)


@pytest.fixture
def registry(monkeypatch):
    """Registrations made in a test are undone after it."""
    monkeypatch.setattr(region_extractors, "_REGISTRY", dict(region_extractors._REGISTRY))
    monkeypatch.setattr(region_extractors, "_RESOLVED", dict(region_extractors._RESOLVED))


def _save_processor(folder, config, vocab, extractor=None):
    processor = tiny_processor(vocab, config)
    processor.region_extractor = extractor
    processor.save_pretrained(folder)
    config.save_pretrained(folder)
    return processor


def test_a_registered_extractor_round_trips_through_the_processor(registry, tmp_path, tiny_uniter_config, tiny_vocab):
    register_region_extractor(TOY_TYPE, f"{__name__}:ToyRegionExtractor")  # lazy: imported when loaded
    assert TOY_TYPE in registered_region_extractor_types()
    processor = _save_processor(tmp_path, tiny_uniter_config, tiny_vocab, ToyRegionExtractor(scale=2.0))
    saved = json.loads((tmp_path / "processor_config.json").read_text())["feature_extractor"]
    assert saved["region_extractor_folder"] == REGION_EXTRACTOR_FOLDER and "region_extractor" not in saved

    loaded = AutoProcessor.from_pretrained(tmp_path)
    assert isinstance(loaded, vlhub.UniterProcessor)
    assert isinstance(loaded.region_extractor, ToyRegionExtractor) and loaded.region_extractor.scale == 2.0
    image = torch.rand(3, 20, 30, generator=torch.Generator().manual_seed(0))
    a = processor(text="a red cat", images=[image])
    b = loaded(text="a red cat", images=[image])
    assert a["region_features"].shape == (1, 4, 16)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    # `vlhub extract`'s loader reads the same folder (the processor folder or its region_extractor/ directly)
    assert isinstance(load_region_extractor(tmp_path), ToyRegionExtractor)
    assert load_region_extractor(tmp_path / REGION_EXTRACTOR_FOLDER).scale == 2.0


def test_unknown_type_is_a_clear_error(tmp_path, tiny_uniter_config, tiny_vocab):
    folder = tmp_path / "mystery"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"region_extractor_type": "mystery_detector"}))
    with pytest.raises(ValueError, match="unknown region_extractor_type 'mystery_detector'.*bottom_up_attention"):
        load_region_extractor(folder)
    # … also when a processor carries it
    _save_processor(tmp_path / "proc", tiny_uniter_config, tiny_vocab, ToyRegionExtractor())
    (tmp_path / "proc" / REGION_EXTRACTOR_FOLDER / "config.json").write_text(
        json.dumps({"region_extractor_type": "mystery_detector"})
    )
    with pytest.raises(ValueError, match="unknown region_extractor_type 'mystery_detector'"):
        AutoProcessor.from_pretrained(tmp_path / "proc")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_region_extractor(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no region extractor folder"):
        load_region_extractor(tmp_path / "nothing")


def test_registration_rules(registry):
    register_region_extractor(TOY_TYPE, ToyRegionExtractor)
    register_region_extractor(TOY_TYPE, ToyRegionExtractor)  # the same class again is fine
    with pytest.raises(ValueError, match="already registered"):
        register_region_extractor(TOY_TYPE, "somewhere.else:Extractor")
    register_region_extractor(TOY_TYPE, f"{__name__}:ToyRegionExtractor")  # the same class, lazily, is fine too
    register_region_extractor(TOY_TYPE, "somewhere.else:Extractor", exist_ok=True)
    with pytest.raises(ValueError, match="module:Class"):
        register_region_extractor("other", "no_colon_here")
    with pytest.raises(TypeError, match="class"):
        register_region_extractor("other", ToyRegionExtractor())


def test_detector_folders_with_and_without_the_type_field(tmp_path):
    from vlhub.processing.detector import RegionExtractor

    detector = tiny_detector()
    detector.save_pretrained(tmp_path / "new")
    config = json.loads((tmp_path / "new" / "config.json").read_text())
    assert config["region_extractor_type"] == "bottom_up_attention"
    assert isinstance(load_region_extractor(tmp_path / "new"), RegionExtractor)
    # folders written before the field existed are the detector's
    (tmp_path / "new" / "config.json").write_text(
        json.dumps({k: v for k, v in config.items() if k != "region_extractor_type"})
    )
    old = load_region_extractor(tmp_path / "new")
    for name, tensor in detector.state_dict().items():
        assert torch.equal(old.state_dict()[name], tensor), name


def test_processor_saved_with_the_old_setting_name_loads(registry, tmp_path, tiny_uniter_config, tiny_vocab):
    register_region_extractor(TOY_TYPE, ToyRegionExtractor)
    _save_processor(tmp_path, tiny_uniter_config, tiny_vocab, ToyRegionExtractor(scale=3.0))
    path = tmp_path / "processor_config.json"
    saved = json.loads(path.read_text())
    saved["feature_extractor"]["region_extractor"] = saved["feature_extractor"].pop("region_extractor_folder")
    path.write_text(json.dumps(saved))  # as processors were saved before the rename
    loaded = AutoProcessor.from_pretrained(tmp_path)
    assert loaded.feature_extractor.region_extractor_folder == REGION_EXTRACTOR_FOLDER
    assert not hasattr(loaded.feature_extractor, "region_extractor")
    assert loaded.region_extractor.scale == 3.0


def test_shapes_world_extractor_registers_itself(tmp_path):
    from vlhub.data import ShapesFeatureExtractor, ShapesRegionExtractor

    assert ShapesFeatureExtractor is ShapesRegionExtractor
    ShapesRegionExtractor(feature_dim=8).save_pretrained(tmp_path)
    assert "shapes" in registered_region_extractor_types()
    loaded = load_region_extractor(tmp_path)
    assert isinstance(loaded, ShapesRegionExtractor) and loaded.feature_dim == 8


def test_a_folder_of_another_type_is_refused_by_each_class_naming_both_types(tmp_path):
    from vlhub.data.shapes_features import ShapesRegionExtractor
    from vlhub.processing.detector import RegionExtractor
    from vlhub.processing.region_extractors import read_region_extractor_config

    ShapesRegionExtractor(feature_dim=8).save_pretrained(tmp_path / "shapes")
    kind, settings = read_region_extractor_config(tmp_path / "shapes")
    assert kind == "shapes" and settings["feature_dim"] == 8 and "region_extractor_type" not in settings
    with pytest.raises(ValueError, match="describes a region extractor of type 'shapes', not 'bottom_up_attention'"):
        RegionExtractor.from_pretrained(tmp_path / "shapes")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.json").write_text(json.dumps({"max_boxes": 36}))  # no type: a detector folder
    with pytest.raises(ValueError, match="type 'bottom_up_attention', not 'shapes'"):
        ShapesRegionExtractor.from_pretrained(tmp_path / "old")
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        ShapesRegionExtractor.from_pretrained(tmp_path)


def test_the_fingerprint_follows_what_a_folder_extracts_with(tmp_path):
    import shutil

    from vlhub.processing.region_extractors import region_extractor_fingerprint, resolve_region_extractor_folder

    tiny_detector(seed=0).save_pretrained(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    (tmp_path / "copy" / "README.md").write_text("a model card does not change the features")
    (tmp_path / "copy" / ".gitattributes").write_text("*.safetensors filter=lfs")
    fingerprint = region_extractor_fingerprint(tmp_path / "a")
    assert fingerprint.startswith("sha256:") and region_extractor_fingerprint(tmp_path / "copy") == fingerprint
    tiny_detector(seed=1).save_pretrained(tmp_path / "other_weights")
    assert region_extractor_fingerprint(tmp_path / "other_weights") != fingerprint
    settings = json.loads((tmp_path / "copy" / "config.json").read_text())
    (tmp_path / "copy" / "config.json").write_text(json.dumps({**settings, "max_boxes": 7}))
    assert region_extractor_fingerprint(tmp_path / "copy") != fingerprint
    shutil.copytree(tmp_path / "a", tmp_path / "nested")
    (tmp_path / "nested" / "vocab").mkdir()
    (tmp_path / "nested" / "vocab" / "extra.txt").write_text("files in sub-folders count too")
    assert region_extractor_fingerprint(tmp_path / "nested") != fingerprint
    # a processor folder's extractor is the one in its region_extractor/ sub-folder, as load_region_extractor reads it
    shutil.copytree(tmp_path / "a", tmp_path / "processor" / REGION_EXTRACTOR_FOLDER)
    assert resolve_region_extractor_folder(tmp_path / "processor") == tmp_path / "processor" / REGION_EXTRACTOR_FOLDER
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no files"):
        region_extractor_fingerprint(tmp_path / "empty")
