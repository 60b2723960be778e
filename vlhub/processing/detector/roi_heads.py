"""RoI head: RoIPool 14×14 at 1/16 on res4 → dilated stride-1 res5 → mean-pooled region feature → predictors."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import roi_pool

from .backbone import make_stage
from .configuration import DetectorConfig

__all__ = ["BoxPredictor", "RoIHeads", "HeadOutputs"]


@dataclass
class HeadOutputs:
    """Per-RoI outputs for `R` RoIs: `features` `(R, F)`, `class_logits` `(R, C + 1)` (background LAST),
    `box_deltas` `(R, 4·C)` or None (not asked for), `attribute_logits` `(R, A + 1)` ("no attribute" LAST) or None."""

    features: torch.Tensor
    class_logits: torch.Tensor
    box_deltas: torch.Tensor | None
    attribute_logits: torch.Tensor | None

    def cpu(self) -> "HeadOutputs":
        return HeadOutputs(
            *(
                None if t is None else t.cpu()
                for t in (self.features, self.class_logits, self.box_deltas, self.attribute_logits)
            )
        )

    def split(self, sizes: list[int]) -> list["HeadOutputs"]:
        parts = [
            t.split(sizes) if t is not None else [None] * len(sizes)
            for t in (self.features, self.class_logits, self.box_deltas, self.attribute_logits)
        ]
        return [HeadOutputs(*fields) for fields in zip(*parts)]


class BoxPredictor(nn.Module):
    """`cls_score` (C + 1 logits, background last), class-specific `bbox_pred` (4·C), and the attribute head:
    embedding of the arg-max class over ALL logits (background included) ⊕ feature → `fc_attr` → ReLU →
    `attr_score` (A + 1 logits, "no attribute" last)."""

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__()
        dim = config.feature_dim
        self.cls_score = nn.Linear(dim, config.num_classes + 1)
        self.bbox_pred = nn.Linear(dim, 4 * config.num_classes)
        self.has_attributes = config.has_attributes
        if self.has_attributes:
            self.cls_embedding = nn.Embedding(config.num_classes + 1, config.attribute_embedding_dim)
            self.fc_attr = nn.Linear(dim + config.attribute_embedding_dim, config.attribute_hidden_dim)
            self.attr_score = nn.Linear(config.attribute_hidden_dim, config.num_attributes + 1)

    def forward(
        self, features: torch.Tensor, box_deltas: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """`box_deltas=False` skips `bbox_pred` (None in its place): the "butd" selection reports the proposals."""
        class_logits = self.cls_score(features)
        box_deltas = self.bbox_pred(features) if box_deltas else None
        attribute_logits = None
        if self.has_attributes:
            embedded = self.cls_embedding(class_logits.argmax(dim=-1))
            hidden = F.relu(self.fc_attr(torch.cat([features, embedded.to(features.dtype)], dim=-1)))
            attribute_logits = self.attr_score(hidden)
        return class_logits, box_deltas, attribute_logits


class RoIHeads(nn.Module):
    """RoIs of all images of a batch go through res5 together (in chunks of `roi_batch_size`); each RoI is pooled
    from its own image's res4 map, so batching never changes a feature."""

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__()
        self.config = config
        self.res5 = make_stage(
            3,
            config.res4_channels,
            config.num_groups * config.width_per_group * 8,
            config.feature_dim,
            first_stride=1,
            config=config,
            dilation=config.res5_dilation,
        )
        self.box_predictor = BoxPredictor(config)

    def pool(self, res4: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """`(R, C4, P, P)` max-pooled bins of `boxes` `(R, 4)` (resized-image pixels) on one image's `res4`, in
        `res4`'s dtype and memory format."""
        # Pooled in float32 whatever the model dtype: box coordinates need float32 precision (and torchvision's
        # CPU RoIPool has no bfloat16 kernel). Max pooling commutes with the later cast, so nothing is lost.
        rois = torch.cat([boxes.new_zeros(len(boxes), 1), boxes], dim=1).float()
        size = (self.config.pooler_resolution,) * 2
        scale = 1.0 / self.config.feature_stride
        memory_format = (
            torch.channels_last if res4.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format
        )
        pooled = roi_pool(res4.float().contiguous(), rois, size, scale)
        return pooled.to(res4.dtype).contiguous(memory_format=memory_format)

    def region_features(self, res4_maps: list[torch.Tensor], boxes: list[torch.Tensor]) -> torch.Tensor:
        """`(ΣR_i, F)` region features of every image's boxes, in order: RoIPool on the box's own image, res5,
        spatial mean. RoIs go through res5 `roi_batch_size` at a time (across images), which bounds memory."""
        owners = torch.cat([torch.full((len(b),), i, dtype=torch.long) for i, b in enumerate(boxes)])
        all_boxes = torch.cat(boxes)
        channels_last = res4_maps[0].is_contiguous(memory_format=torch.channels_last)
        chunks = []
        for start in range(0, len(all_boxes), self.config.roi_batch_size):
            stop = start + self.config.roi_batch_size
            chunk_owners, chunk_boxes = owners[start:stop], all_boxes[start:stop]
            pooled = torch.cat([self.pool(res4_maps[i], chunk_boxes[chunk_owners == i]) for i in chunk_owners.unique()])
            if channels_last:
                pooled = pooled.contiguous(memory_format=torch.channels_last)  # no copy when cat kept NHWC
            chunks.append(self.res5(pooled).mean(dim=(2, 3)))
        return torch.cat(chunks) if chunks else all_boxes.new_zeros(0, self.config.feature_dim)

    def forward(
        self, res4_maps: list[torch.Tensor], boxes: list[torch.Tensor], box_deltas: bool = True
    ) -> list[HeadOutputs]:
        features = self.region_features(res4_maps, boxes)
        class_logits, box_deltas, attribute_logits = self.box_predictor(features, box_deltas)
        outputs = HeadOutputs(
            features.float(),
            class_logits.float(),
            None if box_deltas is None else box_deltas.float(),
            None if attribute_logits is None else attribute_logits.float(),
        )
        return outputs.split([len(b) for b in boxes])
