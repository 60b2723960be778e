"""Run a function right after a module is imported — or at once, if it already is.

transformers imports its Auto-model, processor and pipeline machinery lazily (`from transformers import AutoModel`
imports `transformers.models.auto.modeling_auto` on first use), and importing it costs seconds. vlhub must register
its classes there, but `import vlhub` should not pay for machinery the user never touches. So registration waits for
the user's own import of that machinery: a meta-path finder wraps the module's loader and runs the callbacks once
the module has executed (the usual post-import-hook technique).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from typing import Callable

__all__ = ["when_imported"]

_PENDING: dict[str, list[Callable]] = {}
_LOCK = threading.RLock()


def when_imported(module_name: str, callback: Callable) -> None:
    """Call `callback(module)` once `module_name` has been imported (immediately when it already is)."""
    with _LOCK:
        module = sys.modules.get(module_name)
        if module is None:
            _PENDING.setdefault(module_name, []).append(callback)
            _install()
            return
    callback(module)


def _run(module_name: str, module) -> None:
    with _LOCK:
        callbacks = _PENDING.pop(module_name, [])
    for callback in callbacks:
        callback(module)


class _LoaderWithCallbacks(importlib.abc.Loader):
    def __init__(self, loader, module_name: str):
        self._loader = loader
        self._module_name = module_name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # Put the real loader back before executing, so the module looks exactly as without the hook.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _run(self._module_name, module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _PENDING:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _LoaderWithCallbacks(spec.loader, fullname)
        return spec


_FINDER = _PostImportFinder()


def _install() -> None:
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
