"""Old import paths of code that moved, and old names of things that were replaced: they keep working for a while and
say what to use now."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping

__all__ = ["moved_module", "moved_attribute", "replaced_name"]


def _moved_warning(old: str, new: str, stacklevel: int) -> None:
    warnings.warn(
        f"{old} moved to {new}: import it from there ({old} will stop working in a later release)",
        FutureWarning,
        stacklevel=stacklevel + 1,
    )


def moved_module(old_name: str, new_name: str) -> Callable[[str], object]:
    """For the module `old_name` left behind as an alias of `new_name`: warn once (a module's body runs once per
    process) and return its module-level `__getattr__`, which reads every name from the new module."""
    _moved_warning(old_name, new_name, stacklevel=2)  # the alias module's line (the importer is in importlib)
    new_module = importlib.import_module(new_name)

    def __getattr__(name: str):
        return getattr(new_module, name)

    return __getattr__


def moved_attribute(module_name: str, name: str, moved: Mapping[str, str]) -> object:
    """A module-level `__getattr__`'s answer for `name`, one of the names that moved out of `module_name` (`moved`:
    name → the module it lives in now), with a FutureWarning naming the new home; AttributeError for other names."""
    if name not in moved:
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
    _moved_warning(f"{module_name}.{name}", f"{moved[name]}.{name}", stacklevel=3)  # the caller's line
    return getattr(importlib.import_module(moved[name]), name)


def replaced_name(old: str, replacement: str) -> None:
    """Warn that the public name `old` gave way to `replacement` (a FutureWarning pointing at the caller's line)."""
    warnings.warn(
        f"{old} is replaced by {replacement} ({old} will stop working in a later release)", FutureWarning, stacklevel=3
    )
