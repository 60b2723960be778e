"""Bottom-up-attention detector speed: seconds per image of a FULL-SIZE extractor on 600×800 images.

    python bench/bench_detector.py [--threads 2] [--batch-sizes 1 4] [--dtypes fp32 bf16] [--repeats 1]
                                   [--device cpu|cuda] [--no-channels-last] [--compare-roi-head N] [--tiny]
                                   [--json PATH]
    python bench/bench_detector.py --paired-rounds 3 [--proposals 300] [--height 600 --width 800]
                                   [--agreement-images 40 --fixtures ../shared/fixtures]

The extractor is the released model's size (ResNet-101 C4, 1600 classes + background, 400 attributes + "none",
300 proposals, 600/1000 resize, "butd" selection) with random weights; BatchNorm statistics are randomised like a
trained network's, and `cls_score` is drawn with std 0.5 so that class probabilities are peaked as a trained
model's are (with a default-initialised head every probability is ~1/1601 and the selection's fallback does far
more work than it does on real weights). Speed does not otherwise depend on the values.

Prints, per dtype and batch size, seconds per image (a batch shares one RoI-head pass), a stage breakdown of one
image (backbone, RPN, RoI head over all proposals, selection), and for bf16 the relative difference of its region
features from fp32 on the same proposals. `--compare-roi-head N` first times res5 on N RoIs the plain way (NCHW,
BatchNorm as a separate op) against vlhub's (BatchNorm folded into the convolutions, NHWC), alternating, so the
ratio holds even on a machine shared with other work. `--device cuda` is supported but was not run here (no GPU): it
runs with the GPU's fast settings (bench/device.py: cudnn.benchmark, TF32; channels-last as on the CPU). `--tiny` uses
the tests' tiny detector (a wiring check, not a figure); `--json PATH` writes s/image per dtype and batch size.

`--paired-rounds N` instead times fp32, bf16 and int8 (`RegionExtractor.quantize`, res5 in int8) side by side in N
interleaved rounds, with GFLOP per image (torch.utils.flop_counter) and % of each dtype's peak measured in the same
run; `--agreement-images N` compares bf16 and int8 detections with fp32's on the converted fixture detectors
(`bench/detector_speed.py`).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import numpy as np
import torch

from vlhub.processing.detector import DetectorConfig, RegionExtractor

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: timing, device

from device import add_device_arguments, describe, machine, prepare_device, write_figures  # noqa: E402
from timing import synchronize  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build_extractor(channels_last: bool, device: str, tiny: bool = False, **config_overrides) -> RegionExtractor:
    torch.manual_seed(0)
    if tiny:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.helpers import tiny_detector_config

    extractor = RegionExtractor(
        tiny_detector_config(**config_overrides) if tiny else DetectorConfig(**config_overrides)
    )
    with torch.no_grad():
        for name, buffer in extractor.named_buffers():
            if name.endswith("running_var"):
                buffer.uniform_(0.5, 1.5)
            elif name.endswith("running_mean"):
                buffer.normal_(0.0, 0.1)
        extractor.roi_heads.box_predictor.cls_score.weight.normal_(0.0, 0.5)
    if not channels_last:
        extractor.channels_last = False
        extractor.to(memory_format=torch.contiguous_format)
    return extractor.to(device)


def images(count: int, height: int, width: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8) for _ in range(count)]


def stage_times(extractor: RegionExtractor, image: np.ndarray, device: str):
    """Seconds per stage of one image, and its proposals and region features."""
    times = {}
    with torch.inference_mode():
        start = time.perf_counter()
        prepared = extractor.prepare(image)
        times["load+resize"] = time.perf_counter() - start
        start = time.perf_counter()
        res4 = extractor.backbone_features(prepared[0])
        synchronize(device)
        times["backbone"] = time.perf_counter() - start
        start = time.perf_counter()
        proposals, _ = extractor.proposal_generator(res4, prepared[0].resized_size)
        synchronize(device)
        times["rpn"] = time.perf_counter() - start
        start = time.perf_counter()
        outputs = extractor.roi_heads([res4], [proposals])[0]
        synchronize(device)
        times[f"roi head ({len(proposals)} RoIs)"] = time.perf_counter() - start
        start = time.perf_counter()
        selection = extractor.select(proposals.cpu(), outputs.cpu(), prepared[0])
        times[f"selection ({len(selection.proposal_indices)} kept)"] = time.perf_counter() - start
    return times, proposals, outputs.features


def _unfused_block(block, x: torch.Tensor) -> torch.Tensor:
    """A res5 bottleneck the plain way (convolution, then the frozen BatchNorm as its own op), for comparison."""
    import torch.nn.functional as F

    def conv_norm(conv, v):
        return conv.norm(F.conv2d(v, conv.weight, None, conv.stride, conv.padding, conv.dilation, conv.groups))

    identity = x if block.shortcut is None else conv_norm(block.shortcut, x)
    out = F.relu(conv_norm(block.conv1, x))
    out = F.relu(conv_norm(block.conv2, out))
    return F.relu(conv_norm(block.conv3, out) + identity)


def compare_roi_head(extractor: RegionExtractor, num_rois: int, rounds: int = 3) -> None:
    """res5 on the same RoIs, alternately: NCHW with separate BatchNorm vs vlhub's folded BatchNorm + NHWC.
    Alternating rounds share whatever else the machine is doing, so the ratio is meaningful on a busy machine."""
    torch.manual_seed(1)
    pooled = torch.rand(num_rois, extractor.config.res4_channels, 14, 14)
    res5 = extractor.roi_heads.res5
    timings = {"NCHW, BatchNorm separate": [], "NHWC, BatchNorm folded": []}
    with torch.inference_mode():
        res5_plain = copy.deepcopy(res5).to(memory_format=torch.contiguous_format)
        fast_input = pooled.contiguous(memory_format=torch.channels_last)
        for _ in range(rounds):
            start = time.perf_counter()
            x = pooled
            for block in res5_plain:
                x = _unfused_block(block, x)
            plain = x.mean(dim=(2, 3))
            timings["NCHW, BatchNorm separate"].append(time.perf_counter() - start)
            start = time.perf_counter()
            fast = res5(fast_input).mean(dim=(2, 3))
            timings["NHWC, BatchNorm folded"].append(time.perf_counter() - start)
    difference = (fast - plain).abs().max().item()
    print(
        f"\nres5 on {num_rois} RoIs, {rounds} alternating rounds (min s): "
        + ", ".join(f"{k} {min(v):.2f}" for k, v in timings.items())
        + f"; max abs feature difference {difference:.1e}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["fp32", "bf16"])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--height", type=int, default=600)
    parser.add_argument("--width", type=int, default=800)
    add_device_arguments(parser, default="cpu")
    parser.add_argument("--tiny", action="store_true", help="the tests' tiny detector: a wiring check, not a figure")
    parser.add_argument("--no-channels-last", action="store_true")
    parser.add_argument(
        "--compare-roi-head",
        type=int,
        default=0,
        metavar="N",
        help="also time res5 on N RoIs: plain NCHW + separate BatchNorm vs vlhub's (fp32)",
    )
    _add_paired_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = prepare_device(args.device, parser)
    if args.paired_rounds or args.agreement_images:
        return paired_figures(args)
    info = machine(device, peak_dtypes=())
    print(describe(info))
    print(
        f"torch {torch.__version__}, {args.threads} threads, device {device}, "
        f"channels_last={not args.no_channels_last}, images {args.height}x{args.width}",
        flush=True,
    )
    base = build_extractor(not args.no_channels_last, device, args.tiny)
    if args.compare_roi_head:
        compare_roi_head(base, args.compare_roi_head)
    pictures = images(max(args.batch_sizes), args.height, args.width)
    reference, rows = None, []
    for dtype_name in args.dtypes:
        extractor = base.to(DTYPES[dtype_name])
        # The stage breakdown is also the warm-up (oneDNN primitive creation: milliseconds against seconds).
        times, proposals, features = stage_times(extractor, pictures[0], device)
        print(f"\n[{dtype_name}] one image: " + ", ".join(f"{k} {v:.2f} s" for k, v in times.items()), flush=True)
        for batch in args.batch_sizes:
            start = time.perf_counter()
            for _ in range(args.repeats):
                extractor.detect(pictures[:batch])
            synchronize(device)
            per_image = (time.perf_counter() - start) / (args.repeats * batch)
            print(f"[{dtype_name}] batch {batch}: {per_image:.2f} s/image", flush=True)
            rows.append({"dtype": dtype_name, "batch": batch, "s_per_image": per_image, "images_per_s": 1 / per_image})
        if reference is None:
            reference = (proposals[:50], features[:50])  # 50 RoIs are enough to measure the difference
        else:
            with torch.inference_mode():
                res4 = extractor.backbone_features(extractor.prepare(pictures[0])[0])
                features = extractor.roi_heads([res4], [reference[0]])[0].features
            error = ((features - reference[1]).norm() / reference[1].norm()).item()
            print(
                f"[{dtype_name}] region features vs {args.dtypes[0]} on the same 50 proposals: relative L2 difference "
                f"{error:.2e}",
                flush=True,
            )
        base = extractor.float()
    write_figures(args.json, "detector", info, rows, tiny=args.tiny, height=args.height, width=args.width)


def _add_paired_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--paired-rounds", type=int, default=0, help="fp32 / bf16 / int8 side by side, N rounds")
    parser.add_argument("--paired-images", type=int, default=1, help="images per timed call (default 1)")
    parser.add_argument("--proposals", type=int, default=300, help="RPN proposals per image (default 300)")
    parser.add_argument("--agreement-images", type=int, default=0, help="shapes-world scenes for the agreement")
    parser.add_argument("--fixtures", default="../shared/fixtures", help="folder of detector_frcnn / detector_d2")


def paired_figures(args: argparse.Namespace) -> None:
    from bench.detector_speed import agreement, paired_dtypes

    print(f"torch {torch.__version__}, {args.threads} threads, images {args.height}x{args.width}", flush=True)
    if args.paired_rounds:
        base = build_extractor(True, "cpu", rpn_post_nms_top_n=args.proposals)
        pictures = images(args.paired_images + 1, args.height, args.width)
        paired_dtypes(base, pictures[1:], pictures[:1], args.paired_rounds)
    if args.agreement_images:
        agreement(Path(args.fixtures), args.agreement_images)


if __name__ == "__main__":
    main()
