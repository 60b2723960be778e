"""Deprecated alias: UNITER's converter lives in `vlhub.modeling.uniter.convert_uniter` (with its architecture)."""

from ..modeling.uniter.convert_uniter import *  # noqa: F401,F403
from ..modeling.uniter.convert_uniter import __all__  # noqa: F401
from ..utils.deprecation import moved_module

__getattr__ = moved_module(__name__, "vlhub.modeling.uniter.convert_uniter")
