"""Run a snippet of Python as `python -c` would, in a process of its own that has imported nothing of vlhub or
transformers yet, but forked from a server that has imported torch and the third-party libraries they use once (a
fresh interpreter spent ~3 of its ~4 CPU-s of `import vlhub` on torch). For the tests whose subject is what an import
does first (registrations, warnings that fire once per process).

The server is this module's own interpreter (one per pytest worker, started on first use), not multiprocessing's fork
server: that one is shared by every user of a process and keeps the preload of whoever started it first, so its
children would not be fresh. A server with more preloaded (tests/process_group.py's, tests/fuzz_cases.py's) is forked
from this one and imports only the rest: torch is imported once per pytest worker, not once per server."""

from __future__ import annotations

import atexit
import functools
import json
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

# Nothing that imports vlhub or transformers (the snippets' import order is what they test), nor a module whose absence
# a snippet checks (torchvision, datasets, pandas, pyarrow, gradio): torch and the third-party libraries transformers
# and vlhub import anyway, which were about half of each child's own import time.
PRELOAD = (
    "torch",
    "torch._dynamo",
    "torch.distributed.checkpoint",  # transformers.distributed.checkpoint's (~0.15 s a child)
    "httpx2",  # huggingface_hub's HTTP client, which transformers.utils.hub imports (with trio, ~0.5 s a child)
    "httpcore2._sync.connection_pool",
    "numpy",
    "PIL.Image",
    "huggingface_hub",
    "tokenizers",
    "safetensors.torch",
    "accelerate",
    "jinja2",
    "yaml",
    "regex",
    "filelock",
    "tqdm",
)
TIMEOUT_S = 300

# A forked child runs `code` with its output in files and exits like `python -c`: 0, SystemExit's code, or 1 after a
# traceback (also the processes of tests/process_group.py).
RUN_CHILD = """
import os, sys, traceback


def run(code, stdout, stderr):
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for descriptor, path in ((1, stdout), (2, stderr)):
        sink = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(sink, descriptor)
    sys.argv = ["-c"]
    status = 0
    try:
        exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
    except SystemExit as exit:
        if isinstance(exit.code, int) or exit.code is None:
            status = exit.code or 0
        else:
            print(exit.code, file=sys.stderr)
            status = 1
    except BaseException:
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
"""
# One request a line on stdin (JSON: code, stdout path, stderr path), one exit code a line back on stdout; the server
# kills a child past TIMEOUT_S.
_SERVER = (
    RUN_CHILD
    + """
import json, time


# Each request runs in a forked child; one with a 4th item ("detach") in a grandchild the server does not wait for (a
# server of more preloaded modules, SUB_SERVER), answered 0 at once.
def serve(requests, replies, timeout_s):
    for line in requests:
        code, stdout, stderr, *detach = json.loads(line)
        pid = os.fork()
        if pid == 0:
            if detach and os.fork():
                os._exit(0)  # the grandchild goes on, reparented, past this server's time limit
            run(code, stdout, stderr)
        deadline = time.monotonic() + timeout_s
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        if done[0] == 0:
            os.kill(pid, 9)
            done = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(done[1]), file=replies, flush=True)


if __name__ == "__main__" and len(sys.argv) == 4:
    sys.path[:] = json.loads(sys.argv[1])
    for name in json.loads(sys.argv[2]):
        __import__(name)
    import gc

    gc.freeze()  # the preloaded objects stay out of the children's collections (and their pages unshared by them)
    serve(sys.stdin, sys.stdout, float(sys.argv[3]))
"""
)
# A detached child of the server that imports the rest of a longer preload, then serves as the server does, over a
# Unix socket to the test process (requests in, exit codes out) until the test process closes it.
SUB_SERVER = """
import __main__, gc, json, socket
connection = socket.socket(socket.AF_UNIX)
connection.connect({path!r})
for name in {preload!r}:
    __import__(name)
gc.freeze()
__main__.serve(connection.makefile("r"), connection.makefile("w"), {timeout_s!r})
"""


class _SubServer:
    """A server forked from the base one (SUB_SERVER), with the base server's `stdin`, `stdout` and `wait`."""

    def __init__(self, preload: tuple[str, ...], timeout_s: float):
        base = _server(PRELOAD, TIMEOUT_S)
        self.folder = Path(tempfile.mkdtemp(prefix="vlhub-sub-server-"))
        self.log = self.folder / "stderr"
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(self.folder / "socket"))
        listener.listen(1)
        listener.settimeout(TIMEOUT_S)
        code = SUB_SERVER.format(path=str(self.folder / "socket"), preload=preload[len(PRELOAD) :], timeout_s=timeout_s)
        base.stdin.write(json.dumps([code, str(self.folder / "stdout"), str(self.log), "detach"]) + "\n")
        base.stdin.flush()
        assert base.stdout.readline(), f"the fork server exited (code {base.wait()})"
        self.connection = listener.accept()[0]
        listener.close()
        self.stdin, self.stdout = self.connection.makefile("w"), self.connection.makefile("r")

    def wait(self, timeout: float | None = None) -> str:
        """How the sub-server ended (its stderr's end), as the base server's `wait` gives its exit code."""
        return "of the sub-server unknown; its stderr: " + self.log.read_text(errors="replace")[-3000:]

    def close(self) -> None:
        for stream in (self.stdin, self.stdout, self.connection):
            stream.close()  # the sub-server's loop ends


@functools.cache
def _server(preload: tuple[str, ...] = PRELOAD, timeout_s: float = TIMEOUT_S) -> subprocess.Popen | _SubServer:
    """The server of `preload` whose children are killed past `timeout_s`: forked from the base server (PRELOAD) when
    `preload` extends PRELOAD, else a new interpreter."""
    if preload[: len(PRELOAD)] == PRELOAD and (len(preload) > len(PRELOAD) or timeout_s != TIMEOUT_S):
        server = _SubServer(preload, timeout_s)
        atexit.register(server.close)
        return server
    arguments = [json.dumps(sys.path), json.dumps(preload), str(timeout_s)]
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER, *arguments], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    atexit.register(_stop, server)
    return server


def _stop(server: subprocess.Popen) -> None:
    server.stdin.close()  # the server's loop ends
    server.wait(TIMEOUT_S)


def run_python(code: str, preload: tuple[str, ...] = PRELOAD) -> str:
    """`code`'s stdout; fails the calling test with its stderr when `code` raises (or runs past TIMEOUT_S). `preload`:
    what the server has imported (one server per distinct preload)."""
    return run_python_outputs(code, preload)[0]


def run_python_outputs(code: str, preload: tuple[str, ...] = PRELOAD) -> tuple[str, str]:
    """`code`'s `(stdout, stderr)`, failing as `run_python` does."""
    exit_code, out, err = run_python_status(code, preload)
    assert exit_code == 0, f"exit code {exit_code}:\n{err[-3000:]}"
    return out, err


def run_python_status(
    code: str, preload: tuple[str, ...] = PRELOAD, timeout_s: float = TIMEOUT_S
) -> tuple[int, str, str]:
    """`code`'s `(exit code, stdout, stderr)`, whatever the exit code (-9: killed past `timeout_s`); fails the calling
    test only when the server itself is gone."""
    server = _server(preload, timeout_s)
    with tempfile.TemporaryDirectory(prefix="vlhub-fresh-") as folder:
        stdout, stderr = Path(folder, "stdout"), Path(folder, "stderr")
        server.stdin.write(json.dumps([code, str(stdout), str(stderr)]) + "\n")
        server.stdin.flush()
        reply = server.stdout.readline()
        assert reply, f"the fork server exited (code {server.wait()})"
        out, err = (path.read_text(errors="replace") if path.exists() else "" for path in (stdout, stderr))
    return int(reply), out, err


def _module_code(module: str, arguments: list[str], environment: dict[str, str], cwd: str | None) -> str:
    return (
        "import os, runpy, sys\n"
        f"os.environ.clear()\nos.environ.update({environment!r})\n"
        + (f"os.chdir({cwd!r})\n" if cwd is not None else "")
        + f"sys.argv = [{module!r}, *{arguments!r}]\n"
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
    )


def run_module(module: str, arguments: list[str], environment: dict[str, str]) -> str:
    """`python -m module *arguments` with only `environment`'s variables, as `run_python` runs a snippet: the child sets
    them itself, so what the server's preloaded libraries read at import (huggingface_hub's HF_HOME and offline mode)
    comes from the test session's environment."""
    return run_python(_module_code(module, arguments, environment, None))


def run_module_status(
    module: str, arguments: list[str], environment: dict[str, str], cwd: str | Path
) -> tuple[int, str, str]:
    """`python -m module *arguments` in `cwd` as `run_module` runs it, returning `(exit code, stdout, stderr)` whatever
    the exit code (for a child whose failure the test reports itself, such as a child pytest run)."""
    return run_python_status(_module_code(module, arguments, environment, str(cwd)))
