"""ViLBERT's feature LMDBs (beta and 12-in-1 releases), as a reader registered under the feature format
"vilbert-lmdb"."""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from ...processing.regions import RegionFeatures
from ...processing.stores.original import (
    BUTD_TSV_FIELDS,
    FeatureFileError,
    LmdbReader,
    as_text,
    butd_record,
    record_field,
)
from ...utils.safe_pickle import UnsafePickleError, safe_loads

__all__ = ["VilbertLmdbReader"]


def _unpickle(data: bytes, source: str):
    """`safe_loads` with errors that name the file and entry: a refused global stays an `UnsafePickleError`, any
    other failure (a damaged pickle) is a `FeatureFileError`."""
    try:
        return safe_loads(data)
    except UnsafePickleError as err:
        raise UnsafePickleError(f"{source}: {err}") from None
    except Exception as err:  # pickle raises many types for damaged data (EOFError, UnpicklingError, ValueError...)
        raise FeatureFileError(f"{source}: not a readable pickle, the entry is truncated or corrupt ({err!r})") from err


class VilbertLmdbReader(LmdbReader):
    """ViLBERT's LMDBs: key `keys` holds the pickled id list; each id holds a pickled row.

    Rows are dicts `{image_id, image_w, image_h, num_boxes, boxes, features[, cls_prob]}` with base64 strings
    (the beta release, converted from BUTD TSVs) or numpy arrays (the multi-task release); the Conceptual
    Captions beta LMDB stores lists `[features, cls_prob, boxes, num_boxes, image_h, image_w, image_id,
    caption]`. Pickles are read with a restricted unpickler (numpy arrays and builtin containers only).
    """

    _CC_LIST_FIELDS = ("features", "cls_prob", "boxes", "num_boxes", "image_h", "image_w", "image_id", "caption")

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__(path)
        stored = self._value(b"keys")
        if stored is None:
            raise FeatureFileError(f"{self.path}: no `keys` entry; this is not a ViLBERT feature LMDB")
        self._ids = [as_text(k) for k in _unpickle(stored, f"{self.path} (entry `keys`)")]
        self._index = set(self._ids)

    def _read(self, image_id: str) -> RegionFeatures:
        source = f"{self.path} (image {image_id})"
        data = self._image_value(image_id, "`keys`")
        record = _unpickle(data, source)
        if isinstance(record, (list, tuple)):
            if len(record) != len(self._CC_LIST_FIELDS):
                raise FeatureFileError(
                    f"{source}: a list row should hold {list(self._CC_LIST_FIELDS)}, got {len(record)} items"
                )
            record = dict(zip(self._CC_LIST_FIELDS, record))
        if not isinstance(record, Mapping):
            raise FeatureFileError(f"{source}: expected a dict row, got {type(record).__name__}")
        if "num_boxes" not in record and b"num_boxes" not in record:
            record = {**record, "num_boxes": len(np.asarray(record_field(record, "features", source)))}
        return butd_record(record, source, BUTD_TSV_FIELDS)
