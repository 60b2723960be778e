"""Original releases → vlhub folders: one strict key map per release, shared loading/report/provenance."""

from .common import CheckpointError, ConversionReport
from .uniter import convert_uniter

__all__ = ["CheckpointError", "ConversionReport", "convert_uniter"]
