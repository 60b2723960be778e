"""Caffe `.caffemodel` reader and Caffe → detectron2 converter, on caffemodels written by an encoder of this file.

The encoder below is independent of `vlhub.conversion.caffemodel` (it writes the wire format from caffe.proto's field
numbers); expected values are either the detectron2 fixture pickle (made by detectron2 itself) or written out by hand.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from vlhub.conversion.caffemodel import (
    CaffemodelError,
    caffe_cell_anchors,
    caffe_to_detectron2,
    detectron2_cell_anchors,
    read_caffemodel,
)
from vlhub.conversion.common import CheckpointError
from vlhub.conversion.detector import read_detectron2_pickle

from .conftest import fixtures_root

D2_PICKLE = fixtures_root() / "detector_d2" / "original" / "faster_rcnn_from_caffe_attr.pkl"
FIXTURE_STAGE_BLOCKS = (3, 4, 6, 3)  # the fixture's tiny ResNet-50-deep tree


# ---- a small protobuf encoder (caffe.proto field numbers) -------------------------------------------------------


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def tag(field: int, wire: int) -> bytes:
    return varint(field << 3 | wire)


def length_delimited(field: int, payload: bytes) -> bytes:
    return tag(field, 2) + varint(len(payload)) + payload


def varint_field(field: int, value: int) -> bytes:
    return tag(field, 0) + varint(value)


def encode_blob(array, *, legacy: bool = False, double: bool = False, packed: bool = True, diff: bool = False) -> bytes:
    array = np.asarray(array)
    if legacy:  # num, channels, height, width = 1..4
        dims = (1,) * (4 - array.ndim) + array.shape
        out = b"".join(varint_field(number, d) for number, d in zip((1, 2, 3, 4), dims))
    else:  # shape = 7: BlobShape { dim = 1 (packed int64) }
        out = length_delimited(7, length_delimited(1, b"".join(varint(d) for d in array.shape)))
    flat = array.reshape(-1)
    if double:  # double_data = 8
        out += length_delimited(8, flat.astype("<f8").tobytes())
    elif packed:  # data = 5
        out += length_delimited(5, flat.astype("<f4").tobytes())
    else:
        out += b"".join(tag(5, 5) + struct.pack("<f", v) for v in flat)
    if diff:  # diff = 6: gradients the reader must skip
        out += length_delimited(6, np.full(flat.size, 7.0, "<f4").tobytes())
    return out


def encode_layer(name: str, blobs: list[bytes], *, layer_type: str = "", legacy: bool = False) -> bytes:
    if legacy:  # V1LayerParameter: name = 4, type = 5 (enum), blobs = 6
        return length_delimited(4, name.encode()) + varint_field(5, 4) + b"".join(length_delimited(6, b) for b in blobs)
    # LayerParameter: name = 1, type = 2, param = 6 (a ParamSpec, skipped), blobs = 7, phase = 10 (skipped)
    out = length_delimited(1, name.encode()) + length_delimited(2, layer_type.encode())
    out += length_delimited(6, varint_field(3, 1)) + varint_field(10, 1)
    return out + b"".join(length_delimited(7, b) for b in blobs)


def encode_net(layers: list[bytes], legacy_layers: list[bytes] = ()) -> bytes:
    """NetParameter: name = 1, input = 3 (skipped), layers = 2 (V1), layer = 100."""
    out = length_delimited(1, b"test-net") + length_delimited(3, b"data")
    out += b"".join(length_delimited(2, layer) for layer in legacy_layers)
    return out + b"".join(length_delimited(100, layer) for layer in layers)


def write_caffemodel(path, layers: dict[str, list[np.ndarray]], double: frozenset[str] = frozenset()):
    encoded = [
        encode_layer(name, [encode_blob(b, double=name in double) for b in blobs]) for name, blobs in layers.items()
    ]
    path.write_bytes(encode_net(encoded))
    return path


# ---- the detectron2 fixture pickle, read without executing code --------------------------------------------------


@pytest.fixture(scope="module")
def d2_state() -> dict[str, np.ndarray]:
    if not D2_PICKLE.is_file():
        pytest.skip("no detector_d2 fixture")
    return read_detectron2_pickle(D2_PICKLE)


# ---- the documented conventions, inverted: detectron2 fixture → Caffe layers ---------------------------------------


def butd_block_name(block: int, count: int) -> str:
    """BUTD's ResNet-101 prototxt: 'a, b, c' in stages of 3 blocks, 'a, b1, b2, ...' in longer ones."""
    return "a" if block == 0 else (f"b{block}" if count > 3 else "abc"[block])


def caffe_layers_from_d2(state: dict[str, np.ndarray], stage_blocks) -> dict[str, list[np.ndarray]]:
    layers: dict[str, list[np.ndarray]] = {}

    def unit(prefix: str, conv: str, bn: str, scale: str):
        norm = {k: state[f"{prefix}.norm.{k}"] for k in ("weight", "bias", "running_mean", "running_var")}
        layers[conv] = [state[f"{prefix}.weight"]]
        layers[bn] = [norm["running_mean"], norm["running_var"], np.ones(1, np.float32)]  # factor 1: exact
        layers[scale] = [norm["weight"], norm["bias"]]

    unit("backbone.stem.conv1", "conv1", "bn_conv1", "scale_conv1")
    branches = {"shortcut": "1", "conv1": "2a", "conv2": "2b", "conv3": "2c"}
    for stage, count in zip((2, 3, 4, 5), stage_blocks):
        root = "roi_heads.res5" if stage == 5 else f"backbone.res{stage}"
        for block in range(count):
            suffix = butd_block_name(block, count)
            for d2_name, branch in branches.items():
                if f"{root}.{block}.{d2_name}.weight" in state:
                    tail = f"{stage}{suffix}_branch{branch}"
                    unit(f"{root}.{block}.{d2_name}", f"res{tail}", f"bn{tail}", f"scale{tail}")

    rpn = "proposal_generator.rpn_head"
    layers["rpn_conv/3x3"] = [state[f"{rpn}.conv.weight"], state[f"{rpn}.conv.bias"]]
    # Caffe anchor c = (ratio r, scale s), c = 4r + s; the detectron2 anchor of the same shape is d = 3s + r.
    d2_of_caffe = [3 * (c % 4) + c // 4 for c in range(12)]
    fg_weight = state[f"{rpn}.objectness_logits.weight"][d2_of_caffe]
    fg_bias = state[f"{rpn}.objectness_logits.bias"][d2_of_caffe]
    layers["rpn_cls_score"] = [
        np.concatenate([np.zeros_like(fg_weight), fg_weight]),
        np.concatenate([np.zeros_like(fg_bias), fg_bias]),
    ]  # bg logits 0: fg − bg = logit
    delta_rows = [4 * d + k for d in d2_of_caffe for k in range(4)]
    layers["rpn_bbox_pred"] = [
        state[f"{rpn}.anchor_deltas.weight"][delta_rows],
        state[f"{rpn}.anchor_deltas.bias"][delta_rows],
    ]

    def bg_first(rows):
        return np.concatenate([rows[-1:], rows[:-1]])

    head = "roi_heads.box_predictor"
    layers["cls_score"] = [bg_first(state[f"{head}.cls_score.weight"]), bg_first(state[f"{head}.cls_score.bias"])]
    weights = np.tile([10.0, 10.0, 5.0, 5.0], len(state[f"{head}.cls_score.bias"]) - 1)
    rng = np.random.default_rng(0)
    box_weight = state[f"{head}.bbox_pred.weight"].astype(np.float64) / weights[:, None]
    box_bias = state[f"{head}.bbox_pred.bias"].astype(np.float64) / weights
    layers["bbox_pred"] = [
        np.concatenate([rng.normal(size=(4, box_weight.shape[1])), box_weight]),
        np.concatenate([rng.normal(size=4), box_bias]),
    ]  # background rows: never used
    layers["cls_embedding"] = [bg_first(state[f"{head}.cls_embedding.weight"])]
    layers["fc_attr"] = [state[f"{head}.fc_attr.weight"], state[f"{head}.fc_attr.bias"]]
    layers["attr_score"] = [bg_first(state[f"{head}.attr_score.weight"]), bg_first(state[f"{head}.attr_score.bias"])]
    return layers


@pytest.fixture(scope="module")
def fixture_caffemodel(d2_state, tmp_path_factory):
    layers = caffe_layers_from_d2(d2_state, FIXTURE_STAGE_BLOCKS)
    # bbox_pred / (10, 10, 5, 5) is not exact in float32: stored as double_data so that × back is.
    path = write_caffemodel(tmp_path_factory.mktemp("caffe") / "fixture.caffemodel", layers, frozenset({"bbox_pred"}))
    return path, layers


# ---- (1) the decoder --------------------------------------------------------------------------------------------


def test_decoder_reads_new_and_legacy_blobs_packed_unpacked_and_double(tmp_path):
    weight = np.arange(8, dtype=np.float32).reshape(2, 1, 2, 2) - 3.5
    bias = np.array([0.5, -1.25], np.float32)
    doubles = np.array([1 / 3, -2 / 7, 1e-300])
    legacy = np.array([[1.5, 2.5, 3.5], [4.5, 5.5, 6.5]], np.float32)
    unpacked_shape = length_delimited(7, b"".join(varint_field(1, d) for d in (2, 2)))  # BlobShape dims unpacked
    split_data = (
        length_delimited(5, np.array([1, 2], "<f4").tobytes())
        + tag(5, 5)
        + struct.pack("<f", 3)
        + tag(5, 5)
        + struct.pack("<f", 4)
    )  # one repeated field written packed then unpacked: values concatenate
    net = encode_net(
        [
            encode_layer(
                "conv", [encode_blob(weight, diff=True), encode_blob(bias, packed=False)], layer_type="Convolution"
            ),
            encode_layer("relu", [], layer_type="ReLU"),
            encode_layer("double", [encode_blob(doubles, double=True)]),
            encode_layer("split", [unpacked_shape + split_data]),
        ],
        legacy_layers=[encode_layer("old_fc", [encode_blob(legacy, legacy=True)], legacy=True)],
    )
    layers = read_caffemodel(write_bytes(tmp_path / "tiny.caffemodel", net))

    assert list(layers) == ["old_fc", "conv", "double", "split"]  # file order, layers without blobs left out
    assert layers["old_fc"][0].shape == (1, 1, 2, 3)  # legacy (num, channels, height, width) kept
    np.testing.assert_array_equal(layers["old_fc"][0].reshape(2, 3), legacy)
    assert len(layers["conv"]) == 2 and layers["conv"][0].dtype == np.float32
    np.testing.assert_array_equal(layers["conv"][0], weight)
    np.testing.assert_array_equal(layers["conv"][1], bias)
    assert layers["double"][0].dtype == np.float64
    np.testing.assert_array_equal(layers["double"][0], doubles)
    np.testing.assert_array_equal(layers["split"][0], [[1, 2], [3, 4]])


def write_bytes(path, data: bytes):
    path.write_bytes(data)
    return path


# ---- (2) conversion: round trip through the fixture and each convention by hand -------------------------------------


def test_round_trip_gives_exactly_the_detectron2_pickle(d2_state, fixture_caffemodel):
    path, caffe_layers = fixture_caffemodel
    state, report = caffe_to_detectron2(path, stage_blocks=FIXTURE_STAGE_BLOCKS, anchors="detectron2")
    assert list(state) == list(d2_state)  # same names, in detectron2's state_dict order
    for name, expected in d2_state.items():
        assert state[name].dtype == np.float32 and state[name].shape == expected.shape, name
        np.testing.assert_array_equal(state[name], expected, err_msg=name)
    assert set(report.used.values()) == set(caffe_layers) and not report.dropped
    assert list(report.initialized) == ["proposal_generator.anchor_generator.cell_anchors.0"]
    assert report.used["backbone.res4.5.conv2.norm.running_var"] == "bn4b5_branch2b"


def test_stage_blocks_can_be_read_from_the_file(d2_state, fixture_caffemodel):
    state, _ = caffe_to_detectron2(fixture_caffemodel[0], stage_blocks=None, anchors="detectron2")
    assert list(state) == list(d2_state)


def test_caffe_anchor_mode_keeps_caffe_channel_order(d2_state, fixture_caffemodel):
    path, caffe_layers = fixture_caffemodel
    state, _ = caffe_to_detectron2(path, stage_blocks=FIXTURE_STAGE_BLOCKS)  # anchors="caffe"
    fg = caffe_layers["rpn_cls_score"][1][12:]
    np.testing.assert_array_equal(state["proposal_generator.rpn_head.objectness_logits.bias"], fg)
    deltas = state["proposal_generator.rpn_head.anchor_deltas.bias"]
    np.testing.assert_array_equal(deltas, caffe_layers["rpn_bbox_pred"][1])
    np.testing.assert_array_equal(state["proposal_generator.anchor_generator.cell_anchors.0"], caffe_cell_anchors())
    assert {k for k in state if not np.array_equal(state[k], d2_state[k])} == {
        "proposal_generator.anchor_generator.cell_anchors.0",
        "proposal_generator.rpn_head.objectness_logits.weight",
        "proposal_generator.rpn_head.objectness_logits.bias",
        "proposal_generator.rpn_head.anchor_deltas.weight",
        "proposal_generator.rpn_head.anchor_deltas.bias",
    }


def tiny_caffe_net() -> dict[str, list[np.ndarray]]:
    """One block per stage, 2 channels, 2 classes + background, 2 attributes + 'none'; values chosen by hand."""
    ones, zeros = np.ones(2, np.float32), np.zeros(2, np.float32)
    layers = {}

    def unit(conv, bn, scale, bn_blobs=None, scale_blobs=None, in_channels=2):
        layers[conv] = [np.full((2, in_channels, 1, 1), 0.5, np.float32)]
        layers[bn] = bn_blobs or [zeros, ones, np.ones(1, np.float32)]
        layers[scale] = scale_blobs or [ones, zeros]

    unit(
        "conv1",
        "bn_conv1",
        "scale_conv1",
        in_channels=3,
        bn_blobs=[np.array([2, 4], np.float32), np.array([6, 8], np.float32), np.array([2], np.float32)],
        scale_blobs=[np.array([1.5, 2.5], np.float32), np.array([-1, 1], np.float32)],
    )
    for stage in (2, 3, 4, 5):
        for branch in ("1", "2a", "2b", "2c"):
            tail = f"{stage}a_branch{branch}"
            unit(f"res{tail}", f"bn{tail}", f"scale{tail}")
    layers["bn2a_branch2b"] = [np.array([3, 5], np.float32), np.array([7, 9], np.float32), np.zeros(1, np.float32)]
    layers["rpn_conv/3x3"] = [np.zeros((2, 2, 3, 3), np.float32), zeros]
    score_weight = np.zeros((24, 2, 1, 1), np.float32)
    score_weight[3, 0] = 1.0  # bg of anchor 3
    score_weight[15, 0] = 4.0  # fg of anchor 3
    layers["rpn_cls_score"] = [score_weight, np.concatenate([np.arange(12), 10 * np.arange(12)]).astype(np.float32)]
    layers["rpn_bbox_pred"] = [np.zeros((48, 2, 1, 1), np.float32), np.arange(48, dtype=np.float32)]
    layers["cls_score"] = [np.array([[0, 0], [1, 1], [2, 2]], np.float32), np.array([5, 6, 7], np.float32)]
    layers["bbox_pred"] = [np.arange(24, dtype=np.float32).reshape(12, 2), np.arange(12, dtype=np.float32)]
    layers["cls_embedding"] = [np.array([[0, 0.5], [1, 1.5], [2, 2.5]], np.float32)]
    layers["fc_attr"] = [np.ones((3, 4), np.float32), np.array([1, 2, 3], np.float32)]
    layers["attr_score"] = [np.arange(9, dtype=np.float32).reshape(3, 3), np.array([9, 1, 2], np.float32)]
    return layers


TINY = {"stage_blocks": (1, 1, 1, 1)}


def test_batchnorm_and_scale_become_frozen_bn():
    state, _ = caffe_to_detectron2(tiny_caffe_net(), **TINY)
    norm = "backbone.stem.conv1.norm"
    np.testing.assert_array_equal(state[f"{norm}.running_mean"], [1, 2])  # [2, 4] / factor 2
    np.testing.assert_array_equal(state[f"{norm}.running_var"], [3, 4])  # [6, 8] / 2
    np.testing.assert_array_equal(state[f"{norm}.weight"], [1.5, 2.5])
    np.testing.assert_array_equal(state[f"{norm}.bias"], [-1, 1])
    np.testing.assert_array_equal(state["backbone.res2.0.conv2.norm.running_mean"], [0, 0])  # factor 0 → 0 (Caffe)
    np.testing.assert_array_equal(state["backbone.res2.0.conv2.norm.running_var"], [0, 0])
    assert state["backbone.stem.conv1.weight"].shape == (2, 3, 1, 1)
    assert "backbone.res2.0.shortcut.weight" in state and "roi_heads.res5.0.shortcut.norm.running_var" in state


def test_rpn_objectness_is_fg_minus_bg_in_caffe_and_detectron2_anchor_order():
    caffe_state, _ = caffe_to_detectron2(tiny_caffe_net(), **TINY)
    rpn = "proposal_generator.rpn_head"
    np.testing.assert_array_equal(
        caffe_state[f"{rpn}.objectness_logits.bias"], [0, 9, 18, 27, 36, 45, 54, 63, 72, 81, 90, 99]
    )
    assert caffe_state[f"{rpn}.objectness_logits.weight"].shape == (12, 2, 1, 1)
    assert caffe_state[f"{rpn}.objectness_logits.weight"][3, 0, 0, 0] == 3.0  # 4 − 1
    np.testing.assert_array_equal(caffe_state[f"{rpn}.anchor_deltas.bias"], np.arange(48))

    d2_state, _ = caffe_to_detectron2(tiny_caffe_net(), anchors="detectron2", **TINY)
    # detectron2 anchor (size s, ratio r) = Caffe anchor 4r + s: [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11].
    np.testing.assert_array_equal(
        d2_state[f"{rpn}.objectness_logits.bias"], [0, 36, 72, 9, 45, 81, 18, 54, 90, 27, 63, 99]
    )
    assert d2_state[f"{rpn}.objectness_logits.weight"][9, 0, 0, 0] == 3.0  # Caffe anchor 3 → detectron2 anchor 9
    np.testing.assert_array_equal(
        d2_state[f"{rpn}.anchor_deltas.bias"][:12], [0, 1, 2, 3, 16, 17, 18, 19, 32, 33, 34, 35]
    )


def test_class_rows_put_background_last_and_bbox_pred_drops_it_and_is_scaled():
    state, report = caffe_to_detectron2(tiny_caffe_net(), **TINY)
    head = "roi_heads.box_predictor"
    np.testing.assert_array_equal(state[f"{head}.cls_score.bias"], [6, 7, 5])
    np.testing.assert_array_equal(state[f"{head}.cls_score.weight"], [[1, 1], [2, 2], [0, 0]])
    np.testing.assert_array_equal(state[f"{head}.bbox_pred.bias"], [40, 50, 30, 35, 80, 90, 50, 55])
    np.testing.assert_array_equal(state[f"{head}.bbox_pred.weight"][0], [80, 90])  # Caffe row 4 = [8, 9], × 10
    np.testing.assert_array_equal(state[f"{head}.bbox_pred.weight"][3], [70, 75])  # Caffe row 7 = [14, 15], × 5
    np.testing.assert_array_equal(state[f"{head}.cls_embedding.weight"], [[1, 1.5], [2, 2.5], [0, 0.5]])
    np.testing.assert_array_equal(state[f"{head}.fc_attr.bias"], [1, 2, 3])
    np.testing.assert_array_equal(state[f"{head}.attr_score.bias"], [1, 2, 9])
    np.testing.assert_array_equal(state[f"{head}.attr_score.weight"], [[3, 4, 5], [6, 7, 8], [0, 1, 2]])
    assert any("background" in note for note in report.notes)

    raw, _ = caffe_to_detectron2(tiny_caffe_net(), bbox_reg_weights=(1, 1, 1, 1), **TINY)
    np.testing.assert_array_equal(raw[f"{head}.bbox_pred.bias"], np.arange(4, 12))


def test_anchor_generators_match_caffe_and_detectron2(d2_state):
    # generate_anchors(ratios=[0.5, 1, 2], scales=[4, 8, 16, 32]) as listed in regions.md §1.3 (pixel-inclusive).
    caffe_inclusive = [
        [-38, -16, 53, 31],
        [-84, -40, 99, 55],
        [-176, -88, 191, 103],
        [-360, -184, 375, 199],
        [-24, -24, 39, 39],
        [-56, -56, 71, 71],
        [-120, -120, 135, 135],
        [-248, -248, 263, 263],
        [-14, -36, 29, 51],
        [-36, -80, 51, 95],
        [-80, -168, 95, 183],
        [-168, -344, 183, 359],
    ]
    np.testing.assert_array_equal(caffe_cell_anchors(), caffe_inclusive)
    # What detectron2 generated from the port's config (the fixture's buffer).
    generated = d2_state["proposal_generator.anchor_generator.cell_anchors.0"]
    np.testing.assert_array_equal(detectron2_cell_anchors(), generated)


def test_anchors_given_as_an_array_are_stored_as_given():
    shifted = caffe_cell_anchors() + np.float32([0, 0, 1, 1])  # for detectron2's width convention
    state, report = caffe_to_detectron2(tiny_caffe_net(), anchors=shifted, **TINY)
    np.testing.assert_array_equal(state["proposal_generator.anchor_generator.cell_anchors.0"][0], [-38, -16, 54, 32])
    assert "given" in report.initialized["proposal_generator.anchor_generator.cell_anchors.0"]
    with pytest.raises(ValueError, match=r"shape \(12, 4\)"):
        caffe_to_detectron2(tiny_caffe_net(), anchors=shifted[:9], **TINY)
    with pytest.raises(ValueError, match="'caffe', 'detectron2' or an"):
        caffe_to_detectron2(tiny_caffe_net(), anchors="torchvision", **TINY)
    nine = dict(
        tiny_caffe_net(),
        rpn_cls_score=[np.zeros((18, 2, 1, 1)), np.zeros(18)],
        rpn_bbox_pred=[np.zeros((36, 2, 1, 1)), np.zeros(36)],
    )
    with pytest.raises(CaffemodelError, match="predicts 9 anchors per cell but Caffe's generator .* makes 12"):
        caffe_to_detectron2(nine, **TINY)
    state, _ = caffe_to_detectron2(nine, anchors=np.zeros((9, 4)), **TINY)
    assert state["proposal_generator.rpn_head.objectness_logits.weight"].shape == (9, 2, 1, 1)


def test_plain_model_without_attribute_head():
    layers = tiny_caffe_net()
    state, report = caffe_to_detectron2(layers, attributes=False, **TINY)
    assert not any(k.endswith(("cls_embedding.weight", "fc_attr.weight", "attr_score.weight")) for k in state)
    assert set(report.dropped) == {"cls_embedding", "fc_attr", "attr_score"}
    for name in ("cls_embedding", "fc_attr", "attr_score"):
        del layers[name]
    assert list(caffe_to_detectron2(layers, attributes=False, **TINY)[0]) == list(state)
    with pytest.raises(CaffemodelError, match="cls_embedding, fc_attr, attr_score"):
        caffe_to_detectron2(layers, **TINY)


# ---- (3) errors --------------------------------------------------------------------------------------------------


def test_truncated_and_corrupt_files(fixture_caffemodel, tmp_path):
    data = fixture_caffemodel[0].read_bytes()
    for cut in (1, 2, 7, 100, len(data) // 3, len(data) - 1):
        path = write_bytes(tmp_path / f"cut{cut}.caffemodel", data[:cut])
        with pytest.raises(CaffemodelError, match="truncated|ends"):
            read_caffemodel(path)
    with pytest.raises(CaffemodelError, match="field 1 at byte 0 has wire type 7"):
        read_caffemodel(write_bytes(tmp_path / "bad.caffemodel", b"\x0f" + data[1:]))
    # A blob declaring 6 bytes inside a layer of 4: the inner length is checked against the enclosing message.
    overlong = length_delimited(100, tag(7, 2) + varint(6) + b"\x00" * 2)
    with pytest.raises(CaffemodelError, match="past the end of its message"):
        read_caffemodel(write_bytes(tmp_path / "overlong.caffemodel", overlong + b"\x00" * 8))
    blob = length_delimited(7, length_delimited(1, varint(3))) + length_delimited(5, np.zeros(2, "<f4").tobytes())
    with pytest.raises(CaffemodelError, match=r"shape \(3,\) but holds 2 values"):
        read_caffemodel(write_bytes(tmp_path / "short.caffemodel", encode_net([encode_layer("fc", [blob])])))


def test_files_that_are_not_caffemodels(tmp_path, d2_state):
    torch.save({"weight": torch.zeros(2)}, tmp_path / "model.pt")
    with pytest.raises(CaffemodelError, match="zip archive"):
        read_caffemodel(tmp_path / "model.pt")
    with pytest.raises(CaffemodelError, match="pickle"):
        read_caffemodel(D2_PICKLE)
    (tmp_path / "test.prototxt").write_text('name: "ResNet-101"\nlayer {\n  name: "conv1"\n}\n')
    with pytest.raises(CaffemodelError, match="text prototxt"):
        read_caffemodel(tmp_path / "test.prototxt")
    with pytest.raises(CaffemodelError, match="no layer with weights"):
        read_caffemodel(write_bytes(tmp_path / "empty_net.caffemodel", encode_net([encode_layer("relu", [])])))
    with pytest.raises(CaffemodelError, match="empty"):
        read_caffemodel(write_bytes(tmp_path / "zero.caffemodel", b""))
    with pytest.raises(CaffemodelError, match="does not exist"):
        read_caffemodel(tmp_path / "missing.caffemodel")
    twice = encode_layer("fc", [encode_blob(np.zeros(2))])
    with pytest.raises(CaffemodelError, match="both named 'fc'"):
        read_caffemodel(write_bytes(tmp_path / "twice.caffemodel", encode_net([twice, twice])))


def test_missing_extra_and_malformed_layers_are_named(fixture_caffemodel):
    layers = dict(fixture_caffemodel[1])
    # The fixture is 6 blocks deep in res4; ResNet-101 needs 23: every absent layer is named.
    with pytest.raises(CaffemodelError, match=r"lacks 153 layer\(s\).*res4b6_branch2a, bn4b6_branch2a"):
        caffe_to_detectron2(layers)
    without = {k: v for k, v in layers.items() if k not in ("bn4b3_branch2b", "attr_score")}
    with pytest.raises(CaffemodelError, match=r"lacks 2 layer\(s\).*: bn4b3_branch2b, attr_score$"):
        caffe_to_detectron2(without, stage_blocks=FIXTURE_STAGE_BLOCKS)
    extra = dict(layers, mystery_fc=[np.zeros((2, 2))], res2b_branch1=[np.zeros((64, 64, 1, 1))])
    with pytest.raises(CheckpointError, match=r"2 key\(s\).*no place.*'mystery_fc', 'res2b_branch1'"):
        caffe_to_detectron2(extra, stage_blocks=FIXTURE_STAGE_BLOCKS)
    with_bias = dict(layers, res2a_branch2a=layers["res2a_branch2a"] + [np.zeros(16)])
    with pytest.raises(CaffemodelError, match="'res2a_branch2a' .* has 2 blobs, expected 1"):
        caffe_to_detectron2(with_bias, stage_blocks=FIXTURE_STAGE_BLOCKS)
    short_embedding = dict(layers, cls_embedding=[layers["cls_embedding"][0][:-1]])
    with pytest.raises(CaffemodelError, match="cls_embedding has 20 rows but cls_score has 21"):
        caffe_to_detectron2(short_embedding, stage_blocks=FIXTURE_STAGE_BLOCKS)


def test_vlhub_convert_detector_reads_a_caffemodel(d2_state, fixture_caffemodel, tmp_path):
    from safetensors.torch import load_file

    from vlhub.cli import main
    from vlhub.processing.detector import RegionExtractor

    path, _ = fixture_caffemodel
    assert main(["convert", "detector", str(path), "--output-dir", str(tmp_path / "caffe")]) == 0
    assert main(["convert", "detector", str(D2_PICKLE), "--output-dir", str(tmp_path / "d2")]) == 0
    from_caffe, from_pickle = (load_file(tmp_path / name / "model.safetensors") for name in ("caffe", "d2"))
    rpn = {k for k in from_pickle if k.startswith("proposal_generator.")}  # Caffe anchors and their channel order
    assert set(from_caffe) == set(from_pickle)
    for name in set(from_pickle) - rpn:
        torch.testing.assert_close(from_caffe[name], from_pickle[name], atol=0, rtol=0, msg=name)
    extractor = RegionExtractor.from_pretrained(tmp_path / "caffe")
    assert extractor.config.anchor_style == "caffe" and extractor.config.box_convention == "caffe"
    assert extractor.config.selection_mode == "butd"
    image = np.random.default_rng(0).integers(0, 255, size=(64, 80, 3), dtype=np.uint8)
    regions = extractor(image)
    assert len(regions) == 1 and regions[0].image_size == (64, 80)
