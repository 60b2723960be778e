"""One check for a setting that takes one of a few values, so that every config and converter refuses a wrong one
with the same message (light: imports nothing, configs use it)."""

from __future__ import annotations

from collections.abc import Collection
from typing import TypeVar

__all__ = ["check_choice"]

Value = TypeVar("Value")


def check_choice(value: Value, choices: Collection, name: str) -> Value:
    """`value` if it is one of `choices`, else a `ValueError` naming the setting `name`, the choices and the value."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value
