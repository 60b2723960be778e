"""Model definitions: one sub-package per architecture, plus the blocks they share (`layers`)."""

import importlib
import pkgutil

__all__ = ["discover_architectures"]

_DISCOVERED = False


def discover_architectures() -> None:
    """Import every architecture sub-package of `vlhub.modeling` once; each registers itself with `vlhub.registry`
    (cheaply: configs and names). `import vlhub` runs this (`vlhub.modeling.auto.register_all`), so the registry knows
    every architecture before anything looks one up."""
    global _DISCOVERED
    if _DISCOVERED:
        return
    _DISCOVERED = True
    for module in pkgutil.iter_modules(__path__):
        if module.ispkg:
            importlib.import_module(f"{__name__}.{module.name}")
