"""Bottom-up-attention Faster R-CNN region extractor on torch + torchvision.ops (no detectron2).

configuration (DetectorConfig) · image_io (reading images) · transform (resize, normalise) · backbone (Caffe
ResNet to res4) · rpn (anchors, proposals) · roi_heads (RoIPool, res5, predictors) · boxes (box conventions) ·
selection (the reference box-selection rules) · extractor (RegionExtractor).
"""

from .configuration import DetectorConfig, SELECTION_MODES
from .extractor import Detections, RegionExtractor

__all__ = ["DetectorConfig", "Detections", "RegionExtractor", "SELECTION_MODES"]
