"""Caffe-style ResNet (MSRA "stride in the 1×1 conv", Caffe ceil-mode stem pool, frozen BatchNorm) up to res4.

Module names follow detectron2 (`stem.conv1`, `res2.0.conv1`, `res2.0.shortcut`, each conv owning its `.norm`), so
the released checkpoints load without renaming.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import FrozenBatchNorm2d

from .configuration import DetectorConfig

__all__ = ["ConvNorm", "Bottleneck", "ResNetBackbone", "make_stage"]


class ConvNorm(nn.Conv2d):
    """A bias-free convolution followed by a frozen BatchNorm, computed as one convolution.

    The BatchNorm is folded into the kernel at call time (`w·γ/σ`, `β − μ·γ/σ`), so the stored parameters stay
    those of the checkpoint while inference pays for a single convolution.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        padding: int = 0,
        dilation: int = 1,
        groups: int = 1,
        eps: float = 1e-5,
    ) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias=False)
        self.norm = FrozenBatchNorm2d(out_channels, eps=eps)

    def folded(self) -> tuple[torch.Tensor, torch.Tensor]:
        """`(weight, bias)` of the convolution with the BatchNorm folded in."""
        # Folded in float32 whatever the module's dtype, so bf16 weights lose no more than their own rounding.
        norm = self.norm
        scale = norm.weight.float() * (norm.running_var.float() + norm.eps).rsqrt()
        weight = (self.weight.float() * scale.reshape(-1, 1, 1, 1)).to(self.weight.dtype)
        bias = (norm.bias.float() - norm.running_mean.float() * scale).to(self.weight.dtype)
        return weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.folded()
        return F.conv2d(x, weight, bias, self.stride, self.padding, self.dilation, self.groups)


class Bottleneck(nn.Module):
    """1×1 → 3×3 → 1×1 residual block; the projection `shortcut` exists when the channel count changes."""

    def __init__(
        self,
        in_channels: int,
        bottleneck_channels: int,
        out_channels: int,
        stride: int = 1,
        dilation: int = 1,
        groups: int = 1,
        stride_in_1x1: bool = True,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        stride_1x1, stride_3x3 = (stride, 1) if stride_in_1x1 else (1, stride)
        self.shortcut = (
            ConvNorm(in_channels, out_channels, 1, stride=stride, eps=eps) if in_channels != out_channels else None
        )
        self.conv1 = ConvNorm(in_channels, bottleneck_channels, 1, stride=stride_1x1, eps=eps)
        self.conv2 = ConvNorm(
            bottleneck_channels,
            bottleneck_channels,
            3,
            stride=stride_3x3,
            padding=dilation,
            dilation=dilation,
            groups=groups,
            eps=eps,
        )
        self.conv3 = ConvNorm(bottleneck_channels, out_channels, 1, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.shortcut is None else self.shortcut(x)
        out = F.relu_(self.conv1(x))
        out = F.relu_(self.conv2(out))
        out = self.conv3(out)
        return F.relu_(out + identity)


def make_stage(
    num_blocks: int,
    in_channels: int,
    bottleneck_channels: int,
    out_channels: int,
    first_stride: int,
    config: DetectorConfig,
    dilation: int = 1,
) -> nn.Sequential:
    blocks = []
    for index in range(num_blocks):
        blocks.append(
            Bottleneck(
                in_channels,
                bottleneck_channels,
                out_channels,
                stride=first_stride if index == 0 else 1,
                dilation=dilation,
                groups=config.num_groups,
                stride_in_1x1=config.stride_in_1x1,
                eps=config.norm_eps,
            )
        )
        in_channels = out_channels
    return nn.Sequential(*blocks)


class Stem(nn.Module):
    """7×7/2 convolution + ReLU + 3×3/2 max-pool (Caffe: pad 0, ceil mode; torchvision: pad 1, floor)."""

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__()
        self.conv1 = ConvNorm(3, config.stem_out_channels, 7, stride=2, padding=3, eps=config.norm_eps)
        self.caffe_maxpool = config.caffe_maxpool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu_(self.conv1(x))
        if self.caffe_maxpool:
            return F.max_pool2d(x, kernel_size=3, stride=2, padding=0, ceil_mode=True)
        return F.max_pool2d(x, kernel_size=3, stride=2, padding=1)


class ResNetBackbone(nn.Module):
    """Stem + res2..res4. Input `(N, 3, h, w)` normalised images; output res4 `(N, 4·res2_out, ~h/16, ~w/16)`."""

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__()
        self.stem = Stem(config)
        in_channels = config.stem_out_channels
        out_channels = config.res2_out_channels
        bottleneck = config.num_groups * config.width_per_group
        for stage, num_blocks in zip(("res2", "res3", "res4"), config.blocks_per_stage):
            first_stride = 1 if stage == "res2" else 2
            self.add_module(stage, make_stage(num_blocks, in_channels, bottleneck, out_channels, first_stride, config))
            in_channels, out_channels, bottleneck = out_channels, out_channels * 2, bottleneck * 2

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.res4(self.res3(self.res2(self.stem(images))))
