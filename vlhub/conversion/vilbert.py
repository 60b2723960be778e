"""Deprecated alias: ViLBERT's converter lives in `vlhub.modeling.vilbert.convert_vilbert` (with its architecture)."""

from ..modeling.vilbert.convert_vilbert import *  # noqa: F401,F403
from ..modeling.vilbert.convert_vilbert import __all__  # noqa: F401
from ..utils.deprecation import moved_module

__getattr__ = moved_module(__name__, "vlhub.modeling.vilbert.convert_vilbert")
