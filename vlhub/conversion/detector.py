"""Bottom-up-attention detector weights → a vlhub `RegionExtractor` folder.

Three source formats (the first two with detectron2's module names and class order, background LAST):

- "frcnn": the MMF / Hugging Face port (`unc-nlp/frcnn-vg-finetuned`): `pytorch_model.bin` (`torch.save` of a
  state dict, BatchNorm with `num_batches_tracked`) + `config.yaml` (lower- or upper-case keys);
- "detectron2": a detectron2 pickle (`faster_rcnn_from_caffe[_attr].pkl`): `{"model": {name: np.ndarray},
  "__author__": ...}` + optionally its yacs `config.yaml`. Read with an unpickler that can only rebuild numpy
  arrays — a pickle asking for anything else is refused, never executed;
- "caffe": the original bottom-up-attention `.caffemodel`, parsed without Caffe by `conversion.caffemodel` into a
  detectron2-style dict (background rotated last, RPN fg − bg logits, BatchNorm+Scale folded) and mapped like it.

vlhub's module tree uses the same names, except that the anchors live in `proposal_generator.cell_anchors`
(detectron2: `proposal_generator.anchor_generator.cell_anchors.0`). `detectron2_state_to_vlhub` is the single
key map; the Caffe `.caffemodel` reader produces a detectron2-style dict and goes through it too.
"""

from __future__ import annotations

import logging
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..processing.detector.configuration import RESNET_BLOCKS, DetectorConfig
from ..processing.detector.extractor import RegionExtractor
from ..utils.files import read_yaml
from ..utils.safe_pickle import safe_load
from .common import (
    CheckpointError,
    ConversionReport,
    check_finite_weights,
    converted_folder,
    layer_count,
    load_torch_state_dict,
    sha256_of,
    write_model_card,
)

logger = logging.getLogger(__name__)

__all__ = [
    "convert_detector",
    "detectron2_state_to_vlhub",
    "read_detectron2_pickle",
    "config_from_yaml",
    "infer_config_from_state",
    "DETECTOR_FORMATS",
]

DETECTOR_FORMATS = ("frcnn", "detectron2", "caffe")
_ANCHOR_KEY = "proposal_generator.anchor_generator.cell_anchors.0"
_VLHUB_ANCHOR_KEY = "proposal_generator.cell_anchors"
# The detectron2 notebook (`demo/demo_feature_extraction_attr.ipynb`): NMS thresholds np.arange(0.5, 1.0, 0.1),
# score threshold 0.2, exactly NUM_OBJECTS = 36 detections.
D2_NOTEBOOK_NMS_THRESHOLDS = [float(t) for t in np.arange(0.5, 1.0, 0.1)]
D2_NOTEBOOK_NUM_OBJECTS = 36
D2_NOTEBOOK_SCORE_THRESHOLD = 0.2
_SOURCES = {
    "frcnn": (
        "https://github.com/facebookresearch/mmf (tools/scripts/features/frcnn)",
        "b0ffc7fba39f210f833c127362146aec01a2f259",
    ),
    "detectron2": ("https://github.com/airsplay/py-bottom-up-attention", "85ec9b77bb57c125d6d604305bb525d9f50692be"),
    "caffe": ("https://github.com/peteanderson80/bottom-up-attention", "514e561"),
}


# ---------------------------------------------------------------------------------------------------- reading
def read_detectron2_pickle(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The `"model"` dict `{name: np.ndarray}` of a detectron2 `.pkl` checkpoint, read without executing code."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist or is not a file")
    try:
        with open(path, "rb") as f:
            data = safe_load(f)
    except pickle.UnpicklingError as err:
        raise CheckpointError(f"{str(path)!r} is not a detectron2 weight pickle: {err}") from err
    except Exception as err:  # truncated / not a pickle at all
        raise CheckpointError(
            f"cannot read {str(path)!r} as a pickle (truncated, corrupt or another format): {err}"
        ) from err
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        kind = sorted(data)[:5] if isinstance(data, dict) else type(data).__name__
        raise CheckpointError(
            f"{str(path)!r} is not a detectron2 checkpoint: expected a dict with a 'model' dict of arrays, got {kind}"
        )
    model = data["model"]
    bad = [k for k, v in model.items() if not isinstance(v, np.ndarray)]
    if bad:
        raise CheckpointError(f"{str(path)!r}: entries {bad[:5]} of 'model' are not numpy arrays")
    return model


# ---------------------------------------------------------------------------------------------------- configs
def _upper_keys(value):
    if isinstance(value, dict):
        return {str(k).upper(): _upper_keys(v) for k, v in value.items()}
    return value


def _floats(value) -> list[float]:
    return [float(x) for x in value]


def _first_int(value) -> int:
    return int(value[0] if isinstance(value, (list, tuple)) else value)


# Settings a port's config.yaml gives as they are: (section, key, DetectorConfig field, conversion). "" is the top
# level; the model sections are read at the top level or under MODEL.
_YAML_SETTINGS = (
    ("RESNETS", "DEPTH", "depth", int),
    ("RESNETS", "NUM_GROUPS", "num_groups", int),
    ("RESNETS", "WIDTH_PER_GROUP", "width_per_group", int),
    ("RESNETS", "STEM_OUT_CHANNELS", "stem_out_channels", int),
    ("RESNETS", "RES2_OUT_CHANNELS", "res2_out_channels", int),
    ("RESNETS", "STRIDE_IN_1X1", "stride_in_1x1", bool),
    ("MODEL", "PIXEL_MEAN", "pixel_mean", _floats),
    ("MODEL", "PIXEL_STD", "pixel_std", _floats),
    ("INPUT", "FORMAT", "input_format", str),
    ("INPUT", "MIN_SIZE_TEST", "min_size", _first_int),
    ("INPUT", "MAX_SIZE_TEST", "max_size", int),
    ("PROPOSAL_GENERATOR", "MIN_SIZE", "rpn_min_size", float),
    ("RPN", "PRE_NMS_TOPK_TEST", "rpn_pre_nms_top_n", int),
    ("RPN", "POST_NMS_TOPK_TEST", "rpn_post_nms_top_n", int),
    ("RPN", "NMS_THRESH", "rpn_nms_threshold", float),
    ("RPN", "BBOX_REG_WEIGHTS", "rpn_box_weights", _floats),
    ("ROI_HEADS", "NUM_CLASSES", "num_classes", int),
    ("ROI_BOX_HEAD", "POOLER_RESOLUTION", "pooler_resolution", int),
    ("ROI_BOX_HEAD", "BBOX_REG_WEIGHTS", "box_weights", _floats),
)
# The MMF port's own box selection settings.
_FRCNN_SELECTION_SETTINGS = (
    ("ROI_HEADS", "SCORE_THRESH_TEST", "score_threshold", float),
    ("", "MIN_DETECTIONS", "min_boxes", int),
    ("", "MAX_DETECTIONS", "max_boxes", int),
)
_MODEL_SECTIONS = ("RESNETS", "RPN", "ROI_HEADS", "ROI_BOX_HEAD", "ANCHOR_GENERATOR", "PROPOSAL_GENERATOR")


def config_from_yaml(path: str | os.PathLike, source_format: str) -> dict:
    """DetectorConfig fields from a port's `config.yaml` (MMF lower-case, HF / detectron2 upper-case keys).

    Unsupported architecture switches (RoIAlign pooler, halved res5, class-agnostic boxes, other norms, anchor
    offsets) raise a `ValueError` rather than being approximated.
    """
    raw = read_yaml(path, "the detector config")
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: not a YAML mapping")
    sections = _yaml_sections(_upper_keys(raw))
    _refuse_unsupported(path, sections)
    fields = _copy_settings(sections, _YAML_SETTINGS)
    caffe_pool_key = "MAX_POOL" if source_format == "frcnn" else "CAFFE_MAXPOOL"
    fields["caffe_maxpool"] = bool(sections["MODEL"].get(caffe_pool_key, False))
    proposals, box_head = sections["PROPOSAL_GENERATOR"], sections["ROI_BOX_HEAD"]
    hidden = proposals.get("HIDDEN_CHANNELS", proposals.get("HID_CHANNELS"))
    if hidden is not None and int(hidden) > 0:
        fields["rpn_hidden_channels"] = int(hidden)
    fields.update(_anchor_fields(path, sections["ANCHOR_GENERATOR"]))
    if "ATTR" in box_head and not box_head["ATTR"]:
        fields["num_attributes"] = 0
    elif "NUM_ATTRS" in box_head:
        fields["num_attributes"] = int(box_head["NUM_ATTRS"])
    fields.update(anchor_style="detectron2", box_convention="detectron2")
    if source_format == "frcnn":
        thresholds = sections["ROI_HEADS"].get("NMS_THRESH_TEST", [0.3])
        thresholds = [float(t) for t in (thresholds if isinstance(thresholds, list) else [thresholds])]
        fields.update(resize_backend="torch", selection_mode="max_class_nms", nms_thresholds=thresholds)
        fields.update(_copy_settings(sections, _FRCNN_SELECTION_SETTINGS))
    else:
        fields.update(resize_backend="pil", **_d2_notebook_selection())
    return fields


def _yaml_sections(cfg: dict) -> dict[str, dict]:
    """The sections `_YAML_SETTINGS` names, each a dict (empty when absent)."""
    model = cfg.get("MODEL", {}) or {}
    sections = {name: cfg.get(name) or model.get(name) or {} for name in _MODEL_SECTIONS}
    sections.update({"": cfg, "MODEL": model, "INPUT": cfg.get("INPUT", {}) or {}})
    return sections


def _copy_settings(sections: dict[str, dict], settings) -> dict:
    return {
        field: convert(sections[section][key]) for section, key, field, convert in settings if key in sections[section]
    }


def _refuse_unsupported(path, sections: dict[str, dict]) -> None:
    resnets, box_head = sections["RESNETS"], sections["ROI_BOX_HEAD"]
    if resnets.get("NORM", "FrozenBN") not in ("BN", "FrozenBN"):
        raise ValueError(f"{path}: RESNETS.NORM {resnets['NORM']!r} is not supported (BN / FrozenBN only)")
    if resnets.get("DEFORM_ON_PER_STAGE") and any(resnets["DEFORM_ON_PER_STAGE"]):
        raise ValueError(f"{path}: deformable convolutions are not supported")
    if box_head.get("POOLER_TYPE", "ROIPool") != "ROIPool":
        raise ValueError(
            f"{path}: ROI_BOX_HEAD.POOLER_TYPE {box_head['POOLER_TYPE']!r} is not supported (ROIPool only)"
        )
    if box_head.get("RES5HALVE", False):
        raise ValueError(f"{path}: ROI_BOX_HEAD.RES5HALVE true is not supported (the bottom-up model uses false)")
    if box_head.get("CLS_AGNOSTIC_BBOX_REG", False):
        raise ValueError(f"{path}: class-agnostic box regression is not supported")


def _anchor_fields(path, anchors: dict) -> dict:
    fields = {}
    if not anchors:
        return fields
    if float(anchors.get("OFFSET", 0.0)) != 0.0:
        raise ValueError(f"{path}: ANCHOR_GENERATOR.OFFSET {anchors['OFFSET']} is not supported (0 only)")
    sizes, ratios = anchors.get("SIZES"), anchors.get("ASPECT_RATIOS")
    if sizes is not None:
        if len(sizes) != 1:
            raise ValueError(f"{path}: one anchor level expected (C4 model), got SIZES {sizes}")
        fields["anchor_sizes"] = [float(s) for s in sizes[0]]
    if ratios is not None:
        fields["anchor_ratios"] = [float(r) for r in ratios[0]]
    return fields


def _d2_notebook_selection() -> dict:
    return dict(
        selection_mode="per_class_nms",
        nms_thresholds=list(D2_NOTEBOOK_NMS_THRESHOLDS),
        score_threshold=D2_NOTEBOOK_SCORE_THRESHOLD,
        min_boxes=D2_NOTEBOOK_NUM_OBJECTS,
        max_boxes=D2_NOTEBOOK_NUM_OBJECTS,
    )


def infer_config_from_state(state: dict) -> dict:
    """Architecture sizes read off the tensors of a detectron2-named state dict."""

    def shape(key):
        if key not in state:
            raise CheckpointError(
                f"not a bottom-up-attention detector checkpoint: no {key!r} (has e.g. {sorted(state)[:5]})"
            )
        return tuple(state[key].shape)

    shape("backbone.stem.conv1.weight")  # the first thing every detector checkpoint has
    counts = [layer_count(state, f"backbone.{stage}.") for stage in ("res2", "res3", "res4")]
    depths = {blocks: depth for depth, blocks in RESNET_BLOCKS.items()}
    if tuple(counts) not in depths:
        raise CheckpointError(f"res2/res3/res4 have {counts} blocks; known ResNets: {dict(RESNET_BLOCKS)}")
    bottleneck = shape("backbone.res2.0.conv1.weight")[0]
    groups = bottleneck // shape("backbone.res2.0.conv2.weight")[1]
    fields = dict(
        depth=depths[tuple(counts)],
        num_groups=groups,
        width_per_group=bottleneck // groups,
        stem_out_channels=shape("backbone.stem.conv1.weight")[0],
        res2_out_channels=shape("backbone.res2.0.conv3.weight")[0],
        rpn_hidden_channels=shape("proposal_generator.rpn_head.conv.weight")[0],
        num_classes=shape("roi_heads.box_predictor.cls_score.weight")[0] - 1,
    )
    if "roi_heads.box_predictor.attr_score.weight" in state:
        fields.update(
            num_attributes=shape("roi_heads.box_predictor.attr_score.weight")[0] - 1,
            attribute_embedding_dim=shape("roi_heads.box_predictor.cls_embedding.weight")[1],
            attribute_hidden_dim=shape("roi_heads.box_predictor.fc_attr.weight")[0],
        )
    else:
        fields["num_attributes"] = 0
    return fields


# ---------------------------------------------------------------------------------------------------- key map
def _map_state(state: dict, config: DetectorConfig, report: ConversionReport) -> dict[str, torch.Tensor]:
    with torch.device("meta"):
        expected = RegionExtractor(config).state_dict()
    converted: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key.endswith(".num_batches_tracked"):
            report.drop(key, "BatchNorm step counter; frozen BatchNorm does not use it")
            continue
        target = _VLHUB_ANCHOR_KEY if key == _ANCHOR_KEY else key
        if target not in expected:
            raise CheckpointError(
                f"unexpected key {key!r}: not part of a bottom-up-attention detector with this config "
                f"(depth {config.depth}, attributes {config.num_attributes})"
            )
        tensor = torch.as_tensor(np.asarray(value)) if not isinstance(value, torch.Tensor) else value
        if tuple(tensor.shape) != tuple(expected[target].shape):
            raise CheckpointError(
                f"{key!r} has shape {tuple(tensor.shape)} but the configured detector expects "
                f"{tuple(expected[target].shape)}; does the config match the weights?"
            )
        converted[target] = tensor.detach().to(torch.float32).clone().contiguous()
        report.use(target, key)
    if _VLHUB_ANCHOR_KEY not in converted:
        from ..processing.detector.rpn import cell_anchors_for

        converted[_VLHUB_ANCHOR_KEY] = cell_anchors_for(config)
        report.initialize(_VLHUB_ANCHOR_KEY, f"not in the checkpoint; generated ({config.anchor_style} anchors)")
    missing = sorted(set(expected) - set(converted))
    if missing:
        raise CheckpointError(f"{len(missing)} parameter(s) missing from the checkpoint: {missing[:10]}")
    report.check_complete(state.keys())
    check_finite_weights(converted, report.source, report.used)
    return converted


def detectron2_state_to_vlhub(state: dict[str, np.ndarray], config: DetectorConfig | dict) -> dict[str, torch.Tensor]:
    """Map a detectron2-named state dict (`{name: np.ndarray}`, background LAST in class rows, as in the pickle's
    `"model"` entry) onto vlhub's `RegionExtractor` parameters. `config`: a `DetectorConfig` or a dict of its
    fields. Every key is used or (only `num_batches_tracked`) dropped; missing, unexpected or mis-shaped tensors
    raise `CheckpointError`. Anchors absent from `state` are generated from the config."""
    if isinstance(config, dict):
        config = DetectorConfig.from_dict(config)
    return _map_state(state, config, ConversionReport(source="state dict"))


# ---------------------------------------------------------------------------------------------------- driver
def _detect_format(path: Path) -> str:
    if zipfile.is_zipfile(path):
        return "frcnn"
    if path.suffix == ".pkl":
        return "detectron2"
    if path.suffix == ".caffemodel":
        return "caffe"
    raise CheckpointError(
        f"cannot tell the format of {str(path)!r}: pass format='frcnn' (pytorch_model.bin of the MMF/HF port), "
        "format='detectron2' (.pkl) or format='caffe' (.caffemodel)"
    )


def _vocab(explicit, beside: Path, name: str, count: int, kind: str, report: ConversionReport) -> list[str]:
    path = Path(explicit) if explicit else beside / name
    if path.is_file():
        names = [line.split(",")[0].strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if len(names) != count:
            raise ValueError(f"{path} lists {len(names)} {kind} names but the model has {count} {kind}s")
        return names
    if explicit:
        raise FileNotFoundError(f"{kind} vocabulary {str(path)!r} does not exist")
    report.notes.append(
        f"no {kind} vocabulary given ({name} not found beside the checkpoint): placeholder names "
        f"{kind}_0 .. {kind}_{count - 1} were written"
    )
    logger.warning("no %s vocabulary: writing placeholder names", kind)
    return [f"{kind}_{i}" for i in range(count)]


def convert_detector(
    path: str | os.PathLike,
    output_dir: str | os.PathLike,
    config: str | os.PathLike | None = None,
    format: str | None = None,
    objects_vocab: str | os.PathLike | None = None,
    attributes_vocab: str | os.PathLike | None = None,
    **config_overrides: Any,
) -> ConversionReport:
    """Convert a bottom-up-attention detector checkpoint into a `RegionExtractor` folder.

    path: `pytorch_model.bin` (format "frcnn") or a detectron2 `.pkl` (format "detectron2"); the format is
    detected when not given. config: the port's `config.yaml` (default: `config.yaml` beside the weights, if any);
    without one, sizes come from the tensors and the rest from the released model's settings. Vocabularies:
    `objects_vocab.txt` / `attributes_vocab.txt` (one name per line, first of comma-separated synonyms), default
    beside the weights; placeholder names are written (and reported) when there are none.
    `config_overrides`: DetectorConfig fields to set (e.g. `selection_mode="butd"`).
    Writes `config.json`, `model.safetensors`, the vocab files, `conversion_report.json` and a model card.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist or is not a file")
    source_format = format or _detect_format(path)
    if source_format not in DETECTOR_FORMATS:
        raise ValueError(f"format must be one of {DETECTOR_FORMATS}, got {source_format!r}")
    report = ConversionReport(source=path.name)
    state = _read_state(path, source_format, report)
    fields = _settings(path, config, source_format, state, report)
    fields.update(config_overrides)
    base = DetectorConfig.from_dict({**fields, "object_names": None, "attribute_names": None})
    fields["object_names"] = _vocab(objects_vocab, path.parent, "objects_vocab.txt", base.num_classes, "object", report)
    fields["attribute_names"] = (
        _vocab(attributes_vocab, path.parent, "attributes_vocab.txt", base.num_attributes, "attribute", report)
        if base.num_attributes
        else None
    )
    detector_config = DetectorConfig.from_dict(fields)
    weights = _map_state(state, detector_config, report)
    extractor = RegionExtractor(detector_config)
    extractor.load_state_dict(weights, strict=True)
    _write_folder(extractor, path, Path(output_dir), source_format, report)
    return report


def _read_state(path: Path, source_format: str, report: ConversionReport) -> dict:
    """The checkpoint's detectron2-named state dict (a Caffe model read into detectron2's names, its notes in
    `report`)."""
    if source_format == "frcnn":
        if not zipfile.is_zipfile(path):
            raise CheckpointError(
                f"{str(path)!r} is not a torch.save zip file; a detectron2 .pkl needs format='detectron2'"
            )
        return load_torch_state_dict(path)
    if source_format == "detectron2":
        return read_detectron2_pickle(path)
    # The original Caffe release: read without Caffe into detectron2's names, then the one key map.
    from .caffemodel import caffe_to_detectron2

    state, caffe_report = caffe_to_detectron2(path, stage_blocks=None)  # depth read from the file
    report.notes.extend(f"caffe → detectron2: {note}" for note in caffe_report.notes)
    report.notes.extend(f"caffe layer {k} dropped: {v}" for k, v in caffe_report.dropped.items())
    return state


def _settings(path: Path, config, source_format: str, state: dict, report: ConversionReport) -> dict:
    """DetectorConfig fields: sizes read off the weights, then the format's released settings, then the
    `config.yaml` (given, or beside the weights), which must agree with the weights' sizes."""
    fields = infer_config_from_state(state)
    if source_format == "caffe":
        # BUTD's generate_tsv settings: Caffe anchors and box arithmetic (+1 widths), 600/1000, per-class NMS 0.3.
        # Caffe's proposal layer also drops proposals smaller than 16 px (at the input scale).
        fields.update(
            anchor_style="caffe",
            box_convention="caffe",
            selection_mode="butd",
            nms_thresholds=[0.3],
            rpn_min_size=16.0,
            rpn_pre_nms_top_n=6000,
            rpn_post_nms_top_n=300,
        )
    if source_format == "detectron2":
        fields.update(anchor_style="detectron2", resize_backend="pil", **_d2_notebook_selection())
    config_path = Path(config) if config else path.parent / "config.yaml"
    if config and not config_path.is_file():
        raise FileNotFoundError(f"config {str(config_path)!r} does not exist")
    if not config_path.is_file():
        report.notes.append(
            "no config.yaml: sizes read from the weights, other settings are the released model's"
            + (
                " and the notebook's selection"
                if source_format == "detectron2"
                else " with the original 'butd' selection"
            )
        )
        return fields
    from_yaml = config_from_yaml(config_path, source_format)
    for key in ("depth", "num_classes", "num_attributes", "res2_out_channels", "stem_out_channels"):
        if key in from_yaml and from_yaml[key] != fields[key]:
            raise CheckpointError(f"{config_path} says {key}={from_yaml[key]} but the weights have {key}={fields[key]}")
    fields.update(from_yaml)
    report.notes.append(f"settings read from {config_path.name}")
    return fields


def _write_folder(
    extractor: RegionExtractor, path: Path, output_dir: Path, source_format: str, report: ConversionReport
) -> None:
    repository, commit = _SOURCES[source_format]
    with converted_folder(output_dir) as staging:  # the folder appears only once complete
        extractor.save_pretrained(staging)
        report.save(staging / "conversion_report.json")
        write_model_card(
            staging,
            title=f"Bottom-up-attention Faster R-CNN (converted from {path.name})",
            architecture="bottom-up-attention-detector",
            source_file=path,
            source_sha256=sha256_of(path),
            original_repository=repository,
            original_commit=commit,
            report=report,
            pipeline_tag=None,
            usage=(
                "from vlhub.processing.detector import RegionExtractor\n"
                f"extractor = RegionExtractor.from_pretrained({str(output_dir)!r})\n"
                "regions = extractor(['image.jpg'])  # list[RegionFeatures]"
            ),
        )
