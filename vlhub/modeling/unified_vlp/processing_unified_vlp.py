"""Unified VLP's processor: cased BERT word pieces laid out around 100 region slots, and the 1607-d region vector."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Sequence

import torch
from torch.nn import functional as F
from transformers import BatchFeature

from ...processing.processor_base import RegionProcessor, VisionLanguageProcessor
from ...processing.processor_base import RegionsArgument
from ...processing.regions import RegionFeatures

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from .configuration_unified_vlp import UnifiedVlpConfig

__all__ = ["UnifiedVlpRegionProcessor", "UnifiedVlpProcessor", "vlp_region_geometry", "vlp_region_locations"]

MODES = ("seq2seq", "bidirectional")


def vlp_region_geometry(regions: RegionFeatures) -> torch.Tensor:
    """`(num_regions, 6)`: `[x1, y1, x2, y2, area, confidence]` as the original loader computes it.

    The boxes are normalised by the largest box coordinate (`max(x1, x2) + 1e-5` over the image's regions, likewise
    for y), not by the image size; the area is taken on the normalised box and clamped at 0.
    """
    if regions.scores is None:
        raise ValueError("Unified VLP's region vector needs the detector confidences (RegionFeatures.scores)")
    boxes = regions.boxes
    width = torch.maximum(boxes[:, 0], boxes[:, 2]).max() + 1e-5
    height = torch.maximum(boxes[:, 1], boxes[:, 3]).max() + 1e-5
    x1, x2 = boxes[:, 0] / width, boxes[:, 2] / width
    y1, y2 = boxes[:, 1] / height, boxes[:, 3] / height
    area = ((y2 - y1) * (x2 - x1)).clamp(min=0)
    return torch.stack([x1, y1, x2, y2, area, regions.scores], dim=1)


def vlp_region_locations(regions: RegionFeatures, num_classes: int = 1601) -> torch.Tensor:
    """`(num_regions, 6 + num_classes)`: the original's `vis_pe`, the geometry and the detector class distribution
    (background first), each layer-normalised without parameters (eps 1e-5), geometry first."""
    if regions.class_probs is None:
        raise ValueError(
            "Unified VLP's region vector needs the detector class probabilities (RegionFeatures.class_probs)"
        )
    if regions.class_probs.shape[1] != num_classes:
        raise ValueError(
            f"Unified VLP expects {num_classes} detector classes (background first), got {regions.class_probs.shape[1]}"
        )
    geometry = F.layer_norm(vlp_region_geometry(regions), [6], eps=1e-5)
    classes = F.layer_norm(regions.class_probs, [num_classes], eps=1e-5)
    return torch.cat([geometry, classes], dim=1)


class UnifiedVlpRegionProcessor(RegionProcessor):
    """Regions → Unified VLP inputs: the `max_regions` (100) most confident detections, their features as given
    and the 1607-d `vis_pe` vector as `region_locations`; always padded to `max_regions` slots (the model has
    that many), padded slots 0 in `region_attention_mask`. The original always had exactly 100 regions."""

    location_dim = 1607  # 6 geometry values + 1601 class probabilities (with the default num_classes)

    def __init__(
        self, num_classes: int = 1601, min_regions: int = 100, max_regions: int | None = 100, **kwargs: Any
    ) -> None:
        if max_regions is None:
            raise ValueError("Unified VLP has a fixed number of region slots: max_regions cannot be None")
        super().__init__(min_regions=min(min_regions, max_regions), max_regions=max_regions, **kwargs)
        self.num_classes = num_classes

    def encode_locations(self, regions: RegionFeatures) -> torch.Tensor:
        return vlp_region_locations(regions, self.num_classes)

    @classmethod
    def settings_from_config(cls, config: UnifiedVlpConfig) -> dict:
        """A model has `config.num_regions` slots and `config.num_region_labels` classes in `vis_pe`."""
        return {"max_regions": config.num_regions, "num_classes": config.num_region_labels}

    def __call__(self, regions: RegionsArgument, return_tensors: str | None = "pt", **kwargs: Any) -> BatchFeature:
        out = super().__call__(regions, return_tensors=return_tensors, **kwargs)
        missing = self.max_regions - out["region_features"].shape[1]
        if missing > 0:  # every example fills all the model's slots
            out["region_features"] = F.pad(out["region_features"], (0, 0, 0, missing))
            out["region_locations"] = F.pad(out["region_locations"], (0, 0, 0, missing))
            out["region_attention_mask"] = F.pad(out["region_attention_mask"], (0, missing))
        return out


class UnifiedVlpProcessor(VisionLanguageProcessor):
    """Unified VLP processor: a cased BERT tokenizer (bert-base-cased, vocabulary 28996) and
    `UnifiedVlpRegionProcessor`.

    Layout `[CLS] [UNK] x N [SEP] w_1 .. w_T [SEP]` (N = the region processor's `max_regions`, 100): the [UNK] slots
    are where the model puts the regions, so text positions start at N + 2 = 102. `mode` picks the segments:
    `"seq2seq"` (captioning: 4 for the image block, 5 for the text) or `"bidirectional"` (VQA: 0 and 1).
    Texts are at most 20 word pieces, as the original (`max_text_length` = N + 23); longer ones are truncated with a
    warning.

    - `processor(regions=..., text=...)` (or `images=`): a caption / question with its image.
    - `processor(regions=...)` (or `images=`) without text: the captioning prompt `[CLS] [UNK] x N [SEP]` for
      `model.generate(**inputs)`.
    - `processor.batch_decode(generated)`: captions, cut at the first [SEP]/[PAD], word pieces merged.
    """

    def __init__(
        self,
        feature_extractor: UnifiedVlpRegionProcessor | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        max_text_length: int | None = None,
        mode: str = "seq2seq",
        **kwargs: Any,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        slots = feature_extractor.max_regions if feature_extractor is not None else 100
        super().__init__(feature_extractor, tokenizer, max_text_length=max_text_length or slots + 23, **kwargs)

    def for_task(self, task: str) -> "UnifiedVlpProcessor":
        """This processor in the task's layout: bidirectional (segments 0/1) for "vqa", seq2seq (4/5) otherwise (a
        copy when the mode changes), as the original fine-tunes VQA with `--s2s_prob 0 --bi_prob 1`."""
        mode = "bidirectional" if task == "vqa" else "seq2seq"
        if mode == self.mode:
            return self
        processor = copy.copy(self)
        processor.mode = mode
        return processor

    def model_config_fields(self) -> dict:
        """The token ids of this processor's layout and of generation ([PAD], [CLS], [SEP] = end of caption, the
        region placeholder [UNK], [MASK]), so a model built for another vocabulary than bert-base-cased fits."""
        tok = self.tokenizer
        return {
            "pad_token_id": tok.pad_token_id,
            "bos_token_id": tok.cls_token_id,
            "eos_token_id": tok.sep_token_id,
            "region_token_id": tok.unk_token_id,
            "mask_token_id": tok.mask_token_id,
        }

    @property
    def num_regions(self) -> int:
        return self.feature_extractor.max_regions

    def _types(self) -> tuple[int, int]:
        return (4, 5) if self.mode == "seq2seq" else (0, 1)

    def _image_block(self) -> list[int]:
        tok = self.tokenizer
        return [tok.cls_token_id, *[tok.unk_token_id] * self.num_regions, tok.sep_token_id]

    def build_text_inputs(self, word_piece_ids: list[int]) -> tuple[list[int], list[int]]:
        image_type, text_type = self._types()
        image = self._image_block()
        text = [*word_piece_ids, self.tokenizer.sep_token_id]
        return image + text, [image_type] * len(image) + [text_type] * len(text)

    def regions_only_text_inputs(self, batch_size: int) -> dict[str, torch.Tensor]:
        """The captioning prompt: the image block ([CLS], the region slots, [SEP])."""
        prompt = torch.tensor(self._image_block()).expand(batch_size, -1).clone()
        return {
            "input_ids": prompt,
            "attention_mask": torch.ones_like(prompt),
            "token_type_ids": torch.full_like(prompt, self._types()[0]),
        }

    def _caption_pieces(self, ids) -> list[int]:
        ids = [int(i) for i in ids]
        if len(ids) > self.num_regions + 2 and ids[: self.num_regions + 2] == self._image_block():
            ids = ids[self.num_regions + 2 :]  # generate() returns the prompt too
        stops = {self.tokenizer.sep_token_id, self.tokenizer.pad_token_id}
        for i, token in enumerate(ids):
            if token in stops:
                return ids[:i]
        return ids

    def batch_decode(
        self, sequences: torch.Tensor | Sequence[Sequence[int]], skip_special_tokens: bool = True, **kwargs: Any
    ) -> list[str]:
        """Captions from generated ids `(batch, length)` (with or without the prompt), as the original prints them:
        cut at the first [SEP] or [PAD], tokens joined by spaces with "##" pieces merged ("run ##ning" →
        "running"), cased as generated. `skip_special_tokens` drops other special tokens ([UNK], [MASK], ...)."""
        if kwargs:
            raise TypeError(f"unexpected argument(s) {sorted(kwargs)} for {type(self).__name__}.batch_decode")
        special = set(self.tokenizer.all_special_ids) if skip_special_tokens else set()
        captions = []
        for row in sequences:
            words: list[str] = []
            for token in self.tokenizer.convert_ids_to_tokens(
                [t for t in self._caption_pieces(row) if t not in special]
            ):
                if token.startswith("##") and words:
                    words[-1] += token[2:]
                else:
                    words.append(token)
            captions.append(" ".join(words))
        return captions

    def decode(self, sequence: torch.Tensor | Sequence[int], skip_special_tokens: bool = True, **kwargs: Any) -> str:
        return self.batch_decode([sequence], skip_special_tokens=skip_special_tokens, **kwargs)[0]

    def post_process_image_text_to_text(
        self, generated_outputs: torch.Tensor | Sequence[Sequence[int]], skip_special_tokens: bool = True, **kwargs: Any
    ) -> list[str]:
        return self.batch_decode(generated_outputs, skip_special_tokens=skip_special_tokens, **kwargs)
