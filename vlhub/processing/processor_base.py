"""What every vlhub processor shares: region selection and padding, text preparation, and images → regions.

An architecture's processor is `VisionLanguageProcessor` with a tokenizer and a `RegionProcessor` subclass that
knows that architecture's location encoding (UNITER's 7-d box, ViLBERT's 5-d box, ...). The quirks live with
their architecture; the plumbing lives here once.
"""

from __future__ import annotations

import os
import warnings
from typing import Sequence

import torch
from transformers import BatchFeature
from transformers.feature_extraction_utils import FeatureExtractionMixin
from transformers.processing_utils import ProcessorMixin

from .region_extractors import HUB_KWARGS, REGION_EXTRACTOR_FOLDER, load_region_extractor
from .regions import RegionFeatures

__all__ = ["RegionProcessor", "VisionLanguageProcessor", "select_regions", "load_region_extractor", "REGION_EXTRACTOR_FOLDER"]


def select_regions(
    regions: RegionFeatures,
    confidence_threshold: float | None,
    min_regions: int,
    max_regions: int | None,
) -> RegionFeatures:
    """The bottom-up-attention selection the originals apply to raw detector output.

    With detector confidences and a threshold: order regions by confidence (descending, ties keep their order) and
    keep `clamp(#(confidence > threshold), min_regions, max_regions)` of them. Without confidences (or with
    `confidence_threshold=None`) regions are kept as given, and more than `max_regions` of them is an error rather
    than a silent cut.
    """
    if regions.scores is None or confidence_threshold is None:
        if max_regions is not None and len(regions) > max_regions:
            raise ValueError(
                f"got {len(regions)} regions but this processor allows at most max_regions={max_regions}; select "
                "regions first, or pass detector confidences (scores) so the processor can select by confidence"
            )
        return regions
    order = torch.sort(regions.scores, descending=True, stable=True).indices
    count = int((regions.scores > confidence_threshold).sum())
    count = max(count, min_regions)
    if max_regions is not None:
        count = min(count, max_regions)
    count = min(count, len(regions))
    if torch.equal(order[:count], torch.arange(count)) and count == len(regions):
        return regions
    return regions.select(order[:count])


class RegionProcessor(FeatureExtractionMixin):
    """Turns `RegionFeatures` into padded model inputs: `region_features` `(batch, R, F)`, `region_locations`
    `(batch, R, location_dim)`, `region_attention_mask` `(batch, R)`.

    Subclasses define `encode_locations` (and may override `encode_features`). Settings are JSON attributes saved
    with the processor; `region_extractor_folder` names the sub-folder that holds the processor's region extractor,
    if any (set by `VisionLanguageProcessor.region_extractor`; older folders call it `region_extractor`).
    """

    model_input_names = ["region_features", "region_locations", "region_attention_mask"]
    location_dim: int = 4

    def __init__(
        self,
        region_feature_dim: int = 2048,
        confidence_threshold: float | None = 0.2,
        min_regions: int = 10,
        max_regions: int | None = 100,
        region_extractor_folder: str | None = None,
        **kwargs,
    ):
        legacy_folder = kwargs.pop("region_extractor", None)  # the setting's name in processors saved before
        super().__init__(**kwargs)
        if min_regions < 1:
            raise ValueError(f"min_regions must be at least 1, got {min_regions}")
        if max_regions is not None and max_regions < min_regions:
            raise ValueError(f"max_regions ({max_regions}) must be >= min_regions ({min_regions})")
        self.region_feature_dim = region_feature_dim
        self.confidence_threshold = confidence_threshold
        self.min_regions = min_regions
        self.max_regions = max_regions
        self.region_extractor_folder = region_extractor_folder if region_extractor_folder is not None else legacy_folder

    # -- per-architecture hooks ------------------------------------------------------------------------------
    def encode_locations(self, regions: RegionFeatures) -> torch.Tensor:
        """`(num_regions, location_dim)` location vector of each region."""
        raise NotImplementedError

    def encode_features(self, regions: RegionFeatures) -> torch.Tensor:
        """`(num_regions, feature_dim)` features as the model consumes them."""
        return regions.features

    # -- shared -----------------------------------------------------------------------------------------------
    def select(self, regions: RegionFeatures) -> RegionFeatures:
        return select_regions(regions, self.confidence_threshold, self.min_regions, self.max_regions)

    def __call__(self, regions, return_tensors: str | None = "pt", **kwargs) -> BatchFeature:
        if kwargs:
            raise TypeError(f"unexpected argument(s) {sorted(kwargs)} for {type(self).__name__}")
        if return_tensors not in (None, "pt"):
            raise ValueError(f"vlhub processors return PyTorch tensors; return_tensors must be 'pt', got {return_tensors!r}")
        batch = [regions] if isinstance(regions, RegionFeatures) else list(regions)
        if not batch:
            raise ValueError("no regions given: pass one RegionFeatures per example")
        features, locations = [], []
        for i, item in enumerate(batch):
            if not isinstance(item, RegionFeatures):
                raise TypeError(f"regions[{i}] must be a vlhub.RegionFeatures, got {type(item).__name__}")
            if item.feature_dim != self.region_feature_dim:
                raise ValueError(
                    f"regions[{i}] has {item.feature_dim}-d features but this processor (and its model) expects "
                    f"{self.region_feature_dim}-d features"
                )
            selected = self.select(item)
            features.append(self.encode_features(selected))
            locations.append(self.encode_locations(selected))
        num_regions = max(f.shape[0] for f in features)
        batch_size = len(features)
        region_features = torch.zeros(batch_size, num_regions, self.region_feature_dim)
        region_locations = torch.zeros(batch_size, num_regions, locations[0].shape[1])
        region_attention_mask = torch.zeros(batch_size, num_regions, dtype=torch.long)
        for i, (feat, loc) in enumerate(zip(features, locations)):
            region_features[i, : feat.shape[0]] = feat
            region_locations[i, : loc.shape[0]] = loc
            region_attention_mask[i, : feat.shape[0]] = 1
        return BatchFeature(
            {
                "region_features": region_features,
                "region_locations": region_locations,
                "region_attention_mask": region_attention_mask,
            }
        )


class VisionLanguageProcessor(ProcessorMixin):
    """A word-piece tokenizer plus a `RegionProcessor` (and optionally a region extractor for raw images).

    Call as `processor(text=[...], regions=[RegionFeatures, ...], return_tensors="pt")`, or with `images=` when the
    processor carries a region extractor. One text per image. Returns `input_ids`, `attention_mask`,
    `token_type_ids` `(batch, T)` and the region processor's outputs.

    Text longer than `max_text_length` tokens (special tokens included) is **truncated with a warning** (the
    original data pipelines dropped such examples instead); an empty text is an error.
    """

    def __init__(self, feature_extractor=None, tokenizer=None, max_text_length: int = 60, **kwargs):
        if max_text_length < 3:
            raise ValueError(f"max_text_length must leave room for [CLS] w [SEP], got {max_text_length}")
        self.max_text_length = max_text_length
        super().__init__(feature_extractor, tokenizer, **kwargs)
        self._region_extractor = None

    # -- images → regions -------------------------------------------------------------------------------------
    @property
    def region_extractor(self):
        """The region extractor that turns images into `RegionFeatures` (None when the processor has none). Saved
        with the processor in the sub-folder `region_extractor/`; see `vlhub.processing.region_extractors`."""
        return self._region_extractor

    @region_extractor.setter
    def region_extractor(self, extractor):
        self._region_extractor = extractor
        self.feature_extractor.region_extractor_folder = REGION_EXTRACTOR_FOLDER if extractor is not None else None

    def regions_from_images(self, images) -> list[RegionFeatures]:
        if self._region_extractor is None:
            raise ValueError(
                "this processor has no region extractor, so it cannot take images: pass regions=RegionFeatures(...) "
                "(e.g. read from a feature file), or attach one with `processor.region_extractor = ...`"
            )
        regions = self._region_extractor(images)
        return [regions] if isinstance(regions, RegionFeatures) else list(regions)

    def save_pretrained(self, save_directory, push_to_hub: bool = False, **kwargs):
        if self._region_extractor is not None:
            os.makedirs(save_directory, exist_ok=True)
            self._region_extractor.save_pretrained(os.path.join(save_directory, REGION_EXTRACTOR_FOLDER))
        return super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        processor = super().from_pretrained(pretrained_model_name_or_path, **kwargs)
        subfolder = getattr(processor.feature_extractor, "region_extractor_folder", None)
        if subfolder:
            hub_kwargs = {k: kwargs[k] for k in HUB_KWARGS if k in kwargs}
            processor._region_extractor = load_region_extractor(pretrained_model_name_or_path, subfolder, **hub_kwargs)
        return processor

    # -- text ---------------------------------------------------------------------------------------------------
    def _encode_text(self, text, token_ids) -> list[list[int]]:
        tokenizer = self.tokenizer
        if text is not None and token_ids is not None:
            raise ValueError("pass either text or token_ids, not both")
        if text is not None:
            texts = [text] if isinstance(text, str) else list(text)
            for i, t in enumerate(texts):
                if not isinstance(t, str):
                    raise TypeError(f"text[{i}] must be a string, got {type(t).__name__}")
                if not t.strip():
                    raise ValueError(f"text[{i}] is empty; a question or caption needs at least one word")
            encoded = tokenizer(texts, add_special_tokens=True, truncation=False)["input_ids"]
        else:
            ids = [token_ids] if token_ids and isinstance(token_ids[0], int) else list(token_ids)
            for i, row in enumerate(ids):
                if len(row) == 0:
                    raise ValueError(f"token_ids[{i}] is empty; a text needs at least one word piece")
            encoded = [[tokenizer.cls_token_id, *map(int, row), tokenizer.sep_token_id] for row in ids]
        for i, row in enumerate(encoded):
            if len(row) > self.max_text_length:
                warnings.warn(
                    f"text {i} has {len(row)} tokens with [CLS]/[SEP]; truncated to max_text_length="
                    f"{self.max_text_length}",
                    stacklevel=3,
                )
                encoded[i] = row[: self.max_text_length - 1] + [tokenizer.sep_token_id]
        return encoded

    def __call__(
        self,
        text: str | Sequence[str] | None = None,
        regions: RegionFeatures | Sequence[RegionFeatures] | None = None,
        images=None,
        token_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
        return_tensors: str | None = "pt",
        **kwargs,
    ) -> BatchFeature:
        """text: a string or a list of strings (one per image). token_ids: instead of text, word-piece ids without
        [CLS]/[SEP] (as the original text databases store them). regions: one `RegionFeatures` per text. images:
        instead of regions, images for the region extractor (paths, PIL images or arrays).
        """
        if kwargs:
            raise TypeError(f"unexpected argument(s) {sorted(kwargs)}; expected text/token_ids, regions/images")
        if regions is not None and images is not None:
            raise ValueError("pass either regions or images, not both")
        if images is not None:
            regions = self.regions_from_images(images)
        data = {}
        num_texts = None
        if text is not None or token_ids is not None:
            encoded = self._encode_text(text, token_ids)
            num_texts = len(encoded)
            length = max(len(row) for row in encoded)
            pad = self.tokenizer.pad_token_id or 0
            input_ids = torch.full((num_texts, length), pad, dtype=torch.long)
            attention_mask = torch.zeros((num_texts, length), dtype=torch.long)
            for i, row in enumerate(encoded):
                input_ids[i, : len(row)] = torch.tensor(row)
                attention_mask[i, : len(row)] = 1
            data.update(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=torch.zeros_like(input_ids)
            )
        if regions is not None:
            region_inputs = self.feature_extractor(regions, return_tensors=return_tensors)
            if num_texts is not None and region_inputs["region_features"].shape[0] != num_texts:
                raise ValueError(
                    f"got {num_texts} texts but {region_inputs['region_features'].shape[0]} images: pass one text per "
                    "image (repeat the image or the text to pair them)"
                )
            data.update(region_inputs)
        if not data:
            raise ValueError("nothing to process: pass text (or token_ids) and/or regions (or images)")
        return BatchFeature(data, tensor_type=return_tensors)

    @property
    def model_input_names(self):
        return ["input_ids", "attention_mask", "token_type_ids", *RegionProcessor.model_input_names]

