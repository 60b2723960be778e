"""Run a snippet of Python as `python -c` would, in a process of its own that has imported nothing of vlhub or
transformers yet, but forked from a server that has imported torch once (a fresh interpreter spent ~3 of its ~4 CPU-s
of imports on torch). For the tests whose subject is what an import does first (registrations, warnings that fire
once per process).

multiprocessing has one fork server per process, started by its first user with that user's preload: where another
test of the same pytest worker started it first (tests/fuzz_cases.py preloads vlhub), its children are not fresh, so
the child says so (exit code `NOT_FRESH`) and the snippet runs in a new interpreter (`python -c`) instead."""

from __future__ import annotations

import functools
import multiprocessing
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

PRELOAD = ("torch",)  # nothing that imports vlhub or transformers: the snippets' import order is what they test
TIMEOUT_S = 300
NOT_FRESH = 3  # the child's exit code when the fork server had imported vlhub or transformers


@functools.cache
def _context():
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    return context


def _child(code: str, stdout: str, stderr: str) -> None:
    if any(name in sys.modules for name in ("vlhub", "transformers", "tests.conftest")):
        raise SystemExit(NOT_FRESH)  # a fork server started by another test, with its own preload
    for descriptor, path in ((1, stdout), (2, stderr)):  # read back by `run_python`
        with open(path, "wb") as sink:
            os.dup2(sink.fileno(), descriptor)
    try:
        exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})  # `python -c`'s file name
    except BaseException:
        traceback.print_exc()
        raise SystemExit(1)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def run_python(code: str) -> str:
    """`code`'s stdout; fails the calling test with its stderr when `code` raises (or runs past TIMEOUT_S)."""
    with tempfile.TemporaryDirectory(prefix="vlhub-fresh-") as folder:
        stdout, stderr = Path(folder, "stdout"), Path(folder, "stderr")
        child = _context().Process(target=_child, args=(code, str(stdout), str(stderr)))
        child.start()
        child.join(TIMEOUT_S)
        if child.is_alive():
            child.kill()
            child.join()
        out, err = (path.read_text(errors="replace") if path.exists() else "" for path in (stdout, stderr))
    if child.exitcode == NOT_FRESH:
        ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT_S)
        assert ran.returncode == 0, f"exit code {ran.returncode}:\n{ran.stderr[-3000:]}"
        return ran.stdout
    assert child.exitcode == 0, f"exit code {child.exitcode}:\n{err[-3000:]}"
    return out
