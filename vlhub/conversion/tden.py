"""Deprecated alias: TDEN's converter lives in `vlhub.modeling.tden.convert_tden` (with its architecture)."""

from ..modeling.tden.convert_tden import *  # noqa: F401,F403
from ..modeling.tden.convert_tden import __all__  # noqa: F401
from ..utils.deprecation import moved_module

__getattr__ = moved_module(__name__, "vlhub.modeling.tden.convert_tden")
