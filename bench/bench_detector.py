"""Bottom-up-attention detector speed: seconds per image of a FULL-SIZE extractor on 600×800 images.

    python bench/bench_detector.py [--threads 2] [--batch-sizes 1 4] [--dtypes fp32 bf16] [--repeats 1]
                                   [--device cpu|cuda] [--no-channels-last]

The extractor is the released model's size (ResNet-101 C4, 1600 classes + background, 400 attributes + "none",
300 proposals, 600/1000 resize, "butd" selection) with random weights; BatchNorm statistics are randomised like a
trained network's, and `cls_score` is drawn with std 0.5 so that class probabilities are peaked as a trained
model's are (with a default-initialised head every probability is ~1/1601 and the selection's fallback does far
more work than it does on real weights). Speed does not otherwise depend on the values.

Prints, per dtype and batch size, seconds per image (a batch shares one RoI-head pass), a stage breakdown of one
image (backbone, RPN, RoI head over all proposals, selection), and for bf16 the relative difference of its region
features from fp32 on the same proposals.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from vlhub.processing.detector import DetectorConfig, RegionExtractor

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build_extractor(channels_last: bool, device: str) -> RegionExtractor:
    torch.manual_seed(0)
    extractor = RegionExtractor(DetectorConfig())
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


def synchronize(device: str):
    if device == "cuda":
        torch.cuda.synchronize()


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["fp32", "bf16"])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--height", type=int, default=600)
    parser.add_argument("--width", type=int, default=800)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--no-channels-last", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = args.device
    print(f"torch {torch.__version__}, {args.threads} threads, device {device}, "
          f"channels_last={not args.no_channels_last}, images {args.height}x{args.width}", flush=True)
    base = build_extractor(not args.no_channels_last, device)
    pictures = images(max(args.batch_sizes), args.height, args.width)
    reference = None
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
        if reference is None:
            reference = (proposals[:50], features[:50])  # 50 RoIs are enough to measure the difference
        else:
            with torch.inference_mode():
                res4 = extractor.backbone_features(extractor.prepare(pictures[0])[0])
                features = extractor.roi_heads([res4], [reference[0]])[0].features
            error = ((features - reference[1]).norm() / reference[1].norm()).item()
            print(f"[{dtype_name}] region features vs {args.dtypes[0]} on the same 50 proposals: relative L2 difference "
                  f"{error:.2e}", flush=True)
        base = extractor.float()


if __name__ == "__main__":
    main()
