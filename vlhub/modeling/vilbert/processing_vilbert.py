"""ViLBERT's processor: uncased BERT word pieces, regions with a global image token first and 5-d locations, and
the 12-in-1 task token."""

from __future__ import annotations

import logging
from dataclasses import replace
from numbers import Integral
from typing import TYPE_CHECKING, Any, Sequence

import torch
from torch.nn.utils.rnn import pad_sequence
from torchvision.ops import box_iou
from transformers import BatchFeature

from ...processing.processor_base import CUT_FROM, RegionProcessor, VisionLanguageProcessor
from ...processing.processor_base import ProcessorCall, RegionsArgument, TokenIdsArgument, VisionLanguageProcessorKwargs
from ...processing.regions import RegionFeatures

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "VilbertRegionProcessor",
    "VilbertProcessor",
    "VilbertProcessorKwargs",
    "vilbert_locations",
    "pointing_targets",
    "GLOBAL_TOKEN_LOCATION",
    "GROUND_TRUTH_ROWS",
]

logger = logging.getLogger(__name__)

# What a saved `max_regions` counts: "regions" (detected regions, the global token on top; every processor saved
# since) or "rows" (the global token included; folders saved before, migrated on load).
MAX_REGIONS_COUNTS = ("regions", "rows")
# Where ground-truth regions join the detections: from row `1 + max_regions` on (the detections padded up to it; the
# 12-in-1 pointing tasks read their candidates at `101 + index`), right after each image's detection rows, or not at
# all ("refuse": VCR's datasets join them by another rule, which vlhub does not reproduce).
GROUND_TRUTH_ROWS = ("after_max_regions", "after_detections", "after_cut_detections", "refuse")
# RegionFeatures.metadata key: the mean feature of an image's regions before "first_n" cut them (the global token's).
_ALL_REGIONS_MEAN = "vlhub_vilbert_all_regions_mean"
# The location of the global image token (the whole image, area 1).
GLOBAL_TOKEN_LOCATION = (0.0, 0.0, 1.0, 1.0, 1.0)
# 12-in-1 pointing: a candidate box counts as the answer when its IoU with the answer box is at least this.
POINTING_IOU_THRESHOLD = 0.5


def vilbert_locations(regions: RegionFeatures) -> torch.Tensor:
    """`(num_regions, 5)`: `[x1/W, y1/H, x2/W, y2/H, (x2-x1)(y2-y1)/(W*H)]` in float32, as the original's
    `ImageFeaturesH5Reader` computes them from absolute boxes."""
    boxes = regions.boxes.float()
    height, width = regions.image_size
    area = (boxes[:, 3] - boxes[:, 1]) * (boxes[:, 2] - boxes[:, 0]) / (float(width) * float(height))
    return torch.stack(
        [boxes[:, 0] / width, boxes[:, 1] / height, boxes[:, 2] / width, boxes[:, 3] / height, area], dim=1
    )


def pointing_targets(boxes: torch.Tensor, answer_box: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """The 12-in-1 pointing datasets' soft targets: the IoU of each box `(n, 4)` with `answer_box` `(x1, y1, x2, y2)`,
    both in pixels, in the original's inclusive pixel convention (a box spans `x2 - x1 + 1` pixels), and 0 where it
    is below 0.5. `(n,)` float32."""
    answer = torch.as_tensor(answer_box, dtype=torch.float32).reshape(-1)
    if answer.numel() != 4 or not torch.isfinite(answer).all() or answer[2] < answer[0] or answer[3] < answer[1]:
        raise ValueError(
            f"an answer box must be 4 finite pixel coordinates (x1, y1, x2, y2) with x2 >= x1 and "
            f"y2 >= y1, got {answer_box!r}"
        )
    inclusive = torch.tensor([0.0, 0.0, 1.0, 1.0])
    iou = box_iou(boxes.float() + inclusive, answer[None] + inclusive)[:, 0]
    return torch.where(iou >= POINTING_IOU_THRESHOLD, iou, torch.zeros_like(iou))


class VilbertRegionProcessor(RegionProcessor):
    """Regions → ViLBERT inputs: row 0 is the global image token (the mean of the region features, location
    `[0, 0, 1, 1, 1]`), then the regions in the order given, with 5-d locations.

    `max_regions` counts detected regions; the global token is added on top, as TDEN's `[IMG]` and VL-BERT's
    object 0 (the original's `max_region_num` counts rows: 101 = 100 regions + the global token in the 12-in-1
    release, so a converted processor has `max_regions=100`; 99 for the beta release's tasks). The original's
    feature reader averages *all* of a file's regions into the global token, and its datasets then keep the first
    `max_region_num` rows: `region_selection="first_n"` (the default) does the same, so an image with more than
    `max_regions` regions keeps its first `max_regions` and a global token that averages them all (the cut is logged
    once). `"refuse"` makes such an image an error instead. With `confidence_threshold` set and detector scores
    present, regions are selected by confidence as `clamp(#(score > threshold), min_regions, max_regions)`.

    Ground-truth regions (the original's second, "gt" feature file; `VilbertProcessor(..., ground_truth=...)` and
    `VilbertProcessor.pointing`) join the detections as the 12-in-1 grounding and pointing datasets join them:
    `max_joined_regions` detected and ground-truth regions together (the original's `max_region_num - 1`: 199 for
    Visual7w and Flickr grounding, 305 for GuessWhat pointing, 100 for RefCOCO; None: no limit), the ground-truth
    rows cut first. `ground_truth_rows` places them: `"after_max_regions"` (row `1 + max_regions` on, the detections
    padded up to it: where the pointing tasks read their candidates, `101 + index`) or `"after_detections"` (right
    after each image's detection rows, the datasets' own concatenation). With the releases' 100 detections per image
    both are the original's rows. `"after_cut_detections"` is the VCR datasets' join (converted VCR processors): of
    `max_joined_regions` (else `max_regions`) regions the ground-truth ones are kept first, the image's first
    detections fill the rest; rows: the global token, the kept detections, the kept ground truth; the global token is
    the mean of the detections' and the ground truth's means weighted by their counts + 1 (the original readers'
    row counts). `"refuse"` makes ground-truth regions an error.

    `max_regions_counts` marks the meaning of `max_regions` in a saved folder: `"regions"` (now). A folder saved
    before it counted rows (the global token included); it loads as `"rows"`, and `max_regions` is then lowered by
    one, the same limit in today's meaning (logged once).
    """

    location_dim = 5

    def __init__(
        self,
        region_feature_dim: int = 2048,
        confidence_threshold: float | None = None,
        min_regions: int = 1,
        max_regions: int | None = 100,
        region_selection: str = "first_n",
        max_joined_regions: int | None = None,
        ground_truth_rows: str = "after_max_regions",
        max_regions_counts: str = "regions",
        **kwargs: Any,
    ) -> None:
        if max_regions_counts == "rows" and max_regions is not None:
            max_regions = _regions_from_rows(max_regions)
        elif max_regions_counts not in MAX_REGIONS_COUNTS:
            raise ValueError(f"max_regions_counts must be one of {MAX_REGIONS_COUNTS}, got {max_regions_counts!r}")
        if ground_truth_rows not in GROUND_TRUTH_ROWS:
            raise ValueError(f"ground_truth_rows must be one of {GROUND_TRUTH_ROWS}, got {ground_truth_rows!r}")
        if max_joined_regions is not None and max_joined_regions < max(max_regions or 1, 1):
            raise ValueError(
                f"max_joined_regions counts the detected regions too; it must be at least max_regions "
                f"({max_regions}), got {max_joined_regions}"
            )
        super().__init__(
            region_feature_dim=region_feature_dim,
            confidence_threshold=confidence_threshold,
            min_regions=min_regions,
            max_regions=max_regions,
            region_selection=region_selection,
            **kwargs,
        )
        self.max_joined_regions = max_joined_regions
        self.ground_truth_rows = ground_truth_rows
        self.max_regions_counts = "regions"

    @classmethod
    def from_dict(
        cls, feature_extractor_dict: dict, **kwargs: Any
    ) -> VilbertRegionProcessor | tuple[VilbertRegionProcessor, dict[str, Any]]:
        if "max_regions_counts" not in feature_extractor_dict and "max_regions" not in kwargs:
            # Saved before max_regions stopped counting the global token: its limit counts rows.
            feature_extractor_dict = {**feature_extractor_dict, "max_regions_counts": "rows"}
        return super().from_dict(feature_extractor_dict, **kwargs)

    def too_many_regions(self, count: int, limit: int) -> str:
        return (
            f"got {count} regions but this processor allows at most max_regions={limit} regions (and the global "
            "image token); select regions first, raise max_regions, set region_selection='first_n' to keep the "
            "first ones as the original, or set confidence_threshold so that regions are selected by detector "
            "confidence"
        )

    def select(self, regions: RegionFeatures) -> RegionFeatures:
        selected = super().select(regions)
        if CUT_FROM in selected.metadata and _ALL_REGIONS_MEAN not in selected.metadata:
            # The original averages the file's regions before its dataset keeps the first rows.
            selected.metadata[_ALL_REGIONS_MEAN] = regions.features.float().sum(dim=0, keepdim=True) / len(regions)
        return selected

    def encode_locations(self, regions: RegionFeatures) -> torch.Tensor:
        return vilbert_locations(regions)

    def encode_features(self, regions: RegionFeatures) -> torch.Tensor:
        return regions.features.float()

    def add_global_rows(
        self, features: torch.Tensor, locations: torch.Tensor, regions: RegionFeatures
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if features.shape[0] == 0:
            raise ValueError("an image without regions has no global image token (the mean of its region features)")
        global_feature = regions.metadata.get(_ALL_REGIONS_MEAN)
        if global_feature is None:
            global_feature = features.sum(dim=0, keepdim=True) / features.shape[0]
        global_location = torch.tensor([GLOBAL_TOKEN_LOCATION], dtype=locations.dtype)
        return torch.cat([global_feature, features]), torch.cat([global_location, locations])

    def join_ground_truth(
        self, regions: RegionsArgument, ground_truth: RegionsArgument, name: str = "ground_truth"
    ) -> tuple[BatchFeature, list[tuple[int, int]]]:
        """The detections' rows (global token first) joined with each image's ground-truth regions (`RegionFeatures`
        of the same image, no global token of their own), by `max_joined_regions` and `ground_truth_rows`. Returns
        the padded inputs and, per image, `(first ground-truth row, ground-truth regions kept)`. Errors name the
        ground-truth regions as `name`."""
        regions = [regions] if isinstance(regions, RegionFeatures) else list(regions)
        ground_truth = [ground_truth] if isinstance(ground_truth, RegionFeatures) else list(ground_truth)
        if len(ground_truth) != len(regions):
            raise ValueError(
                f"got {len(regions)} images but {len(ground_truth)} {name} sets: pass one {name} "
                "RegionFeatures per image"
            )
        if self.ground_truth_rows == "refuse":
            raise ValueError(
                "this processor refuses ground-truth regions (ground_truth_rows='refuse'): its task's "
                "original joins them by a rule its converter did not reproduce; pass the regions to use "
                "as regions=, or set ground_truth_rows to 'after_cut_detections' (the VCR datasets' join), "
                "'after_detections' or 'after_max_regions'"
            )
        if self.ground_truth_rows == "after_cut_detections":
            return self._join_after_cut_detections(regions, ground_truth, name)
        if self.ground_truth_rows == "after_max_regions" and self.max_regions is None:
            raise ValueError(
                "ground_truth_rows='after_max_regions' places the ground-truth rows after max_regions "
                "detected ones; this processor has max_regions=None (set it, e.g. 100 as the releases, or "
                "set ground_truth_rows='after_detections')"
            )
        detected = self(regions)
        detections = (detected["region_attention_mask"].sum(dim=1) - 1).tolist()
        rows, layout, cuts = [], [], []
        for i, (image, truth, count) in enumerate(zip(regions, ground_truth, detections)):
            _check_ground_truth(truth, image, self.region_feature_dim, f"{name}[{i}]", i)
            kept = self._ground_truth_kept(len(truth), count, f"{name}[{i}]")
            if kept < len(truth):
                cuts.append((count + len(truth), count + kept))
            start = 1 + (self.max_regions if self.ground_truth_rows == "after_max_regions" else count)
            rows.append(_joined_rows(detected, i, start, truth, kept, self))
            layout.append((start, kept))
        return self._joined_batch(rows, cuts, len(regions)), layout

    def _join_after_cut_detections(self, regions, ground_truth, name: str):
        """`join_ground_truth` for `ground_truth_rows="after_cut_detections"`, the original VCR datasets' join: of
        `max_joined_regions` (else `max_regions`) regions the ground-truth ones are kept first, the file's first
        detections fill the rest; rows: the merged global token, the kept detections, the kept ground truth."""
        if self.confidence_threshold is not None and any(image.scores is not None for image in regions):
            raise ValueError(
                "ground_truth_rows='after_cut_detections' keeps each image's first detections as the original VCR "
                "datasets do; this processor would select them by confidence_threshold: set confidence_threshold="
                "None or pass regions without scores"
            )
        limit = self.max_regions if self.max_joined_regions is None else self.max_joined_regions
        rows, layout, cuts = [], [], []
        for i, (image, truth) in enumerate(zip(regions, ground_truth)):
            _check_vcr_join(image, truth, self.region_feature_dim, f"{name}[{i}]", i)
            total = len(image) + len(truth)
            if limit is not None and total > limit and self.region_selection == "refuse":
                raise ValueError(
                    f"{name}[{i}]: {len(image)} detected and {len(truth)} ground-truth regions exceed "
                    f"max_joined_regions={limit}; set region_selection='first_n' to keep the ground-truth regions "
                    "first and the first detections as the original VCR datasets do, or raise max_joined_regions"
                )
            kept_truth = len(truth) if limit is None else min(limit, len(truth))
            kept_detections = len(image) if limit is None else min(limit - kept_truth, len(image))
            if kept_truth + kept_detections < total:
                cuts.append((total, kept_truth + kept_detections))
            rows.append(self._vcr_rows(image, truth, kept_detections, kept_truth))
            layout.append((1 + kept_detections, kept_truth))
        return self._joined_batch(rows, cuts, len(regions)), layout

    def _vcr_rows(self, image: RegionFeatures, truth: RegionFeatures, kept_detections: int, kept_truth: int):
        """One image's `(features, locations, mask)` as the VCR datasets build them: the global token is the mean of
        both files' global tokens (each the mean of all of its file's regions), weighted by the files' row counts
        (regions + 1, the reader's `num_boxes`), then the first detections and the first ground-truth regions."""
        detected, true = self.encode_features(image), self.encode_features(truth)
        detected_mean, true_mean = detected.sum(0, keepdim=True) / len(image), true.sum(0, keepdim=True) / len(truth)
        merged = (detected_mean * (len(image) + 1) + true_mean * (len(truth) + 1)) / (len(image) + len(truth) + 2)
        features = torch.cat([merged, detected[:kept_detections], true[:kept_truth]])
        global_location = torch.tensor([GLOBAL_TOKEN_LOCATION], dtype=torch.float32)
        locations = torch.cat(
            [
                global_location,
                self.encode_locations(image)[:kept_detections].float(),
                self.encode_locations(truth)[:kept_truth].float(),
            ]
        )
        return features.float(), locations, torch.ones(features.shape[0], dtype=torch.long)

    def _joined_batch(self, rows: list, cuts: list[tuple[int, int]], batch_size: int) -> BatchFeature:
        """Both joins' end: reports the images cut, pads the images' `(features, locations, mask)` rows."""
        if cuts:
            self._report_ground_truth_cuts(cuts, batch_size)
        features, locations, masks = (pad_sequence(part, batch_first=True) for part in zip(*rows))
        return BatchFeature(
            {"region_features": features, "region_locations": locations, "region_attention_mask": masks}
        )

    def _ground_truth_kept(self, count: int, detections: int, name: str) -> int:
        """How many of an image's `count` ground-truth regions `max_joined_regions` keeps after `detections`."""
        if self.max_joined_regions is None or detections + count <= self.max_joined_regions:
            return count
        if self.region_selection == "refuse":
            raise ValueError(
                f"{name}: {detections} detected and {count} ground-truth regions exceed "
                f"max_joined_regions={self.max_joined_regions}; set region_selection='first_n' to keep "
                "the first ground-truth regions as the original datasets do, or raise max_joined_regions"
            )
        return max(0, self.max_joined_regions - detections)

    def _report_ground_truth_cuts(self, cuts: list[tuple[int, int]], batch_size: int) -> None:
        first = self.regions_cut == 0
        self.regions_cut += len(cuts)
        kept_what = (
            "ground-truth regions first and the first detections after them (the VCR datasets' rule)"
            if self.ground_truth_rows == "after_cut_detections"
            else "detections and the first ground-truth regions"
        )
        if first:
            logger.warning(
                f"{len(cuts)} of {batch_size} images had more detected and ground-truth regions together than "
                f"max_joined_regions={self.max_joined_regions} ({', '.join(str(b) for b, _ in cuts)}): kept the "
                f"{kept_what}, as the original 12-in-1 datasets cut max_region_num rows. Later cuts are not logged "
                "again; `regions_cut` on the region processor counts the images cut."
            )


def _regions_from_rows(max_rows: int) -> int:
    """A `max_regions` saved when it counted rows (the global token included), in today's meaning."""
    global _ROWS_MIGRATION_LOGGED
    if max_rows < 2:
        raise ValueError(
            f"a saved max_regions that counts rows includes the global image token; it must be at least "
            f"2, got {max_rows}"
        )
    if not _ROWS_MIGRATION_LOGGED:
        _ROWS_MIGRATION_LOGGED = True
        logger.warning(
            f"this ViLBERT processor was saved when max_regions counted rows, the global image token "
            f"included: loaded as max_regions={max_rows - 1} detected regions, the same limit (save the "
            "processor again to store it so)"
        )
    return max_rows - 1


_ROWS_MIGRATION_LOGGED = False


def _check_ground_truth(truth, image: RegionFeatures, feature_dim: int, name: str, index: int) -> None:
    if not isinstance(truth, RegionFeatures):
        raise TypeError(f"{name} must be a vlhub.RegionFeatures, got {type(truth).__name__}")
    if truth.feature_dim != feature_dim:
        raise ValueError(
            f"{name} has {truth.feature_dim}-d features but this processor expects {feature_dim}-d features"
        )
    if tuple(truth.image_size) != tuple(image.image_size):
        raise ValueError(
            f"{name} are boxes of an image of size {tuple(truth.image_size)} but "
            f"regions[{index}] of one of size {tuple(image.image_size)}: both must be of one image"
        )


def _check_vcr_join(image, truth, feature_dim: int, name: str, index: int) -> None:
    """The detections and ground truth of one image that the VCR join merges (`RegionFeatures` are never empty:
    both have a global token)."""
    if not isinstance(image, RegionFeatures):
        raise TypeError(f"regions[{index}] must be a vlhub.RegionFeatures, got {type(image).__name__}")
    if image.feature_dim != feature_dim:
        raise ValueError(
            f"regions[{index}] has {image.feature_dim}-d features but this processor expects {feature_dim}-d features"
        )
    _check_ground_truth(truth, image, feature_dim, name, index)


def _joined_rows(detected: BatchFeature, index: int, start: int, truth: RegionFeatures, kept: int, encoder):
    """One image's `(features, locations, mask)`: its detection rows, padded up to row `start`, then the first
    `kept` rows of `truth`."""
    rows = []
    for name, encoded in (
        ("region_features", encoder.encode_features(truth)[:kept]),
        ("region_locations", encoder.encode_locations(truth)[:kept]),
        ("region_attention_mask", torch.ones(kept, dtype=torch.long)),
    ):
        head = detected[name][index, :start]
        missing = start - head.shape[0]
        if missing > 0:
            head = torch.cat([head, head.new_zeros((missing, *head.shape[1:]))])
        rows.append(torch.cat([head, encoded.to(head.dtype)]))
    return tuple(rows)


class VilbertProcessorKwargs(VisionLanguageProcessorKwargs, total=False):
    """ViLBERT's call options.

    `task_id` (multi-task models): the 12-in-1 task number of every example of the call; defaults to the processor's
    `task_id` setting. `ground_truth`: per image, the ground-truth regions (the original's "gt" feature file, without
    its global token) that join the detections as the 12-in-1 grounding and VCR datasets join them in training
    (`max_joined_regions`, `ground_truth_rows` of the region processor).
    """

    task_id: int | None
    ground_truth: RegionsArgument | None


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

    valid_processor_kwargs = VilbertProcessorKwargs

    def __init__(
        self,
        feature_extractor: VilbertRegionProcessor | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        max_text_length: int = 36,
        num_task_tokens: int = 0,
        task_id: int | None = None,
        **kwargs: Any,
    ) -> None:
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
            raise ValueError(
                f"task_id must be an integer in 0..{self.num_task_tokens - 1} (the checkpoint's task "
                f"tokens), got {task_id!r}"
            )
        return task_id

    def encode_call(self, call: ProcessorCall, options: VilbertProcessorKwargs) -> BatchFeature:
        """The call with `options["task_id"]` and `options["ground_truth"]` (see `VilbertProcessorKwargs`)."""
        return self._encode(call, options.get("task_id"), options.get("ground_truth"))[0]

    def _encode(
        self,
        call: ProcessorCall,
        task_id: int | None,
        ground_truth: RegionsArgument | None,
        ground_truth_name: str = "ground_truth",
    ) -> tuple[BatchFeature, list[tuple[int, int]] | None]:
        """`encode_call`'s outputs and, with `ground_truth`, the layout of its rows (`join_ground_truth`'s)."""
        if task_id is None:
            task_id = self.task_id
        if task_id is not None:
            self._check_task_id(task_id)
        elif self.num_task_tokens > 0:
            raise ValueError(
                f"this processor belongs to a multi-task ViLBERT (task tokens for task ids 0..{self.num_task_tokens - 1}):"
                " pass task_id= (e.g. 1 for VQA, 15 for GQA, 8 for Flickr30k retrieval) or set processor.task_id"
            )
        layout = None
        if ground_truth is not None:
            regions = self._detections(call.regions, call.images)
            joined, layout = self.feature_extractor.join_ground_truth(regions, ground_truth, ground_truth_name)
            if call.text is None and call.token_ids is None:
                return joined, layout  # the regions alone, as the multiple-choice collator encodes them
            call = replace(call, regions=None, images=None)
        outputs = super().encode_call(call, {})
        if layout is not None:
            if "input_ids" in outputs and outputs["input_ids"].shape[0] != len(layout):
                raise ValueError(
                    f"got {outputs['input_ids'].shape[0]} texts but {len(layout)} images: pass one text per image"
                )
            outputs.update(joined)
        if task_id is not None and "input_ids" in outputs:
            outputs["task_ids"] = torch.full((outputs["input_ids"].shape[0], 1), task_id, dtype=torch.long)
        return outputs, layout

    def _detections(self, regions, images) -> list[RegionFeatures]:
        regions = self.regions_or_images(regions, images)
        if regions is None:
            raise ValueError("ground-truth regions join the detected ones: pass regions= (or images=) too")
        return [regions] if isinstance(regions, RegionFeatures) else list(regions)

    @property
    def model_input_names(self) -> list[str]:
        names = super().model_input_names
        return [*names, "task_ids"] if self.num_task_tokens > 0 else names

    @staticmethod
    def guesswhat_text(questions: Sequence[str], answers: Sequence[str]) -> str:
        """GuessWhat pointing's text (12-in-1 task 17): the dialogue as the original writes it, every turn
        `start <question> answer <answer> stop` (plain words, no special tokens); the pointing text of `pointing`."""
        if isinstance(questions, str) or isinstance(answers, str) or len(questions) != len(answers) or not questions:
            raise ValueError(
                f"a GuessWhat dialogue is one answer per question, at least one turn; got "
                f"{len(questions)} questions and {len(answers)} answers"
            )
        return " ".join(f"start {question} answer {answer} stop" for question, answer in zip(questions, answers))

    def pointing(
        self,
        text: str | Sequence[str] | None = None,
        regions: RegionFeatures | Sequence[RegionFeatures] | None = None,
        candidates: RegionFeatures | Sequence[RegionFeatures] | None = None,
        choices: Sequence[int] | Sequence[Sequence[int]] | None = None,
        answer_boxes: Sequence[Sequence[float]] | torch.Tensor | None = None,
        images: Any = None,
        token_ids: TokenIdsArgument | None = None,
        task_id: int | None = None,
        return_tensors: str | None = "pt",
    ) -> BatchFeature:
        """Inputs for pointing among candidate boxes (12-in-1 "V-logit-mc": Visual7w pointing, task 4; GuessWhat
        pointing, task 17) in the original's layout, for `VilbertForReferringExpression`.

        Args:
            text: the question (Visual7w; `[CLS] question [SEP]` as for every task), one per example.
            regions: the detected regions (or `images=` for the region extractor), one `RegionFeatures` per example.
            candidates: the candidate boxes' features, one `RegionFeatures` per example: the original's second
                ("gt") feature file, pooled at the annotated boxes, without its global token. Visual7w lists every
                box of every question on the image, ordered by box id, as its rows. They join the detections as
                `ground_truth` does in `__call__`.
            choices: per example, the rows of `candidates` this question chooses among (the original's
                `multiple_choice_idx`; Visual7w: the 4 boxes of the question, by box id; GuessWhat: the game's
                objects). Default: every candidate kept. Examples with fewer choices than the batch's most are padded
                as the original pads GuessWhat's: the extra choices name a padded (masked) row after every example's
                candidates, so their score is the head's -10000 and their target 0. A choice of a candidate that
                `max_joined_regions` cut is an error (the original's gather fails there).
            answer_boxes: optional, per example the answer box `(x1, y1, x2, y2)` in pixels (Visual7w: `x, y,
                x + width, y + height`); gives `labels` `(batch, num_choices)`, the original's soft targets
                (`pointing_targets` of the chosen candidates' boxes).
            task_id: as for `__call__` (12-in-1: 4 for Visual7w, 17 for GuessWhat pointing).

        Returns the outputs of `__call__` with the candidates as ground truth: the global image token and the
        detected regions, then the candidates' rows (5-d locations, no global token of their own) from row
        `1 + max_regions` on (`ground_truth_rows="after_max_regions"`, the releases' 101) or right after each
        image's detections; and `choice_region_ids` `(batch, num_choices)`: the candidates' rows (the original's
        `101 + multiple_choice_idx`). With 100 detected regions the rows are the original's exactly; with fewer, the
        original put the candidates right after the detections, where `101 + idx` no longer found them, and vlhub
        names the candidates' own rows instead.
        """
        if candidates is None:
            raise ValueError("pointing needs candidates=: the candidate boxes' RegionFeatures, one per example")
        regions = self._detections(regions, images)
        candidates = [candidates] if isinstance(candidates, RegionFeatures) else list(candidates)
        call = ProcessorCall(text, regions, None, token_ids, return_tensors)
        outputs, layout = self._encode(call, task_id, candidates, "candidates")
        choice_rows = _pointing_choices(choices, [len(boxes) for boxes in candidates], [kept for _, kept in layout])
        num_choices = max(len(row) for row in choice_rows)
        ids = [[start + choice for choice in row] for row, (start, _) in zip(choice_rows, layout)]
        if any(len(row) < num_choices for row in choice_rows):
            # A padded choice names a masked row after every example's rows (the original: row 305 of 306).
            padded_row = outputs["region_features"].shape[1]
            for name in ("region_features", "region_locations", "region_attention_mask"):
                outputs[name] = torch.nn.functional.pad(outputs[name], (0, 0) * (outputs[name].ndim - 2) + (0, 1))
            ids = [row + [padded_row] * (num_choices - len(row)) for row in ids]
        outputs["choice_region_ids"] = torch.tensor(ids, dtype=torch.long)
        if answer_boxes is not None:
            outputs["labels"] = _pointing_labels(candidates, choice_rows, answer_boxes, num_choices)
        return outputs


def _pointing_choices(choices, num_candidates: list[int], num_kept: list[int]) -> list[list[int]]:
    """Per example, the candidate rows chosen among (checked): `choices` as given, or every kept candidate."""
    if choices is None:
        return [list(range(n)) for n in num_kept]
    if isinstance(choices, torch.Tensor):
        choices = choices.tolist()
    choices = list(choices)
    rows = [choices] if choices and isinstance(choices[0], Integral) else [list(c) for c in choices]
    if len(rows) != len(num_candidates):
        raise ValueError(f"got {len(num_candidates)} images but {len(rows)} choice lists: one per example")
    if not all(rows):
        raise ValueError(f"every example needs at least one choice, got {[len(row) for row in rows]} choices")
    for i, (row, count, kept) in enumerate(zip(rows, num_candidates, num_kept)):
        bad = [c for c in row if isinstance(c, bool) or not isinstance(c, Integral) or not 0 <= c < count]
        if bad:
            raise ValueError(f"choices[{i}] must be rows of candidates[{i}] (0..{count - 1}), got {bad}")
        cut = [c for c in row if c >= kept]
        if cut:
            raise ValueError(
                f"choices[{i}] names candidates {cut}, which max_joined_regions cut (it keeps {kept} of "
                f"the {count} candidates of this image); the original fails on them too: raise "
                "max_joined_regions or choose among the kept candidates"
            )
    return [[int(c) for c in row] for row in rows]


def _pointing_labels(candidates, choice_rows, answer_boxes, num_choices: int) -> torch.Tensor:
    """`(batch, num_choices)` soft targets: `pointing_targets` of the chosen candidates, 0 for padded choices."""
    answer_boxes = list(answer_boxes)
    if len(answer_boxes) != len(candidates):
        raise ValueError(f"got {len(candidates)} images but {len(answer_boxes)} answer boxes: one per example")
    labels = []
    for i, (boxes, rows, answer) in enumerate(zip(candidates, choice_rows, answer_boxes)):
        try:
            targets = pointing_targets(boxes.boxes[rows], answer)
        except ValueError as err:
            raise ValueError(f"answer_boxes[{i}]: {err}") from err
        labels.append(torch.nn.functional.pad(targets, (0, num_choices - len(rows))))
    return torch.stack(labels)
