"""Reading and converting a full-size bottom-up-attention `.caffemodel` (ResNet-101, 1601 classes, 401 attributes).

    python bench/bench_caffemodel_convert.py [CAFFEMODEL] [--repeats 3]

Without CAFFEMODEL, a synthetic file of the released size (random values, the layer names and shapes of
`resnet101_faster_rcnn_final.caffemodel`) is written to a temporary folder with the encoder of
`tests/test_caffemodel.py`. Prints the file size, seconds for `read_caffemodel` and for `caffe_to_detectron2`, and the
peak of memory numpy allocated while converting (tracemalloc).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.test_caffemodel import butd_block_name, write_caffemodel  # noqa: E402
from vlhub.conversion.caffemodel import BUTD_STAGE_BLOCKS, caffe_to_detectron2, read_caffemodel  # noqa: E402


def butd_layers(rng: np.random.Generator) -> dict[str, list[np.ndarray]]:
    """Random blobs with the shapes of the released ResNet-101 detector."""

    def normal(*shape):
        return rng.standard_normal(shape, dtype=np.float32)

    layers: dict[str, list[np.ndarray]] = {}

    def unit(tail: str, out_channels: int, in_channels: int, kernel: int):
        conv = "conv1" if tail == "_conv1" else f"res{tail}"
        layers[conv] = [normal(out_channels, in_channels, kernel, kernel)]
        layers[f"bn{tail}"] = [normal(out_channels), np.abs(normal(out_channels)), np.array([999.98], np.float32)]
        layers[f"scale{tail}"] = [normal(out_channels), normal(out_channels)]

    unit("_conv1", 64, 3, 7)
    in_channels = 64
    for stage, count, width in zip((2, 3, 4, 5), BUTD_STAGE_BLOCKS, (64, 128, 256, 512)):
        for block in range(count):
            name = f"{stage}{butd_block_name(block, count)}"
            if block == 0:
                unit(f"{name}_branch1", 4 * width, in_channels, 1)
            unit(f"{name}_branch2a", width, in_channels if block == 0 else 4 * width, 1)
            unit(f"{name}_branch2b", width, width, 3)
            unit(f"{name}_branch2c", 4 * width, width, 1)
        in_channels = 4 * width
    layers["rpn_conv/3x3"] = [normal(512, 1024, 3, 3), normal(512)]
    layers["rpn_cls_score"] = [normal(24, 512, 1, 1), normal(24)]
    layers["rpn_bbox_pred"] = [normal(48, 512, 1, 1), normal(48)]
    layers["cls_score"] = [normal(1601, 2048), normal(1601)]
    layers["bbox_pred"] = [normal(6404, 2048), normal(6404)]
    layers["cls_embedding"] = [normal(1601, 256)]
    layers["fc_attr"] = [normal(512, 2304), normal(512)]
    layers["attr_score"] = [normal(401, 512), normal(401)]
    return layers


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("caffemodel", nargs="?", help="a real .caffemodel (default: a synthetic one of the same size)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        path = Path(args.caffemodel) if args.caffemodel else Path(folder) / "synthetic.caffemodel"
        if not args.caffemodel:
            write_caffemodel(path, butd_layers(np.random.default_rng(0)))
        print(f"file: {path.name}, {path.stat().st_size / 2**20:.1f} MiB")

        read_seconds, convert_seconds = [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            layers = read_caffemodel(path)
            read_seconds.append(time.perf_counter() - start)
            start = time.perf_counter()
            state, _ = caffe_to_detectron2(layers)
            convert_seconds.append(time.perf_counter() - start)
            del layers, state

        tracemalloc.start()
        state, report = caffe_to_detectron2(path)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        values = sum(a.size for a in state.values())
        print(
            f"{len(state)} tensors, {values:,} values ({values * 4 / 2**20:.1f} MiB float32); "
            f"{len(report.used)} from {len(set(report.used.values()))} Caffe layers"
        )
        print(f"read_caffemodel: {min(read_seconds):.2f} s (best of {args.repeats})")
        print(f"caffe_to_detectron2 on the read layers: {min(convert_seconds):.2f} s (best of {args.repeats})")
        print(f"peak numpy memory, file → state dict: {peak / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
