"""ViLBERT's processor: uncased BERT word pieces, regions with a global image token first and 5-d locations, and
the 12-in-1 task token."""

from __future__ import annotations

import torch
from transformers import BatchFeature

from ...processing.processor_base import RegionProcessor, VisionLanguageProcessor, select_regions
from ...processing.regions import RegionFeatures

__all__ = ["VilbertRegionProcessor", "VilbertProcessor", "vilbert_locations", "GLOBAL_TOKEN_LOCATION"]

# The location of the global image token (the whole image, area 1).
GLOBAL_TOKEN_LOCATION = (0.0, 0.0, 1.0, 1.0, 1.0)


def vilbert_locations(regions: RegionFeatures) -> torch.Tensor:
    """`(num_regions, 5)`: `[x1/W, y1/H, x2/W, y2/H, (x2-x1)(y2-y1)/(W*H)]` in float32, as the original's
    `ImageFeaturesH5Reader` computes them from absolute boxes."""
    boxes = regions.boxes.float()
    height, width = regions.image_size
    area = (boxes[:, 3] - boxes[:, 1]) * (boxes[:, 2] - boxes[:, 0]) / (float(width) * float(height))
    return torch.stack(
        [boxes[:, 0] / width, boxes[:, 1] / height, boxes[:, 2] / width, boxes[:, 3] / height, area], dim=1
    )


class VilbertRegionProcessor(RegionProcessor):
    """Regions → ViLBERT inputs: row 0 is the global image token (the mean of the region features, location
    `[0, 0, 1, 1, 1]`), then the regions in the order given, with 5-d locations.

    `max_regions` counts every row, the global token included (the original's `max_region_num`, 101 = 100 detected
    regions + the global token). By default regions are taken as given (the releases use the detector's 100 boxes,
    or 10-36 for the beta features); more than `max_regions - 1` is an error, not a silent cut. With
    `confidence_threshold` set and detector scores present, regions are selected by confidence as
    `clamp(#(score > threshold), min_regions, max_regions - 1)`.
    """

    location_dim = 5

    def __init__(self, region_feature_dim: int = 2048, confidence_threshold: float | None = None,
                 min_regions: int = 1, max_regions: int | None = 101, **kwargs):
        if max_regions is not None and max_regions < 2:
            raise ValueError(f"max_regions counts the global image token too; it must be at least 2, got {max_regions}")
        super().__init__(region_feature_dim=region_feature_dim, confidence_threshold=confidence_threshold,
                         min_regions=min_regions, max_regions=max_regions, **kwargs)

    def select(self, regions: RegionFeatures) -> RegionFeatures:
        detected = None if self.max_regions is None else self.max_regions - 1
        if detected is not None and len(regions) > detected and (regions.scores is None or self.confidence_threshold is None):
            raise ValueError(
                f"got {len(regions)} regions but this processor allows at most max_regions={self.max_regions} rows, "
                f"the global image token included ({detected} regions); select regions first, raise max_regions, or "
                "set confidence_threshold so that regions are selected by detector confidence"
            )
        return select_regions(regions, self.confidence_threshold, min(self.min_regions, detected or self.min_regions),
                              detected)

    def encode_locations(self, regions: RegionFeatures) -> torch.Tensor:
        return vilbert_locations(regions)

    def encode_features(self, regions: RegionFeatures) -> torch.Tensor:
        return regions.features.float()

    def add_global_rows(self, features, locations, regions):
        if features.shape[0] == 0:
            raise ValueError("an image without regions has no global image token (the mean of its region features)")
        global_feature = features.sum(dim=0, keepdim=True) / features.shape[0]
        global_location = torch.tensor([GLOBAL_TOKEN_LOCATION], dtype=locations.dtype)
        return torch.cat([global_feature, features]), torch.cat([global_location, locations])


class VilbertProcessor(VisionLanguageProcessor):
    """ViLBERT processor: an uncased BERT tokenizer (`bert-base-uncased`) and `VilbertRegionProcessor`.

    `processor(text=[...], regions=[RegionFeatures, ...], return_tensors="pt")` (or `images=` with a region
    extractor) → `input_ids`, `attention_mask`, `token_type_ids` (`[CLS] text [SEP]`, type 0), `region_features`,
    `region_locations`, `region_attention_mask`; for a multi-task model (`num_task_tokens > 0`) also `task_ids`
    `(batch, 1)`, from `task_id=` (a call argument, or the processor's default `task_id` setting; 12-in-1 task
    numbers: 1 VQA, 7/8 retrieval COCO/Flickr30k, 9-11 RefCOCO/+/g, 12 NLVR2, 13 SNLI-VE, 15 GQA, ...).

    Texts longer than `max_text_length` (36, the pre-training length; the releases' tasks use 16-80) are truncated
    with a warning, keeping [SEP].
    """

    def __init__(self, feature_extractor=None, tokenizer=None, max_text_length: int = 36, num_task_tokens: int = 0,
                 task_id: int | None = None, **kwargs):
        if num_task_tokens < 0:
            raise ValueError(f"num_task_tokens must be >= 0, got {num_task_tokens}")
        self.num_task_tokens = num_task_tokens
        self.task_id = task_id
        if task_id is not None:
            self._check_task_id(task_id)
        super().__init__(feature_extractor, tokenizer, max_text_length=max_text_length, **kwargs)

    def _check_task_id(self, task_id) -> int:
        if self.num_task_tokens == 0:
            raise ValueError("task_id was given but this processor's model has no task tokens (num_task_tokens = 0)")
        if isinstance(task_id, bool) or not isinstance(task_id, int) or not 0 <= task_id < self.num_task_tokens:
            raise ValueError(f"task_id must be an integer in 0..{self.num_task_tokens - 1} (the checkpoint's task "
                             f"tokens), got {task_id!r}")
        return task_id

    def __call__(self, text=None, regions=None, images=None, token_ids=None, return_tensors="pt",
                 task_id: int | None = None, **kwargs) -> BatchFeature:
        """As `VisionLanguageProcessor.__call__`, plus `task_id` (multi-task models): the 12-in-1 task number of
        every example of the call; defaults to the processor's `task_id` setting."""
        if task_id is None:
            task_id = self.task_id
        if task_id is not None:
            self._check_task_id(task_id)
        elif self.num_task_tokens > 0:
            raise ValueError(
                f"this processor belongs to a multi-task ViLBERT (task tokens for task ids 0..{self.num_task_tokens - 1}):"
                " pass task_id= (e.g. 1 for VQA, 15 for GQA, 8 for Flickr30k retrieval) or set processor.task_id"
            )
        outputs = super().__call__(text=text, regions=regions, images=images, token_ids=token_ids,
                                   return_tensors=return_tensors, **kwargs)
        if task_id is not None and "input_ids" in outputs:
            outputs["task_ids"] = torch.full((outputs["input_ids"].shape[0], 1), task_id, dtype=torch.long)
        return outputs

    @property
    def model_input_names(self):
        names = super().model_input_names
        return [*names, "task_ids"] if self.num_task_tokens > 0 else names
