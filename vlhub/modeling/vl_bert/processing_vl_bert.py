"""VL-BERT's processor: uncased BERT word pieces + objects with the whole image as object 0 and box geometry
normalised in the resized image, as the original data loaders prepare them (`vqa/data/datasets/vqa.py`,
`refcoco/data/datasets/refcoco.py`, `*/data/transforms/transforms.py`)."""

from __future__ import annotations

import copy
import logging
from dataclasses import replace
import warnings
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch
from transformers import BatchFeature

from ...processing.processor_base import ProcessorCall, RegionProcessor, VisionLanguageProcessor
from ...processing.processor_base import RegionsArgument, VisionLanguageProcessorKwargs
from ...processing.regions import RegionFeatures
from ...registry import VcrTokens

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from ...processing.detector.image_io import ImageInput

__all__ = [
    "VlBertRegionProcessor",
    "VlBertProcessor",
    "VlBertProcessorKwargs",
    "vl_bert_resized_size",
    "vl_bert_resized_boxes",
    "vl_bert_locations",
]

logger = logging.getLogger(__name__)

# RegionFeatures.metadata key marking regions `sort_by_class_score` already ordered (sorting again could swap ties).
_SORTED_BY_CLASS_SCORE = "vlhub_sorted_by_class_score"

# VCR: detected people are named in the text by these gender-neutral names, in turn (`vcr/data/datasets/vcr.py`).
GENDER_NEUTRAL_NAMES = (
    "Casey",
    "Riley",
    "Jessie",
    "Jackie",
    "Avery",
    "Jaime",
    "Peyton",
    "Kerry",
    "Jody",
    "Kendall",
    "Frankie",
    "Pat",
    "Quinn",
)


def _vcr_object_names(objects: Sequence[str], person_offset: int) -> list[str]:
    """The name of each VCR object in the text: its class, a person the next `GENDER_NEUTRAL_NAMES` entry."""
    names, person = [], person_offset
    for name in objects:
        if name == "person":
            name, person = GENDER_NEUTRAL_NAMES[person % len(GENDER_NEUTRAL_NAMES)], person + 1
        names.append(name)
    return names


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


def vl_bert_resized_boxes(
    boxes: torch.Tensor, image_size: tuple[int, int], min_size: int = 600, max_size: int | None = 1000
) -> tuple[torch.Tensor, tuple[int, int]]:
    """`boxes` `(R, 4)` (x1, y1, x2, y2 in pixels of the image of `image_size` = (height, width)) in the resized image
    (`vl_bert_resized_size`), clamped to `[0, W-1] x [0, H-1]` as the original loaders do; and that `(W, H)`."""
    height0, width0 = (int(round(v)) for v in image_size)
    width, height = vl_bert_resized_size(width0, height0, min_size, max_size)
    boxes = boxes.float().clone()
    # The original multiplies its float32 boxes by Python-float ratios and clamps in float32.
    boxes[:, [0, 2]] = (boxes[:, [0, 2]] * (width * 1.0 / width0)).clamp(min=0, max=width - 1)
    boxes[:, [1, 3]] = (boxes[:, [1, 3]] * (height * 1.0 / height0)).clamp(min=0, max=height - 1)
    return boxes, (width, height)


def vl_bert_locations(
    boxes: torch.Tensor, image_size: tuple[int, int], min_size: int = 600, max_size: int | None = 1000
) -> torch.Tensor:
    """`(R, 4)` = `(x_center / W, y_center / H, width / W, height / H)` of `boxes` `(R, 4)` (x1, y1, x2, y2 in pixels of
    the image of `image_size` = (height, width)), computed as the original does: boxes scaled to the resized image
    (`vl_bert_resized_size`, W x H), clamped to `[0, W-1] x [0, H-1]`, then converted (width = x2 - x1, no +1)."""
    boxes, (width, height) = vl_bert_resized_boxes(boxes, image_size, min_size, max_size)
    x_center, y_center = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
    box_width, box_height = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    return torch.stack([x_center / width, y_center / height, box_width / width, box_height / height], dim=1)


class VlBertRegionProcessor(RegionProcessor):
    """Regions → VL-BERT inputs: `region_features` `(batch, 1 + R, F)`, `region_locations` `(batch, 1 + R, 4)`,
    `region_attention_mask`.

    Object 0 is the whole image (`ADD_IMAGE_AS_A_BOX`): the box `[0, 0, w-1, h-1]` with the feature
    `regions.metadata["image_box_feature"]` when given (what the original reads from a feature file that has one),
    else the mean of the region features (the original's default otherwise). Regions are kept in the order
    given (the released VQA features were selected at extraction, 10-100 per image; more than `max_regions` is an
    error; the original's loaders keep every box, so converted processors have `max_regions=None`); with
    `confidence_threshold` set and detector scores present they are selected by confidence
    (`min_regions`..`max_regions`) as the other architectures do. Boxes are normalised
    in the image the original resizes to (`min_size` 600, `max_size` 1000; VCR used 1200).

    `sort_by_class_score=True` orders the selected regions by their largest class probability, highest first, as
    the original's Conceptual Captions pre-training loader does (`np.argsort(max class score)[::-1]`); it needs the
    detector's class probabilities (`class_probs`, the feature file's `classes`).
    """

    location_dim = 4

    def __init__(
        self,
        min_size: int = 600,
        max_size: int | None = 1000,
        confidence_threshold: float | None = None,
        min_regions: int = 1,
        max_regions: int | None = 100,
        image_feature_precomputed: bool = True,
        pixel_mean: tuple[float, float, float] | list[float] = (102.9801, 115.9465, 122.7717),
        sort_by_class_score: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            confidence_threshold=confidence_threshold, min_regions=min_regions, max_regions=max_regions, **kwargs
        )
        if min_size < 1 or (max_size is not None and max_size < min_size):
            raise ValueError(f"need 1 <= min_size <= max_size, got min_size={min_size}, max_size={max_size}")
        self.min_size = min_size
        self.max_size = max_size
        self.image_feature_precomputed = image_feature_precomputed
        self.pixel_mean = list(pixel_mean)
        self.sort_by_class_score = sort_by_class_score

    def select(self, regions: RegionFeatures) -> RegionFeatures:
        selected = super().select(regions)
        if not self.sort_by_class_score or selected.metadata.get(_SORTED_BY_CLASS_SCORE):
            return selected
        if selected.class_probs is None:
            raise ValueError(
                "sort_by_class_score orders regions by their largest class probability: these regions "
                "have no class_probs (a VL-BERT feature file's `classes`)"
            )
        # The original's order exactly: numpy's default argsort of the largest score, reversed.
        order = np.argsort(selected.class_probs.numpy().max(axis=1))[::-1].copy()
        ordered = selected.take(torch.from_numpy(order))
        ordered.metadata[_SORTED_BY_CLASS_SCORE] = True
        return ordered

    def encode_images(self, images: Sequence[ImageInput], boxes: Sequence[torch.Tensor]) -> dict:
        """e2e models: `pixel_values` `(batch, 3, H, W)` (each image resized as the original — short side `min_size`,
        long side at most `max_size`, PIL bilinear — BGR 0-255 minus `pixel_mean`, zero padded bottom/right),
        `region_boxes` `(batch, 1 + R, 4)` in those pixels (object 0 = the whole image, boxes scaled and clamped),
        `region_locations` and `region_attention_mask`. `boxes`: one `(R, 4)` tensor per image, original pixels."""
        from PIL import Image

        from ...processing.detector.image_io import load_rgb_image

        if len(images) != len(boxes):
            raise ValueError(f"got {len(images)} images but {len(boxes)} box lists: pass one (R, 4) tensor per image")
        pixels, all_boxes, locations = [], [], []
        for i, (image, image_boxes) in enumerate(zip(images, boxes)):
            rgb = load_rgb_image(image, name=f"images[{i}]")
            image_boxes = torch.as_tensor(image_boxes, dtype=torch.float32)
            if image_boxes.ndim != 2 or image_boxes.shape[1] != 4:
                raise ValueError(f"boxes[{i}] must have shape (num_boxes, 4), got {tuple(image_boxes.shape)}")
            if self.max_regions is not None and len(image_boxes) > self.max_regions:
                raise ValueError(
                    f"boxes[{i}] has {len(image_boxes)} boxes; this processor allows max_regions={self.max_regions}"
                )
            height0, width0 = rgb.shape[:2]
            whole = torch.tensor([[0.0, 0.0, width0 - 1.0, height0 - 1.0]])
            with_image = torch.cat([whole, image_boxes])
            resized_boxes, (width, height) = vl_bert_resized_boxes(
                with_image, (height0, width0), self.min_size, self.max_size
            )
            resized = Image.fromarray(rgb).resize((width, height), Image.BILINEAR)
            tensor = torch.from_numpy(np.asarray(resized, dtype=np.float32).copy()).permute(2, 0, 1)
            # The original: ToTensor (/255), then RGB → BGR, ×255, minus the Caffe means (std 1).
            bgr = (tensor / 255.0)[[2, 1, 0]] * 255.0 - torch.tensor(self.pixel_mean).view(3, 1, 1)
            pixels.append(bgr)
            all_boxes.append(resized_boxes)
            locations.append(vl_bert_locations(with_image, (height0, width0), self.min_size, self.max_size))
        batch = len(pixels)
        height = max(p.shape[1] for p in pixels)
        width = max(p.shape[2] for p in pixels)
        count = max(len(b) for b in all_boxes)
        pixel_values = torch.zeros(batch, 3, height, width)
        region_boxes = torch.zeros(batch, count, 4)
        region_locations = torch.zeros(batch, count, 4)
        region_attention_mask = torch.zeros(batch, count, dtype=torch.long)
        for i, (p, b, loc) in enumerate(zip(pixels, all_boxes, locations)):
            pixel_values[i, :, : p.shape[1], : p.shape[2]] = p
            region_boxes[i, : len(b)] = b
            region_locations[i, : len(b)] = loc
            region_attention_mask[i, : len(b)] = 1
        return {
            "pixel_values": pixel_values,
            "region_boxes": region_boxes,
            "region_locations": region_locations,
            "region_attention_mask": region_attention_mask,
        }

    def encode_locations(self, regions: RegionFeatures) -> torch.Tensor:
        return vl_bert_locations(regions.boxes, regions.image_size, self.min_size, self.max_size)

    def add_global_rows(
        self, features: torch.Tensor, locations: torch.Tensor, regions: RegionFeatures
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if len(regions) == 0:
            raise ValueError("VL-BERT needs at least one region: the whole-image feature is their mean")
        height, width = (int(round(v)) for v in regions.image_size)
        image_box = torch.tensor([[0.0, 0.0, width - 1.0, height - 1.0]])
        image_location = vl_bert_locations(image_box, regions.image_size, self.min_size, self.max_size)
        return torch.cat([self.image_box_feature(features, regions), features]), torch.cat([image_location, locations])

    @staticmethod
    def image_box_feature(features: torch.Tensor, regions: RegionFeatures) -> torch.Tensor:
        """`(1, F)`: object 0's feature. The original's VQA loader takes the feature file's `image_box_feature` (the
        detector's feature of the whole-image box) when the file has one, else the mean of the box features; here
        `regions.metadata["image_box_feature"]` (`(F,)` or `(1, F)`, set by `VlBertJsonReader` from such a file, or
        by you) plays that part."""
        given = regions.metadata.get("image_box_feature")
        if given is None:
            return features.mean(dim=0, keepdim=True)
        given = torch.as_tensor(np.asarray(given, dtype=np.float32) if not torch.is_tensor(given) else given)
        given = given.to(dtype=features.dtype)
        given = given.unsqueeze(0) if given.ndim == 1 else given
        if tuple(given.shape) != (1, features.shape[1]):
            raise ValueError(
                f"metadata['image_box_feature'] must hold one feature of the regions' size {features.shape[1]} "
                f"(shape ({features.shape[1]},) or (1, {features.shape[1]})), got shape {tuple(given.shape)}"
            )
        if not torch.isfinite(given).all():
            raise ValueError("metadata['image_box_feature'] has NaN or infinite values")
        return given


class VlBertProcessorKwargs(VisionLanguageProcessorKwargs, total=False):
    """VL-BERT's call options: `boxes`, for an "e2e" model (`image_feature_precomputed=False`), one `(R, 4)` tensor
    per image of `images` (original pixels); without them an "e2e" processor takes its region extractor's boxes. An
    "e2e" call returns `pixel_values` and `region_boxes` instead of `region_features`."""

    boxes: Sequence[torch.Tensor] | None


class VlBertProcessor(VisionLanguageProcessor):
    """VL-BERT processor: an uncased BERT tokenizer (`bert-base-uncased`, vocabulary 30522) and
    `VlBertRegionProcessor`.

    `processor(text=[...], regions=[RegionFeatures, ...], return_tensors="pt")` → `input_ids`, `attention_mask`,
    `token_type_ids`, `region_features`, `region_locations`, `region_attention_mask`.

    With `answer_slot=True` (VQA models) a question is laid out `[CLS] q [SEP] [MASK] [SEP]`, the `[MASK]` and its
    `[SEP]` of token type 1: the model reads the answer from the `[MASK]` output. Otherwise (pre-training, RefCOCO+)
    `[CLS] text [SEP]`, all of type 0. The objects and `[END]` are not text tokens: the model adds them.

    `max_text_and_objects` (None: off) is the original's Conceptual Captions pre-training limit (`SEQ_LEN`, 64): an
    example's tokens (special tokens included) and objects (the whole image included) together at most this many,
    cut one at a time from whichever of the two is longer (objects from the end, word pieces before the last
    `[SEP]`), with object 0 the mean of *every* selected region, the cut ones too. With the region processor's
    `sort_by_class_score` the cut objects are the least confident. At least one word piece and the whole image stay.
    The first batch with a cut says so in the log, once.
    """

    valid_processor_kwargs = VlBertProcessorKwargs

    def __init__(
        self,
        feature_extractor: VlBertRegionProcessor | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        max_text_length: int = 64,
        answer_slot: bool = False,
        max_text_and_objects: int | None = None,
        **kwargs: Any,
    ) -> None:
        if max_text_and_objects is not None and max_text_and_objects < 4:
            raise ValueError(
                f"max_text_and_objects must leave room for [CLS] w [SEP] and the whole image, got "
                f"{max_text_and_objects}"
            )
        self.answer_slot = answer_slot
        self.max_text_and_objects = max_text_and_objects
        self._joint_cut_logged = False
        super().__init__(feature_extractor, tokenizer, max_text_length=max_text_length, **kwargs)

    @property
    def image_feature_precomputed(self) -> bool:
        return getattr(self.feature_extractor, "image_feature_precomputed", True)

    @property
    def model_input_names(self) -> list[str]:
        names = super().model_input_names
        if self.image_feature_precomputed:
            return names
        return [n for n in names if n != "region_features"] + ["pixel_values", "region_boxes"]

    def encode_call(self, call: ProcessorCall, options: VlBertProcessorKwargs) -> BatchFeature:
        """The call with `options["boxes"]` (see `VlBertProcessorKwargs`): a 'prec' processor encodes regions (cut
        to `max_text_and_objects` with their text when set), an 'e2e' one images and their boxes."""
        boxes = options.get("boxes")
        if self.image_feature_precomputed:
            if boxes is not None:
                raise ValueError(
                    "boxes= are for an 'e2e' VL-BERT processor; this one ('prec') takes regions= "
                    "(RegionFeatures) or images= through its region extractor"
                )
            has_text = call.text is not None or call.token_ids is not None
            if self.max_text_and_objects is not None and call.regions is not None and has_text:
                call = self._fitted(call)
            return super().encode_call(call, {})
        return self._encode_e2e(call, boxes)

    def _fitted(self, call: ProcessorCall) -> ProcessorCall:
        """`call` with its word pieces and regions cut to `max_text_and_objects` together."""
        token_ids, regions = self.fit_text_and_objects(self.word_pieces(call.text, call.token_ids), call.regions)
        return replace(call, text=None, token_ids=token_ids, regions=regions)

    def _encode_e2e(self, call: ProcessorCall, boxes: Sequence[torch.Tensor] | None) -> BatchFeature:
        """An 'e2e' processor's call: the text as usual, `pixel_values` and `region_boxes` from the images and their
        `boxes` (else the region extractor's)."""
        if call.regions is not None:
            raise ValueError(
                "this is an 'e2e' VL-BERT processor: it takes images= (and boxes=), not precomputed "
                "regions=; the model computes the region features from the pixels itself"
            )
        if call.images is None:
            raise ValueError("an 'e2e' VL-BERT processor needs images= (and boxes=, or a region extractor)")
        images = [call.images] if not isinstance(call.images, (list, tuple)) else list(call.images)
        if boxes is None:
            if self.region_extractor is None:
                raise ValueError(
                    "pass boxes= (one (R, 4) tensor per image, original pixels): this processor has no "
                    "region extractor to find them"
                )
            boxes = [r.boxes for r in self.regions_from_images(images)]
        has_text = call.text is not None or call.token_ids is not None
        data = dict(super().encode_call(replace(call, images=None), {})) if has_text else {}
        visual = self.feature_extractor.encode_images(images, list(boxes))
        if data and data["input_ids"].shape[0] != visual["pixel_values"].shape[0]:
            raise ValueError(f"got {data['input_ids'].shape[0]} texts but {visual['pixel_values'].shape[0]} images")
        return BatchFeature({**data, **visual}, tensor_type=call.return_tensors)

    def fit_text_and_objects(
        self, word_pieces: list[list[int]], regions: RegionsArgument
    ) -> tuple[list[list[int]], list]:
        """Each example's word pieces and selected regions cut to `max_text_and_objects` together, as the original's
        Conceptual Captions loader cuts them; the regions carry object 0's feature (the mean of all of them)."""
        batch = [regions] if isinstance(regions, RegionFeatures) else list(regions)
        if len(batch) != len(word_pieces):
            raise ValueError(f"got {len(word_pieces)} texts but {len(batch)} images: pass one text per image")
        fitted_pieces, fitted_regions, cuts = [], [], []
        for i, (pieces, item) in enumerate(zip(word_pieces, batch)):
            if not isinstance(item, RegionFeatures):
                raise TypeError(f"regions[{i}] must be a vlhub.RegionFeatures, got {type(item).__name__}")
            try:
                selected = self.feature_extractor.select(item)
            except ValueError as err:
                raise ValueError(f"regions[{i}]: {err}") from err
            if not len(selected):
                raise ValueError(
                    f"regions[{i}]: VL-BERT needs at least one region: the whole-image feature is their mean"
                )
            specials = len(self.build_text_inputs(pieces)[0]) - len(pieces)
            text_keep, object_keep = self._joint_lengths(specials + len(pieces), 1 + len(selected))
            kept = selected.take(torch.arange(object_keep - 1))
            # The original's object 0: the mean over all the boxes, before the cut (its file's own feature unused).
            kept.metadata["image_box_feature"] = selected.features.mean(dim=0)
            fitted_pieces.append(pieces[: max(text_keep - specials, 1)])
            fitted_regions.append(kept)
            if text_keep < specials + len(pieces) or object_keep < 1 + len(selected):
                cuts.append(f"{specials + len(pieces)} + {1 + len(selected)} → {text_keep} + {object_keep}")
        if cuts and not self._joint_cut_logged:
            self._joint_cut_logged = True
            logger.warning(
                f"{len(cuts)} of {len(batch)} examples had more tokens + objects than max_text_and_objects="
                f"{self.max_text_and_objects} ({', '.join(cuts)}): cut from the longer, as the original's "
                "Conceptual Captions loader does. Later cuts are not logged again."
            )
        return fitted_pieces, fitted_regions

    def _joint_lengths(self, text_length: int, object_count: int) -> tuple[int, int]:
        """(tokens, objects) kept of an example: the original's loop, one from the longer while over the limit."""
        limit = self.max_text_and_objects
        while text_length + object_count > limit and text_length > 0 and object_count > 0:
            if object_count > text_length:
                object_count -= 1
            else:
                text_length -= 1
        return max(text_length, 2), max(object_count, 1)

    # -- VCR ------------------------------------------------------------------------------------------------------
    def _vcr_pieces(self, tokens, names: list[str], what: str) -> tuple[list[int], list[int]]:
        """VCR's mixed tokens (words, and lists of object indices) → word-piece ids and each piece's object tag:
        a reference `[o1, o2, ...]` becomes `name(o1) and name(o2) ...`, the name's pieces tagged `o + 1` (object 0
        is the whole image), every other piece (words, "and") tagged 0 — the original's `BASIC_ALIGN: false`."""
        if isinstance(tokens, str) or not isinstance(tokens, (list, tuple)) or not tokens:
            raise ValueError(
                f"{what} must be a non-empty list of VCR tokens (words and lists of object indices), got {tokens!r}"
            )
        ids, tags = [], []

        def add(text: str, tag: int):
            pieces = self.tokenizer.convert_tokens_to_ids(self.tokenizer.tokenize(text))
            ids.extend(pieces)
            tags.extend([tag] * len(pieces))

        for i, token in enumerate(tokens):
            if isinstance(token, str):
                add(token, 0)
                continue
            if not isinstance(token, (list, tuple)) or not token:
                raise ValueError(f"{what}[{i}] must be a word or a non-empty list of object indices, got {token!r}")
            for j, index in enumerate(token):
                if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(names):
                    raise ValueError(
                        f"{what}[{i}] refers to object {index!r}; the image has {len(names)} objects "
                        f"(indices 0..{len(names) - 1})"
                    )
                if j:
                    add("and", 0)
                add(names[index], index + 1)
        if not ids:
            raise ValueError(f"{what} has no word pieces")
        return ids, tags

    def vcr_text(
        self,
        question: VcrTokens,
        choices: Sequence[VcrTokens],
        objects: Sequence[str],
        answer: VcrTokens | None = None,
        max_length: int = 64,
        person_name_offset: int = 0,
    ) -> BatchFeature:
        """One VCR example's texts, one row per choice, laid out as the original VL-BERT VCR model builds them.

        Args:
            question, choices, answer: VCR's tokens: a list of words and object references (lists of indices into
                `objects`), e.g. `["why", "is", [0], "smiling", "?"]`; `choices` the 4 answers (Q→A) or, with
                `answer` (the chosen answer's tokens, QA→R), the 4 rationales.
            objects: the image's object classes, in the order of the regions you pass (`["person", "dog", ...]`).
                References become names: a "person" is named `GENDER_NEUTRAL_NAMES` in turn (from
                `person_name_offset`; the original's counter runs on across examples), other objects by class.
            max_length: word pieces per choice without the special tokens (the original's `seq_len`, 64).

        Each row is `[CLS] A [SEP] B [SEP]`: Q→A has A = question, B = answer; QA→R has A = question + answer,
        B = rationale. `[CLS]`, A and the first `[SEP]` are token type 0; B and its `[SEP]` type 1. Too long texts
        are cut as the original cuts them: Q→A pops the last piece of the longer of question and answer, and the
        question stays cut for every choice; QA→R pops the rationale while it is longer than question + answer,
        else the question (down to one piece), else the answer.

        Returns `input_ids`, `token_type_ids`, `attention_mask` and `text_region_ids` (each piece's object: 0 =
        the whole image, `o + 1` = `objects[o]`, matching the regions' rows after the whole-image object 0), each
        `(num_choices, text_length)`; pass them to `VlBertForMultipleChoice` with a leading batch dimension.
        """
        if isinstance(objects, str) or not all(isinstance(o, str) for o in objects):
            raise ValueError(f"objects must be a list of class names, got {objects!r}")
        if max_length < 3:
            raise ValueError(f"max_length must leave room for the texts, got {max_length}")
        if isinstance(choices, (str, bytes)) or not choices:
            raise ValueError("choices must be a non-empty list of answers (or rationales), each a list of VCR tokens")
        names = _vcr_object_names(objects, person_name_offset)
        q_ids, q_tags = self._vcr_pieces(question, names, "question")
        rows = [self._vcr_pieces(c, names, f"choices[{k}]") for k, c in enumerate(choices)]
        ans_ids, ans_tags = ([], []) if answer is None else self._vcr_pieces(answer, names, "answer")
        cut_from = max(len(q_ids) + len(ans_ids) + len(b_ids) for b_ids, _ in rows)
        cut_from = cut_from if cut_from > max_length else 0
        if answer is None:  # Q→A
            for b_ids, b_tags in rows:
                while len(q_ids) + len(b_ids) > max_length:
                    target = (b_ids, b_tags) if len(b_ids) > len(q_ids) else (q_ids, q_tags)
                    target[0].pop(), target[1].pop()
            a_ids, a_tags = q_ids, q_tags
        else:  # QA→R
            for b_ids, b_tags in rows:
                while len(q_ids) + len(ans_ids) + len(b_ids) > max_length:
                    if len(b_ids) > len(q_ids) + len(ans_ids):
                        target = (b_ids, b_tags)
                    elif len(q_ids) > 1:
                        target = (q_ids, q_tags)
                    else:
                        target = (ans_ids, ans_tags)
                    target[0].pop(), target[1].pop()
            a_ids, a_tags = q_ids + ans_ids, q_tags + ans_tags
        if cut_from:  # cut as the original cuts, but never silently
            warnings.warn(
                f"{question!r}: a VCR text of {cut_from} word pieces was truncated to max_length="
                f"{max_length}, the longer part's last pieces first (as the original)",
                stacklevel=2,
            )
        cls, sep = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        length = max(len(a_ids) + len(b_ids) + 3 for b_ids, _ in rows)
        out = {
            name: torch.zeros(len(rows), length, dtype=torch.long)
            for name in ("input_ids", "token_type_ids", "attention_mask", "text_region_ids")
        }
        out["input_ids"].fill_(self.tokenizer.pad_token_id)
        for k, (b_ids, b_tags) in enumerate(rows):
            ids = [cls, *a_ids, sep, *b_ids, sep]
            n = len(ids)
            out["input_ids"][k, :n] = torch.tensor(ids)
            out["token_type_ids"][k, len(a_ids) + 2 : n] = 1
            out["attention_mask"][k, :n] = 1
            out["text_region_ids"][k, :n] = torch.tensor([0, *a_tags, 0, *b_tags, 0])
        return BatchFeature(out, tensor_type="pt")

    def for_task(self, task: str) -> "VlBertProcessor":
        """This processor with the answer slot on for "vqa" and off for the other tasks, and without the
        pre-training rule (`max_text_and_objects`, `sort_by_class_score`: the fine-tuning loaders keep every box in
        the file's order); a copy if anything changes."""
        answer_slot = task == "vqa"
        pretraining_rule = self.max_text_and_objects is not None or self.feature_extractor.sort_by_class_score
        if answer_slot == self.answer_slot and not pretraining_rule:
            return self
        processor = copy.copy(self)
        processor.answer_slot = answer_slot
        if pretraining_rule:
            processor.max_text_and_objects = None
            processor.feature_extractor = copy.copy(self.feature_extractor)
            processor.feature_extractor.sort_by_class_score = False
        return processor

    def build_text_inputs(self, word_piece_ids: list[int]) -> tuple[list[int], list[int]]:
        if not self.answer_slot:
            return super().build_text_inputs(word_piece_ids)
        tok = self.tokenizer
        question = [tok.cls_token_id, *word_piece_ids, tok.sep_token_id]
        return [*question, tok.mask_token_id, tok.sep_token_id], [0] * len(question) + [1, 1]
