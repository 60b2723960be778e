"""Making `accelerate launch --num_processes N script.py` start N processes on a machine without GPUs.

On a CPU-only machine accelerate's launcher falls back to its single-process "simple" launcher when neither
`--multi_gpu` nor an MPI host file is given (`--cpu --num_processes 2` also starts one process), so the user's
two processes silently become one. What does start N CPU processes (gloo) is accelerate's torchrun-based
launcher: `accelerate launch --multi_gpu --num_processes N` (plus `ACCELERATE_USE_CPU=1`, or an
`Accelerator(cpu=True)` as vlhub's loop builds when no GPU is present).

`relaunch_with_cpu_processes()` detects the fallback (the parent is `accelerate launch` asking for N > 1 processes,
this process is alone, no GPU) and replaces the process with that launcher, so the plain command does what it says.
"""

from __future__ import annotations

import os
import sys

import torch

__all__ = ["relaunch_with_cpu_processes", "requested_processes"]

_GUARD = "VLHUB_CPU_RELAUNCHED"


def _parent_argv() -> list[str]:
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            return [a.decode() for a in f.read().split(b"\0") if a]
    except OSError:  # not Linux, or no access: nothing to detect
        return []


def requested_processes(parent: list[str], script: str) -> tuple[int, list[str]] | None:
    """(N, launcher options) when `parent` is `accelerate launch [options] <script> ...` with `--num_processes N`."""
    if "launch" not in parent or not any(os.path.basename(a).startswith("accelerate") for a in parent[:3]):
        return None
    script_path = os.path.realpath(script)
    try:
        start = parent.index("launch") + 1
        end = next(i for i in range(start, len(parent)) if os.path.realpath(parent[i]) == script_path)
    except (ValueError, StopIteration):
        return None
    options = parent[start:end]
    count = None
    for i, option in enumerate(options):
        if option == "--num_processes" and i + 1 < len(options):
            count = options[i + 1]
        elif option.startswith("--num_processes="):
            count = option.split("=", 1)[1]
    if count is None or not count.isdigit() or int(count) < 2:
        return None
    return int(count), options


def relaunch_with_cpu_processes(script: str | None = None) -> None:
    """If accelerate fell back to one process for a multi-process request on a CPU-only machine, re-launch through
    accelerate's multi-process launcher (gloo on the CPU). Returns normally when there is nothing to do."""
    if "WORLD_SIZE" in os.environ or os.environ.get(_GUARD) or torch.cuda.is_available():
        return
    if "ACCELERATE_MIXED_PRECISION" not in os.environ:  # set by every `accelerate launch`
        return
    script = script or sys.argv[0]
    request = requested_processes(_parent_argv(), script)
    if request is None:
        return
    count, options = request
    options = [o for o in options if o not in ("--cpu", "--multi_gpu")]
    print(f"vlhub: accelerate started 1 process for --num_processes {count} (no GPU here); re-launching with "
          f"accelerate's multi-process launcher on the CPU (gloo): ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu "
          f"{' '.join(options)} {script} ...", file=sys.stderr, flush=True)
    env = {**os.environ, _GUARD: "1", "ACCELERATE_USE_CPU": "1"}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", *options, script, *sys.argv[1:]]
    os.execve(sys.executable, command, env)
