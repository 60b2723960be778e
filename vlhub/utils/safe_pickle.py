"""Loading the pickles the original projects published without letting them run code.

Feature LMDBs (ViLBERT) and detectron2 checkpoints are pickles of plain containers and numpy arrays. A pickle
can name any importable callable, so `pickle.loads` on a downloaded file is arbitrary code execution. This
unpickler resolves only the handful of globals that numpy arrays and builtin containers need and refuses
everything else with an error naming the global.
"""

from __future__ import annotations

import io
import pickle
from typing import Any, BinaryIO

import numpy as np

from .limits import check_declared_array

__all__ = ["UnsafePickleError", "safe_loads", "safe_load"]

# (module, name) pairs a pickle of numpy arrays and builtin containers may reference. numpy 2 moved
# `numpy.core` to `numpy._core`; py2-era pickles use `_codecs.encode` for bytes.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("collections", "OrderedDict"),
    ("_codecs", "encode"),
    ("builtins", "bytearray"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "complex"),
    ("builtins", "slice"),
}


class UnsafePickleError(pickle.UnpicklingError):
    """The pickle references something other than numpy arrays and builtin containers."""


def _shape(shape) -> tuple:
    return (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)


class _NdarrayGuard:
    """`numpy.ndarray` as a pickle sees it. Called (`ndarray(shape, dtype)`, which allocates `shape` before any data
    is read), it first checks the declared size (`vlhub.utils.limits`); passed to `_reconstruct`, it stands for
    `numpy.ndarray` itself."""

    def __call__(self, shape, dtype=float, buffer=None, *args, **kwargs):
        if buffer is None:
            check_declared_array(_shape(shape), dtype, "a pickled numpy array")
        return np.ndarray(shape, dtype, buffer, *args, **kwargs)


_NDARRAY = _NdarrayGuard()


def _guarded_reconstruct(reconstruct):
    def _reconstruct(subtype, shape, dtype):
        check_declared_array(
            _shape(shape), np.dtype(dtype) if not isinstance(dtype, bytes) else np.uint8, "a pickled numpy array"
        )
        return reconstruct(np.ndarray if subtype is _NDARRAY else subtype, shape, dtype)

    return _reconstruct


def _bytearray(*args):
    if args and isinstance(args[0], int):  # bytearray(n) allocates n bytes
        check_declared_array((args[0],), np.uint8, "a pickled bytearray")
    return bytearray(*args)


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED_GLOBALS:
            found = super().find_class(module, name)
            # The globals that allocate a size the pickle declares check it first.
            if name == "_reconstruct":
                return _guarded_reconstruct(found)
            if found is np.ndarray:
                return _NDARRAY
            if found is bytearray:
                return _bytearray
            return found
        raise UnsafePickleError(
            f"refusing to load {module}.{name} from a pickle: only numpy arrays and builtin containers are "
            "allowed (a pickle that names other callables can run arbitrary code)"
        )


def safe_loads(data: bytes, encoding: str = "latin1") -> object:
    """`pickle.loads` restricted to numpy arrays and builtin containers.

    `encoding="latin1"` reads python-2 pickles of numpy arrays correctly (their str payloads are raw bytes).
    """
    return _RestrictedUnpickler(io.BytesIO(data), encoding=encoding).load()


def safe_load(file: BinaryIO, encoding: str = "latin1") -> Any:
    """`pickle.load` from an open binary file, restricted like `safe_loads`."""
    return _RestrictedUnpickler(file, encoding=encoding).load()
