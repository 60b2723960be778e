"""TDEN's processor: uncased BERT word pieces in two layouts (understanding / generation) + regions with an [IMG]
row (the mean feature at `[0, 0, 1, 1, 1]`) and 5-d locations, as X-modaler's data mappers build them."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Sequence

import torch
from transformers import BatchFeature

from ...processing.processor_base import RegionProcessor, VisionLanguageProcessor, keep_first_regions
from ...processing.processor_base import ProcessorCall, VisionLanguageProcessorKwargs
from ...processing.regions import RegionFeatures

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["TdenRegionProcessor", "TdenProcessor", "TdenProcessorKwargs", "tden_locations", "TEXT_STREAMS"]

# The two text layouts: "understanding" = `[CLS] w [SEP]`, type 0 (VQA, retrieval, pre-training's U stream);
# "generation" = `[CLS] w`, type 1 (captioning inputs: no [SEP], which is the end-of-sentence target instead).
TEXT_STREAMS = ("understanding", "generation")


def tden_locations(regions: RegionFeatures) -> torch.Tensor:
    """`(num_regions, 5)`: `[x1/W, y1/H, x2/W, y2/H, (x2-x1)(y2-y1)/(W*H)]` in float32 (`boxes_to_locfeats`)."""
    boxes = regions.boxes.float()
    height, width = regions.image_size
    area = (boxes[:, 3] - boxes[:, 1]) * (boxes[:, 2] - boxes[:, 0]) / (float(width) * float(height))
    scale = torch.tensor([float(width), float(height), float(width), float(height)], dtype=torch.float32)
    return torch.cat([boxes / scale, area.unsqueeze(1)], dim=1)


class TdenRegionProcessor(RegionProcessor):
    """Regions → TDEN inputs: row 0 is the [IMG] token (the mean of the kept regions' features, location
    `[0, 0, 1, 1, 1]`), then the regions with 5-d locations; `region_attention_mask` counts [IMG].

    X-modaler's data mappers (`read_np_bbox`, the COCO and Conceptual Captions datasets) keep the first
    `MAX_FEAT_NUM - 1` regions of each feature file, whatever their number, and average those for [IMG]:
    `max_regions` is that count, 50 (pre-training, captioning, retrieval, VCR; the default) or 100 (VQA), and
    `region_selection="first_n"` (the default) keeps them the same way (the cut is logged once). With detector
    confidences the regions are first selected as the bottom-up-attention extraction did (`confidence_threshold`,
    `min_regions`, `max_detections`). `region_selection="refuse"` makes more than `max_regions` an error instead.
    """

    location_dim = 5

    def __init__(
        self, max_regions: int | None = 50, max_detections: int = 100, region_selection: str = "first_n", **kwargs: Any
    ) -> None:
        super().__init__(max_regions=max_regions, region_selection=region_selection, **kwargs)
        self.max_detections = max_detections

    def select(self, regions: RegionFeatures) -> RegionFeatures:
        """With detector confidences: X-modaler's extraction (`tools/generate_npz.py`) keeps the boxes with confidence
        >= `confidence_threshold` *in detector order*, or the `min_regions` / `max_detections` most confident ones
        when there are fewer / more; the data mappers then take the first `max_regions`. Without confidences (a
        feature file) the `region_selection` rule: the first `max_regions` ("first_n"), or an error beyond them."""
        if regions.scores is None or self.confidence_threshold is None or self.region_selection == "refuse":
            return super().select(regions)
        scores = regions.scores
        keep = (scores >= self.confidence_threshold).nonzero().flatten()
        by_confidence = torch.sort(scores, descending=True, stable=True).indices
        if len(keep) < self.min_regions:
            keep = by_confidence[: self.min_regions]
        elif len(keep) > self.max_detections:
            keep = by_confidence[: self.max_detections]
        if torch.equal(keep, torch.arange(len(regions))):
            return keep_first_regions(regions, self.max_regions)
        return keep_first_regions(regions.select(keep), self.max_regions)

    def encode_locations(self, regions: RegionFeatures) -> torch.Tensor:
        return tden_locations(regions)

    def add_global_rows(
        self, features: torch.Tensor, locations: torch.Tensor, regions: RegionFeatures
    ) -> tuple[torch.Tensor, torch.Tensor]:
        image_feature = features.sum(dim=0, keepdim=True) / features.shape[0]
        image_location = torch.tensor([[0.0, 0.0, 1.0, 1.0, 1.0]], dtype=locations.dtype)
        return torch.cat([image_feature, features], dim=0), torch.cat([image_location, locations], dim=0)


class TdenProcessorKwargs(VisionLanguageProcessorKwargs, total=False):
    """TDEN's call options: `stream` ("understanding" | "generation") overrides the processor's `text_stream` for
    the call."""

    stream: str | None


class TdenProcessor(VisionLanguageProcessor):
    """TDEN processor: an uncased BERT tokenizer (`bert-base-uncased`) and `TdenRegionProcessor`.

    `processor(text=[...], regions=[RegionFeatures, ...])` → `input_ids`, `attention_mask`, `token_type_ids`,
    `region_features`, `region_locations`, `region_attention_mask`.

    `text_stream` picks the text layout (a setting saved with the processor; `stream=` overrides it per call):
    `"understanding"` gives `[CLS] w [SEP]` of type 0 (VQA, retrieval); `"generation"` gives the captioning input
    `[CLS] w` of type 1, without [SEP] (a caption's trailing "." is dropped, as the original caption files are
    cleaned). Texts longer than `max_text_length` tokens are truncated with a warning. In the generation layout,
    regions without text give the captioning prompt `[CLS]` for `model.generate(**inputs)`.
    """

    valid_processor_kwargs = TdenProcessorKwargs

    def __init__(
        self,
        feature_extractor: TdenRegionProcessor | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        max_text_length: int = 36,
        text_stream: str = "understanding",
        **kwargs: Any,
    ) -> None:
        if text_stream not in TEXT_STREAMS:
            raise ValueError(f"text_stream must be one of {TEXT_STREAMS}, got {text_stream!r}")
        self.text_stream = text_stream
        self._stream = text_stream
        super().__init__(feature_extractor, tokenizer, max_text_length=max_text_length, **kwargs)

    def for_task(self, task: str) -> "TdenProcessor":
        """This processor in the task's text layout: "generation" for "captioning", "understanding" otherwise (a copy
        when the layout changes)."""
        stream = "generation" if task == "captioning" else "understanding"
        if stream == self.text_stream:
            return self
        processor = copy.copy(self)
        processor.text_stream = processor._stream = stream
        return processor

    def model_config_fields(self) -> dict:
        """The token ids generation uses ([PAD], [CLS] = start, [SEP] = end of caption), so a model built for
        another vocabulary than bert-base-uncased fits."""
        tok = self.tokenizer
        return {"pad_token_id": tok.pad_token_id, "bos_token_id": tok.cls_token_id, "eos_token_id": tok.sep_token_id}

    def batch_decode(
        self, sequences: torch.Tensor | Sequence[Sequence[int]], skip_special_tokens: bool = True, **kwargs: Any
    ) -> list[str]:
        """Captions from generated ids (the tokenizer's `batch_decode`, without [CLS], [SEP] and padding by
        default)."""
        return super().batch_decode(sequences, skip_special_tokens=skip_special_tokens, **kwargs)

    @property
    def text_token_type_id(self) -> int:
        return 1 if self._stream == "generation" else 0

    def build_text_inputs(self, word_piece_ids: list[int]) -> tuple[list[int], list[int]]:
        ids = [self.tokenizer.cls_token_id, *word_piece_ids]
        if self._stream == "understanding":
            ids.append(self.tokenizer.sep_token_id)
        return ids, [self.text_token_type_id] * len(ids)

    def encode_call(self, call: ProcessorCall, options: TdenProcessorKwargs) -> BatchFeature:
        """The call in the layout of `options["stream"]` (default: `text_stream`)."""
        stream = options.get("stream")
        stream = self.text_stream if stream is None else stream
        if stream not in TEXT_STREAMS:
            raise ValueError(f"stream must be one of {TEXT_STREAMS}, got {stream!r}")
        if stream == "generation" and call.text is not None:
            texts = [call.text] if isinstance(call.text, str) else list(call.text)
            call = replace(call, text=[t.strip().removesuffix(".").strip() if isinstance(t, str) else t for t in texts])
        self._stream = stream
        try:
            return super().encode_call(call, options)
        finally:
            self._stream = self.text_stream

    def regions_only_text_inputs(self, batch_size: int) -> dict[str, torch.Tensor]:
        """The generation stream's captioning prompt, [CLS]; the understanding stream gives the regions alone."""
        if self._stream != "generation":
            return {}
        prompt = torch.full((batch_size, 1), self.tokenizer.cls_token_id, dtype=torch.long)
        return {"input_ids": prompt, "attention_mask": torch.ones_like(prompt)}
