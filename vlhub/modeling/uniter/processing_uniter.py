"""UNITER's processor: cased BERT word pieces + regions with UNITER's 7-d location vector."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...processing.processor_base import RegionProcessor, VisionLanguageProcessor
from ...processing.regions import FLOAT16_FEATURES, RegionFeatures, check_float16_range

__all__ = ["UniterRegionProcessor", "UniterProcessor", "uniter_locations"]


def uniter_locations(regions: RegionFeatures, float16_storage: bool = True) -> torch.Tensor:
    """`(num_regions, 7)`: `[x1/W, y1/H, x2/W, y2/H, w/W, h/H, (w/W)*(h/H)]`.

    Computed as the original feature extractor does (x2/W as x1/W + w/W, in float32). With `float16_storage` the
    first six values are rounded to float16, as the original feature files store them, before the area is
    appended in float32 — the released models saw exactly these numbers.
    """
    # In numpy: the same float32 operations (IEEE, correctly rounded, as PyTorch's; float16 rounding to nearest even
    # in both) at a third of the per-op cost of tensors this small.
    boxes = regions.boxes.numpy()
    height, width = regions.image_size
    size = np.array([width, height], dtype=boxes.dtype)
    corner = boxes[:, :2] / size  # x1/W, y1/H
    extent = (boxes[:, 2:] - boxes[:, :2]) / size  # w/W, h/H
    stored = np.concatenate([corner, corner + extent, extent], axis=1)
    if float16_storage:
        stored = stored.astype(np.float16).astype(np.float32)
    return torch.from_numpy(np.concatenate([stored, stored[:, 4:5] * stored[:, 5:6]], axis=1))


class UniterRegionProcessor(RegionProcessor):
    """Regions → UNITER inputs.

    Selection as the original's feature databases: `clamp(#(conf > 0.2), 10, 100)` regions counted by detector
    confidence, the first that many in the order given (`region_selection="count_by_confidence"`, the default;
    settings `confidence_threshold`, `min_regions`, `max_regions`; the referring-expression configs' `conf_th -1`
    is `region_selection="first_n"` with `max_regions=num_bb`). With `float16_storage=True` (default) features
    and normalised boxes are rounded to float16 as the original feature files store them.
    """

    location_dim = 7

    def __init__(
        self, float16_storage: bool = True, region_selection: str = "count_by_confidence", **kwargs: Any
    ) -> None:
        super().__init__(region_selection=region_selection, **kwargs)
        self.float16_storage = float16_storage

    def encode_locations(self, regions: RegionFeatures) -> torch.Tensor:
        return uniter_locations(regions, self.float16_storage)

    def encode_features(self, regions: RegionFeatures) -> torch.Tensor:
        if not self.float16_storage or regions.metadata.get(FLOAT16_FEATURES):  # float16 values already
            return regions.features
        check_float16_range(regions.features, "features")  # beyond 65504 the rounding would give inf
        return regions.features.half().float()


class UniterProcessor(VisionLanguageProcessor):
    """UNITER processor: a cased BERT tokenizer (`bert-base-cased`, vocabulary 28996) and `UniterRegionProcessor`.

    `processor(text=[...], regions=[RegionFeatures, ...], return_tensors="pt")` → `input_ids`, `attention_mask`,
    `token_type_ids`, `region_features`, `region_locations`, `region_attention_mask`. Texts longer than
    `max_text_length` tokens (60 by default; a converted model's is the training config's `max_txt_len` word pieces
    plus [CLS] and [SEP]) are truncated with a warning.

    UNITER's layout is the base processor's default (`build_text_inputs`: `[CLS] w [SEP]`, token type 0) and it adds
    no global region row; only the region encodings (`UniterRegionProcessor`) are its own (its settings are the base
    processor's).
    """
