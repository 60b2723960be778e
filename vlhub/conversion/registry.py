"""The registry of `vlhub convert <name>` converters.

A converter is a name, a `convert(args: argparse.Namespace) -> ConversionReport` callable and an
`add_arguments(parser: argparse.ArgumentParser) -> None` callable. Both may be given as lazy `"module.path:attribute"`
strings, so registering a converter imports nothing heavy (this module imports neither torch nor transformers);
they are imported when the command line is built or the converter runs.

    from vlhub.conversion.registry import register_converter

    register_converter(
        "uniter",
        convert="vlhub.modeling.uniter.convert_uniter:convert_from_args",
        add_arguments="vlhub.modeling.uniter.convert_uniter:add_arguments",
        help="an original UNITER .pt checkpoint (ChenRocks/UNITER)",
    )

`vlhub convert uniter CHECKPOINT --output-dir DIR ...` is then built from `add_arguments` and runs `convert`.
By convention every converter has an `--output-dir` argument (the folder it writes).
"""

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # annotations only: this module imports nothing heavy
    import argparse

    from .common import ConversionReport

__all__ = ["Converter", "converters", "get_converter", "register_converter"]

Target = Callable[..., Any] | str


def _resolve(target: Target) -> Callable[..., Any]:
    if callable(target):
        return target
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"a lazy converter target must be 'module.path:attribute', got {target!r}")
    value = importlib.import_module(module_name)
    for part in attribute.split("."):
        value = getattr(value, part)
    if not callable(value):
        raise TypeError(f"{target!r} is not callable")
    return value


def _spelling(target: Target) -> str:
    """`module:qualname` of a callable (the lazy spelling of the same target), or the string itself."""
    if isinstance(target, str):
        return target
    module, name = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    return f"{module}:{name}" if module and name else repr(target)


def _same_target(a: Target, b: Target) -> bool:
    return a is b or a == b or _spelling(a) == _spelling(b)


@dataclass(frozen=True)
class Converter:
    """A registered converter; `convert` and `add_arguments` resolve lazy targets on first use."""

    name: str
    convert_target: Target
    add_arguments_target: Target
    help: str = ""

    def convert(self, args: "argparse.Namespace") -> "ConversionReport":
        """Run the conversion for parsed command-line `args`; returns its `ConversionReport`."""
        return _resolve(self.convert_target)(args)

    def add_arguments(self, parser: "argparse.ArgumentParser") -> None:
        """Add this converter's command-line arguments to `parser`."""
        _resolve(self.add_arguments_target)(parser)


_CONVERTERS: dict[str, Converter] = {}


def register_converter(name: str, convert: Target, add_arguments: Target, help: str = "") -> Converter:
    """Register the converter `vlhub convert <name>`.

    Registering the same name again with the same targets is a no-op; with a different target it is an error
    (`ValueError`), so two architectures cannot silently claim one name.
    """
    if not name or not isinstance(name, str) or name.startswith("-") or any(c.isspace() for c in name):
        raise ValueError(f"a converter name must be a non-empty word usable on the command line, got {name!r}")
    for what, target in (("convert", convert), ("add_arguments", add_arguments)):
        if not (callable(target) or (isinstance(target, str) and ":" in target)):
            raise TypeError(f"{what} must be a callable or a 'module.path:attribute' string, got {target!r}")
    existing = _CONVERTERS.get(name)
    if existing is not None:
        if _same_target(existing.convert_target, convert) and _same_target(
            existing.add_arguments_target, add_arguments
        ):
            return existing
        raise ValueError(
            f"a converter named {name!r} is already registered ({_spelling(existing.convert_target)}); "
            f"cannot register {_spelling(convert)} under the same name"
        )
    converter = Converter(name, convert, add_arguments, help)
    _CONVERTERS[name] = converter
    return converter


def converters() -> dict[str, Converter]:
    """The registered converters by name (a copy, in registration order)."""
    return dict(_CONVERTERS)


def get_converter(name: str) -> Converter:
    """The converter registered as `name`; an unknown name raises `ValueError` listing the known ones."""
    try:
        return _CONVERTERS[name]
    except KeyError:
        known = ", ".join(sorted(_CONVERTERS)) or "none"
        raise ValueError(f"no converter named {name!r}; registered converters: {known}") from None
