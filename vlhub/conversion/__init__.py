"""Original releases → vlhub folders: the shared loading/report/provenance machinery and the region detector's
converter. Each architecture's converter (one strict key map per release) lives in its folder,
`vlhub/modeling/<arch>/convert_<arch>.py`, and is declared by its `Architecture(converter=...)`.

Importing this package registers the converters of `vlhub convert` (lazily: nothing heavy is imported until a
converter runs or the command line is built) and exposes the conversion functions on first access.
"""

import importlib

from ..registry import on_register
from .registry import Converter, converters, get_converter, register_converter

__all__ = [
    "CheckpointError",
    "ConversionReport",
    "Converter",
    "convert_detector",
    "convert_uniter",
    "converters",
    "detectron2_state_to_vlhub",
    "get_converter",
    "register_converter",
]

_LAZY = {
    "CheckpointError": ".common",
    "ConversionReport": ".common",
    "convert_detector": ".detector",
    "detectron2_state_to_vlhub": ".detector",
    "convert_uniter": "vlhub.modeling.uniter.convert_uniter",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _detector_arguments(parser) -> None:
    from .common import add_source_arguments
    from .detector import DETECTOR_FORMATS

    add_source_arguments(
        parser,
        source="file",
        source_help="pytorch_model.bin (MMF/HF FRCNN port), a detectron2 .pkl or a .caffemodel",
        config_help="the port's config.yaml (default: config.yaml beside FILE, if any)",
    )
    parser.add_argument("--format", choices=DETECTOR_FORMATS, help="source format (default: detected)")
    parser.add_argument("--objects-vocab", help="objects_vocab.txt (default: beside FILE; else placeholder names)")
    parser.add_argument("--attributes-vocab", help="attributes_vocab.txt (default: beside FILE; else placeholders)")


def _convert_detector_from_args(args):
    from .common import call_with_arguments
    from .detector import convert_detector

    keywords = ("config", "format", "objects_vocab", "attributes_vocab")
    return call_with_arguments(convert_detector, args, ("file", "output_dir"), keywords)


# The region detector is shared by every architecture, so its converter is registered here.
register_converter(
    "detector",
    convert=_convert_detector_from_args,
    add_arguments=_detector_arguments,
    help="bottom-up-attention Faster R-CNN weights (MMF/HF pytorch_model.bin, detectron2 .pkl or Caffe .caffemodel)",
)


def _register_architecture_converter(architecture) -> None:
    """`vlhub convert <model_type>` for every architecture that declares a converter module."""
    if architecture.converter:
        register_converter(
            architecture.model_type,
            convert=f"{architecture.converter}:convert_from_args",
            add_arguments=f"{architecture.converter}:add_arguments",
            help=f"an original {architecture.name} checkpoint"
            + (f" ({architecture.original_repository})" if architecture.original_repository else ""),
        )


on_register(_register_architecture_converter)
