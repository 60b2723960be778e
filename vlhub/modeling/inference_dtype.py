"""The machine's fastest accurate inference dtype, and opt-in int8 dynamic quantization of linear layers."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel

from ..utils.precision import bf16_is_fast
from .modeling_utils import VisionLanguagePreTrainedModel
from .packed_linear import PackedLinear


def read_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU feature flags of the first processor listed in ``cpuinfo`` (empty where the file is absent)."""
    if not cpuinfo.is_file():
        return frozenset()
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def fastest_inference_dtype(device: torch.device | str = "cpu") -> torch.dtype:
    """bfloat16 where bf16 products are measured or known clearly faster than float32's on `device` (`bf16_is_fast`:
    on a CPU, bf16 units and a timed product, once per process; a CUDA device that supports bf16), else float32: bf16
    emulated in fp32, or on units slower than the fp32 ones (an Intel Xeon with AVX512-BF16 and no AMX: ~0.5x), costs
    speed as well as accuracy."""
    return torch.bfloat16 if bf16_is_fast(device) else torch.float32


def copy_in_dtype(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A copy of ``model`` whose floating-point parameters and buffers are in ``dtype`` (what ``model.to(dtype)``
    casts), with its tied weights still tied; ``model`` is left as it is. Each tensor is cast straight into the copy,
    so memory peaks at the model plus the copy, not at two copies in the model's own dtype."""
    if not dtype.is_floating_point:
        raise ValueError(f"copy_in_dtype casts to a floating-point dtype, got {dtype}")
    cast: dict[int, object] = {}
    for parameter in model.parameters():
        if parameter.is_floating_point():
            cast[id(parameter)] = nn.Parameter(parameter.detach().to(dtype), requires_grad=parameter.requires_grad)
    for buffer in model.buffers():
        if buffer.is_floating_point():
            cast[id(buffer)] = buffer.detach().to(dtype)
    return copy.deepcopy(model, cast)  # deepcopy takes the prepared tensors from its memo, by the originals' ids


def _refuse_saving(*args: object, **kwargs: object) -> None:
    raise ValueError(
        "this model's linear layers are int8 dynamically quantized (quantize_linear_weights), a CPU inference form "
        "that save_pretrained / push_to_hub cannot store or reload: save the float32 model it was made from, and "
        "quantize again after loading"
    )


def _quantized_layers(model: nn.Module) -> dict:
    """quantize_dynamic's spec: every nn.Linear except a vision-language model's region-feature layers (its
    declared `_region_feature_layers`), whose float weights its forward and the input checks read; they see only the
    regions, a small part of the work. Weights are quantized per output channel: at the same speed as one scale per
    tensor, it kept more answers and captions as float32 had them (on an AVX512-VNNI Xeon, 2026-11-29: the demo's
    captions 89.0% identical against 65.5%, ViLBERT's answers 99.8% against 99.5%; bench/bench_quantized.py)."""
    spec: dict = {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}
    if isinstance(model, VisionLanguagePreTrainedModel):
        base = next(name for name, module in model.named_modules() if module is model.base_model)
        for path in model.base_model._region_feature_layers:
            spec[f"{base}.{path}" if base else path] = None
    return spec


def quantize_linear_weights(model: nn.Module, dtype: str = "int8") -> nn.Module:
    """A copy of ``model`` whose ``nn.Linear`` layers are int8 dynamically quantized (weights int8 per output
    channel, activations quantized per batch at run time; a vision-language model's region-feature layers stay float32);
    ``model`` itself is left as it is.

    CPU inference of a float32 model only: the copy cannot be trained or moved to a GPU, and its ``save_pretrained``
    and ``push_to_hub`` raise (save the float32 model instead).
    """
    if dtype != "int8":
        raise ValueError(f"quantize_linear_weights supports only 'int8', got {dtype!r}")
    if model.training:
        raise ValueError("int8 dynamic quantization is for inference only: call model.eval() first")
    devices = {parameter.device.type for parameter in model.parameters()}
    if devices - {"cpu"}:
        raise ValueError(f"int8 dynamic quantization runs on the CPU only; the model is on {sorted(devices)}")
    float_dtypes = {parameter.dtype for parameter in model.parameters() if parameter.is_floating_point()}
    if float_dtypes - {torch.float32}:
        raise ValueError(
            f"int8 dynamic quantization takes a float32 model; its parameters are {sorted(map(str, float_dtypes))}"
        )
    if any(isinstance(module, PackedLinear) for module in model.modules()):
        # quantize_dynamic matches nn.Linear by exact type: packed layers would silently stay fp32.
        raise ValueError("the model's linear weights are packed (pack_linear_weights): quantize an unpacked model")
    with warnings.catch_warnings():
        # torch marks its eager quantization deprecated in favour of torchao; it is still what runs int8 products
        # fastest on CPUs without VNNI (fbgemm). The user did not call torch.ao: the warnings are vlhub's to act on.
        warnings.filterwarnings("ignore", message="torch.ao.quantization is deprecated")
        warnings.filterwarnings("ignore", message="torch.quantize_per_tensor, torch.quantize_per_channel")
        quantized = torch.ao.quantization.quantize_dynamic(model, _quantized_layers(model), dtype=torch.qint8)
    if isinstance(quantized, PreTrainedModel):
        # Its state_dict holds packed int8 parameters that from_pretrained cannot read back into nn.Linear.
        quantized.save_pretrained = quantized.push_to_hub = _refuse_saving
    return quantized


def count_quantized_linears(model: nn.Module) -> int:
    """How many of ``model``'s linear layers run int8 dynamically quantized."""
    return sum(isinstance(module, torch.ao.nn.quantized.dynamic.Linear) for module in model.modules())
