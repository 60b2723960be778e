"""One markdown table from the benches' `--json` files (bench/run_all.sh runs them, then this).

    python bench/collect_table.py --json-dir DIR [--out FILE] [--title TEXT]

Reads DIR/machine.json (bench/device.py: the device and its matmul peaks) and one file per bench
(encoders, vlp_decoding, tden_decoding, detector, training, data, dtypes), and writes one table, a row per figure:
encoders' examples/s with the share of the matmul peak of their dtype (measured by the encoder bench in the same
process), decoding seconds per image, detector images/s, training steps/s, data-path examples/s, linear-layer GFLOP/s
per dtype. A bench whose file is missing gets a row saying so, and the exit status is 1; the table is printed and,
with `--out`, written atomically.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

BENCHES = ("encoders", "vlp_decoding", "tden_decoding", "detector", "training", "data", "dtypes")
HEADER = ("bench", "what", "setting", "figure", "unit", "% of peak")


def encoder_rows(result: dict) -> Iterator[tuple]:
    for row in result["figures"]:
        dtype = "bf16" if row["dtype"] == "bfloat16" else "fp32"
        yield (
            "encoders",
            row["case"],
            f"{dtype}, {row['attention']}, batch {row['batch']}",
            row["examples_per_s"],
            "examples/s",
            f"{row['percent_of_peak']:.1f}% of {dtype}",
        )


def decoding_rows(result: dict) -> Iterator[tuple]:
    settings, model = result["settings"], "Unified VLP" if result["bench"] == "vlp_decoding" else "TDEN"
    for row in result["figures"]:
        if result["bench"] == "vlp_decoding":
            if not row["cache"]:
                continue
            search = row["search"] if row["search"] == "greedy" else f"{row['search']} {settings['beams']}"
        else:
            if row["run"] != "cache" or row["decoder"] != "generate":
                continue
            search = "greedy" if row["beams"] == 1 else f"beam {row['beams']}"
        setting = f"{search}, batch {row['batch']}, cached, {settings['dtype']}"
        yield ("decoding", f"{model} {settings['size']}", setting, row["s_per_image"], "s/image", "")


def detector_rows(result: dict) -> Iterator[tuple]:
    settings = result["settings"]
    what = "tiny detector (wiring)" if settings["tiny"] else "R101-C4 detector"
    for row in result["figures"]:
        setting = f"{row['dtype']}, batch {row['batch']}, {settings['height']}×{settings['width']}"
        yield ("detector", what, setting, row["images_per_s"], "images/s", "")


def training_rows(result: dict) -> Iterator[tuple]:
    for row in result["figures"]:
        if row["kind"] != "pre-training":
            continue
        setting = f"batch {row['batch']}, {row['objectives']}, mixed precision {row['mixed_precision']}"
        yield ("training", f"UNITER-{row['size']} pre-training", setting, row["steps_per_s"], "steps/s", "")


def data_rows(result: dict) -> Iterator[tuple]:
    for row in result["figures"]:
        for workers in result["settings"]["workers"]:
            key = f"data_path_examples_per_s_{workers}_workers"
            yield ("data path", f"{row['images']} images", f"{workers} workers, batch 32", row[key], "examples/s", "")


def dtype_rows(result: dict) -> Iterator[tuple]:
    settings = result["settings"]
    for row in result["figures"]:
        setting = f"{row['dtype']}, {settings['tokens']}×{settings['width']} @ {settings['width']}²"
        yield ("dtypes", "linear layer", setting, row["gflops"], "GFLOP/s", "")


ROWS: dict[str, Callable[[dict], Iterator[tuple]]] = {
    "encoders": encoder_rows,
    "vlp_decoding": decoding_rows,
    "tden_decoding": decoding_rows,
    "detector": detector_rows,
    "training": training_rows,
    "data": data_rows,
    "dtypes": dtype_rows,
}


def figure(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def build_table(folder: Path, title: str) -> tuple[str, list[str]]:
    """The markdown (title, machine line, table) and the benches whose file is missing."""
    lines, missing = [f"### {title}", ""], []
    machine_file = folder / "machine.json"
    if machine_file.exists():
        from device import describe  # bench/device.py (this script's folder is on sys.path)

        info = json.loads(machine_file.read_text())["machine"]
        lines += [f"{info['device']}: {describe(info)}", ""]
    else:
        missing.append("machine")
    lines += ["| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
    for bench in BENCHES:
        path = folder / f"{bench}.json"
        if not path.exists():
            missing.append(bench)
            lines.append(f"| {bench} | not measured: no {path.name} (see its log) | | | | |")
            continue
        rows = list(ROWS[bench](json.loads(path.read_text())))
        if not rows:
            missing.append(bench)
            lines.append(f"| {bench} | no figure in {path.name} | | | | |")
        for bench_name, what, setting, value, unit, share in rows:
            lines.append(f"| {bench_name} | {what} | {setting} | {figure(value)} | {unit} | {share} |")
    return "\n".join(lines) + "\n", missing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json-dir", type=Path, required=True, help="the benches' --json files")
    parser.add_argument("--out", type=Path, help="also write the table here (atomically)")
    parser.add_argument("--title", default="vlhub benchmarks")
    args = parser.parse_args()
    if not args.json_dir.is_dir():
        parser.error(f"--json-dir {args.json_dir}: not a folder")
    table, missing = build_table(args.json_dir, args.title)
    print(table, end="")
    if args.out:
        from vlhub.utils.files import atomic_write_text

        atomic_write_text(args.out, table)
    if missing:
        sys.exit(f"collect_table.py: no figures from {', '.join(missing)}")


if __name__ == "__main__":
    main()
