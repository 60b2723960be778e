"""bench_detector.py's paired figures: fp32 / bf16 / int8 side by side in one run, as % of this machine's peaks, and
how far bf16 and int8 detections stay from fp32's on a set of images (the converted fixture detectors)."""

from __future__ import annotations

import re
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from torch.ao.nn.quantized import Conv2d as QuantizedConv2d
from torch.utils.flop_counter import FlopCounterMode
from torchvision.ops import box_iou

from bench.timing import interleaved_rounds
from vlhub.modeling.inference_dtype import read_cpu_flags
from vlhub.processing.detector import RegionExtractor

BOX_IOU = 0.99  # "equal boxes": the same number, in the same order, each pair at IoU >= this
OBJECT_IOU = 0.5  # "same objects": confident detections paired at IoU >= this with the same class


def cpu_kind() -> str:
    flags = sorted(flag for flag in read_cpu_flags() if flag.startswith(("avx", "amx")) or "vnni" in flag)
    return f"{torch.get_num_threads()} threads, {torch.backends.cpu.get_cpu_capability()}, flags: {' '.join(flags)}"


def conv_peaks(rounds: int, rois: int = 16) -> dict[str, float]:
    """GFLOP/s of res5's widest 1×1 convolution (2048 → 512 over `rois` 14×14 RoIs, NHWC: a large GEMM) in fp32,
    bf16 and int8 (torch.ao quantized conv, the int8 path's kernel), interleaved rounds, medians."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(2048, 512, 1).eval().to(memory_format=torch.channels_last)
    inputs = torch.rand(rois, 2048, 14, 14).contiguous(memory_format=torch.channels_last)
    bf16_conv, bf16_inputs = torch.nn.Conv2d(2048, 512, 1).to(torch.bfloat16), inputs.to(torch.bfloat16)
    bf16_conv = bf16_conv.eval().to(memory_format=torch.channels_last)
    int8_conv = QuantizedConv2d(2048, 512, 1)
    weight = conv.weight.detach()
    scales = weight.abs().amax(dim=(1, 2, 3)) / 127
    int8_conv.set_weight_bias(
        torch.quantize_per_channel(weight, scales, torch.zeros(512, dtype=torch.long), 0, torch.qint8), conv.bias
    )
    int8_conv.scale, int8_conv.zero_point = 0.1, 0
    int8_inputs = torch.quantize_per_tensor(inputs, 1 / 127, 0, torch.quint8)
    calls = {
        "fp32": lambda: conv(inputs),
        "bf16": lambda: bf16_conv(bf16_inputs),
        "int8": lambda: int8_conv(int8_inputs),
    }
    with torch.inference_mode():
        for call in calls.values():
            call()
        times = interleaved_rounds(calls, rounds, "cpu")
    flops = 2 * rois * 196 * 2048 * 512
    return {name: flops / statistics.median(wall for wall, _ in walls) / 1e9 for name, walls in times.items()}


def gflop_per_image(extractor: RegionExtractor, image: np.ndarray) -> float:
    """Convolution and matrix-product GFLOP of one image (torch.utils.flop_counter), whatever the dtype."""
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        extractor.detect(image)
    return counter.get_total_flops() / 1e9


def paired_dtypes(base: RegionExtractor, pictures: list[np.ndarray], calibration: list, rounds: int) -> None:
    """Seconds per image of fp32, bf16 and int8 (res5) copies of `base`, interleaved rounds, with GFLOP/s and % of
    the peak of the same dtype measured in this run."""
    import copy

    extractors = {
        "fp32": base,
        "bf16": copy.deepcopy(base).to(torch.bfloat16),
        "int8": copy.deepcopy(base).quantize(calibration),
    }
    gflop = gflop_per_image(base, pictures[0])
    peaks = conv_peaks(rounds)
    calls = {name: (lambda e=extractor: e.detect(pictures)) for name, extractor in extractors.items()}
    with torch.inference_mode():
        extractors["int8"].detect(pictures[:1])  # warm-up (oneDNN primitives, quantized weight packing)
        times = interleaved_rounds(calls, rounds, "cpu")
    print(f"\nCPU: {cpu_kind()}", flush=True)
    print(
        "peaks (res5's 2048→512 1×1 conv, GFLOP/s): " + ", ".join(f"{k} {v:.0f}" for k, v in peaks.items()), flush=True
    )
    print(
        f"{gflop:.0f} GFLOP per image ({len(pictures)} images per call, {rounds} interleaved rounds, medians)",
        flush=True,
    )
    fp32 = statistics.median(wall for wall, _ in times["fp32"]) / len(pictures)
    for name, walls in times.items():
        seconds = statistics.median(wall for wall, _ in walls) / len(pictures)
        rate = gflop / seconds
        print(
            f"  {name}: {seconds:6.2f} s/image  {rate:5.1f} GFLOP/s  {100 * rate / peaks[name]:4.0f}% of the {name} "
            f"peak  {fp32 / seconds:4.2f}x fp32",
            flush=True,
        )


def _equal_boxes(reference, other) -> bool:
    if len(reference) != len(other):
        return False
    if len(reference) == 0:
        return True
    return bool((box_iou(reference.boxes, other.boxes).diagonal() >= BOX_IOU).all())


def fixture_detectors(fixtures: Path, workdir: Path) -> dict[str, RegionExtractor]:
    """The converted fixture detectors (tiny random weights, see each README) in their own selection and "butd"."""
    from vlhub.conversion.detector import convert_detector

    detectors = {}
    for name, weights in (("detector_frcnn", "pytorch_model.bin"), ("detector_d2", "faster_rcnn_from_caffe_attr.pkl")):
        root = fixtures / name
        convert_detector(root / "original" / weights, workdir / name)
        overrides = {}
        match = re.search(r"NUM_OBJECTS\s*=\s*(\d+)", (root / "README.md").read_text(encoding="utf-8"))
        if match:  # the notebook's fixed count (the d2 fixture)
            overrides = {"min_boxes": int(match.group(1)), "max_boxes": int(match.group(1))}
        own = RegionExtractor.from_pretrained(workdir / name, **overrides)
        detectors[f"{name} ({own.config.selection_mode})"] = own
        detectors[f"{name} (butd)"] = RegionExtractor.from_pretrained(
            workdir / name, selection_mode="butd", nms_thresholds=own.config.nms_thresholds[:1]
        )
    return detectors


def evaluation_images(fixtures: Path, count: int, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(evaluation images, 4 calibration images): the fixtures' own pictures and shapes-world scenes (256 px)."""
    from vlhub.data.shapes_scene import sample_scene

    pictures = []
    for name in ("detector_frcnn",):  # both fixtures hold the same three PNGs
        raw = load_file(fixtures / name / "raw_inputs.safetensors")
        pictures += [raw[key].numpy() for key in sorted(raw)]
    rng = np.random.default_rng(seed)
    scenes = [sample_scene(rng, 256, 1, 6).image for _ in range(count + 4)]
    return pictures + scenes[:count], scenes[count:]


def _same_box_set(reference: torch.Tensor, other: torch.Tensor) -> bool:
    """The same `(N, 4)` boxes in any order: as many, each at IoU >= `BOX_IOU` with one of the other's."""
    if len(reference) != len(other):
        return False
    if len(reference) == 0:
        return True
    close = box_iou(reference, other) >= BOX_IOU
    return bool(close.any(dim=1).all() and close.any(dim=0).all())


def _confident(detections, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`(boxes, class_ids)` of the detections scoring at least `threshold`: what a selection keeps before filling its
    minimum count with the best of the rest."""
    keep = detections.scores >= threshold
    return detections.boxes[keep], detections.class_ids[keep]


def _same_objects(reference, other, threshold: float, iou: float = OBJECT_IOU) -> bool:
    """The same objects found: the detections scoring at least `threshold` pair up one to one between the two, each
    pair of the same class at IoU >= `iou` (a detection benchmark's notion of a hit, not the same box)."""
    (boxes_a, classes_a), (boxes_b, classes_b) = _confident(reference, threshold), _confident(other, threshold)
    if len(boxes_a) != len(boxes_b):
        return False
    if len(boxes_a) == 0:
        return True
    hits = (box_iou(boxes_a, boxes_b) >= iou) & (classes_a[:, None] == classes_b[None, :])
    return bool(hits.any(dim=1).all() and hits.any(dim=0).all())


def compare_dtypes(detectors: dict[str, RegionExtractor], pictures: list, calibration: list) -> None:
    """bf16 and int8 (res5, calibrated on `calibration`) against fp32 for each float32 detector: % of `pictures`
    whose boxes are equal (same count and order, `BOX_IOU`), % with the same boxes in another order, % whose boxes
    scoring at least the config's `score_threshold` are the same (in any order), % where those find the same objects
    (`_same_objects`), and the
    relative L2 difference of region features on fp32's proposals (median and max over images)."""
    import copy

    for label, reference in detectors.items():
        others = {
            "bf16": copy.deepcopy(reference).to(torch.bfloat16),
            "int8": copy.deepcopy(reference).quantize(calibration),
        }
        with torch.inference_mode():
            expected = reference.detect(pictures, batch_size=1)
            prepared = reference.prepare(pictures)
            proposals, float_heads = reference.run_heads(prepared)
            for name, other in others.items():
                found = other.detect(pictures, batch_size=1)
                equal = sum(_equal_boxes(e, f) for e, f in zip(expected, found))
                same_set = sum(_same_box_set(e.boxes, f.boxes) for e, f in zip(expected, found))
                threshold = reference.config.score_threshold
                confident = sum(
                    _same_box_set(_confident(e, threshold)[0], _confident(f, threshold)[0])
                    for e, f in zip(expected, found)
                )
                objects = sum(_same_objects(e, f, threshold) for e, f in zip(expected, found))
                heads = other.roi_heads([other.backbone_features(item) for item in prepared], proposals)
                errors = [
                    float((h.features - f.features).norm() / f.features.norm()) for h, f in zip(heads, float_heads)
                ]
                print(
                    f"  {label:34s} {name}: boxes equal on {100 * equal / len(pictures):5.1f}% "
                    f"({equal}/{len(pictures)}), as a set on {100 * same_set / len(pictures):5.1f}%, those scoring "
                    f">= {threshold} as a set on {100 * confident / len(pictures):5.1f}%, the same objects (class, IoU "
                    f">= {OBJECT_IOU}) on {100 * objects / len(pictures):5.1f}%; features "
                    f"rel. L2 median {statistics.median(errors):.1e}, max {max(errors):.1e}",
                    flush=True,
                )


def agreement(fixtures: Path, count: int) -> None:
    """`compare_dtypes` on the converted fixture detectors, over the fixtures' PNGs and `count` shapes-world
    scenes."""
    pictures, calibration = evaluation_images(fixtures, count)
    print(
        f"\nagreement with fp32 on {len(pictures)} images (3 fixture PNGs + {count} shapes-world scenes); int8",
        flush=True,
    )
    print(f"calibrated on 4 other scenes; boxes equal = same count, same order, IoU >= {BOX_IOU} each", flush=True)
    with tempfile.TemporaryDirectory() as workdir:
        compare_dtypes(fixture_detectors(fixtures, Path(workdir)), pictures, calibration)
