"""From pixels or stored features to model inputs."""

from .regions import RegionFeatures

__all__ = ["RegionFeatures"]
