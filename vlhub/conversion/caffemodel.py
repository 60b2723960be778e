"""Bottom-up-attention Caffe weights (`.caffemodel`) → the detectron2 state dict of `faster_rcnn_from_caffe*.pkl`.

`peteanderson80/bottom-up-attention` released `resnet101_faster_rcnn_final.caffemodel` (10-100 boxes) and
`resnet101_faster_rcnn_final_iter_320000.caffemodel` (36 boxes). This module reads them without Caffe or the protobuf
package and renames/reorders their blobs into exactly the `{name: np.ndarray}` dict that the `"model"` entry of the
detectron2 port's pickle (`airsplay/py-bottom-up-attention`, `faster_rcnn_from_caffe_attr.pkl`) holds, so everything
downstream (`vlhub.conversion.detector`) handles one format.

Wire format read (field numbers of `caffe/src/caffe/proto/caffe.proto`, BVLC master):

| message | field | number | wire type | use |
| --- | --- | --- | --- | --- |
| NetParameter | `layer` (LayerParameter) | 100 | length-delimited | current layers |
| NetParameter | `layers` (V1LayerParameter) | 2 | length-delimited | legacy (2014) layers |
| LayerParameter | `name` / `type` | 1 / 2 | length-delimited | layer name / type string |
| LayerParameter | `blobs` (BlobProto) | 7 | length-delimited | learned weights |
| V1LayerParameter | `layer` (V0LayerParameter) | 1 | length-delimited | pre-2014 format: refused |
| V1LayerParameter | `name` / `type` | 4 / 5 | length-delimited / varint (enum) | |
| V1LayerParameter | `blobs` (BlobProto) | 6 | length-delimited | |
| BlobProto | `num`, `channels`, `height`, `width` | 1, 2, 3, 4 | varint (int32 or int64) | legacy 4-d shape |
| BlobProto | `data` | 5 | packed float32 (unpacked 32-bit accepted) | values |
| BlobProto | `diff` / `double_diff` | 6 / 9 | packed | gradients: skipped unread |
| BlobProto | `shape` (BlobShape) | 7 | length-delimited | shape (wins over the legacy dims) |
| BlobProto | `double_data` | 8 | packed float64 (unpacked 64-bit accepted) | values |
| BlobShape | `dim` | 1 | packed int64 (unpacked varint accepted) | |

Every other field is skipped by seeking over it, so only the blobs' values are read into memory (one layer at a time).

Conventions turned around (Caffe → detectron2; see `shared/specs/regions.md` §1-2):

- `BatchNorm` blobs `[mean·f, var·f, f]` (f = the moving-average scale factor, `blobs[2]`) →
  `running_mean = b0 / f`, `running_var = b1 / f` (f = 0 → 0, as Caffe); `Scale` `[gamma, beta]` → FrozenBN
  `weight`, `bias`. Both use eps 1e-5.
- `rpn_cls_score` has 2A softmax channels, background block first (`[bg_0..bg_{A-1}, fg_0..fg_{A-1}]`);
  detectron2 has A sigmoid logits: `fg − bg` (softmax over the pair = sigmoid of the difference).
- `cls_score`, `cls_embedding` (rows) and `attr_score`: Caffe class/attribute 0 = background / "no attribute";
  detectron2 puts it LAST (rows rotated by one).
- `bbox_pred`: Caffe has 4·(K+1) rows with the background's 4 first (never used) → dropped; the remaining 4·K rows
  are multiplied by detectron2's `ROI_BOX_HEAD.BBOX_REG_WEIGHTS` (10, 10, 5, 5), because py-faster-rcnn saved the
  weights with its target normalisation folded in (effective weights 1, 1, 1, 1) while the port decodes with
  deltas / (10, 10, 5, 5).
- Anchors: Caffe does not store them; `proposal_generator.anchor_generator.cell_anchors.0` (a persistent buffer in
  that detectron2, loaded from the checkpoint over the generated one) gets Caffe's `generate_anchors` boxes by
  default — see `caffe_cell_anchors` and the `anchors` argument of `caffe_to_detectron2`.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np

from ..processing.detector import rpn as rpn_anchors
from .common import CheckpointError, ConversionReport

__all__ = [
    "CaffemodelError",
    "BUTD_STAGE_BLOCKS",
    "caffe_cell_anchors",
    "caffe_to_detectron2",
    "detectron2_cell_anchors",
    "read_caffemodel",
]


class CaffemodelError(CheckpointError):
    """The file is not a readable Caffe `.caffemodel`, or its layers are not the bottom-up-attention detector's."""


# ---------------------------------------------------------------------------------------------------------------
# Protobuf wire format
# ---------------------------------------------------------------------------------------------------------------

_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5
_WIRE_NAMES = {_VARINT: "varint", _FIXED64: "64-bit", _LENGTH_DELIMITED: "length-delimited", _FIXED32: "32-bit"}


@dataclass(frozen=True)
class _Span:
    """A length-delimited field's payload, located in the file but not read yet."""

    start: int
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length


class _WireReader:
    """Reads protobuf fields from a seekable binary file, checking every length against the enclosing message."""

    def __init__(self, file: BinaryIO, size: int, source: str):
        self.file = file
        self.size = size
        self.source = source
        self.position = 0

    def error(self, problem: str) -> CaffemodelError:
        return CaffemodelError(f"cannot read {self.source!r} as a Caffe .caffemodel: {problem}")

    def _read(self, count: int) -> bytes:
        data = self.file.read(count)
        if len(data) != count:
            raise self.error(
                f"the file ends at byte {self.position + len(data)} but a field needs {count} bytes from byte "
                f"{self.position} (truncated download?)"
            )
        self.position += count
        return data

    def _seek(self, position: int):
        self.file.seek(position)
        self.position = position

    def _varint(self, end: int) -> int:
        value, shift = 0, 0
        while True:
            if self.position >= end:
                limit = "the end of its message (corrupt)"
                if end == self.size:
                    limit = "the end of the file (truncated download?)"
                raise self.error(f"a varint at byte {self.position} runs past {limit}")
            byte = self._read(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift >= 70:
                raise self.error(f"a varint longer than 10 bytes ends at byte {self.position} (corrupt file)")

    def fields(self, span: _Span) -> Iterator[tuple[int, int, int | bytes | _Span]]:
        """(field number, wire type, value) of each field of the message in `span`: an int for varints, the raw
        bytes for 32/64-bit fields, a `_Span` for length-delimited ones (read it, descend into it, or leave it)."""
        position = span.start
        while position < span.end:
            self._seek(position)
            tag = self._varint(span.end)
            number, wire = tag >> 3, tag & 7
            if number == 0:
                raise self.error(f"field number 0 at byte {position} (not protobuf data, or corrupt)")
            if wire == _VARINT:
                value: int | bytes | _Span = self._varint(span.end)
            elif wire in (_FIXED64, _FIXED32):
                width = 8 if wire == _FIXED64 else 4
                if self.position + width > span.end:
                    raise self._overrun(position, width, span)
                value = self._read(width)
            elif wire == _LENGTH_DELIMITED:
                length = self._varint(span.end)
                value = _Span(self.position, length)
                if value.end > span.end:
                    raise self._overrun(position, length, span)
            else:
                raise self.error(
                    f"field {number} at byte {position} has wire type {wire}, which Caffe never writes "
                    "(not a binary protobuf, or corrupt)"
                )
            next_position = value.end if isinstance(value, _Span) else self.position
            yield number, wire, value
            position = next_position

    def _overrun(self, position: int, length: int, span: _Span) -> CaffemodelError:
        if span.end == self.size:
            return self.error(
                f"the field at byte {position} declares {length} bytes but the file ends at byte {self.size} "
                "(truncated download?)"
            )
        return self.error(
            f"the field at byte {position} declares {length} bytes, past the end of its message (corrupt)"
        )

    def read(self, span: _Span) -> bytes:
        self._seek(span.start)
        return self._read(span.length)

    def read_array(self, span: _Span, dtype: str) -> np.ndarray:
        itemsize = np.dtype(dtype).itemsize
        if span.length % itemsize:
            raise self.error(
                f"packed values at byte {span.start} take {span.length} bytes, not a multiple of {itemsize}"
            )
        self._seek(span.start)
        buffer = bytearray(span.length)
        if self.file.readinto(buffer) != span.length:
            raise self.error(f"the file ends inside the values starting at byte {span.start} (truncated download?)")
        self.position = span.end
        return np.frombuffer(buffer, dtype=dtype)

    def read_packed_varints(self, span: _Span) -> list[int]:
        self._seek(span.start)
        values = []
        while self.position < span.end:
            values.append(self._varint(span.end))
        return values

    def text(self, span: _Span, what: str) -> str:
        try:
            return self.read(span).decode("utf-8")
        except UnicodeDecodeError as err:
            raise self.error(f"{what} at byte {span.start} is not UTF-8 text (corrupt)") from err


def _expect_wire(reader: _WireReader, message: str, field: str, wire: int, expected: tuple[int, ...]):
    if wire not in expected:
        allowed = " or ".join(_WIRE_NAMES[w] for w in expected)
        got = _WIRE_NAMES.get(wire, wire)
        raise reader.error(f"{message}.{field} has wire type {got}, expected {allowed} (corrupt)")


def _read_blob(reader: _WireReader, span: _Span, where: str) -> np.ndarray:
    """One BlobProto → an array of its shape (float32 for `data`, float64 for `double_data`)."""
    shape: list[int] | None = None
    legacy: dict[int, int] = {}
    floats: list[np.ndarray] = []
    doubles: list[np.ndarray] = []
    for number, wire, value in reader.fields(span):
        if number == 7:  # shape: BlobShape
            _expect_wire(reader, "BlobProto", "shape", wire, (_LENGTH_DELIMITED,))
            shape = shape or []
            for dim_number, dim_wire, dim in reader.fields(value):
                if dim_number != 1:
                    continue
                _expect_wire(reader, "BlobShape", "dim", dim_wire, (_LENGTH_DELIMITED, _VARINT))
                shape.extend(reader.read_packed_varints(dim) if dim_wire == _LENGTH_DELIMITED else [dim])
        elif number in (1, 2, 3, 4):  # num, channels, height, width
            _expect_wire(reader, "BlobProto", "num/channels/height/width", wire, (_VARINT,))
            legacy[number] = value
        elif number == 5:  # data
            _expect_wire(reader, "BlobProto", "data", wire, (_LENGTH_DELIMITED, _FIXED32))
            packed = wire == _LENGTH_DELIMITED
            floats.append(reader.read_array(value, "<f4") if packed else np.frombuffer(value, "<f4"))
        elif number == 8:  # double_data
            _expect_wire(reader, "BlobProto", "double_data", wire, (_LENGTH_DELIMITED, _FIXED64))
            packed = wire == _LENGTH_DELIMITED
            doubles.append(reader.read_array(value, "<f8") if packed else np.frombuffer(value, "<f8"))
        # 6 (diff), 9 (double_diff) and unknown fields: skipped without reading
    if floats and doubles:
        raise reader.error(f"{where} has both float and double values (corrupt)")
    chunks = floats or doubles
    values = chunks[0] if len(chunks) == 1 else np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    if shape is None:
        # Legacy blobs: Caffe reads (num, channels, height, width); a field left out keeps the proto default, which
        # the writers never relied on, so count it as 1.
        shape = [legacy.get(i, 1) for i in (1, 2, 3, 4)] if legacy else [values.size]
    if any(d < 0 for d in shape) or math.prod(shape) != values.size:
        raise reader.error(f"{where} has shape {tuple(shape)} but holds {values.size} values (corrupt or truncated)")
    # Native byte order (a copy only on big-endian machines); writable like every other array returned.
    values = values.astype(values.dtype.newbyteorder("="), copy=False)
    return (values if values.flags.writeable else values.copy()).reshape(shape)


def _read_layer(reader: _WireReader, span: _Span, legacy: bool, index: int) -> tuple[str | None, list[np.ndarray]]:
    name_field, blobs_field = (4, 6) if legacy else (1, 7)
    message = "V1LayerParameter" if legacy else "LayerParameter"
    name: str | None = None
    blob_spans: list[_Span] = []
    for number, wire, value in reader.fields(span):
        if number == name_field:
            _expect_wire(reader, message, "name", wire, (_LENGTH_DELIMITED,))
            name = reader.text(value, "a layer name")
        elif number == blobs_field:
            _expect_wire(reader, message, "blobs", wire, (_LENGTH_DELIMITED,))
            blob_spans.append(value)
        elif legacy and number == 1 and wire == _LENGTH_DELIMITED:
            raise reader.error(
                f"layer {index} is in the pre-2014 V0 format (V1LayerParameter.layer); upgrade the file first with "
                "Caffe's `upgrade_net_proto_binary` tool"
            )
    where = f"layer {name or index!r}"
    return name, [_read_blob(reader, blob, f"{where} blob {i}") for i, blob in enumerate(blob_spans)]


# Leading bytes of files people confuse with a .caffemodel, for a clearer message than a wire-format error.
_OTHER_FORMATS = (
    (b"PK\x03\x04", "a zip archive (a PyTorch .pt/.pth saved by torch>=1.6, or a .npz)"),
    (b"\x89HDF", "an HDF5 file (Keras .h5?)"),
    (b"\x93NUMPY", "a NumPy .npy file"),
    *(
        (bytes([0x80, version]), "a Python pickle (a detectron2 .pkl or an old PyTorch .pt?)")
        for version in (2, 3, 4, 5)
    ),
)
_PROTOTXT = re.compile(rb"^\s*(#|name\s*:|layers?\s*\{|input\s*:)")
_TEXT_BYTES = frozenset(b"\t\n\r" + bytes(range(0x20, 0x7F)))


def read_caffemodel(path: str | os.PathLike) -> dict[str, list[np.ndarray]]:
    """The learned blobs of every layer of a binary Caffe `NetParameter` file, by layer name, in file order.

    Layers without blobs (ReLU, Pooling, ...) are left out. Arrays keep the blob's shape (`BlobShape`, or the legacy
    (num, channels, height, width)) and its precision: float32 for `data`, float64 for `double_data`. Gradients
    (`diff`) are skipped without being read.

    Raises `CaffemodelError` for a missing, empty, truncated or corrupt file, a file of another format (zip/PyTorch,
    pickle, HDF5, text prototxt), one without any layer with weights, and duplicate layer names.
    """
    path = Path(path)
    if not path.is_file():
        raise CaffemodelError(f"caffemodel {str(path)!r} does not exist or is not a file")
    size = path.stat().st_size
    if size == 0:
        raise CaffemodelError(f"caffemodel {str(path)!r} is empty (0 bytes)")
    layers: dict[str, list[np.ndarray]] = {}
    with open(path, "rb") as file:
        head = file.read(64)
        for magic, kind in _OTHER_FORMATS:
            if head.startswith(magic):
                raise CaffemodelError(f"{str(path)!r} is {kind}, not a binary Caffe .caffemodel (NetParameter)")
        if _PROTOTXT.match(head) and all(byte in _TEXT_BYTES for byte in head):
            raise CaffemodelError(
                f"{str(path)!r} is a text prototxt (the network definition), not the binary .caffemodel with weights"
            )
        file.seek(0)
        reader = _WireReader(file, size, str(path))
        index = 0
        for number, wire, value in reader.fields(_Span(0, size)):
            if number not in (2, 100):
                continue
            _expect_wire(reader, "NetParameter", "layer" if number == 100 else "layers", wire, (_LENGTH_DELIMITED,))
            name, blobs = _read_layer(reader, value, legacy=number == 2, index=index)
            index += 1
            if not blobs:
                continue
            if name is None:
                raise reader.error(f"layer {index - 1} has weights but no name")
            if name in layers:
                raise reader.error(f"two layers with weights are both named {name!r}")
            layers[name] = blobs
    if not layers:
        raise CaffemodelError(
            f"{str(path)!r} holds no layer with weights: not a Caffe .caffemodel "
            f"({index} layer definitions, none with blobs)"
        )
    return layers


# ---------------------------------------------------------------------------------------------------------------
# Anchors
# ---------------------------------------------------------------------------------------------------------------

ANCHOR_STRIDE = 16
ANCHOR_RATIOS = (0.5, 1.0, 2.0)  # height / width
ANCHOR_SCALES = (4, 8, 16, 32)  # × the 16-pixel base: 64, 128, 256, 512 pixels


def caffe_cell_anchors(
    base_size: int = ANCHOR_STRIDE, ratios: Sequence[float] = ANCHOR_RATIOS, scales: Sequence[int] = ANCHOR_SCALES
) -> np.ndarray:
    """The RPN cell anchors of py-faster-rcnn's `generate_anchors`, [len(ratios)·len(scales), 4], as Caffe uses them
    (the detector's own generator, as numpy).

    Order = Caffe's channel order: ratio-major (anchor r·len(scales) + s), pixel-inclusive corners
    (x2 = x1 + w − 1): anchor 0 is [-38, -16, 53, 31], 92 × 48. Decode them with Caffe's convention
    (width = x2 − x1 + 1, vlhub's `box_convention="caffe"`); for detectron2's (width = x2 − x1), the boxes
    `anchors + (0, 0, 1, 1)` decode to exactly the same proposals (same widths and centres).
    """
    return rpn_anchors.caffe_cell_anchors(base_size, tuple(ratios), tuple(scales)).numpy()


def detectron2_cell_anchors(
    sizes: Sequence[float] = tuple(ANCHOR_STRIDE * s for s in ANCHOR_SCALES), ratios: Sequence[float] = ANCHOR_RATIOS
) -> np.ndarray:
    """The cell anchors detectron2's `DefaultAnchorGenerator` generates (offset 0): size-major, centred on 0, exact
    areas (not rounded), [len(sizes)·len(ratios), 4] (the detector's own generator, as numpy)."""
    return rpn_anchors.detectron2_cell_anchors(tuple(sizes), tuple(ratios)).numpy()


def _caffe_to_detectron2_anchor_order(num_ratios: int, num_scales: int) -> np.ndarray:
    """For each detectron2 anchor (size-major), the index of the Caffe anchor (ratio-major) of the same shape."""
    return np.asarray([r * num_scales + s for s in range(num_scales) for r in range(num_ratios)])


# ---------------------------------------------------------------------------------------------------------------
# Layer map
# ---------------------------------------------------------------------------------------------------------------

BUTD_STAGE_BLOCKS = (3, 4, 23, 3)  # ResNet-101: res2, res3, res4 (backbone), res5 (RoI head)
_STAGES = (2, 3, 4, 5)
_BRANCHES = {"1": "shortcut", "2a": "conv1", "2b": "conv2", "2c": "conv3"}
_BLOCK_LAYER = re.compile(r"^(res|bn|scale)([2-5])([a-z]\d*)_branch(1|2a|2b|2c)$")


def _block_index(suffix: str) -> int:
    """'a' → 0, 'b' → 1, 'c' → 2, ... (ResNet-50 style) or 'b1' → 1, 'b22' → 22 (ResNet-101/152 style)."""
    return int(suffix[1:]) if len(suffix) > 1 else ord(suffix) - ord("a")


def _block_suffix(index: int, numbered: bool) -> str:
    return "a" if index == 0 else f"b{index}" if numbered else chr(ord("a") + index)


def _stage_target(stage: int, block: int) -> str:
    return f"roi_heads.res5.{block}" if stage == 5 else f"backbone.res{stage}.{block}"


@dataclass
class _ConvUnit:
    """A conv without bias + its BatchNorm + Scale layers, and where they go."""

    conv: str
    batch_norm: str
    scale: str
    target: str  # e.g. "backbone.res2.0.conv1"


def _backbone_units(layer_names, stage_blocks: Sequence[int] | None) -> tuple[list[_ConvUnit], list[str]]:
    """The conv units of stem + res2..res5 in detectron2's state-dict order, and the names of expected layers that
    are missing. Block numbering ('a, b, c' or 'a, b1, b2, ...') is taken from the file, stage by stage."""
    found: dict[tuple[int, int, str], dict[str, str]] = {}
    numbered: dict[int, bool] = {}  # stage → the file numbers its blocks 'b1, b2, ...' (True) or letters (False)
    for name in layer_names:
        match = _BLOCK_LAYER.match(name)
        if match is None:
            continue
        role, stage, suffix, branch = match.group(1), int(match.group(2)), match.group(3), match.group(4)
        if len(suffix) > 1 and not suffix.startswith("b"):
            continue  # not a block name this map knows: reported as unused
        if suffix != "a":
            numbered[stage] = numbered.get(stage, False) or len(suffix) > 1
        key = (stage, _block_index(suffix), branch)
        if role in found.setdefault(key, {}):
            raise CaffemodelError(
                f"layers {found[key][role]!r} and {name!r} both name block {key[1]} of res{stage}; "
                "use one numbering ('a, b, c, ...' or 'a, b1, b2, ...') per stage"
            )
        found[key][role] = name
    if stage_blocks is None:
        # At least block 'a' of every stage, so that a stage missing altogether is reported.
        stage_blocks = [1 + max((b for (s, b, _) in found if s == stage), default=0) for stage in _STAGES]
    if len(stage_blocks) != 4:
        raise ValueError(f"stage_blocks must give the blocks of res2, res3, res4 and res5, got {stage_blocks}")

    units = [_ConvUnit("conv1", "bn_conv1", "scale_conv1", "backbone.stem.conv1")]
    missing = [name for name in ("conv1", "bn_conv1", "scale_conv1") if name not in layer_names]
    for stage, count in zip(_STAGES, stage_blocks):
        uses_numbers = numbered.get(stage, count > 3)  # BUTD: 'a, b, c' for 3 blocks, 'a, b1, ...' beyond
        for block in range(count):
            suffix = _block_suffix(block, uses_numbers)
            # detectron2's BottleneckBlock registers the shortcut before conv1..conv3.
            for branch in (["1"] if block == 0 else []) + ["2a", "2b", "2c"]:
                present = found.get((stage, block, branch), {})
                names = {
                    role: present.get(role, f"{role}{stage}{suffix}_branch{branch}") for role in ("res", "bn", "scale")
                }
                missing.extend(name for role, name in names.items() if role not in present)
                units.append(
                    _ConvUnit(
                        names["res"], names["bn"], names["scale"], f"{_stage_target(stage, block)}.{_BRANCHES[branch]}"
                    )
                )
    return units, missing


_RPN_LAYERS = ("rpn_conv/3x3", "rpn_cls_score", "rpn_bbox_pred")
_BOX_LAYERS = ("cls_score", "bbox_pred")
_ATTRIBUTE_LAYERS = ("cls_embedding", "fc_attr", "attr_score")


class _Layers:
    """Checked access to the Caffe layers' blobs, with shapes reduced to the detectron2 module's."""

    def __init__(self, layers: Mapping[str, Sequence[np.ndarray]]):
        self.layers = layers

    def blobs(self, name: str, counts: tuple[int, ...], what: str) -> list[np.ndarray]:
        blobs = list(self.layers[name])
        if len(blobs) not in counts:
            expected = " or ".join(str(c) for c in counts)
            raise CaffemodelError(f"layer {name!r} ({what}) has {len(blobs)} blobs, expected {expected}")
        return [np.asarray(b) for b in blobs]

    @staticmethod
    def vector(blob: np.ndarray, name: str, index: int, length: int | None = None) -> np.ndarray:
        if sum(d != 1 for d in blob.shape) > 1:
            raise CaffemodelError(f"blob {index} of layer {name!r} should be a vector, got shape {blob.shape}")
        vector = blob.reshape(-1)
        if length is not None and vector.size != length:
            raise CaffemodelError(f"blob {index} of layer {name!r} has {vector.size} values, expected {length}")
        return vector

    @staticmethod
    def matrix(blob: np.ndarray, name: str) -> np.ndarray:
        # InnerProduct / Embed weights: (rows, cols); legacy blobs carry them as (1, 1, rows, cols).
        if blob.ndim < 2 or any(d != 1 for d in blob.shape[:-2]):
            raise CaffemodelError(f"the weight of layer {name!r} should be a matrix, got shape {blob.shape}")
        return blob.reshape(blob.shape[-2:])

    @staticmethod
    def conv_weight(blob: np.ndarray, name: str) -> np.ndarray:
        if blob.ndim != 4:
            raise CaffemodelError(
                f"the weight of convolution {name!r} should be 4-d (out, in, kh, kw), got {blob.shape}"
            )
        return blob


def _background_last(rows: np.ndarray) -> np.ndarray:
    """Caffe keeps background / 'no attribute' in row 0, detectron2 in the last row."""
    return np.concatenate([rows[1:], rows[:1]])


@dataclass
class _Output:
    """The detectron2 state dict being built (float32, contiguous, in insertion order) and its report."""

    state: dict[str, np.ndarray]
    report: ConversionReport

    def put(self, target: str, array: np.ndarray, layer: str):
        self.state[target] = np.ascontiguousarray(array, dtype=np.float32)
        self.report.use(target, layer)

    def add(self, target: str, array: np.ndarray, reason: str):
        """A tensor the caffemodel does not store."""
        self.state[target] = np.ascontiguousarray(array, dtype=np.float32)
        self.report.initialize(target, reason)


def caffe_to_detectron2(
    source: str | os.PathLike | Mapping[str, Sequence[np.ndarray]],
    *,
    stage_blocks: Sequence[int] | None = BUTD_STAGE_BLOCKS,
    attributes: bool = True,
    anchors: Literal["caffe", "detectron2"] | np.ndarray = "caffe",
    bbox_reg_weights: Sequence[float] = (10.0, 10.0, 5.0, 5.0),
) -> tuple[dict[str, np.ndarray], ConversionReport]:
    """The detectron2 state dict (the `"model"` dict of `faster_rcnn_from_caffe_attr.pkl`) of a bottom-up-attention
    `.caffemodel`, and the report of where every Caffe layer went.

    Args:
        source: a `.caffemodel` path, or `{layer name: [blobs]}` as `read_caffemodel` returns.
        stage_blocks: bottleneck blocks of res2, res3, res4, res5; every one must be present (default ResNet-101).
            `None` takes the counts from the file (then a missing LAST block of a stage cannot be noticed).
        attributes: convert the attribute head (`cls_embedding`, `fc_attr`, `attr_score`; required when True);
            False drops those layers (with that reason in the report) for the plain `faster_rcnn_from_caffe.pkl`.
        anchors: what `proposal_generator.anchor_generator.cell_anchors.0` holds, and the RPN channel order.
            "caffe": Caffe's own anchors (`caffe_cell_anchors`, pixel-inclusive: decode them with Caffe's +1 width
            convention) in Caffe's channel order — the original RPN exactly. For a model decoding with detectron2's
            width convention pass `anchors=caffe_cell_anchors() + (0, 0, 1, 1)`, which decodes identically.
            "detectron2": the anchors detectron2's `DefaultAnchorGenerator` makes from the port's config (sizes
            64-512, ratios 0.5/1/2; `detectron2_cell_anchors`), RPN channels permuted from Caffe's ratio-major to its
            size-major order (each channel keeps the anchor of the nearest shape, e.g. 90.5×45.3 for Caffe's 92×48).
            An array [A, 4]: stored as given, channels in Caffe's order.
        bbox_reg_weights: detectron2's `ROI_BOX_HEAD.BBOX_REG_WEIGHTS`, by which the `bbox_pred` rows are scaled
            (the port's config: 10, 10, 5, 5; (1, 1, 1, 1) for a model that decodes Caffe's deltas as they are).

    Returns:
        `(state, report)`. `state` maps detectron2 names to float32 arrays in detectron2's `state_dict()` order:
        `backbone.stem.conv1.weight` [64, 3, 7, 7] + `.norm.{weight,bias,running_mean,running_var}` [64];
        `backbone.res{2,3,4}.{i}.{shortcut (block 0 only),conv1,conv2,conv3}.weight` + `.norm.*`;
        `proposal_generator.anchor_generator.cell_anchors.0` [A, 4];
        `proposal_generator.rpn_head.conv.{weight [512, 1024, 3, 3], bias}`,
        `...objectness_logits.{weight [A, 512, 1, 1], bias [A]}`, `...anchor_deltas.{weight [4A, 512, 1, 1], bias}`;
        `roi_heads.res5.{0,1,2}.*`; `roi_heads.box_predictor.cls_score.{weight [K+1, 2048], bias}` (background
        last), `bbox_pred.{weight [4K, 2048], bias}`, and with attributes `cls_embedding.weight [K+1, 256]`,
        `fc_attr.{weight [512, 2304], bias}`, `attr_score.{weight [N+1, 512], bias}` ('no attribute' last).
        The report names the Caffe layer of every tensor (`used`), the layers left out and why (`dropped`), the
        anchors (`initialized`: not stored by Caffe) and each reordering (`notes`).

    Raises:
        CaffemodelError: an unreadable file, missing layers (all named), wrong blob counts or inconsistent shapes.
        CheckpointError: layers with weights that have no place in the detector (all named).
    """
    if isinstance(source, Mapping):
        layers, source_name = source, "caffemodel layers"
    else:
        layers, source_name = read_caffemodel(source), str(source)
    if len(bbox_reg_weights) != 4:
        raise ValueError(f"bbox_reg_weights must be 4 numbers (dx, dy, dw, dh), got {bbox_reg_weights}")
    units, missing = _backbone_units(set(layers), stage_blocks)
    head_layers = _RPN_LAYERS + _BOX_LAYERS + (_ATTRIBUTE_LAYERS if attributes else ())
    missing.extend(name for name in head_layers if name not in layers)
    if missing:
        listed = ", ".join(missing[:20]) + (" ..." if len(missing) > 20 else "")
        raise CaffemodelError(
            f"{source_name!r} lacks {len(missing)} layer(s) of the bottom-up-attention detector: {listed}"
        )

    access = _Layers(layers)
    out = _Output({}, ConversionReport(source=source_name))
    # detectron2's module order: backbone, proposal generator, RoI heads (res5, then the predictor).
    for unit in units:
        if not unit.target.startswith("roi_heads."):
            _convert_conv_unit(access, unit, out)
    _convert_rpn(access, anchors, out)
    for unit in units:
        if unit.target.startswith("roi_heads."):
            _convert_conv_unit(access, unit, out)
    num_classes, feature_dim = _convert_box_predictor(access, bbox_reg_weights, out)
    if attributes:
        _convert_attribute_head(access, num_classes, feature_dim, out)
    else:
        for name in _ATTRIBUTE_LAYERS:
            if name in layers:
                out.report.drop(name, "attribute head not requested (attributes=False)")
    out.report.check_complete(layers)
    return out.state, out.report


def _convert_conv_unit(access: _Layers, unit: _ConvUnit, out: _Output):
    (weight,) = access.blobs(unit.conv, (1,), "convolution without bias")
    weight = access.conv_weight(weight, unit.conv)
    channels = weight.shape[0]
    mean_sum, var_sum, factor = access.blobs(unit.batch_norm, (3,), "BatchNorm: mean·f, variance·f, f")
    factor = float(access.vector(factor, unit.batch_norm, 2, 1)[0])
    scale = 0.0 if factor == 0 else 1.0 / factor  # as Caffe's BatchNormLayer::Forward_cpu
    gamma, beta = access.blobs(unit.scale, (2,), "Scale with bias: gamma, beta")
    out.put(f"{unit.target}.weight", weight, unit.conv)
    out.put(f"{unit.target}.norm.weight", access.vector(gamma, unit.scale, 0, channels), unit.scale)
    out.put(f"{unit.target}.norm.bias", access.vector(beta, unit.scale, 1, channels), unit.scale)
    mean = access.vector(mean_sum, unit.batch_norm, 0, channels).astype(np.float64) * scale
    var = access.vector(var_sum, unit.batch_norm, 1, channels).astype(np.float64) * scale
    out.put(f"{unit.target}.norm.running_mean", mean, unit.batch_norm)
    out.put(f"{unit.target}.norm.running_var", var, unit.batch_norm)


def _conv_with_bias(access: _Layers, name: str) -> tuple[np.ndarray, np.ndarray]:
    weight, bias = access.blobs(name, (2,), "convolution with bias")
    weight = access.conv_weight(weight, name)
    return weight, access.vector(bias, name, 1, weight.shape[0])


def _cell_anchors(anchors, num_anchors: int) -> tuple[np.ndarray, np.ndarray, str]:
    """(cell anchors [A, 4], for each of them the Caffe RPN channel it takes, description)."""
    if isinstance(anchors, str) and anchors == "detectron2":
        grid = (len(ANCHOR_RATIOS), len(ANCHOR_SCALES))
        if num_anchors != grid[0] * grid[1]:
            raise CaffemodelError(
                f"anchors='detectron2' needs {grid[0] * grid[1]} RPN anchors, the file has {num_anchors}"
            )
        description = "detectron2 DefaultAnchorGenerator (size-major); RPN channels permuted from Caffe's ratio-major"
        return detectron2_cell_anchors(), _caffe_to_detectron2_anchor_order(*grid), description
    if isinstance(anchors, str):
        if anchors != "caffe":
            raise ValueError(f"anchors must be 'caffe', 'detectron2' or an [A, 4] array, got {anchors!r}")
        cell_anchors, description = caffe_cell_anchors(), "Caffe generate_anchors (ratio-major, pixel-inclusive)"
        if len(cell_anchors) != num_anchors:
            raise CaffemodelError(
                f"the RPN predicts {num_anchors} anchors per cell but Caffe's generator with ratios {ANCHOR_RATIOS} "
                f"and scales {ANCHOR_SCALES} makes {len(cell_anchors)}; pass the anchors as an array"
            )
    else:
        cell_anchors, description = np.asarray(anchors, dtype=np.float32), "given by the caller"
        if cell_anchors.shape != (num_anchors, 4):
            raise ValueError(f"anchors must have shape ({num_anchors}, 4) for this RPN, got {cell_anchors.shape}")
    return cell_anchors, np.arange(num_anchors), description


def _convert_rpn(access: _Layers, anchors, out: _Output):
    prefix = "proposal_generator.rpn_head"
    conv_weight, conv_bias = _conv_with_bias(access, "rpn_conv/3x3")
    score_weight, score_bias = _conv_with_bias(access, "rpn_cls_score")
    delta_weight, delta_bias = _conv_with_bias(access, "rpn_bbox_pred")
    if score_weight.shape[0] % 2:
        raise CaffemodelError(f"rpn_cls_score has {score_weight.shape[0]} channels, expected 2 × anchors (bg, fg)")
    num_anchors = score_weight.shape[0] // 2
    if delta_weight.shape[0] != 4 * num_anchors:
        raise CaffemodelError(
            f"rpn_bbox_pred has {delta_weight.shape[0]} channels, expected 4 × {num_anchors} anchors "
            f"(rpn_cls_score has {score_weight.shape[0]})"
        )
    cell_anchors, order, description = _cell_anchors(anchors, num_anchors)
    delta_order = (4 * order[:, None] + np.arange(4)).reshape(-1)
    # Softmax over (bg, fg) = sigmoid(fg − bg): the detectron2 logit is the difference of the two channel blocks.
    logit_weight = score_weight[num_anchors:].astype(np.float64) - score_weight[:num_anchors]
    logit_bias = score_bias[num_anchors:].astype(np.float64) - score_bias[:num_anchors]

    out.add(
        "proposal_generator.anchor_generator.cell_anchors.0",
        cell_anchors,
        f"{num_anchors} anchors, {description}: Caffe's proposal layer generates them instead of storing them",
    )
    out.put(f"{prefix}.conv.weight", conv_weight, "rpn_conv/3x3")
    out.put(f"{prefix}.conv.bias", conv_bias, "rpn_conv/3x3")
    out.put(f"{prefix}.objectness_logits.weight", logit_weight[order], "rpn_cls_score")
    out.put(f"{prefix}.objectness_logits.bias", logit_bias[order], "rpn_cls_score")
    out.put(f"{prefix}.anchor_deltas.weight", delta_weight[delta_order], "rpn_bbox_pred")
    out.put(f"{prefix}.anchor_deltas.bias", delta_bias[delta_order], "rpn_bbox_pred")
    out.report.notes.append(f"rpn_cls_score: {2 * num_anchors} softmax channels (bg block, fg block) → fg − bg logits")


def _inner_product(access: _Layers, name: str, rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    weight, bias = access.blobs(name, (2,), "InnerProduct with bias")
    weight = access.matrix(weight, name)
    if rows is not None and weight.shape[0] != rows:
        raise CaffemodelError(f"layer {name!r} has {weight.shape[0]} outputs, expected {rows}")
    return weight, access.vector(bias, name, 1, weight.shape[0])


def _convert_box_predictor(access: _Layers, bbox_reg_weights, out: _Output) -> tuple[int, int]:
    """cls_score and bbox_pred; returns (class rows incl. background, pooled feature size)."""
    prefix = "roi_heads.box_predictor"
    cls_weight, cls_bias = _inner_product(access, "cls_score")
    num_classes, feature_dim = cls_weight.shape
    box_weight, box_bias = _inner_product(access, "bbox_pred", rows=4 * num_classes)
    if box_weight.shape[1] != feature_dim:
        raise CaffemodelError(f"bbox_pred reads {box_weight.shape[1]} features but cls_score reads {feature_dim}")
    out.put(f"{prefix}.cls_score.weight", _background_last(cls_weight), "cls_score")
    out.put(f"{prefix}.cls_score.bias", _background_last(cls_bias), "cls_score")
    # The background's 4 regression rows come first in Caffe and are never used; detectron2 has none.
    row_scale = np.tile(np.asarray(bbox_reg_weights, dtype=np.float64), num_classes - 1)
    out.put(f"{prefix}.bbox_pred.weight", box_weight[4:].astype(np.float64) * row_scale[:, None], "bbox_pred")
    out.put(f"{prefix}.bbox_pred.bias", box_bias[4:].astype(np.float64) * row_scale, "bbox_pred")
    out.report.notes.append("cls_score, cls_embedding and attr_score rows: background moved from first to last")
    out.report.notes.append(
        f"bbox_pred: the background's 4 rows dropped (unused), rows scaled by {tuple(bbox_reg_weights)}"
    )
    return num_classes, feature_dim


def _convert_attribute_head(access: _Layers, num_classes: int, feature_dim: int, out: _Output):
    prefix = "roi_heads.box_predictor"
    (embedding,) = access.blobs("cls_embedding", (1,), "Embed without bias")
    embedding = access.matrix(embedding, "cls_embedding")
    if embedding.shape[0] != num_classes:
        raise CaffemodelError(f"cls_embedding has {embedding.shape[0]} rows but cls_score has {num_classes} classes")
    hidden_weight, hidden_bias = _inner_product(access, "fc_attr")
    if hidden_weight.shape[1] != feature_dim + embedding.shape[1]:
        raise CaffemodelError(
            f"fc_attr reads {hidden_weight.shape[1]} values, expected pool5 ({feature_dim}) + cls_embedding "
            f"({embedding.shape[1]})"
        )
    score_weight, score_bias = _inner_product(access, "attr_score")
    if score_weight.shape[1] != hidden_weight.shape[0]:
        raise CaffemodelError(
            f"attr_score reads {score_weight.shape[1]} values but fc_attr gives {hidden_weight.shape[0]}"
        )
    # The embedding is looked up with the argmax class, whose index moves with the class rows.
    out.put(f"{prefix}.cls_embedding.weight", _background_last(embedding), "cls_embedding")
    out.put(f"{prefix}.fc_attr.weight", hidden_weight, "fc_attr")
    out.put(f"{prefix}.fc_attr.bias", hidden_bias, "fc_attr")
    out.put(f"{prefix}.attr_score.weight", _background_last(score_weight), "attr_score")
    out.put(f"{prefix}.attr_score.bias", _background_last(score_bias), "attr_score")
