"""Deprecated alias: Unified VLP's converter lives in `vlhub.modeling.unified_vlp.convert_unified_vlp` (with its architecture)."""

from ..modeling.unified_vlp.convert_unified_vlp import *  # noqa: F401,F403
from ..modeling.unified_vlp.convert_unified_vlp import __all__  # noqa: F401
from ..utils.deprecation import moved_module

__getattr__ = moved_module(__name__, "vlhub.modeling.unified_vlp.convert_unified_vlp")
