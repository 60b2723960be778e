"""The detector converter: both formats, strictness, vocabularies, the safe pickle reader, the CLI."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from vlhub.cli import main
from vlhub.conversion.common import CheckpointError
from vlhub.conversion.detector import convert_detector, detectron2_state_to_vlhub, read_detectron2_pickle
from vlhub.processing.detector import RegionExtractor

from .conftest import fixtures_root
from .helpers import tiny_detector


def _d2_state(extractor: RegionExtractor) -> dict[str, np.ndarray]:
    """A detectron2-named state dict (as in a .pkl's "model") of a vlhub extractor."""
    state = {k: v.numpy().copy() for k, v in extractor.state_dict().items()}
    state["proposal_generator.anchor_generator.cell_anchors.0"] = state.pop("proposal_generator.cell_anchors")
    return state


def _write_pkl(path: Path, state: dict, protocol: int = 3) -> Path:
    with open(path, "wb") as f:
        pickle.dump({"model": state, "__author__": "test"}, f, protocol=protocol)
    return path


class _Exploit:
    def __reduce__(self):
        import os

        return (os.system, ("touch pwned_by_pickle",))


def test_malicious_pickle_is_refused_not_executed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": {"x": _Exploit()}, "__author__": "x"}, f)
    with pytest.raises(CheckpointError, match="refusing to load (posix|os).system"):
        read_detectron2_pickle(path)
    with pytest.raises(CheckpointError, match="refusing"):
        convert_detector(path, tmp_path / "out")
    assert not (tmp_path / "pwned_by_pickle").exists()


@pytest.mark.parametrize("protocol", [2, 3, 4])
def test_pickle_round_trip_and_anchor_generation(tmp_path, protocol):
    extractor = tiny_detector(seed=2)
    state = _d2_state(extractor)
    path = _write_pkl(tmp_path / "model.pkl", state, protocol)
    read = read_detectron2_pickle(path)
    assert sorted(read) == sorted(state) and all(np.array_equal(read[k], state[k]) for k in state)
    converted = detectron2_state_to_vlhub(read, extractor.config)
    assert set(converted) == set(extractor.state_dict())
    del read["proposal_generator.anchor_generator.cell_anchors.0"]  # e.g. a Caffe-derived dict
    generated = detectron2_state_to_vlhub(read, extractor.config.to_dict())
    assert generated["proposal_generator.cell_anchors"].tolist()[0] == [-38.0, -16.0, 53.0, 31.0]


def test_state_map_is_strict():
    extractor = tiny_detector()
    state = _d2_state(extractor)
    config = extractor.config
    with pytest.raises(CheckpointError, match="unexpected key 'roi_heads.extra.weight'"):
        detectron2_state_to_vlhub({**state, "roi_heads.extra.weight": np.zeros(3, np.float32)}, config)
    missing = dict(state)
    del missing["roi_heads.box_predictor.cls_score.bias"]
    with pytest.raises(CheckpointError, match="missing from the checkpoint.*cls_score.bias"):
        detectron2_state_to_vlhub(missing, config)
    wrong = {**state, "roi_heads.box_predictor.cls_score.bias": np.zeros(9, np.float32)}
    with pytest.raises(CheckpointError, match=r"cls_score.bias' has shape \(9,\)"):
        detectron2_state_to_vlhub(wrong, config)
    # num_batches_tracked (nn.BatchNorm2d checkpoints) is dropped with a reason
    counted = {**state, "backbone.stem.conv1.norm.num_batches_tracked": np.array(0)}
    assert "backbone.stem.conv1.norm.num_batches_tracked" not in detectron2_state_to_vlhub(counted, config)


def test_config_inferred_from_weights_without_yaml(tmp_path):
    extractor = tiny_detector(seed=4)
    path = _write_pkl(tmp_path / "model.pkl", _d2_state(extractor))
    (tmp_path / "objects_vocab.txt").write_text("cat,kitty\ndog\nbird\ntable\nsky\n")
    report = convert_detector(path, tmp_path / "out")
    loaded = RegionExtractor.from_pretrained(tmp_path / "out")
    for key in (
        "depth",
        "width_per_group",
        "stem_out_channels",
        "res2_out_channels",
        "rpn_hidden_channels",
        "num_classes",
        "num_attributes",
        "attribute_embedding_dim",
        "attribute_hidden_dim",
    ):
        assert getattr(loaded.config, key) == getattr(extractor.config, key), key
    assert loaded.object_names == ["cat", "dog", "bird", "table", "sky"]  # first synonym of each line
    assert loaded.attribute_names == ["attribute_0", "attribute_1", "attribute_2"]
    assert any("placeholder" in note for note in report.notes)
    for name, tensor in extractor.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert (tmp_path / "out" / "conversion_report.json").is_file()
    assert (tmp_path / "out" / "README.md").is_file()


def test_wrong_files_give_clear_errors(tmp_path):
    text = tmp_path / "notes.pkl"
    text.write_text("hello")
    with pytest.raises(CheckpointError, match="is not a detectron2 weight pickle|cannot read"):
        convert_detector(text, tmp_path / "out")
    torch.save({"bert.embeddings.word_embeddings.weight": torch.zeros(3, 2)}, tmp_path / "uniter.pt")
    with pytest.raises(CheckpointError, match="not a bottom-up-attention detector checkpoint"):
        convert_detector(tmp_path / "uniter.pt", tmp_path / "out")
    with pytest.raises(CheckpointError, match="cannot tell the format"):
        convert_detector(text.rename(tmp_path / "weights.dat"), tmp_path / "out")
    with open(tmp_path / "list.pkl", "wb") as f:
        pickle.dump([1, 2, 3], f)
    with pytest.raises(CheckpointError, match="expected a dict with a 'model' dict"):
        convert_detector(tmp_path / "list.pkl", tmp_path / "out")
    with pytest.raises(CheckpointError, match="not a torch.save zip"):
        convert_detector(tmp_path / "list.pkl", tmp_path / "out", format="frcnn")
    with pytest.raises(CheckpointError, match="does not exist"):
        convert_detector(tmp_path / "absent.bin", tmp_path / "out")


def test_yaml_that_disagrees_with_weights_or_is_unsupported(tmp_path):
    source = fixtures_root() / "detector_d2"
    if not source.is_dir():
        pytest.skip("no detector_d2 fixture")
    shutil.copy(source / "original" / "faster_rcnn_from_caffe_attr.pkl", tmp_path / "w.pkl")
    yaml_text = (source / "original" / "config.yaml").read_text()
    (tmp_path / "classes.yaml").write_text(yaml_text.replace("NUM_CLASSES: 20", "NUM_CLASSES: 30"))
    with pytest.raises(CheckpointError, match="num_classes=30 but the weights have num_classes=20"):
        convert_detector(tmp_path / "w.pkl", tmp_path / "out", config=tmp_path / "classes.yaml")
    (tmp_path / "align.yaml").write_text(yaml_text.replace('POOLER_TYPE: "ROIPool"', 'POOLER_TYPE: "ROIAlignV2"'))
    with pytest.raises(ValueError, match="ROIPool only"):
        convert_detector(tmp_path / "w.pkl", tmp_path / "out", config=tmp_path / "align.yaml")


def test_cli_converts_a_detector(tmp_path, capsys):
    extractor = tiny_detector(seed=5)
    path = _write_pkl(tmp_path / "model.pkl", _d2_state(extractor))
    assert (
        main(["convert", "detector", str(path), "--output-dir", str(tmp_path / "out"), "--format", "detectron2"]) == 0
    )
    assert "tensors converted" in capsys.readouterr().out
    assert RegionExtractor.from_pretrained(tmp_path / "out").config.num_classes == extractor.config.num_classes
    assert main(["convert", "detector", str(tmp_path / "nothing.pkl"), "--output-dir", str(tmp_path / "x")]) == 2
    assert "does not exist" in capsys.readouterr().err
