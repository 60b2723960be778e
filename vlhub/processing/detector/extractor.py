"""`RegionExtractor`: images in, bottom-up-attention region features out."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..region_extractors import DEFAULT_REGION_EXTRACTOR_TYPE, REGION_EXTRACTOR_TYPE_KEY, read_region_extractor_config
from ..regions import RegionFeatures
from .backbone import ResNetBackbone
from .boxes import clip_boxes, decode_boxes
from .configuration import DetectorConfig
from .image_io import ImageInput, as_image_list, load_rgb_image
from .quantization import calibration_rois, quantize_res5
from .roi_heads import HeadOutputs, RoIHeads
from .rpn import RegionProposalNetwork
from .selection import Selection, select_butd, select_max_class_nms, select_per_class_nms
from .transform import PreparedImage, prepare_image

__all__ = [
    "Detections",
    "RegionExtractor",
    "CONFIG_NAME",
    "WEIGHTS_NAME",
    "OBJECTS_VOCAB_NAME",
    "ATTRIBUTES_VOCAB_NAME",
]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
OBJECTS_VOCAB_NAME = "objects_vocab.txt"
ATTRIBUTES_VOCAB_NAME = "attributes_vocab.txt"
# `region_extractor_type` in config.json (registered in `vlhub.processing.region_extractors`, where it is also the
# type of folders saved before the field existed)
REGION_EXTRACTOR_TYPE = DEFAULT_REGION_EXTRACTOR_TYPE


@dataclass
class Detections:
    """Everything the detector says about the N selected detections of one image.

    `features` `(N, F)` pooled res5 features of each detection's proposal; `boxes` `(N, 4)` reported boxes
    (proposals in "butd", regressed boxes otherwise) and `proposal_boxes` `(N, 4)`, both x1 y1 x2 y2 in ORIGINAL
    pixels; `proposal_indices` `(N,)` (order of the RPN output); `class_ids` `(N,)` 0-based object ids;
    `scores` `(N,)` detection confidences; `class_probs` `(N, C + 1)` softmax over all classes, background FIRST;
    `attribute_ids`, `attribute_scores` `(N,)` and `attribute_probs` `(N, A)` (softmax over the A attributes,
    "no attribute" excluded, as the reference ports compute it) or None; `image_size` / `resized_size` `(H, W)`.
    """

    features: torch.Tensor
    boxes: torch.Tensor
    proposal_boxes: torch.Tensor
    proposal_indices: torch.Tensor
    class_ids: torch.Tensor
    scores: torch.Tensor
    class_probs: torch.Tensor
    attribute_ids: torch.Tensor | None
    attribute_scores: torch.Tensor | None
    attribute_probs: torch.Tensor | None
    image_size: tuple[int, int]
    resized_size: tuple[int, int]
    nms_thresholds_tried: list[float]

    def __len__(self) -> int:
        return len(self.features)

    def to_region_features(self) -> RegionFeatures:
        """The `RegionFeatures` of these detections: every field of `RegionFeatures` that `Detections` also has."""
        own = {f.name for f in fields(self)}
        return RegionFeatures(**{f.name: getattr(self, f.name) for f in fields(RegionFeatures) if f.name in own})


def _read_vocab(path: Path) -> list[str] | None:
    if not path.is_file():
        return None
    return [line.split(",")[0].strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class RegionExtractor(nn.Module):
    """The bottom-up-attention Faster R-CNN (ResNet C4, RoIPool, dilated res5 head, attribute head).

    ```python
    extractor = RegionExtractor.from_pretrained("path/to/detector")
    regions = extractor(["cat.jpg", pil_image])     # list[RegionFeatures], boxes in original pixels
    detections = extractor.detect("cat.jpg")       # list[Detections] with class / attribute ids
    ```
    Each image keeps its own resize; the backbone and RPN run per image, the RoI head runs on the RoIs of all
    images together, so results do not depend on what else is in the batch. Inference runs under
    `torch.inference_mode`; `extractor.to(torch.bfloat16)` runs the convolutions in bfloat16 (box arithmetic and
    selection stay in float32).
    """

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__()
        self.config = config
        self.backbone = ResNetBackbone(config)
        self.proposal_generator = RegionProposalNetwork(config)
        self.roi_heads = RoIHeads(config)
        # NHWC for oneDNN's convolutions: same sums; measured on par with or slightly faster than NCHW on CPU.
        self.channels_last = True
        self.to(memory_format=torch.channels_last)
        self.quantization: str | None = None  # "int8" once `quantize` has run
        self.eval()

    # ------------------------------------------------------------------ names
    @property
    def object_names(self) -> list[str]:
        return self.config.object_names or [f"object_{i}" for i in range(self.config.num_classes)]

    @property
    def attribute_names(self) -> list[str]:
        return self.config.attribute_names or [f"attribute_{i}" for i in range(self.config.num_attributes)]

    @property
    def feature_dim(self) -> int:
        return self.config.feature_dim

    # ------------------------------------------------------------------ stages
    def load_image(self, image: ImageInput, name: str = "image") -> np.ndarray:
        """`(H, W, 3)` uint8 RGB pixels of one image, checked against this detector's size limits (`image_io`)."""
        return load_rgb_image(
            image, name=name, min_side=self.config.feature_stride, max_pixels=self.config.max_image_pixels
        )

    def prepare(self, images: ImageInput | Sequence[ImageInput]) -> list[PreparedImage]:
        """Load, check, resize and normalise (see `image_io` for accepted forms)."""
        items, _ = as_image_list(images)
        prepared = []
        for index, image in enumerate(items):
            rgb = self.load_image(image, name=f"images[{index}]")
            try:
                prepared.append(prepare_image(rgb, self.config))
            except ValueError as err:
                raise ValueError(f"images[{index}]: {err}") from err
        return prepared

    def backbone_features(self, prepared: PreparedImage) -> torch.Tensor:
        """`(1, C4, Hf, Wf)` res4 map of one prepared image."""
        weight = self.backbone.stem.conv1.weight
        images = prepared.tensor[None].to(device=weight.device, dtype=weight.dtype)
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return self.backbone(images)

    def run_heads(self, prepared: list[PreparedImage]) -> tuple[list[torch.Tensor], list[HeadOutputs]]:
        """Proposals `(R_i, 4)` (resized pixels, by decreasing objectness) and RoI-head outputs of each image."""
        res4_maps = [self.backbone_features(p) for p in prepared]
        proposals = []
        for index, (res4, item) in enumerate(zip(res4_maps, prepared)):
            boxes, _ = self.proposal_generator(res4, item.resized_size, item.scale)
            if len(boxes) == 0:
                raise ValueError(f"images[{index}]: the region proposal network found no non-empty box")
            proposals.append(boxes)
        # "butd" reports the proposals themselves: the class-specific box regression (4·C outputs per RoI) is skipped.
        return proposals, self.roi_heads(res4_maps, proposals, box_deltas=self.config.selection_mode != "butd")

    def select(self, proposals: torch.Tensor, outputs: HeadOutputs, prepared: PreparedImage) -> Selection:
        config = self.config
        probs = outputs.class_logits.softmax(dim=-1)
        convention = config.box_convention
        if config.selection_mode == "butd":
            return select_butd(
                proposals,
                probs,
                config.score_threshold,
                config.nms_thresholds[0],
                config.min_boxes,
                config.max_boxes,
                convention,
            )
        predicted = clip_boxes(
            decode_boxes(outputs.box_deltas, proposals, config.box_weights, convention),
            prepared.resized_size,
            convention,
        )
        if config.selection_mode == "max_class_nms":
            return select_max_class_nms(
                predicted, probs, config.nms_thresholds, config.min_boxes, config.max_boxes, convention
            )
        return select_per_class_nms(
            predicted,
            probs,
            config.score_threshold,
            config.nms_thresholds,
            config.min_boxes,
            config.max_boxes,
            convention,
        )

    def _to_original(self, boxes: torch.Tensor, prepared: PreparedImage) -> torch.Tensor:
        """Resized-image boxes → original pixels, clipped to the original image."""
        height, width = prepared.original_size
        if self.config.box_convention == "caffe":
            boxes = boxes / prepared.scale  # generate_tsv.py: rois / im_scale
        else:
            scale_y, scale_x = prepared.scales_yx
            boxes = boxes * boxes.new_tensor([scale_x, scale_y, scale_x, scale_y])
        one = 1 if self.config.box_convention == "caffe" else 0
        return torch.stack(
            [
                boxes[:, 0].clamp(0, width - one),
                boxes[:, 1].clamp(0, height - one),
                boxes[:, 2].clamp(0, width - one),
                boxes[:, 3].clamp(0, height - one),
            ],
            dim=1,
        )

    def _detections(self, proposals, outputs: HeadOutputs, prepared: PreparedImage) -> Detections:
        selection = self.select(proposals, outputs, prepared)
        ids = selection.proposal_indices
        probs = outputs.class_logits[ids].softmax(dim=-1)
        attribute_ids = attribute_scores = attribute_probs = None
        if outputs.attribute_logits is not None:
            attribute_probs = outputs.attribute_logits[ids, :-1].softmax(dim=-1)
            attribute_scores, attribute_ids = attribute_probs.max(dim=-1)
        return Detections(
            features=outputs.features[ids],
            boxes=self._to_original(selection.boxes, prepared),
            proposal_boxes=self._to_original(proposals[ids], prepared),
            proposal_indices=ids,
            class_ids=selection.class_ids,
            scores=selection.scores,
            class_probs=torch.cat([probs[:, -1:], probs[:, :-1]], dim=1),
            attribute_ids=attribute_ids,
            attribute_scores=attribute_scores,
            attribute_probs=attribute_probs,
            image_size=prepared.original_size,
            resized_size=prepared.resized_size,
            nms_thresholds_tried=selection.nms_thresholds_tried,
        )

    # ------------------------------------------------------------------ public API
    @torch.inference_mode()
    def detect(self, images: ImageInput | Sequence[ImageInput], batch_size: int | None = None) -> list[Detections]:
        """`Detections` of each image. `batch_size` images share one RoI-head pass (default: all)."""
        prepared = self.prepare(images)
        step = batch_size or max(len(prepared), 1)
        if step < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        results = []
        for start in range(0, len(prepared), step):
            chunk = prepared[start : start + step]
            proposals, outputs = self.run_heads(chunk)
            # Selection and box arithmetic are small: they run on the CPU whatever the model's device.
            results.extend(self._detections(p.cpu(), o.cpu(), item) for p, o, item in zip(proposals, outputs, chunk))
        return results

    def forward(self, images: ImageInput | Sequence[ImageInput], batch_size: int | None = None) -> list[RegionFeatures]:
        """`RegionFeatures` of each image (a list, also for a single image)."""
        detections = self.detect(images, batch_size=batch_size)
        for index, found in enumerate(detections):
            if len(found) == 0:  # only "per_class_nms" can keep nothing: no class probability above the threshold
                raise ValueError(
                    f"images[{index}]: no detection has a class probability above score_threshold="
                    f"{self.config.score_threshold}; lower it, or use selection_mode='butd' (always >= min_boxes)"
                )
        return [d.to_region_features() for d in detections]

    def quantize(self, calibration_images: ImageInput | Sequence[ImageInput], dtype: str = "int8") -> "RegionExtractor":
        """Run res5 (~90% of the FLOPs) in int8 from now on, its activation ranges calibrated on the RoIs of
        `calibration_images` (see `quantization`); in place, returns the extractor. CPU inference only; a quantized
        extractor cannot be saved (save the float one and quantize after loading)."""
        if dtype != "int8":
            raise ValueError(f"RegionExtractor.quantize supports only 'int8', got {dtype!r}")
        if self.quantization is not None:
            raise ValueError(f"the extractor is already quantized ({self.quantization})")
        if self.backbone.stem.conv1.weight.dtype != torch.float32:
            raise ValueError("quantize a float32 extractor: int8 ranges are calibrated on float32 activations")
        with torch.inference_mode(False):
            self.roi_heads.res5 = quantize_res5(self.roi_heads.res5, calibration_rois(self, calibration_images))
        self.quantization = dtype
        return self

    # ------------------------------------------------------------------ persistence
    def save_pretrained(self, save_directory: str | os.PathLike) -> None:
        """Write `config.json`, `model.safetensors` (float32) and the object / attribute vocabularies."""
        if self.quantization is not None:
            raise ValueError(
                f"a {self.quantization}-quantized extractor cannot be saved: save the float32 one and call "
                "quantize() after loading it"
            )
        directory = Path(save_directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.config.to_json_file(
            directory / CONFIG_NAME,
            exclude=("object_names", "attribute_names"),
            extra={REGION_EXTRACTOR_TYPE_KEY: REGION_EXTRACTOR_TYPE},
        )
        state = {k: v.detach().float().contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(directory / WEIGHTS_NAME), metadata={"format": "pt", "vlhub": "region_extractor"})
        (directory / OBJECTS_VOCAB_NAME).write_text("\n".join(self.object_names) + "\n", encoding="utf-8")
        if self.config.num_attributes:
            (directory / ATTRIBUTES_VOCAB_NAME).write_text("\n".join(self.attribute_names) + "\n", encoding="utf-8")

    @classmethod
    def from_pretrained(cls, pretrained_path: str | os.PathLike, **config_overrides: Any) -> "RegionExtractor":
        """Load a folder written by `save_pretrained` (or a Hub repo holding one); keyword arguments override
        config fields (e.g. `selection_mode="max_class_nms"`, `max_boxes=36`)."""
        directory = Path(pretrained_path)
        if not directory.is_dir():
            from ...utils.network import download_snapshot

            directory = download_snapshot(str(pretrained_path), "the region extractor")
        _, data = read_region_extractor_config(directory, REGION_EXTRACTOR_TYPE)
        for field_name, file_name in (("object_names", OBJECTS_VOCAB_NAME), ("attribute_names", ATTRIBUTES_VOCAB_NAME)):
            if field_name not in config_overrides and data.get(field_name) is None:
                data[field_name] = _read_vocab(directory / file_name)
        config = DetectorConfig.from_dict(data, **config_overrides)
        extractor = cls(config)
        weights = directory / WEIGHTS_NAME
        if not weights.is_file():
            raise FileNotFoundError(f"{str(directory)!r} has no {WEIGHTS_NAME}")
        state = load_file(str(weights))
        try:
            missing, unexpected = extractor.load_state_dict(state, strict=False)
        except RuntimeError as err:  # shape mismatches
            raise ValueError(f"{weights} does not fit the configured detector: {err}") from err
        if missing or unexpected:
            raise ValueError(
                f"{weights} does not fit the configured detector: missing {sorted(missing)[:5]}, unexpected "
                f"{sorted(unexpected)[:5]}"
            )
        return extractor
