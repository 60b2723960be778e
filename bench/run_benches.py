"""Runs bench/run_all.sh's jobs (its benches, then the table) one after another, each in a process of its own forked
from this one after it has imported torch, transformers and vlhub: a fresh interpreter spends ~7 CPU-s on those
imports before its bench starts, and every bench imports them anyway.

    python bench/run_benches.py JOBS LOG_DIR

JOBS holds one record per bench, fields separated by NUL bytes: the number of fields that follow, then the bench's
name, its script (a path) and its arguments. Each bench runs as `python SCRIPT ARGUMENTS` would (its own process,
`sys.argv`, `__main__`, bench/ first on `sys.path`), with its stdout and stderr in LOG_DIR/NAME.log. Progress goes to
stderr; the names of the benches that failed go to stdout, one a line. Nothing here touches CUDA before forking (a
forked child cannot use a CUDA context its parent made): each bench sets its device up itself.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
import traceback
from pathlib import Path

import torch


def read_jobs(path: Path) -> list[list[str]]:
    """[name, script, *arguments] per record of `path`."""
    fields = path.read_bytes().decode().split("\0")[:-1]
    jobs = []
    while fields:
        count = int(fields.pop(0))
        if count < 2 or count > len(fields):
            sys.exit(f"run_benches.py: {path}: a record of {count} fields, {len(fields)} left in the file")
        jobs.append(fields[:count])
        del fields[:count]
    return jobs


def run_child(script: str, arguments: list[str], log: Path) -> None:
    """In the forked child: run `script` as its own `__main__` with its output in `log`, and exit as Python would."""
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sink = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(sink, 1)
    os.dup2(sink, 2)
    # Streams of its own over the log, as a new interpreter has (this process's may be wrapped, e.g. by pytest).
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.argv = [script, *arguments]
    sys.path[0] = str(Path(script).resolve().parent)
    status = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit:
        if isinstance(exit.code, int) or exit.code is None:
            status = exit.code or 0
        else:
            sys.stdout.flush()  # the message ends the log, as on a terminal
            print(exit.code, file=sys.stderr)
            status = 1
    except BaseException:
        sys.stdout.flush()
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def run_job(name: str, script: str, arguments: list[str], log_dir: Path) -> bool:
    """One bench in a forked child; True when it exited with status 0."""
    print(f"[run_all] {name}: {Path(script).name} {' '.join(arguments)}", file=sys.stderr, flush=True)
    log = log_dir / f"{name}.log"
    start = time.monotonic()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        run_child(script, arguments, log)
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    seconds = round(time.monotonic() - start)
    if status == 0:
        print(f"[run_all] {name} done in {seconds} s", file=sys.stderr, flush=True)
        return True
    print(f"[run_all] {name} FAILED (exit {status}) after {seconds} s; the end of {log}:", file=sys.stderr)
    print("\n".join(log.read_text(errors="replace").splitlines()[-5:]), file=sys.stderr, flush=True)
    return False


def run_jobs(jobs: list[list[str]], log_dir: Path) -> list[str]:
    """Each job in turn; the names of those that failed."""
    if torch.cuda.is_initialized():
        sys.exit("run_benches.py: CUDA was initialised before forking; forked benches could not use it")
    return [name for name, script, *arguments in jobs if not run_job(name, script, arguments, log_dir)]


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: run_benches.py JOBS LOG_DIR")
    jobs, log_dir = read_jobs(Path(sys.argv[1])), Path(sys.argv[2])
    import transformers.modeling_utils  # noqa: F401  (the model machinery every bench uses; it imports torch._dynamo)

    import vlhub  # noqa: F401

    for name in run_jobs(jobs, log_dir):
        print(name, flush=True)


if __name__ == "__main__":
    main()
