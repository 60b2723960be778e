"""Original releases → vlhub folders: one strict key map per release, shared loading/report/provenance."""

from .common import CheckpointError, ConversionReport
from .detector import convert_detector, detectron2_state_to_vlhub
from .uniter import convert_uniter

__all__ = ["CheckpointError", "ConversionReport", "convert_detector", "convert_uniter", "detectron2_state_to_vlhub"]
