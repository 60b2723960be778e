"""Deprecated alias: VL-BERT's converter lives in `vlhub.modeling.vl_bert.convert_vl_bert` (with its architecture)."""

from ..modeling.vl_bert.convert_vl_bert import *  # noqa: F401,F403
from ..modeling.vl_bert.convert_vl_bert import __all__  # noqa: F401
from ..utils.deprecation import moved_module

__getattr__ = moved_module(__name__, "vlhub.modeling.vl_bert.convert_vl_bert")
