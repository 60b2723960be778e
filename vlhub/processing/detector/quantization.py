"""Int8 res5 for CPU inference: the RoI head's dilated res5 (~90% of the detector's FLOPs) as int8 convolutions.

Static post-training quantization through torch.ao (eager mode): the BatchNorm is folded into each convolution,
conv + ReLU pairs are fused, weights are int8 per output channel, activations uint8 per tensor over the full 8 bits
on a CPU with int8 dot-product units (VNNI, AMX) and over 7 bits elsewhere (`reduce_range`, which keeps AVX2 kernels
without VNNI from saturating; `activation_range`). The activation ranges are calibrated by
running the float res5 over the RoIs of a few calibration images. The scales are fixed once calibrated, so a
region's feature depends only on its own RoI: batching and chunking change nothing (integer sums are exact).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.ao import quantization
from torch.ao.nn.quantized import FloatFunctional

from ...utils.precision import cpu_int8_dot_product_units
from .backbone import Bottleneck, ConvNorm
from .image_io import ImageInput

if TYPE_CHECKING:  # the extractor imports this module
    from .extractor import RegionExtractor

__all__ = ["QUANTIZATION_ENGINES", "QuantizableRes5", "activation_range", "calibration_rois", "quantize_res5"]

# torch.ao quantized CPU engines whose int8 convolutions this was measured with (fbgemm / oneDNN on x86).
QUANTIZATION_ENGINES = ("x86", "fbgemm", "onednn")


def _plain_conv(conv: ConvNorm) -> nn.Conv2d:
    """A float32 `nn.Conv2d` with `conv`'s BatchNorm folded in (torch.ao quantizes `nn.Conv2d` modules)."""
    weight, bias = conv.folded()
    plain = nn.Conv2d(
        conv.in_channels,
        conv.out_channels,
        conv.kernel_size,
        conv.stride,
        conv.padding,
        conv.dilation,
        conv.groups,
        bias=True,
        device=weight.device,
    )
    with torch.no_grad():
        plain.weight.copy_(weight.float())
        plain.bias.copy_(bias.float())
    return plain


class _QuantizableBottleneck(nn.Module):
    """A `Bottleneck` in the shape torch.ao's eager quantization needs: modules for every op, the residual sum
    through `FloatFunctional` (becomes `add_relu` on int8)."""

    def __init__(self, block: Bottleneck) -> None:
        super().__init__()
        self.shortcut = None if block.shortcut is None else _plain_conv(block.shortcut)
        self.conv1, self.relu1 = _plain_conv(block.conv1), nn.ReLU()
        self.conv2, self.relu2 = _plain_conv(block.conv2), nn.ReLU()
        self.conv3 = _plain_conv(block.conv3)
        self.residual = FloatFunctional()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.shortcut is None else self.shortcut(x)
        out = self.relu1(self.conv1(x))
        out = self.relu2(self.conv2(out))
        return self.residual.add_relu(self.conv3(out), identity)


class QuantizableRes5(nn.Module):
    """res5 between a quantize and a dequantize step: float32 pooled RoIs in, float32 `(R, F, P, P)` maps out."""

    def __init__(self, res5: nn.Sequential) -> None:
        super().__init__()
        self.quant = quantization.QuantStub()
        self.blocks = nn.Sequential(*(_QuantizableBottleneck(block) for block in res5))
        self.dequant = quantization.DeQuantStub()

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.dequant(self.blocks(self.quant(pooled.float())))


def calibration_rois(extractor: RegionExtractor, images: ImageInput | Sequence[ImageInput]) -> Iterator[torch.Tensor]:
    """Pooled float32 RoIs `(≤ roi_batch_size, C4, P, P)` of every proposal of each image, as res5 receives them."""
    for prepared in extractor.prepare(images):
        res4 = extractor.backbone_features(prepared)
        proposals, _ = extractor.proposal_generator(res4, prepared.resized_size, prepared.scale)
        for chunk in proposals.split(extractor.config.roi_batch_size):
            yield extractor.roi_heads.pool(res4, chunk).float()


def activation_range() -> tuple[int, int]:
    """The uint8 activations' range: all 8 bits where the CPU has int8 dot-product units (VNNI, AMX: int32 sums), 7
    bits elsewhere (torch.ao's x86 default, `reduce_range`: AVX2 kernels without VNNI sum u8·s8 pairs in int16, which
    saturates on full 8-bit ranges). On an AVX512-VNNI Xeon the full range cut res5's feature error against float32
    from 9.3–9.8e-3 to 8.1–8.2e-3 relative L2 (bench/bench_detector.py --agreement-images 3, 2026-11-29)."""
    return (0, 255) if cpu_int8_dot_product_units() else (0, 127)


def quantize_res5(res5: nn.Sequential, calibration: Iterable[torch.Tensor]) -> QuantizableRes5:
    """An int8 copy of `res5` (float weights untouched), its activation ranges observed on `calibration` (pooled
    RoIs). CPU only; the active `torch.backends.quantized.engine` must be one of `QUANTIZATION_ENGINES`."""
    engine = torch.backends.quantized.engine
    if engine not in QUANTIZATION_ENGINES:
        raise ValueError(
            f"int8 res5 needs an x86 quantized engine ({', '.join(QUANTIZATION_ENGINES)}); this machine runs {engine!r}"
        )
    devices = {parameter.device.type for parameter in res5.parameters()}
    if devices - {"cpu"}:
        raise ValueError(f"int8 quantization runs on the CPU only; the detector is on {sorted(devices)}")
    model = QuantizableRes5(res5).eval()
    model.qconfig = quantization.QConfig(
        activation=quantization.HistogramObserver.with_args(
            dtype=torch.quint8, quant_min=0, quant_max=activation_range()[1]
        ),
        weight=quantization.default_per_channel_weight_observer,
    )
    observed = 0
    with warnings.catch_warnings(), torch.no_grad():  # observers update their buffers in place: not inference_mode
        # torch.ao's eager quantization says it is deprecated in favour of torchao (a new, export-based dependency);
        # it is what this torch ships, and it runs.
        warnings.filterwarnings("ignore", message="torch.ao.quantization is deprecated", category=DeprecationWarning)
        for block in model.blocks:
            quantization.fuse_modules(block, [["conv1", "relu1"], ["conv2", "relu2"]], inplace=True)
        quantization.prepare(model, inplace=True)
        for pooled in calibration:
            model(pooled)
            observed += len(pooled)
        if observed == 0:
            raise ValueError("int8 calibration needs at least one RoI: give at least one calibration image")
        return quantization.convert(model, inplace=True)
