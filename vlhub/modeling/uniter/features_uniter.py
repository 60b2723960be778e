"""UNITER's image databases (LMDB), as a reader registered under the feature format "uniter-lmdb"."""

from __future__ import annotations

import io
import json
import os

import numpy as np

from ...processing.regions import RegionFeatures
from ...processing.stores.original import (
    FeatureFileError,
    LmdbReader,
    as_text,
    feature_array,
    load_npz,
    record_field,
    require_package,
)

__all__ = ["UniterLmdbReader"]


def _decode_msgpack(data: bytes, source: str) -> dict:
    msgpack = require_package("msgpack")

    def numpy_hook(obj):
        # msgpack-numpy's encoding of an ndarray: {nd: True, type: dtype str, shape, data: raw bytes}
        if obj.get(b"nd") is True or obj.get("nd") is True:
            get = lambda k: obj[k.encode()] if k.encode() in obj else obj[k]  # noqa: E731
            return np.frombuffer(get("data"), dtype=np.dtype(as_text(get("type")))).reshape(get("shape"))
        return obj

    try:
        return msgpack.unpackb(data, object_hook=numpy_hook, raw=False, strict_map_key=False)
    except Exception as err:  # msgpack raises several unrelated exception types for corrupt data
        raise FeatureFileError(f"{source}: value is neither a compressed npz nor msgpack ({err})") from err


class UniterLmdbReader(LmdbReader):
    """UNITER's image database (`img_db/<split>/feat_th0.2_max100_min10[_compressed]`).

    Keys are npz file names (e.g. `coco_val2014_000000000139.npz`, the image id); values are
    `np.savez_compressed` bytes, or msgpack-numpy in the uncompressed variant. Fields: `features` (N, 2048) fp16,
    `norm_bb` (N, 6) fp16 `[x1/W, y1/H, x2/W, y2/H, w/W, h/H]`, `conf` (N, 1) and `soft_labels` (N, 1601,
    background first). UNITER stores no image size, so boxes stay normalised: `image_size` is (1, 1) and UNITER's
    processor computes exactly the original 7-d locations from them. A `feat_th*` database holds the rows already
    selected (the first `clamp(#(conf > conf_th), min_bb, max_bb)` of the extraction's file; an `all` database every
    row); the reader keeps the stored order, which the processor's selection relies on.
    """

    _RESERVED_KEYS = {b"__keys__"}

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__(path)
        stored = self._value(b"__keys__")
        keys = (
            json.loads(stored)
            if stored is not None
            else [k.decode() for k in self._all_keys() if k not in self._RESERVED_KEYS]
        )
        self._ids = [as_text(k) for k in keys]
        self._index = set(self._ids)

    def _read(self, image_id: str) -> RegionFeatures:
        source = f"{self.path} (image {image_id})"
        data = self._image_value(image_id, "__keys__")
        if data[:2] == b"PK":  # a zip archive: np.savez_compressed
            record = load_npz(io.BytesIO(data), source)
        else:
            record = _decode_msgpack(data, source)
        features = feature_array(record_field(record, "features", source), source, "features", np.float32)
        norm_bb = feature_array(record_field(record, "norm_bb", source), source, "norm_bb", np.float32, len(features))
        if norm_bb.shape[1] < 4:
            raise FeatureFileError(f"{source}: norm_bb should have 6 columns, got {norm_bb.shape}")
        extra = {}
        if "conf" in record:
            extra["scores"] = feature_array(record["conf"], source, "conf", np.float32).reshape(-1)
        if "soft_labels" in record:
            extra["class_probs"] = feature_array(
                record["soft_labels"], source, "soft_labels", np.float32, len(features)
            )
        try:
            return RegionFeatures.from_normalized_boxes(features, norm_bb[:, :4], **extra)
        except (ValueError, TypeError) as err:
            raise FeatureFileError(f"{source}: {err}") from err
