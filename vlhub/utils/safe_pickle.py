"""Loading the pickles the original projects published without letting them run code.

Feature LMDBs (ViLBERT) and detectron2 checkpoints are pickles of plain containers and numpy arrays. A pickle
can name any importable callable, so `pickle.loads` on a downloaded file is arbitrary code execution. This
unpickler resolves only the handful of globals that numpy arrays and builtin containers need and refuses
everything else with an error naming the global.
"""

from __future__ import annotations

import io
import pickle

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


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise UnsafePickleError(
            f"refusing to load {module}.{name} from a pickle: only numpy arrays and builtin containers are "
            "allowed (a pickle that names other callables can run arbitrary code)"
        )


def safe_loads(data: bytes, encoding: str = "latin1"):
    """`pickle.loads` restricted to numpy arrays and builtin containers.

    `encoding="latin1"` reads python-2 pickles of numpy arrays correctly (their str payloads are raw bytes).
    """
    return _RestrictedUnpickler(io.BytesIO(data), encoding=encoding).load()


def safe_load(file, encoding: str = "latin1"):
    """`pickle.load` from an open binary file, restricted like `safe_loads`."""
    return _RestrictedUnpickler(file, encoding=encoding).load()
