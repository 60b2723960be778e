"""Unified VLP's detectron-vlp feature files (HDF5), as a reader registered under the feature format "vlp-h5"."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ...processing.regions import RegionFeatures
from ...processing.stores.original import FeatureFileError, FeatureReader, feature_array, make_regions, require_package
from ...utils.limits import check_declared_array

__all__ = ["VlpH5Reader"]


def _plain_h5_dataset(h5py, handle, name: str, path) -> np.ndarray:
    """The dataset `name` of an open h5 file, read only when its data lives in that file.

    HDF5 can point elsewhere: a soft or external link, a virtual dataset mapped onto other files, or "external
    storage" whose raw bytes are any file on disk. Reading such a dataset would copy another file's bytes into the
    features, so each of these is refused with an error naming the file and the dataset."""
    link = handle.get(name, getlink=True)
    kinds = {h5py.SoftLink: "a soft link", h5py.ExternalLink: "an external link"}
    if type(link) in kinds:
        target = f"{link.filename}:{link.path}" if isinstance(link, h5py.ExternalLink) else link.path
        raise FeatureFileError(
            f"{path}: dataset {name!r} is {kinds[type(link)]} (to {target}); only datasets stored in the file itself "
            "are read"
        )
    dataset = handle.get(name)
    if not isinstance(dataset, h5py.Dataset):
        raise FeatureFileError(f"{path}: {name!r} is not a dataset (it is a {type(dataset).__name__})")
    create_plist = dataset.id.get_create_plist()
    if create_plist.get_layout() == h5py.h5d.VIRTUAL:
        raise FeatureFileError(
            f"{path}: dataset {name!r} is a virtual dataset (its data lives in other files); only datasets stored in "
            "the file itself are read"
        )
    if create_plist.get_external_count() > 0:
        raise FeatureFileError(
            f"{path}: dataset {name!r} uses external storage (its raw data is the file "
            f"{create_plist.get_external(0)[0].decode(errors='replace')!r}); only datasets stored in the file itself "
            "are read"
        )
    # What the header declares is checked before anything is allocated: an absurd shape, or a contiguous dataset
    # whose stored bytes are fewer than its shape needs (unwritten data reads as fill values, not features).
    try:
        nbytes = check_declared_array(dataset.shape or (), dataset.dtype, f"dataset {name!r}")
    except ValueError as err:
        raise FeatureFileError(f"{path}: {err}") from err
    stored = dataset.id.get_storage_size()
    if create_plist.get_layout() == h5py.h5d.CONTIGUOUS and stored < nbytes:
        raise FeatureFileError(
            f"{path}: dataset {name!r} declares {nbytes} bytes (shape {dataset.shape}, {dataset.dtype}) but stores "
            f"{stored}; it was never written or is damaged"
        )
    try:
        return dataset[()]
    except OSError as err:  # HDF5 reports a truncated file or a damaged chunk as an OSError
        raise FeatureFileError(
            f"{path}: dataset {name!r} cannot be read; the file is truncated or damaged ({err})"
        ) from err


def _open_h5(h5py, path):
    """An h5 file opened for reading; a truncated or non-HDF5 file is a `FeatureFileError` naming it."""
    try:
        return h5py.File(path, "r")
    except OSError as err:
        raise FeatureFileError(
            f"{path}: not a readable HDF5 file (truncated, damaged or another format: {err})"
        ) from err


class VlpH5Reader(FeatureReader):
    """Unified VLP's detectron-vlp features: fc6 features, class probabilities and boxes in h5 files.

    Args:
        features: the feature h5 file, or a pattern with `{shard}` for the 1000-shard layout
            (`..._feat{shard}.h5`, shard = the id's last 3 characters).
        class_probs: the class-probability h5 file or pattern (`..._cls{shard}.h5`), (100, 1601) with
            background first; optional.
        boxes: the bbox h5 (100, 6) = `[x1, y1, x2, y2, class_idx, max_conf]` in pixels; it lists the ids.
        image_sizes: `{image_id: (height, width)}`. VLP never stored image sizes (its loader normalises by the
            largest box coordinate instead); without them, pass `image_size_from_boxes=True` to use
            `(max y2, max x2)` of each image's boxes — recorded as `metadata["image_size_from_boxes"]`.
    """

    def __init__(
        self,
        features: str | os.PathLike,
        boxes: str | os.PathLike,
        class_probs: str | os.PathLike | None = None,
        image_sizes: Mapping[str, tuple[int, int]] | None = None,
        image_size_from_boxes: bool = False,
    ) -> None:
        super().__init__()
        self._h5py = require_package("h5py")
        self.path = Path(boxes)
        self.features_pattern = str(features)
        self.class_probs_pattern = None if class_probs is None else str(class_probs)
        if image_sizes is None and not image_size_from_boxes:
            raise ValueError(
                "VLP feature files hold no image sizes: pass image_sizes={image_id: (height, width)}, or "
                "image_size_from_boxes=True to use each image's largest box coordinates"
            )
        self.image_sizes = image_sizes
        with _open_h5(self._h5py, self.path) as bbox_file:
            self._ids = list(bbox_file.keys())
        self._index = set(self._ids)

    def _dataset(self, pattern: str, image_id: str, what: str) -> np.ndarray:
        path = pattern.format(shard=image_id[-3:]) if "{shard}" in pattern else pattern
        if not os.path.exists(path):
            raise FeatureFileError(f"{what} file {path} for image {image_id!r} does not exist")
        with _open_h5(self._h5py, path) as handle:
            if image_id not in handle:
                raise FeatureFileError(f"{path}: no {what} for image {image_id!r}")
            return _plain_h5_dataset(self._h5py, handle, image_id, path)

    def _read(self, image_id: str) -> RegionFeatures:
        source = f"VLP features of image {image_id!r}"
        with _open_h5(self._h5py, self.path) as bbox_file:
            bbox = np.asarray(_plain_h5_dataset(self._h5py, bbox_file, image_id, self.path), dtype=np.float32)
        if bbox.ndim != 2 or bbox.shape[1] != 6:
            raise FeatureFileError(f"{self.path}: boxes of {image_id!r} should be (N, 6), got {bbox.shape}")
        features = feature_array(
            self._dataset(self.features_pattern, image_id, "feature"), source, "features", np.float32, len(bbox)
        )
        extra = {"scores": bbox[:, 5]}
        if self.class_probs_pattern is not None:
            extra["class_probs"] = feature_array(
                self._dataset(self.class_probs_pattern, image_id, "class-probability"),
                source,
                "class_probs",
                np.float32,
                len(bbox),
            )
        boxes = bbox[:, :4]
        if self.image_sizes is not None:
            if image_id not in self.image_sizes:
                raise FeatureFileError(f"image_sizes has no entry for {image_id!r}")
            image_size = tuple(self.image_sizes[image_id])
        else:
            image_size = (float(boxes[:, 3].max()), float(boxes[:, 2].max()))
        regions = make_regions(source, features=features, boxes=boxes, image_size=image_size, **extra)
        regions.metadata["class_ids"] = bbox[:, 4].astype(np.int64)
        if self.image_sizes is None:
            regions.metadata["image_size_from_boxes"] = True
        return regions
