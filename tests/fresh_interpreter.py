"""Run a snippet of Python as `python -c` would, in a process of its own that has imported nothing of vlhub or
transformers yet, but forked from a server that has imported torch once (a fresh interpreter spent ~3 of its ~4 CPU-s
of imports on torch). For the tests whose subject is what an import does first (registrations, warnings that fire
once per process)."""

from __future__ import annotations

import functools
import multiprocessing
import os
import tempfile
import traceback
from pathlib import Path

PRELOAD = ("torch",)  # nothing that imports vlhub or transformers: the snippets' import order is what they test
TIMEOUT_S = 300


@functools.cache
def _context():
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    return context


def _child(code: str, stdout: str, stderr: str) -> None:
    import sys

    for descriptor, path in ((1, stdout), (2, stderr)):  # read back by `run_python`
        with open(path, "wb") as sink:
            os.dup2(sink.fileno(), descriptor)
    try:
        imported = sorted(name for name in ("vlhub", "transformers", "tests.conftest") if name in sys.modules)
        assert not imported, f"the forked interpreter has already imported {imported}"
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
    assert child.exitcode == 0, f"exit code {child.exitcode}:\n{err[-3000:]}"
    return out
