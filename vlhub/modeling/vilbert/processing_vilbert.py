"""ViLBERT's processor: uncased BERT word pieces, regions with a global image token first and 5-d locations, and
the 12-in-1 task token."""

from __future__ import annotations

from numbers import Integral
from typing import Sequence

import torch
from torch.nn.utils.rnn import pad_sequence
from torchvision.ops import box_iou
from transformers import BatchFeature

from ...processing.processor_base import CUT_FROM, RegionProcessor, VisionLanguageProcessor
from ...processing.regions import RegionFeatures

__all__ = [
    "VilbertRegionProcessor", "VilbertProcessor", "vilbert_locations", "pointing_targets", "GLOBAL_TOKEN_LOCATION",
]

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


def pointing_targets(boxes: torch.Tensor, answer_box) -> torch.Tensor:
    """The 12-in-1 pointing datasets' soft targets: the IoU of each box `(n, 4)` with `answer_box` `(x1, y1, x2, y2)`,
    both in pixels, in the original's inclusive pixel convention (a box spans `x2 - x1 + 1` pixels), and 0 where it
    is below 0.5. `(n,)` float32."""
    answer = torch.as_tensor(answer_box, dtype=torch.float32).reshape(-1)
    if answer.numel() != 4 or not torch.isfinite(answer).all() or answer[2] < answer[0] or answer[3] < answer[1]:
        raise ValueError(f"an answer box must be 4 finite pixel coordinates (x1, y1, x2, y2) with x2 >= x1 and "
                         f"y2 >= y1, got {answer_box!r}")
    inclusive = torch.tensor([0.0, 0.0, 1.0, 1.0])
    iou = box_iou(boxes.float() + inclusive, answer[None] + inclusive)[:, 0]
    return torch.where(iou >= POINTING_IOU_THRESHOLD, iou, torch.zeros_like(iou))


class VilbertRegionProcessor(RegionProcessor):
    """Regions → ViLBERT inputs: row 0 is the global image token (the mean of the region features, location
    `[0, 0, 1, 1, 1]`), then the regions in the order given, with 5-d locations.

    `max_regions` counts every row, the global token included (the original's `max_region_num`: 101 = 100 detected
    regions + the global token in the 12-in-1 release, 100 in the beta release's tasks). The original's feature
    reader averages *all* of a file's regions into the global token, and its datasets then keep the first
    `max_region_num` rows: `region_selection="first_n"` (the default) does the same, so an image with more than
    `max_regions - 1` regions keeps its first `max_regions - 1` and a global token that averages them all (the cut is
    logged once). `"refuse"` makes such an image an error instead. With `confidence_threshold` set and detector
    scores present, regions are selected by confidence as `clamp(#(score > threshold), min_regions, max_regions - 1)`.
    """

    location_dim = 5

    def __init__(self, region_feature_dim: int = 2048, confidence_threshold: float | None = None,
                 min_regions: int = 1, max_regions: int | None = 101, region_selection: str = "first_n", **kwargs):
        if max_regions is not None and max_regions < 2:
            raise ValueError(f"max_regions counts the global image token too; it must be at least 2, got {max_regions}")
        super().__init__(region_feature_dim=region_feature_dim, confidence_threshold=confidence_threshold,
                         min_regions=min_regions, max_regions=max_regions, region_selection=region_selection, **kwargs)

    def select(self, regions: RegionFeatures) -> RegionFeatures:
        selected = self.select_at_most(regions, None if self.max_regions is None else self.max_regions - 1)
        if CUT_FROM in selected.metadata and _ALL_REGIONS_MEAN not in selected.metadata:
            # The original averages the file's regions before its dataset keeps the first rows.
            selected.metadata[_ALL_REGIONS_MEAN] = regions.features.float().sum(dim=0, keepdim=True) / len(regions)
        return selected

    def too_many_regions(self, count: int, limit: int) -> str:
        return (f"got {count} regions but this processor allows at most max_regions={self.max_regions} rows, the "
                f"global image token included ({limit} regions); select regions first, raise max_regions, set "
                "region_selection='first_n' to keep the first ones as the original, or set confidence_threshold so "
                "that regions are selected by detector confidence")

    def encode_locations(self, regions: RegionFeatures) -> torch.Tensor:
        return vilbert_locations(regions)

    def encode_features(self, regions: RegionFeatures) -> torch.Tensor:
        return regions.features.float()

    def add_global_rows(self, features, locations, regions):
        if features.shape[0] == 0:
            raise ValueError("an image without regions has no global image token (the mean of its region features)")
        global_feature = regions.metadata.get(_ALL_REGIONS_MEAN)
        if global_feature is None:
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

    @staticmethod
    def guesswhat_text(questions: Sequence[str], answers: Sequence[str]) -> str:
        """GuessWhat pointing's text (12-in-1 task 17): the dialogue as the original writes it, every turn
        `start <question> answer <answer> stop` (plain words, no special tokens); the pointing text of `pointing`."""
        if isinstance(questions, str) or isinstance(answers, str) or len(questions) != len(answers) or not questions:
            raise ValueError(f"a GuessWhat dialogue is one answer per question, at least one turn; got "
                             f"{len(questions)} questions and {len(answers)} answers")
        return " ".join(f"start {question} answer {answer} stop" for question, answer in zip(questions, answers))

    def pointing(
        self,
        text: str | Sequence[str] | None = None,
        regions: RegionFeatures | Sequence[RegionFeatures] | None = None,
        candidates: RegionFeatures | Sequence[RegionFeatures] | None = None,
        choices: Sequence[int] | Sequence[Sequence[int]] | None = None,
        answer_boxes=None,
        images=None,
        token_ids=None,
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
                box of every question on the image, ordered by box id, as its rows.
            choices: per example, the rows of `candidates` this question chooses among (the original's
                `multiple_choice_idx`; Visual7w: the 4 boxes of the question, by box id; GuessWhat: the game's
                objects). Default: every candidate. Examples with fewer choices than the batch's most are padded as
                the original pads GuessWhat's: the extra choices name one more row, a padded (masked) one, so
                their score is the head's -10000 and their target 0.
            answer_boxes: optional, per example the answer box `(x1, y1, x2, y2)` in pixels (Visual7w: `x, y,
                x + width, y + height`); gives `labels` `(batch, num_choices)`, the original's soft targets
                (`pointing_targets` of the chosen candidates' boxes).
            task_id: as for `__call__` (12-in-1: 4 for Visual7w, 17 for GuessWhat pointing).

        Returns the outputs of `__call__` whose region rows are the global image token and the detected regions,
        padded to the region processor's `max_regions` rows (101 in the releases: every candidate row starts there,
        whatever the number of detections), then the candidates' rows (5-d locations, no global token of their
        own), padded to the batch's most; and `choice_region_ids` `(batch, num_choices)`: `max_regions + choice`
        (the original's `101 + multiple_choice_idx`). With 100 detected regions the rows are the original's
        exactly; with fewer, the original put the candidates right after the detections, where `101 + idx` no
        longer found them, and vlhub pads instead.
        """
        if candidates is None:
            raise ValueError("pointing needs candidates=: the candidate boxes' RegionFeatures, one per example")
        if regions is not None and images is not None:
            raise ValueError("pass either regions or images, not both")
        if images is not None:
            regions = self.regions_from_images(images)
        if regions is None:
            raise ValueError("pointing needs the detected regions: pass regions= (or images=)")
        regions = [regions] if isinstance(regions, RegionFeatures) else list(regions)
        candidates = [candidates] if isinstance(candidates, RegionFeatures) else list(candidates)
        if len(candidates) != len(regions):
            raise ValueError(f"got {len(regions)} images but {len(candidates)} candidate sets: pass one candidates "
                             "RegionFeatures per image")
        first_rows = self.feature_extractor.max_regions
        if first_rows is None:
            raise ValueError("pointing places the candidates after max_regions rows; this processor's region "
                             "processor has max_regions=None (set it, e.g. 101 as the releases)")
        outputs = self(text=text, regions=regions, token_ids=token_ids, task_id=task_id,
                       return_tensors=return_tensors)
        features, locations, masks = [], [], []
        for i, (image, boxes) in enumerate(zip(regions, candidates)):
            if not isinstance(boxes, RegionFeatures):
                raise TypeError(f"candidates[{i}] must be a vlhub.RegionFeatures, got {type(boxes).__name__}")
            if boxes.feature_dim != self.feature_extractor.region_feature_dim:
                raise ValueError(f"candidates[{i}] has {boxes.feature_dim}-d features but this processor expects "
                                 f"{self.feature_extractor.region_feature_dim}-d features")
            if tuple(boxes.image_size) != tuple(image.image_size):
                raise ValueError(f"candidates[{i}] are boxes of an image of size {tuple(boxes.image_size)} but "
                                 f"regions[{i}] of one of size {tuple(image.image_size)}: both must be of one image")
            features.append(self.feature_extractor.encode_features(boxes).float())
            locations.append(self.feature_extractor.encode_locations(boxes).float())
            masks.append(torch.ones(len(boxes), dtype=torch.long))
        choice_rows = self._pointing_choices(choices, [len(boxes) for boxes in candidates])
        num_choices = max(len(row) for row in choice_rows)
        if any(len(row) < num_choices for row in choice_rows):
            # A padded choice names a masked row after every example's candidates (the original: row 305 of 306).
            padded_row = max(len(boxes) for boxes in candidates)
            features[0] = torch.nn.functional.pad(features[0], (0, 0, 0, padded_row + 1 - features[0].shape[0]))
            locations[0] = torch.nn.functional.pad(locations[0], (0, 0, 0, padded_row + 1 - locations[0].shape[0]))
            masks[0] = torch.nn.functional.pad(masks[0], (0, padded_row + 1 - masks[0].shape[0]))
            choice_rows = [row + [padded_row] * (num_choices - len(row)) for row in choice_rows]
        detected = {name: outputs[name] for name in ("region_features", "region_locations", "region_attention_mask")}
        padding = first_rows - detected["region_features"].shape[1]
        outputs["region_features"] = torch.cat(
            [torch.nn.functional.pad(detected["region_features"], (0, 0, 0, padding)),
             pad_sequence(features, batch_first=True)], dim=1)
        outputs["region_locations"] = torch.cat(
            [torch.nn.functional.pad(detected["region_locations"], (0, 0, 0, padding)),
             pad_sequence(locations, batch_first=True)], dim=1)
        outputs["region_attention_mask"] = torch.cat(
            [torch.nn.functional.pad(detected["region_attention_mask"], (0, padding)),
             pad_sequence(masks, batch_first=True)], dim=1)
        outputs["choice_region_ids"] = first_rows + torch.tensor(choice_rows, dtype=torch.long)
        if answer_boxes is not None:
            answer_boxes = list(answer_boxes)
            if len(answer_boxes) != len(regions):
                raise ValueError(f"got {len(regions)} images but {len(answer_boxes)} answer boxes: one per example")
            labels = []
            for i, (boxes, rows, answer) in enumerate(zip(candidates, choice_rows, answer_boxes)):
                real = [row for row in rows if row < len(boxes)]
                try:
                    targets = pointing_targets(boxes.boxes[real], answer)
                except ValueError as err:
                    raise ValueError(f"answer_boxes[{i}]: {err}") from err
                labels.append(torch.nn.functional.pad(targets, (0, num_choices - len(real))))
            outputs["labels"] = torch.stack(labels)
        return outputs

    @staticmethod
    def _pointing_choices(choices, num_candidates: list[int]) -> list[list[int]]:
        if choices is None:
            return [list(range(n)) for n in num_candidates]
        if isinstance(choices, torch.Tensor):
            choices = choices.tolist()
        choices = list(choices)
        rows = [choices] if choices and isinstance(choices[0], Integral) else [list(c) for c in choices]
        if len(rows) != len(num_candidates):
            raise ValueError(f"got {len(num_candidates)} images but {len(rows)} choice lists: one per example")
        if not all(rows):
            raise ValueError(f"every example needs at least one choice, got {[len(row) for row in rows]} choices")
        for i, (row, count) in enumerate(zip(rows, num_candidates)):
            bad = [c for c in row if isinstance(c, bool) or not isinstance(c, Integral) or not 0 <= c < count]
            if bad:
                raise ValueError(f"choices[{i}] must be rows of candidates[{i}] (0..{count - 1}), got {bad}")
        return [[int(c) for c in row] for row in rows]
