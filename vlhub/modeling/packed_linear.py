"""CPU inference of small batches on linear weights pre-packed for oneDNN (opt-in).

A decoding step with a key/value cache multiplies a handful of rows (batch × beams, one new token each) by every
weight matrix of the model, so it is bound by reading the weights, not by arithmetic. For such skinny products
PyTorch's default CPU path (MKL's `sgemm`) re-packs the weight on every call and, measured on the project's AMD EPYC
machine, streams the weights at ~5 GB/s for 2–8 rows against ~12 GB/s for a single row. oneDNN on a weight packed
once ahead (what `torch.compile`'s CPU freezing does) streams at ~16 GB/s for 3–8 rows and is also a little faster
for large products. The result is the same float32 linear map; the summation order differs, so outputs differ from
`F.linear`'s in the last bits (~1e-6 relative).

```python
from vlhub import packed_linear_weights
with torch.no_grad(), packed_linear_weights(model):     # or pack_linear_weights(model) / unpack_linear_weights(model)
    ids = model.generate(**inputs, num_beams=5)
```

Every `torch.nn.Linear` of the model (exactly that class) becomes a `PackedLinear` (same parameters, same
`state_dict`) holding a packed copy of its weight (extra memory: one more copy of those weights). The packed path is
taken only where it is valid: float32 on the CPU, and no gradient to compute (inference, `torch.no_grad()`); anything
else (training, another dtype or device, code being compiled by `torch.compile`) runs `F.linear` as before. A weight
changed in place or replaced since it was packed (optimizer step, `load_state_dict`, `.to()`) is re-packed at its next
use.
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn
from torch.nn import functional as F

__all__ = [
    "PackedLinear",
    "packed_linear_available",
    "pack_linear_weights",
    "unpack_linear_weights",
    "packed_linear_weights",
]


def packed_linear_available() -> bool:
    """Whether this torch build has oneDNN and its packed linear operators (`torch.ops.mkldnn`)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._reorder_linear_weight and torch.ops.mkldnn._linear_pointwise)
    except (AttributeError, RuntimeError):
        return False


def _register_flop_formula() -> None:
    """Teach `torch.utils.flop_counter` the packed product (2 · rows · in · out, as `F.linear`), so that FLOP counts
    of a packed model stay right."""
    from torch.utils import flop_counter

    target = torch.ops.mkldnn._linear_pointwise
    if target in flop_counter.flop_registry:
        return

    @flop_counter.register_flop_formula(target)
    def linear_pointwise_flop(input_shape, weight_shape, *args, out_shape=None, **kwargs) -> int:
        rows = math.prod(input_shape[:-1])
        return 2 * rows * weight_shape[0] * weight_shape[1]


class PackedLinear(nn.Linear):
    """`nn.Linear` whose float32 CPU inference runs oneDNN on a pre-packed copy of the weight (see the module
    docstring). Made by `pack_linear_weights` from an existing `nn.Linear` (its class is switched, its parameters
    kept); `unpack_linear_weights` switches it back. Input `(..., in_features)`, output `(..., out_features)`."""

    _packed_weight: torch.Tensor | None
    _packed_key: tuple | None

    def _repack(self) -> None:
        weight = self.weight.detach()
        self._packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous())
        self._packed_key = (weight.data_ptr(), weight._version, tuple(weight.shape))

    def __getstate__(self):
        # The packed copy is an opaque oneDNN tensor (no storage to copy or pickle): copies re-pack at first use.
        state = super().__getstate__()
        state["_packed_weight"], state["_packed_key"] = None, None
        return state

    def _packed_path(self, input: torch.Tensor) -> bool:
        weight = self.weight
        return (
            input.device.type == "cpu" and weight.device.type == "cpu"
            and input.dtype == torch.float32 and weight.dtype == torch.float32
            and (self.bias is None or self.bias.dtype == torch.float32)
            and input.numel() > 0
            and not torch.compiler.is_compiling()  # the packed copy is an opaque tensor: compiled code gets F.linear
            and not (torch.is_grad_enabled() and (weight.requires_grad or input.requires_grad
                                                  or (self.bias is not None and self.bias.requires_grad)))
        )

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self._packed_path(input):
            return F.linear(input, self.weight, self.bias)
        weight = self.weight
        if self._packed_key != (weight.data_ptr(), weight._version, tuple(weight.shape)):
            self._repack()
        bias = None if self.bias is None else self.bias.detach()
        return torch.ops.mkldnn._linear_pointwise(input.contiguous(), self._packed_weight, bias, "none", [], "")


def pack_linear_weights(model: nn.Module) -> int:
    """Switch every `nn.Linear` of `model` (exactly that class, subclasses are left alone) to `PackedLinear` and pack
    its weight now. Returns how many were switched (0 where this torch has no oneDNN: nothing changes)."""
    if not packed_linear_available():
        return 0
    _register_flop_formula()
    count = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = PackedLinear
            module._packed_weight, module._packed_key = None, None
            if module.weight.device.type == "cpu" and module.weight.dtype == torch.float32:
                module._repack()
            count += 1
    return count


def unpack_linear_weights(model: nn.Module) -> int:
    """Undo `pack_linear_weights`: every `PackedLinear` of `model` becomes an `nn.Linear` again and its packed copy is
    freed. Returns how many were switched back."""
    count = 0
    for module in model.modules():
        if type(module) is PackedLinear:
            module.__class__ = nn.Linear
            del module._packed_weight, module._packed_key
            count += 1
    return count


@contextlib.contextmanager
def packed_linear_weights(model: nn.Module):
    """`pack_linear_weights(model)` for the duration of the block, then `unpack_linear_weights(model)`; a model that
    was packed before the block stays packed after it."""
    if any(type(module) is PackedLinear for module in model.modules()):
        yield model
        return
    pack_linear_weights(model)
    try:
        yield model
    finally:
        unpack_linear_weights(model)
