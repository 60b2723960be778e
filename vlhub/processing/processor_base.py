"""What every vlhub processor shares: region selection and padding, text layout and padding, and images → regions.

An architecture's processor is a `VisionLanguageProcessor` subclass with a tokenizer and a `RegionProcessor`
subclass. The quirks live with their architecture, in hooks; the plumbing (validation, selection, truncation,
padding, masks, saving, the region extractor) lives here once.

Hooks an architecture overrides (defaults in brackets):

- `VisionLanguageProcessor.build_text_inputs(word_piece_ids) -> (input_ids, token_type_ids)`: one example's token
  sequence from its word pieces [`[CLS] w [SEP]`, every token of type `text_token_type_id`]. VL-BERT adds its
  answer `[MASK]` slot, VLP its region slots and segment ids, TDEN its generation stream. It must add the same
  number of tokens to every example; truncation removes word pieces until the result fits `max_text_length`.
- `VisionLanguageProcessor.text_token_type_id` [0]: the token type of the default layout.
- `VisionLanguageProcessor.encode_call(call, options) -> BatchFeature` [the inputs encoded]: one call's inputs
  (`ProcessorCall`) with the architecture's own keyword options, the typed fields of its `valid_processor_kwargs`
  (a `VisionLanguageProcessorKwargs`) merged by transformers' `_merge_kwargs` (TDEN: `stream`; ViLBERT: `task_id`,
  `ground_truth`; VL-BERT: `boxes`). Keywords no field declares are an error before it is called.
- `RegionProcessor.encode_locations(regions) -> (R, location_dim)` [required]: the architecture's box encoding.
- `RegionProcessor.select(regions) -> RegionFeatures` [the `region_selection` rule up to `max_regions`]: which of an
  image's regions are kept (ViLBERT notes the mean of all for its global token, TDEN applies its extraction rule).
- `RegionProcessor.encode_features(regions) -> (R, F)` [the features as given].
- `RegionProcessor.add_global_rows(features, locations, regions) -> (features, locations)` [unchanged]: rows
  added to one example's encoded regions before padding, in step (ViLBERT/TDEN: the mean feature with location
  `[0,0,1,1,1]` as row 0; VL-BERT: the whole-image box as object 0). They count as real regions in
  `region_attention_mask`.

Masks are 2-D 0/1 `(batch, length)`; the models build the 4-D attention masks (transformers' `masking_utils`).
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence, Unpack

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import BatchEncoding, BatchFeature
from transformers.feature_extraction_utils import FeatureExtractionMixin
from transformers.processing_utils import ProcessingKwargs, ProcessorMixin
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from .region_extractors import HUB_KWARGS, REGION_EXTRACTOR_FOLDER, load_region_extractor
from ..utils.arguments import check_positive_int, check_token_ids
from ..utils.tensors import all_finite
from .regions import FLOAT16_FEATURES, RegionFeatures, mark_float16_exact

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

    from .region_extractors import RegionExtractorLike

__all__ = [
    "RegionProcessor",
    "VisionLanguageProcessor",
    "VisionLanguageProcessorKwargs",
    "ProcessorCall",
    "select_regions",
    "keep_first_regions",
    "check_text",
    "load_region_extractor",
    "REGION_EXTRACTOR_FOLDER",
    "REGION_SELECTIONS",
    "CUT_FROM",
    "pad_text_rows",
    "TextArgument",
    "RegionsArgument",
    "TokenIdsArgument",
]

logger = logging.getLogger(__name__)

# What a processor call takes: one text or a batch; one image's regions or a batch; one text's word-piece ids or a
# batch of them.
TextArgument = str | Sequence[str]
RegionsArgument = RegionFeatures | Sequence[RegionFeatures]
TokenIdsArgument = Sequence[int] | Sequence[Sequence[int]]


class VisionLanguageProcessorKwargs(ProcessingKwargs, total=False):
    """The keyword options of a vlhub processor call, in transformers' `ProcessingKwargs` groups.

    Every processor honours `return_tensors` ("pt" by default, "np", or None), given flat or in `common_kwargs`,
    `text_kwargs` or `images_kwargs` (one value for the whole call); the groups' other options (padding, image
    resizing, ...) do not apply to word pieces and regions and are refused. An architecture with options of its own
    subclasses this class, declares them as typed fields, names it as its processor's `valid_processor_kwargs` and
    reads them in `VisionLanguageProcessor.encode_call`; a processor attribute of a field's name is its default.
    """


# The `ProcessingKwargs` groups a call may pass `return_tensors` in.
_CALL_GROUPS = ("common_kwargs", "text_kwargs", "images_kwargs")


@dataclass(frozen=True)
class ProcessorCall:
    """One processor call's inputs (text or token_ids, regions or images) and the tensors it returns."""

    text: TextArgument | None = None
    regions: RegionsArgument | None = None
    images: Any = None
    token_ids: TokenIdsArgument | None = None
    return_tensors: str | None = "pt"


# How a processor chooses an image's regions (the setting `region_selection`, saved with the processor):
# "by_confidence": with detector confidences (scores) and a `confidence_threshold`, the clamp(#(score > threshold),
#     min_regions, max_regions) most confident (the bottom-up-attention selection); without them every region is kept
#     and more than the limit is an error.
# "count_by_confidence": the same count, but the first that many regions in the order given, not the most confident
#     (UNITER's data loader: nbb from the confidences, then the file's first nbb rows); without confidences as
#     "by_confidence".
# "first_n": with confidences and a threshold as "by_confidence"; without them the first `max_regions` regions in
#     the order given (a feature file's order), as X-modaler's and ViLBERT's data loaders cut; the cut is logged once.
# "refuse": every region as given, whatever its confidences; more than the limit is an error.
REGION_SELECTIONS = ("by_confidence", "count_by_confidence", "first_n", "refuse")
# RegionFeatures.metadata key: how many regions an image had before "first_n" cut it (set on the cut copy).
CUT_FROM = "vlhub_cut_from"


def select_regions(
    regions: RegionFeatures,
    confidence_threshold: float | None,
    min_regions: int,
    max_regions: int | None,
    in_given_order: bool = False,
) -> RegionFeatures:
    """The bottom-up-attention selection the originals apply to raw detector output.

    With detector confidences and a threshold: order regions by confidence (descending, ties keep their order) and
    keep `clamp(#(confidence > threshold), min_regions, max_regions)` of them; with `in_given_order`, keep that many
    of the first regions in the order given instead (UNITER's rule). Without confidences (or with
    `confidence_threshold=None`) regions are kept as given, and more than `max_regions` of them is an error rather
    than a silent cut.
    """
    settings = (confidence_threshold, min_regions, max_regions, in_given_order)
    if regions.metadata.get(_SELECTED_WITH) == settings:  # already this selection's output (a collator selected it)
        return regions
    if regions.scores is None or confidence_threshold is None:
        if max_regions is not None and len(regions) > max_regions:
            raise ValueError(
                f"got {len(regions)} regions but this processor allows at most max_regions={max_regions}; select "
                "regions first, or pass detector confidences (scores) so the processor can select by confidence"
            )
        return regions
    # In numpy (a third of the per-op cost at this size): a stable descending sort (ties keep their order, as
    # `torch.sort(descending=True, stable=True)`), and the threshold compared in float32, as PyTorch compares it.
    scores = regions.scores.numpy()
    order = np.arange(len(regions)) if in_given_order else np.argsort(-scores, kind="stable")
    count = int(np.count_nonzero(scores > np.float32(confidence_threshold)))
    count = max(count, min_regions)
    if max_regions is not None:
        count = min(count, max_regions)
    count = min(count, len(regions))
    if count == len(regions) and np.array_equal(order, np.arange(count)):
        return regions  # the caller's own object: left unmarked
    selected = regions.take(torch.from_numpy(order[:count]))  # indices of a sort: valid, no check needed
    # Selecting again must give the same regions: say so, so the processor neither sorts them a second time nor
    # (in the given order) counts again over the kept ones only.
    selected.metadata[_SELECTED_WITH] = settings
    return selected


# RegionFeatures.metadata key: the (confidence_threshold, min_regions, max_regions, in_given_order) that selected
# these regions.
_SELECTED_WITH = "vlhub_selected_with"


def keep_first_regions(regions: RegionFeatures, limit: int | None) -> RegionFeatures:
    """The first `limit` regions in the order given (`regions` itself when it has no more). A cut copy records how
    many regions the image had in `metadata[CUT_FROM]`, so the processor can report the cut."""
    if limit is None or len(regions) <= limit:
        return regions
    kept = regions.take(torch.arange(limit))
    kept.metadata[CUT_FROM] = len(regions)
    return kept


class RegionProcessor(FeatureExtractionMixin):
    """Turns `RegionFeatures` into padded model inputs: `region_features` `(batch, R, F)`, `region_locations`
    `(batch, R, location_dim)`, `region_attention_mask` `(batch, R)` (2-D, 1 for real regions and global rows, 0 for
    padding; the models build 4-D masks from it).

    Per example: `select` (by detector confidence), `encode_features` and `encode_locations` (subclasses define the
    latter), `add_global_rows`, then padding to the batch's longest. Settings are JSON attributes saved with the
    processor; `region_extractor_folder` names the sub-folder that holds the processor's region extractor, if any
    (set by `VisionLanguageProcessor.region_extractor`; older folders call it `region_extractor`).

    `region_selection` (one of `REGION_SELECTIONS`) is the rule that picks an image's regions: `"by_confidence"`
    (default), `"count_by_confidence"` (as many as "by_confidence" keeps, but the first ones in the file's order, as
    UNITER cuts), `"first_n"` (the first `max_regions` of the file, as X-modaler and ViLBERT cut) or `"refuse"`. A
    converter sets it, with `max_regions` and the confidence settings, to what the original release's data loader
    does (see docs/region-rules.md). When "first_n" cuts images, the first batch that has any says so in the log
    (how many images, from how many regions to how many); `regions_cut` counts every image cut since.
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
        region_selection: str = "by_confidence",
        **kwargs: Any,
    ) -> None:
        legacy_folder = kwargs.pop("region_extractor", None)  # the setting's name in processors saved before
        super().__init__(**kwargs)
        min_regions = check_positive_int(min_regions, "min_regions")
        if max_regions is not None and max_regions < min_regions:
            raise ValueError(f"max_regions ({max_regions}) must be >= min_regions ({min_regions})")
        if region_selection not in REGION_SELECTIONS:
            raise ValueError(f"region_selection must be one of {REGION_SELECTIONS}, got {region_selection!r}")
        self.region_feature_dim = region_feature_dim
        self.confidence_threshold = confidence_threshold
        self.min_regions = min_regions
        self.max_regions = max_regions
        self.region_selection = region_selection
        self.region_extractor_folder = region_extractor_folder if region_extractor_folder is not None else legacy_folder
        self.regions_cut = 0  # images "first_n" cut so far (not a setting: never saved)

    # -- per-architecture hooks ------------------------------------------------------------------------------
    def encode_locations(self, regions: RegionFeatures) -> torch.Tensor:
        """`(num_regions, location_dim)` location vector of each (selected) region."""
        raise NotImplementedError

    def encode_features(self, regions: RegionFeatures) -> torch.Tensor:
        """`(num_regions, feature_dim)` features as the model consumes them."""
        return regions.features

    def add_global_rows(
        self, features: torch.Tensor, locations: torch.Tensor, regions: RegionFeatures
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One example's encoded `features` `(R, F)` and `locations` `(R, location_dim)` with rows added that are no
        detected region: a global image token (ViLBERT, TDEN: the mean feature and `[0, 0, 1, 1, 1]` as row 0) or a
        whole-image box (VL-BERT's object 0). `regions` are the selected regions the rows were encoded from (their
        `image_size`, `boxes`, ...). Must return as many feature rows as location rows; every returned row counts in
        `region_attention_mask`. The default adds nothing."""
        return features, locations

    @classmethod
    def settings_from_config(cls, config: PreTrainedConfig) -> dict:
        """Region settings a model `config` fixes, for a processor built to fit a new model (e.g. Unified VLP's
        fixed number of region slots and detector classes). The default fixes none."""
        return {}

    # -- shared -----------------------------------------------------------------------------------------------
    def select(self, regions: RegionFeatures) -> RegionFeatures:
        """The regions the model sees, by `region_selection`, at most `max_regions` of them."""
        return self.select_at_most(regions, self.max_regions)

    def select_at_most(self, regions: RegionFeatures, limit: int | None) -> RegionFeatures:
        """`region_selection`'s rule keeping at most `limit` detected regions (None: no limit)."""
        by_confidence = regions.scores is not None and self.confidence_threshold is not None
        counted = self.region_selection in ("by_confidence", "count_by_confidence")
        if self.region_selection == "refuse" or (counted and not by_confidence):
            if limit is not None and len(regions) > limit:
                raise ValueError(self.too_many_regions(len(regions), limit))
            return regions
        if not by_confidence:  # "first_n" on regions without confidences: a feature file's first `limit`
            return keep_first_regions(regions, limit)
        minimum = self.min_regions if limit is None else min(self.min_regions, limit)
        return select_regions(
            regions,
            self.confidence_threshold,
            minimum,
            limit,
            in_given_order=self.region_selection == "count_by_confidence",
        )

    def too_many_regions(self, count: int, limit: int) -> str:
        """The error for an image of `count` regions when the selection refuses more than `limit`."""
        advice = (
            "select regions first, or set region_selection='first_n' to keep the first ones as the original "
            "data loader does"
            if self.region_selection == "refuse"
            else "select regions first, pass detector confidences (scores) so the processor can select by "
            "confidence, or set region_selection='first_n' to keep the first ones"
        )
        return f"got {count} regions but this processor allows at most max_regions={limit}; {advice}"

    def to_dict(self) -> dict:
        output = super().to_dict()
        output.pop("regions_cut", None)  # a count of this session's work, not a setting
        return output

    def _report_cuts(self, cuts: list[tuple[int, int]], batch_size: int) -> None:
        """Count the images "first_n" cut in one batch (`(regions before, kept)` each); the first batch with any says
        so in the log, once."""
        first = self.regions_cut == 0
        self.regions_cut += len(cuts)
        if first:
            before = sorted({b for b, _ in cuts})
            kept = sorted({k for _, k in cuts})
            logger.warning(
                f"{len(cuts)} of {batch_size} images had more regions than this processor keeps "
                f"({', '.join(map(str, before))} regions): kept the first {', '.join(map(str, kept))} of each, as the "
                f"original data loader does (region_selection={self.region_selection!r}, max_regions="
                f"{self.max_regions}). Later cuts are not logged again; `regions_cut` on the region processor counts "
                "the images cut."
            )

    def __call__(self, regions: RegionsArgument, return_tensors: str | None = "pt", **kwargs: Any) -> BatchFeature:
        if kwargs:
            raise TypeError(f"unexpected argument(s) {sorted(kwargs)} for {type(self).__name__}")
        if return_tensors not in (None, "pt"):
            raise ValueError(
                f"vlhub processors return PyTorch tensors; return_tensors must be 'pt', got {return_tensors!r}"
            )
        batch = [regions] if isinstance(regions, RegionFeatures) else list(regions)
        if not batch:
            raise ValueError("no regions given: pass one RegionFeatures per example")
        features, locations, float16_exact, cuts = [], [], True, []
        for i, item in enumerate(batch):
            feat, loc, selected = self._encode_example(item, f"regions[{i}]")
            features.append(feat)
            locations.append(loc)
            float16_exact = float16_exact and feat is selected.features and selected.metadata.get(FLOAT16_FEATURES)
            if CUT_FROM in selected.metadata:
                cuts.append((selected.metadata[CUT_FROM], len(selected)))
        if cuts:
            self._report_cuts(cuts, len(batch))
        # One padding op per input (a row-by-row copy into a zeroed batch cost more than the encoding itself).
        region_features = pad_sequence(features, batch_first=True).to(torch.float32)
        if float16_exact:  # a float16 store's values, passed through: DataLoader workers send them as float16
            mark_float16_exact(region_features)
        region_locations = pad_sequence(locations, batch_first=True).to(torch.float32)
        lengths = torch.tensor([f.shape[0] for f in features])
        region_attention_mask = (torch.arange(region_features.shape[1]) < lengths[:, None]).long()
        return BatchFeature(
            {
                "region_features": region_features,
                "region_locations": region_locations,
                "region_attention_mask": region_attention_mask,
            }
        )

    def encode_example(self, regions: RegionFeatures, name: str = "regions[0]") -> tuple[torch.Tensor, torch.Tensor]:
        """One example's encoded `(features (R, F), locations (R, location_dim))` before padding: checked, selected,
        encoded and with its global rows. Every error names the example as `name` (the processor's `regions[i]`; a
        pipeline passes the user's own index, e.g. `image[2]`)."""
        return self._encode_example(regions, name)[:2]

    def _encode_example(self, regions, name: str) -> tuple[torch.Tensor, torch.Tensor, RegionFeatures]:
        """`encode_example`'s encodings and the selected regions they were encoded from."""
        if not isinstance(regions, RegionFeatures):
            raise TypeError(f"{name} must be a vlhub.RegionFeatures, got {type(regions).__name__}")
        if regions.feature_dim != self.region_feature_dim:
            raise ValueError(
                f"{name} has {regions.feature_dim}-d features but this processor (and its model) expects "
                f"{self.region_feature_dim}-d features"
            )
        try:
            selected = self.select(regions)
            feat, loc = self.add_global_rows(self.encode_features(selected), self.encode_locations(selected), selected)
        except ValueError as err:  # selection and the hooks do not know which example they were given
            raise ValueError(f"{name}: {err}") from err
        if feat.shape[0] != loc.shape[0]:
            raise ValueError(
                f"{type(self).__name__} encoded {name} as {feat.shape[0]} feature rows but {loc.shape[0]} "
                "location rows; encode_features/encode_locations/add_global_rows must keep them in step"
            )
        # RegionFeatures hold finite values (checked when built), so features passed through unchanged need no check.
        encoded = (("locations", loc),) if feat is selected.features else (("features", feat), ("locations", loc))
        for what, values in encoded:
            if not all_finite(values):  # RegionFeatures are finite: the encoding overflowed
                raise ValueError(
                    f"{type(self).__name__} encoded the finite {name} into NaN or infinite {what}; values beyond the "
                    "encoding's range (e.g. the float16 limit of 65504 when rounding to float16) must be rescaled"
                )
        return feat, loc, selected


def pad_text_rows(
    tokenizer: PreTrainedTokenizerBase, input_ids: list[list[int]], token_type_ids: list[list[int]]
) -> BatchEncoding:
    """`tokenizer.pad({"input_ids": ..., "token_type_ids": ...}, padding=True, return_attention_mask=True,
    return_tensors="pt")`, computed directly for a tokenizer that pads as transformers' base class does (its
    `pad_token_id`, `pad_token_type_id` and `padding_side`): the same tensors without that method's per-row Python
    work (~0.7 ms for a batch of 32). Any other tokenizer is asked to pad."""
    if (
        not input_ids
        or not isinstance(tokenizer, PreTrainedTokenizerBase)
        or tokenizer.pad_token_id is None
        or tokenizer.padding_side not in ("right", "left")
        or type(tokenizer)._pad is not _BASE_PAD
        or tokenizer.model_input_names[:1] != ["input_ids"]
    ):
        return tokenizer.pad(
            {"input_ids": input_ids, "token_type_ids": token_type_ids},
            padding=True,
            return_attention_mask=True,
            return_tensors="pt",
        )
    longest = max(len(ids) for ids in input_ids)
    pad_id, pad_type = tokenizer.pad_token_id, tokenizer.pad_token_type_id

    def padded(rows: list[list[int]], value: int) -> torch.Tensor:
        if tokenizer.padding_side == "right":
            return torch.tensor([row + [value] * (longest - len(row)) for row in rows], dtype=torch.long)
        return torch.tensor([[value] * (longest - len(row)) + row for row in rows], dtype=torch.long)

    return BatchEncoding(
        {
            "input_ids": padded(input_ids, pad_id),
            "token_type_ids": padded(token_type_ids, pad_type),
            "attention_mask": padded([[1] * len(ids) for ids in input_ids], 0),
        }
    )


_BASE_PAD = PreTrainedTokenizerBase._pad


def check_text(text: object, name: str = "text") -> str:
    """`text` if it is a non-empty string of valid Unicode; otherwise a `TypeError`/`ValueError` naming it as `name`.
    A lone surrogate (e.g. from decoding bytes with errors="surrogateescape") cannot be tokenized."""
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a string, got {type(text).__name__}")
    if not text.strip():
        raise ValueError(
            f"{name} is empty; it must be a non-empty string (a question or caption needs at least one word)"
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"{name} is not valid Unicode: it holds the lone surrogate {text[err.start]!r} at position {err.start} "
            "(decode the source text with errors='replace', or fix it)"
        ) from None
    return text


class VisionLanguageProcessor(ProcessorMixin):
    """A word-piece tokenizer plus a `RegionProcessor` (and optionally a region extractor for raw images).

    Call as `processor(text=[...], regions=[RegionFeatures, ...], return_tensors="pt")`, or with `images=` when the
    processor carries a region extractor. One text per image. Returns `input_ids`, `attention_mask`,
    `token_type_ids` `(batch, T)` and the region processor's outputs. Masks are 2-D 0/1 (1 for real tokens); the
    models turn them into 4-D attention masks.

    Each text's token sequence comes from the `build_text_inputs` hook (default `[CLS] text [SEP]`); the tokenizer
    pads the batch (its `pad_token_id` and `padding_side`). A sequence longer than `max_text_length` tokens (special
    tokens included) is **truncated with a warning**: word pieces are dropped from the end (from the start if the
    tokenizer's `truncation_side` is "left") until it fits, so `[SEP]` stays last. The original data pipelines
    dropped such examples instead. An empty text is an error.
    """

    text_token_type_id: int = 0  # token type of every token of the default layout
    valid_processor_kwargs = VisionLanguageProcessorKwargs
    # `_merge_kwargs`' defaults (transformers' processor-attribute route): model inputs as PyTorch tensors.
    text_kwargs = {"return_tensors": "pt"}
    images_kwargs = {"return_tensors": "pt"}

    def __init__(
        self,
        feature_extractor: RegionProcessor | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        max_text_length: int = 60,
        **kwargs: Any,
    ) -> None:
        if max_text_length < 3:
            raise ValueError(f"max_text_length must leave room for [CLS] w [SEP], got {max_text_length}")
        self.max_text_length = max_text_length
        super().__init__(feature_extractor, tokenizer, **kwargs)
        self._region_extractor = None

    # -- images → regions -------------------------------------------------------------------------------------
    @property
    def region_extractor(self) -> RegionExtractorLike | None:
        """The region extractor that turns images into `RegionFeatures` (None when the processor has none). Saved
        with the processor in the sub-folder `region_extractor/`; see `vlhub.processing.region_extractors`."""
        return self._region_extractor

    @region_extractor.setter
    def region_extractor(self, extractor: RegionExtractorLike | None) -> None:
        self._region_extractor = extractor
        self.feature_extractor.region_extractor_folder = REGION_EXTRACTOR_FOLDER if extractor is not None else None

    def regions_from_images(self, images: Any) -> list[RegionFeatures]:
        if self._region_extractor is None:
            raise ValueError(
                "this processor has no region extractor, so it cannot take images: pass regions=RegionFeatures(...) "
                "(e.g. read from a feature file), or attach one with `processor.region_extractor = ...`"
            )
        regions = self._region_extractor(images)
        return [regions] if isinstance(regions, RegionFeatures) else list(regions)

    def regions_or_images(
        self, regions: RegionsArgument | None, images: Any
    ) -> RegionFeatures | Sequence[RegionFeatures] | None:
        """`regions` as given, or those the region extractor finds in `images` (both given is an error; neither:
        None)."""
        if regions is not None and images is not None:
            raise ValueError("pass either regions or images, not both")
        return self.regions_from_images(images) if images is not None else regions

    def save_pretrained(self, save_directory: str | os.PathLike, push_to_hub: bool = False, **kwargs: Any) -> list[str]:
        if self._region_extractor is not None:
            os.makedirs(save_directory, exist_ok=True)
            self._region_extractor.save_pretrained(os.path.join(save_directory, REGION_EXTRACTOR_FOLDER))
        return super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs: Any
    ) -> "VisionLanguageProcessor":
        processor = super().from_pretrained(pretrained_model_name_or_path, **kwargs)
        subfolder = processor.feature_extractor.region_extractor_folder
        if subfolder:
            hub_kwargs = {k: kwargs[k] for k in HUB_KWARGS if k in kwargs}
            processor._region_extractor = load_region_extractor(pretrained_model_name_or_path, subfolder, **hub_kwargs)
        return processor

    # -- text: per-architecture hooks ---------------------------------------------------------------------------
    def model_config_fields(self) -> dict:
        """Config fields a new model must share with this processor (e.g. the ids of the special tokens its layout
        or generation uses), applied when a model is built from scratch for it. The default is none."""
        return {}

    def for_task(self, task: str) -> "VisionLanguageProcessor":
        """The processor to fine-tune and run `task` ("vqa", "retrieval", ...) with. The default is this one; an
        architecture whose text layout depends on the task (VL-BERT's VQA answer slot) returns a configured copy."""
        return self

    def build_text_inputs(self, word_piece_ids: list[int]) -> tuple[list[int], list[int]]:
        """One example's `(input_ids, token_type_ids)` from its word-piece ids (no special tokens).

        The default is `[CLS] w [SEP]` with every token of type `text_token_type_id`. Override for another layout
        (extra tokens, answer or region slots, segments). The layout must add the same number of tokens whatever
        the number of word pieces: truncation relies on it. Padding and the attention mask are done for you.
        """
        ids = [self.tokenizer.cls_token_id, *word_piece_ids, self.tokenizer.sep_token_id]
        return ids, [self.text_token_type_id] * len(ids)

    def regions_only_text_inputs(self, batch_size: int) -> dict[str, torch.Tensor]:
        """The text inputs a call with regions and no text gives each of its `batch_size` examples: the captioning
        prompt `generate()` starts from, for a processor whose model captions (Unified VLP's image block, TDEN's
        [CLS]). The default gives none (the regions alone)."""
        return {}

    # -- text: shared -------------------------------------------------------------------------------------------
    def word_pieces(
        self, text: TextArgument | None = None, token_ids: TokenIdsArgument | None = None
    ) -> list[list[int]]:
        """Each text's word-piece ids without special tokens, from `text` (tokenized) or `token_ids` (as given)."""
        if text is not None and token_ids is not None:
            raise ValueError("pass either text or token_ids, not both")
        if text is not None:
            texts = [text] if isinstance(text, str) else list(text)
            for i, t in enumerate(texts):
                check_text(t, f"text[{i}]")
            return self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        return check_token_ids(token_ids, len(self.tokenizer))

    def _build_within_limit(self, pieces: list[int], index: int) -> tuple[list[int], list[int]]:
        ids, types = self.build_text_inputs(pieces)
        overflow = len(ids) - self.max_text_length
        if overflow <= 0:
            return ids, types
        keep = len(pieces) - overflow
        if keep < 1:
            raise ValueError(
                f"text {index}: the layout of {type(self).__name__} needs {len(ids) - len(pieces)} tokens besides the "
                f"word pieces, which leaves no room for them within max_text_length={self.max_text_length}"
            )
        warnings.warn(
            f"text {index} has {len(ids)} tokens with its special tokens; truncated to max_text_length="
            f"{self.max_text_length}",
            stacklevel=5,  # the caller of __call__ (through encode_call and encode_text; one frame more under an override)
        )
        left = self.tokenizer.truncation_side == "left"
        ids, types = self.build_text_inputs(pieces[overflow:] if left else pieces[:keep])
        if len(ids) != self.max_text_length:
            raise ValueError(
                f"{type(self).__name__}.build_text_inputs must add the same number of tokens to every text (it made "
                f"{len(ids)} tokens of {keep} word pieces, expected {self.max_text_length})"
            )
        return ids, types

    def encode_text(self, text: TextArgument | None = None, token_ids: TokenIdsArgument | None = None) -> BatchFeature:
        """`input_ids`, `attention_mask`, `token_type_ids` `(batch, T)`: each text laid out by `build_text_inputs`,
        truncated to `max_text_length` (with a warning), padded by the tokenizer."""
        rows = []
        for i, pieces in enumerate(self.word_pieces(text, token_ids)):
            ids, types = self._build_within_limit(pieces, i)
            rows.append((ids, types))
            if len(ids) != len(types):
                raise ValueError(
                    f"{type(self).__name__}.build_text_inputs gave text {i} {len(ids)} ids but {len(types)} token types"
                )
        return pad_text_rows(self.tokenizer, [ids for ids, _ in rows], [types for _, types in rows])

    def __call__(
        self,
        text: TextArgument | None = None,
        regions: RegionsArgument | None = None,
        images: Any = None,
        token_ids: TokenIdsArgument | None = None,
        **kwargs: Unpack[VisionLanguageProcessorKwargs],
    ) -> BatchFeature:
        """text: a string or a list of strings (one per image). token_ids: instead of text, word-piece ids without
        [CLS]/[SEP] (as the original text databases store them). regions: one `RegionFeatures` per text. images:
        instead of regions, images for the region extractor (paths, PIL images or arrays). The keyword options are
        those of the processor's `valid_processor_kwargs` (`VisionLanguageProcessorKwargs` and an architecture's
        own); any other keyword is an error.
        """
        # No @auto_docstring: transformers 5.24 unrolls a processor's kwargs only in a processing_*.py file and raises
        # "Unrolling kwargs is not supported" here; the options are documented on the kwargs classes.
        return_tensors, options = self.call_options(kwargs)
        return self.encode_call(ProcessorCall(text, regions, images, token_ids, return_tensors), options)

    def call_options(self, kwargs: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
        """A call's keyword options merged with the processor's defaults by transformers' `_merge_kwargs`: its
        `return_tensors` and its architecture's own options (the fields `valid_processor_kwargs` adds to
        `ProcessingKwargs`). A keyword the processor does not honour is a `TypeError` (`_merge_kwargs` would only
        log it), a group that is no dict a `TypeError`, groups that disagree a `ValueError`."""
        declared = self.valid_processor_kwargs
        own = [name for name in declared.__annotations__ if name not in ProcessingKwargs.__annotations__]
        unknown = [key for key in kwargs if key not in (*own, *_CALL_GROUPS, "return_tensors")]
        for group in _CALL_GROUPS:
            if not isinstance(kwargs.get(group, {}), dict):
                raise TypeError(f"{group} must be a dict of options, got {type(kwargs[group]).__name__}")
            unknown += [f"{group}[{key!r}]" for key in kwargs.get(group, {}) if key != "return_tensors"]
        if unknown:
            raise TypeError(
                f"unexpected argument(s) {sorted(unknown)}; expected text/token_ids, regions/images and the options "
                f"{['return_tensors', *own]}"
            )
        merged = self._merge_kwargs(declared, **kwargs)
        return_tensors = merged["text_kwargs"].get("return_tensors")
        if merged["images_kwargs"].get("return_tensors", return_tensors) != return_tensors:
            raise ValueError(
                "one call returns one kind of tensors: text_kwargs and images_kwargs name different return_tensors"
            )
        return return_tensors, {name: merged[name] for name in own if name in merged}

    def encode_call(self, call: ProcessorCall, options: dict[str, Any]) -> BatchFeature:
        """The hook of a call: `call`'s inputs encoded with `options`, the architecture's own keyword options (the
        fields its `valid_processor_kwargs` declares, merged with their defaults; none here). An architecture with
        options overrides it, reads them and hands the (possibly changed) call on to `super().encode_call`."""
        regions = self.regions_or_images(call.regions, call.images)
        data = {}
        num_texts = None
        if call.text is not None or call.token_ids is not None:
            text_inputs = self.encode_text(call.text, call.token_ids)
            num_texts = text_inputs["input_ids"].shape[0]
            data.update(
                input_ids=text_inputs["input_ids"],
                attention_mask=text_inputs["attention_mask"],
                token_type_ids=text_inputs["token_type_ids"],
            )
        if regions is not None:
            region_inputs = self.feature_extractor(regions, return_tensors=call.return_tensors)
            if num_texts is not None and region_inputs["region_features"].shape[0] != num_texts:
                raise ValueError(
                    f"got {num_texts} texts but {region_inputs['region_features'].shape[0]} images: pass one text per "
                    "image (repeat the image or the text to pair them)"
                )
            data.update(region_inputs)
            if num_texts is None:
                data.update(self.regions_only_text_inputs(region_inputs["region_features"].shape[0]))
        if not data:
            raise ValueError("nothing to process: pass text (or token_ids) and/or regions (or images)")
        return BatchFeature(data, tensor_type=call.return_tensors)

    @property
    def model_input_names(self) -> list[str]:
        return ["input_ids", "attention_mask", "token_type_ids", *RegionProcessor.model_input_names]
