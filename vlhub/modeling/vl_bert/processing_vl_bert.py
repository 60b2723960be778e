"""VL-BERT's processor: uncased BERT word pieces + objects with the whole image as object 0 and box geometry
normalised in the resized image, as the original data loaders prepare them (`vqa/data/datasets/vqa.py`,
`refcoco/data/datasets/refcoco.py`, `*/data/transforms/transforms.py`)."""

from __future__ import annotations

import copy

import torch

from ...processing.processor_base import RegionProcessor, VisionLanguageProcessor
from ...processing.regions import RegionFeatures

__all__ = ["VlBertRegionProcessor", "VlBertProcessor", "vl_bert_resized_size", "vl_bert_locations"]


def vl_bert_resized_size(width: int, height: int, min_size: int = 600, max_size: int | None = 1000) -> tuple[int, int]:
    """`(width, height)` of the image the original resizes to: short side `min_size`, long side at most `max_size`,
    int-truncated (the original `Resize.get_size`)."""
    size = min_size
    if max_size is not None:
        short, long = float(min(width, height)), float(max(width, height))
        if long / short * size > max_size:
            size = int(max_size * short / long)
    if (width <= height and width == size) or (height <= width and height == size):
        return width, height
    if width < height:
        return size, int(size * height / width)
    return int(size * width / height), size


def vl_bert_locations(
    boxes: torch.Tensor, image_size: tuple[int, int], min_size: int = 600, max_size: int | None = 1000
) -> torch.Tensor:
    """`(R, 4)` = `(x_center / W, y_center / H, width / W, height / H)` of `boxes` `(R, 4)` (x1, y1, x2, y2 in pixels of
    the image of `image_size` = (height, width)), computed as the original does: boxes scaled to the resized image
    (`vl_bert_resized_size`, W x H), clamped to `[0, W-1] x [0, H-1]`, then converted (width = x2 - x1, no +1)."""
    height0, width0 = (int(round(v)) for v in image_size)
    width, height = vl_bert_resized_size(width0, height0, min_size, max_size)
    boxes = boxes.float().clone()
    # The original multiplies its float32 boxes by Python-float ratios and clamps in float32.
    boxes[:, [0, 2]] = (boxes[:, [0, 2]] * (width * 1.0 / width0)).clamp(min=0, max=width - 1)
    boxes[:, [1, 3]] = (boxes[:, [1, 3]] * (height * 1.0 / height0)).clamp(min=0, max=height - 1)
    x_center, y_center = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
    box_width, box_height = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    return torch.stack([x_center / width, y_center / height, box_width / width, box_height / height], dim=1)


class VlBertRegionProcessor(RegionProcessor):
    """Regions → VL-BERT inputs: `region_features` `(batch, 1 + R, F)`, `region_locations` `(batch, 1 + R, 4)`,
    `region_attention_mask`.

    Object 0 is the whole image (`ADD_IMAGE_AS_A_BOX`): the box `[0, 0, w-1, h-1]` with the mean of the region
    features (the original's default when a feature file has no `image_box_feature`). Regions are kept in the order
    given (the released VQA features were selected at extraction, 10-100 per image; more than `max_regions` is an
    error); with `confidence_threshold` set and detector scores present they are selected by confidence
    (`min_regions`..`max_regions`) as the other architectures do. Boxes are normalised
    in the image the original resizes to (`min_size` 600, `max_size` 1000; VCR used 1200).
    """

    location_dim = 4

    def __init__(
        self,
        min_size: int = 600,
        max_size: int | None = 1000,
        confidence_threshold: float | None = None,
        min_regions: int = 1,
        max_regions: int | None = 100,
        **kwargs,
    ):
        super().__init__(
            confidence_threshold=confidence_threshold, min_regions=min_regions, max_regions=max_regions, **kwargs
        )
        if min_size < 1 or (max_size is not None and max_size < min_size):
            raise ValueError(f"need 1 <= min_size <= max_size, got min_size={min_size}, max_size={max_size}")
        self.min_size = min_size
        self.max_size = max_size

    def encode_locations(self, regions: RegionFeatures) -> torch.Tensor:
        return vl_bert_locations(regions.boxes, regions.image_size, self.min_size, self.max_size)

    def add_global_rows(self, features, locations, regions: RegionFeatures):
        if len(regions) == 0:
            raise ValueError("VL-BERT needs at least one region: the whole-image feature is their mean")
        height, width = (int(round(v)) for v in regions.image_size)
        image_box = torch.tensor([[0.0, 0.0, width - 1.0, height - 1.0]])
        image_location = vl_bert_locations(image_box, regions.image_size, self.min_size, self.max_size)
        image_feature = features.mean(dim=0, keepdim=True)
        return torch.cat([image_feature, features]), torch.cat([image_location, locations])


class VlBertProcessor(VisionLanguageProcessor):
    """VL-BERT processor: an uncased BERT tokenizer (`bert-base-uncased`, vocabulary 30522) and
    `VlBertRegionProcessor`.

    `processor(text=[...], regions=[RegionFeatures, ...], return_tensors="pt")` → `input_ids`, `attention_mask`,
    `token_type_ids`, `region_features`, `region_locations`, `region_attention_mask`.

    With `answer_slot=True` (VQA models) a question is laid out `[CLS] q [SEP] [MASK] [SEP]`, the `[MASK]` and its
    `[SEP]` of token type 1: the model reads the answer from the `[MASK]` output. Otherwise (pre-training, RefCOCO+)
    `[CLS] text [SEP]`, all of type 0. The objects and `[END]` are not text tokens: the model adds them.
    """

    def __init__(
        self, feature_extractor=None, tokenizer=None, max_text_length: int = 64, answer_slot: bool = False, **kwargs
    ):
        self.answer_slot = answer_slot
        super().__init__(feature_extractor, tokenizer, max_text_length=max_text_length, **kwargs)

    def for_task(self, task: str) -> "VlBertProcessor":
        """This processor with the answer slot on for "vqa" and off for the other tasks (a copy if it changes)."""
        answer_slot = task == "vqa"
        if answer_slot == self.answer_slot:
            return self
        processor = copy.copy(self)
        processor.answer_slot = answer_slot
        return processor

    def build_text_inputs(self, word_piece_ids: list[int]) -> tuple[list[int], list[int]]:
        if not self.answer_slot:
            return super().build_text_inputs(word_piece_ids)
        tok = self.tokenizer
        question = [tok.cls_token_id, *word_piece_ids, tok.sep_token_id]
        return [*question, tok.mask_token_id, tok.sep_token_id], [0] * len(question) + [1, 1]
