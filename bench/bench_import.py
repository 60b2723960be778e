"""What `import vlhub` costs next to `import transformers, torch`, each import in a fresh Python process.

    python bench/bench_import.py [--rounds 5]

Every round runs each case once in a new interpreter, in an order rotated from round to round (so a shared
machine's load falls on all alike); the child times its own import statement (wall and CPU, interpreter start-up
excluded) and counts `sys.modules`. Printed: the median over rounds, and whether the heavy data libraries were
loaded. The last two cases show what registering vlhub's model classes costs once the user reaches for
transformers' Auto models (transformers' `modeling_utils`, which imports torchvision whenever it is installed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CASES = {
    "import transformers, torch": "import transformers, torch",
    "import vlhub": "import vlhub",
    "import transformers, torch, vlhub": "import transformers, torch, vlhub",
    "from transformers import AutoModel": "from transformers import AutoModel",
    "import vlhub; from transformers import AutoModel": "import vlhub; from transformers import AutoModel",
}
HEAVY = ("datasets", "pandas", "pyarrow", "torchvision")
_CHILD = """
import sys, time
start, cpu = time.perf_counter(), time.process_time()
{code}
wall, cpu = time.perf_counter() - start, time.process_time() - cpu
import json
print(json.dumps({{"wall": wall, "cpu": cpu, "modules": len(sys.modules),
                  "heavy": [m for m in {heavy!r} if m in sys.modules]}}))
"""


def run_case(code: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    result = subprocess.run(
        [sys.executable, "-c", _CHILD.format(code=code, heavy=HEAVY)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    names = list(CASES)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for round_index in range(args.rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            runs[name].append(run_case(CASES[name]))
    print(f"median of {args.rounds} fresh processes (Python {sys.version.split()[0]}, {os.cpu_count()} CPUs)")
    print(f"{'case':50s} {'wall s':>7s} {'cpu s':>7s} {'modules':>8s}  heavy modules loaded")
    for name in names:
        wall = statistics.median(r["wall"] for r in runs[name])
        cpu = statistics.median(r["cpu"] for r in runs[name])
        modules = statistics.median(r["modules"] for r in runs[name])
        print(f"{name:50s} {wall:7.2f} {cpu:7.2f} {modules:8.0f}  {', '.join(runs[name][-1]['heavy']) or '-'}")
    for clock in ("wall", "cpu"):
        base = statistics.median(r[clock] for r in runs["import transformers, torch"])
        both = statistics.median(r[clock] for r in runs["import transformers, torch, vlhub"])
        print(f"vlhub on top of transformers and torch: {both - base:+.2f} s ({clock}, medians)")


if __name__ == "__main__":
    main()
