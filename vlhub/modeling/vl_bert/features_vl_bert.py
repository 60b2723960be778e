"""VL-BERT's precomputed feature files, as a reader registered under the feature format "vl-bert-json"."""

from __future__ import annotations

import json

import numpy as np

from ...processing.regions import RegionFeatures
from ...processing.stores.original import BUTD_TSV_FIELDS, FeatureFileError, FolderReader, butd_record, feature_array

__all__ = ["VlBertJsonReader"]


class VlBertJsonReader(FolderReader):
    """VL-BERT's precomputed features (`vgbua_res101_precomputed/*`, unzipped): one `<image_id>.json` per image with
    `image_w`, `image_h`, `num_boxes`, and base64 float32 `boxes` (N, 4) pixels and `features` (N, 2048); optional
    `classes` (N, 1601) detector class probabilities (Conceptual Captions) → `class_probs`, and
    `image_box_feature` (1, 2048), the whole-image box's feature → `metadata["image_box_feature"]`, which
    VL-BERT's processor uses for object 0 (else the mean of the features, as the original)."""

    suffix, kind = ".json", "VL-BERT json"

    def _read(self, image_id: str) -> RegionFeatures:
        path = self.path / f"{image_id}.json"
        try:
            record = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise FeatureFileError(f"{path}: not a readable json feature file ({err})") from err
        if not isinstance(record, dict):
            raise FeatureFileError(f"{path}: expected a json object, got {type(record).__name__}")
        if "classes" in record:
            record["cls_prob"] = record.pop("classes")
        regions = butd_record(record, str(path), BUTD_TSV_FIELDS)
        if record.get("image_box_feature") is not None:
            feature = feature_array(record["image_box_feature"], str(path), "image_box_feature", np.float32).reshape(-1)
            if feature.shape != (regions.features.shape[1],):
                raise FeatureFileError(
                    f"{path}: image_box_feature has {feature.size} values; the box features have "
                    f"{regions.features.shape[1]}"
                )
            regions.metadata["image_box_feature"] = feature
        return regions
