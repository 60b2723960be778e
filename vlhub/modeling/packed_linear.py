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
taken only where it is valid and faster: float32 on the CPU, no gradient to compute (inference, `torch.no_grad()`),
and at least `packed_min_rows()` rows (2-5, measured on this machine); anything else (training, another dtype or
device, code being compiled by `torch.compile`, fewer rows) runs `F.linear` as before. A weight changed in place or
replaced since it was packed (optimizer step, `load_state_dict`, `.to()`) is re-packed at its next use.

Packing also fuses what oneDNN can do inside the same product (2–4% of a batch-1 ViLBERT forward on that machine):
- the query, key and value projections of a self-attention (transformers' `BertSelfAttention`, and each stream's
  three of vlhub's `CoAttention`) run as one product over the concatenated weights, packed once (instead of their
  three own packed copies); the first of the three to be called computes all and hands the other two theirs when they
  are called on the same input tensor (any other input computes anew);
- the feed-forward's GELU runs inside its first product (`BertIntermediate` with exact, erf GELU);
- the residual add runs inside the output products (`BertSelfOutput`, `BertOutput`, `CoAttentionOutput`) when their
  dropout does nothing (evaluation mode, or p = 0).
Every fused path falls back to the plain modules' computation wherever packing does not apply.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator

import torch
from torch import nn
from torch.nn import functional as F

from ..utils.deprecation import replaced_name
from ..utils.kernel_probe import log_measurement, measured_speedup

__all__ = [
    "PROBED_MIN_ROWS",
    "PACKED_ROWS_EVERYWHERE",
    "packed_min_rows",
    "PackedLinear",
    "packed_linear_available",
    "packing_pays",
    "PACKING_MIN_SPEEDUP",
    "packed_speedup",
    "pack_linear_weights",
    "unpack_linear_weights",
    "packed_linear_weights",
    "dense_plus_residual",
    "register_packed_class",
    "register_projection_groups",
]


# Few-row products: MKL's default path has fast kernels for the fewest rows, and where the packed kernel overtakes it
# depends on the CPU (bench/bench_skinny_linear.py over the BERT-base shapes): on the AVX2 EPYC one row ran 1.4-13x
# faster on F.linear and two rows depended on the shape (packed decoding of 2-row VLP steps gained 1.5x there); on
# the AVX512 Xeon F.linear won on every shape up to 3 rows, the packed kernel from 4. From 5 rows on the packed
# kernel won or tied everywhere. So `packed_min_rows` measures the threshold once per process among these:
PROBED_MIN_ROWS = (2, 3, 4)
PACKED_ROWS_EVERYWHERE = 5


def __getattr__(name: str) -> object:
    # Names of the fixed rules that measurements replaced.
    if name == "PACKED_MIN_ROWS":
        replaced_name("PACKED_MIN_ROWS", "packed_min_rows(), the row threshold measured on this machine")
        return packed_min_rows()
    if name == "ENCODER_PACKING_CPU_KINDS":
        raise AttributeError(
            "ENCODER_PACKING_CPU_KINDS was removed: whether an encoder is packed is measured on the machine "
            "(packing_pays(decodes=False), packed_speedup), not read from its CPU kind"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def packed_linear_available() -> bool:
    """Whether this torch build has oneDNN and its packed linear operators (`torch.ops.mkldnn`)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._reorder_linear_weight and torch.ops.mkldnn._linear_pointwise)
    except (AttributeError, RuntimeError):
        return False


# The CPU kind does not say whether packing pays (bench/bench_encoders.py --pipeline, docs/performance.md): packed
# encoders ran ~1.4x plain on an AVX512 AMD EPYC, 0.90-0.94x on an AVX2-only EPYC and 0.99-1.07x on an AVX512 Intel
# Xeon. And packing costs one more copy of the linear weights, so the default packs only where its kernel measured
# clearly faster on this machine (`packed_speedup`): on the AVX512 Xeon the probe's feed-forward ran 1.08-1.19x packed while
# whole batch-1 VQA pipelines ran 0.99-1.07x (attention and the small products gain less), not worth twice the memory;
# where packing paid (AVX512 EPYC encoders ~1.4x, decoding steps 1.4-1.6x) it cleared this by far.
PACKING_MIN_SPEEDUP = 1.3
# The rows the probe multiplies, per kind of work: a whole-sequence encoder forward at batch 1 (a question and ~36
# regions, ~60 rows) and a decoding step (beam 5 at batch 1: 5 rows).
PROBE_ROWS = {"encoder": 64, "decoder": 5}


def _packed_product(
    input: torch.Tensor,
    packed_weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str = "none",
    algorithm: str = "",
) -> torch.Tensor:
    """oneDNN's product of `input` by a weight packed with `_reorder_linear_weight`, plus `bias`, with the post-op
    `activation` fused in."""
    return torch.ops.mkldnn._linear_pointwise(input.contiguous(), packed_weight, bias, activation, [], algorithm)


@functools.cache
def packed_speedup(rows: int) -> float:
    """How many times faster oneDNN's packed kernel runs a BERT-base feed-forward (768 -> 3072 -> 768, float32) on
    `rows` rows than `F.linear` does on a core of this machine (`measured_speedup`: one thread, interleaved rounds;
    ~0.1 s at 64 rows). Needs `packed_linear_available()`."""
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(3072, 768, generator=generator) * 0.02, torch.randn(768, 3072, generator=generator) * 0.02]
    biases = [torch.zeros(3072), torch.zeros(768)]
    inputs = torch.randn(rows, 768, generator=generator)
    packed = [torch.ops.mkldnn._reorder_linear_weight(weight) for weight in weights]

    def plain() -> torch.Tensor:
        return F.linear(F.linear(inputs, weights[0], biases[0]), weights[1], biases[1])

    def packed_product() -> torch.Tensor:
        return _packed_product(_packed_product(inputs, packed[0], biases[0]), packed[1], biases[1])

    speedup = measured_speedup(plain, packed_product, rounds=5)
    log_measurement(f"oneDNN's packed float32 kernel on {rows} rows against F.linear", speedup)
    return speedup


@functools.cache
def packed_min_rows() -> int:
    """The fewest rows a packed layer multiplies on its packed weight (fewer run `F.linear`): the first of
    `PROBED_MIN_ROWS` at which the packed kernel measured at least as fast as `F.linear` here (`packed_speedup`), else
    `PACKED_ROWS_EVERYWHERE`. Measured once per process (~0.13 s), by `pack_linear_weights`."""
    if not packed_linear_available():
        return PACKED_ROWS_EVERYWHERE
    return next((rows for rows in PROBED_MIN_ROWS if packed_speedup(rows) >= 1.0), PACKED_ROWS_EVERYWHERE)


def packing_pays(decodes: bool) -> bool:
    """Whether the default path packs a float32 CPU model: where oneDNN's packed kernels measured at least
    `PACKING_MIN_SPEEDUP` times `F.linear`'s speed on this machine for that kind of work (`packed_speedup` at
    `PROBE_ROWS`: a decoding step's few rows for a model that decodes, a batch-1 sequence's rows for an encoder).
    False where torch has no oneDNN."""
    if not packed_linear_available():
        return False
    return packed_speedup(PROBE_ROWS["decoder" if decodes else "encoder"]) >= PACKING_MIN_SPEEDUP


def _register_flop_formula() -> None:
    """Teach `torch.utils.flop_counter` the packed product (2 · rows · in · out, as `F.linear`), so that FLOP counts
    of a packed model stay right."""
    from torch.utils import flop_counter

    target = torch.ops.mkldnn._linear_pointwise
    if target in flop_counter.flop_registry:
        return

    @flop_counter.register_flop_formula(target)
    def linear_pointwise_flop(input_shape, second_shape, *args, out_shape=None, **kwargs) -> int:
        # (X, W, B, attr, scalars, algorithm), or the `.binary` overload (X, other, W, B, attr) with the residual second
        weight_shape = args[0] if len(args) == 3 else second_shape
        rows = math.prod(input_shape[:-1])
        return 2 * rows * weight_shape[0] * weight_shape[1]


class PackedLinear(nn.Linear):
    """`nn.Linear` whose float32 CPU inference runs oneDNN on a pre-packed copy of the weight (see the module
    docstring). Made by `pack_linear_weights` from an existing `nn.Linear` (its class is switched, its parameters
    kept); `unpack_linear_weights` switches it back. Input `(..., in_features)`, output `(..., out_features)`."""

    _packed_weight: torch.Tensor | None
    _packed_key: tuple | None
    _projection_group: PackedProjectionGroup | None  # set when its input is shared with sibling layers

    def _repack(self) -> None:
        weight = self.weight.detach()
        self._packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous())
        self._packed_key = self._weight_key()

    def __getstate__(self):
        # The packed copy is an opaque oneDNN tensor (no storage to copy or pickle): copies re-pack at first use.
        state = super().__getstate__()
        state["_packed_weight"], state["_packed_key"] = None, None
        return state

    def _packed_path(self, input: torch.Tensor) -> bool:
        weight = self.weight
        return (
            input.device.type == "cpu"
            and weight.device.type == "cpu"
            and input.dtype == torch.float32
            and weight.dtype == torch.float32
            and (self.bias is None or self.bias.dtype == torch.float32)
            and input.numel() > 0
            and not torch.compiler.is_compiling()  # the packed copy is an opaque tensor: compiled code gets F.linear
            and input.numel() >= packed_min_rows() * input.shape[-1]
            and not (
                torch.is_grad_enabled()
                and (weight.requires_grad or input.requires_grad or (self.bias is not None and self.bias.requires_grad))
            )
        )

    def _weight_key(self) -> tuple:
        weight = self.weight
        return (weight.data_ptr(), weight._version, tuple(weight.shape))

    def _packed_operands(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The packed weight (re-packed if the weight changed since) and the bias, for a `_packed_path` call."""
        if self._packed_key != self._weight_key():
            self._repack()
        return self._packed_weight, None if self.bias is None else self.bias.detach()

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self._projection_group is not None and self._packed_path(input):
            return self._projection_group.project(self, input)
        return self.forward_alone(input)

    def forward_alone(self, input: torch.Tensor) -> torch.Tensor:
        """This layer's product by itself, also when it belongs to a projection group (whose call would compute the
        other members' products too); on its own packed copy of the weight, made at first use."""
        return self.packed_forward(input) if self._packed_path(input) else F.linear(input, self.weight, self.bias)

    def packed_forward(self, input: torch.Tensor, activation: str = "none", algorithm: str = "") -> torch.Tensor:
        """This layer's product on the packed weight, with oneDNN's post-op `activation` ("gelu" with algorithm
        "none" is the exact, erf GELU) fused in. Only on the packed path (`_packed_path(input)`)."""
        weight, bias = self._packed_operands()
        return _packed_product(input, weight, bias, activation, algorithm)

    def packed_forward_plus(self, input: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """`self(input) + residual` as one oneDNN product. Only on the packed path."""
        weight, bias = self._packed_operands()
        return torch.ops.mkldnn._linear_pointwise.binary(input.contiguous(), residual.contiguous(), weight, bias, "add")


def _version(tensor: torch.Tensor) -> int | None:
    """The tensor's in-place change counter (`torch.inference_mode` tensors have none)."""
    return None if tensor.is_inference() else tensor._version


class PackedProjectionGroup:
    """Linear layers that read the same input (a self-attention's query, key and value) computed as one oneDNN
    product over their concatenated weights, packed once. Whichever member is called first computes every member's
    output and keeps the others' until they are called on that same tensor (unchanged since); a call on any other
    input computes anew. Members are `PackedLinear`s whose `_projection_group` is this group."""

    def __init__(self, members: list[PackedLinear]) -> None:
        self.members = members
        self._packed_weight = self._packed_key = self._bias = None
        self._pending_input, self._pending_version, self._pending = None, None, {}

    def __getstate__(self):  # the packed copy is opaque: copies re-pack at first use; pending outputs are not kept
        state = dict(self.__dict__)
        state.update(
            _packed_weight=None, _packed_key=None, _bias=None, _pending_input=None, _pending_version=None, _pending={}
        )
        return state

    def project(self, member: PackedLinear, input: torch.Tensor) -> torch.Tensor:
        # changes with any member's weight or bias (both are concatenated into the group's own copies)
        key = tuple((other._weight_key(), other.bias.data_ptr(), other.bias._version) for other in self.members)
        if (
            input is self._pending_input
            and _version(input) == self._pending_version
            and key == self._packed_key
            and member in self._pending
        ):
            output = self._pending.pop(member)
            if not self._pending:
                self._pending_input = None
            return output
        if not all(other._packed_path(input) for other in self.members):
            return F.linear(input, member.weight, member.bias)
        if self._packed_key != key:
            weight = torch.cat([other.weight.detach() for other in self.members])
            self._packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous())
            self._bias = torch.cat([other.bias.detach() for other in self.members])
            self._packed_key = key
        fused = _packed_product(input, self._packed_weight, self._bias)
        outputs = dict(zip(self.members, fused.split([other.out_features for other in self.members], dim=-1)))
        output = outputs.pop(member)
        self._pending_input, self._pending_version, self._pending = input, _version(input), outputs
        return output


def _dropout_is_identity(dropout: nn.Module) -> bool:
    return not dropout.training or dropout.p == 0


def dense_plus_residual(
    dense: nn.Linear, dropout: nn.Dropout, input: torch.Tensor, residual: torch.Tensor
) -> torch.Tensor:
    """`dropout(dense(input)) + residual` (a transformer block's output before its LayerNorm), as one oneDNN product
    when `dense` is packed, the packed path applies and the dropout does nothing."""
    if (
        type(dense) is PackedLinear
        and _dropout_is_identity(dropout)
        and dense._packed_path(input)
        and dense._projection_group is None
        and residual.shape == (*input.shape[:-1], dense.out_features)
    ):
        return dense.packed_forward_plus(input, residual)
    return dropout(dense(input)) + residual


# Blocks whose class packing switches to a subclass with fused products (exactly these classes; subclasses are left
# alone), and back; and modules whose linear layers read one input per group. The shared layers register
# transformers' BERT blocks here (`vlhub.modeling.layers`); vlhub's own modules may instead name their groups in a
# `packed_projection_groups` class attribute.
_PACKED_CLASSES: dict[type, type] = {}
_UNPACKED_CLASSES: dict[type, type] = {}
_PROJECTION_GROUPS: dict[type, tuple] = {}


def register_packed_class(plain: type, packed: type) -> None:
    """`pack_linear_weights` switches modules of class `plain` to `packed` (a subclass with the same parameters whose
    forward fuses work into the packed products and otherwise runs `plain`'s), `unpack_linear_weights` back."""
    _PACKED_CLASSES[plain], _UNPACKED_CLASSES[packed] = packed, plain


def register_projection_groups(module_class: type, groups: tuple[tuple[str, ...], ...]) -> None:
    """In modules of class `module_class`, each group of `nn.Linear` children (by name) reads one input: packed, a
    group runs as one product (`PackedProjectionGroup`)."""
    _PROJECTION_GROUPS[module_class] = groups


def _projection_groups(module: nn.Module) -> tuple:
    return getattr(type(module), "packed_projection_groups", None) or _PROJECTION_GROUPS.get(type(module), ())


def pack_linear_weights(model: nn.Module) -> int:
    """Switch every `nn.Linear` of `model` (exactly that class, subclasses are left alone) to `PackedLinear` and pack
    its weight now. Returns how many were switched (0 where this torch has no oneDNN: nothing changes)."""
    if not packed_linear_available():
        return 0
    _register_flop_formula()
    packed_min_rows()  # measured now rather than inside the first forward
    count = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = PackedLinear
            module._packed_weight, module._packed_key, module._projection_group = None, None, None
            count += 1
        elif type(module) in _PACKED_CLASSES:
            module.__class__ = _PACKED_CLASSES[type(module)]
    for module in model.modules():
        for names in _projection_groups(module):
            members = [getattr(module, name) for name in names]
            if (
                all(
                    type(member) is PackedLinear and member._projection_group is None and member.bias is not None
                    for member in members
                )
                and len({member.in_features for member in members}) == 1
            ):
                group = PackedProjectionGroup(members)
                for member in members:
                    member._projection_group = group
    for module in model.modules():  # pack now what runs alone (a group packs its weights at its first use)
        if (
            type(module) is PackedLinear
            and module._projection_group is None
            and module.weight.device.type == "cpu"
            and module.weight.dtype == torch.float32
        ):
            module._repack()
    return count


def unpack_linear_weights(model: nn.Module) -> int:
    """Undo `pack_linear_weights`: every `PackedLinear` of `model` becomes an `nn.Linear` again and its packed copy is
    freed. Returns how many were switched back."""
    count = 0
    for module in model.modules():
        if type(module) is PackedLinear:
            module.__class__ = nn.Linear
            del module._packed_weight, module._packed_key, module._projection_group
            count += 1
        elif type(module) in _UNPACKED_CLASSES:
            module.__class__ = _UNPACKED_CLASSES[type(module)]
    return count


@contextlib.contextmanager
def packed_linear_weights(model: nn.Module) -> Iterator[nn.Module]:
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
