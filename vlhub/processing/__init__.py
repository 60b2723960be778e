"""From pixels or stored features to model inputs."""

from .region_extractors import load_region_extractor, register_region_extractor, registered_region_extractor_types
from .regions import RegionFeatures

__all__ = ["RegionFeatures", "load_region_extractor", "register_region_extractor", "registered_region_extractor_types"]
