"""The processes of one distributed run on the CPU, started as `accelerate launch --num_processes N` starts them with
configs/accelerate/cpu_processes.yaml (torchrun's environment: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT; and
accelerate's ACCELERATE_USE_CPU and ACCELERATE_MIXED_PRECISION), but forked from a server that has imported vlhub's
training and extraction code once (tests/fresh_interpreter.py), not N + 1 new interpreters of ~8 CPU-s of imports
each. For the tests whose subject is what the processes do together; that the launcher itself starts the processes
is checked by tests/test_training_cli.py::test_accelerate_launch_num_processes_2_starts_two_processes.

Each process's exit code, stdout and stderr come back on their own (the launcher's merge them into one pipe)."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.fresh_interpreter import PRELOAD, RUN_CHILD, TIMEOUT_S, run_python

# The training command lines' and `vlhub.extract`'s own imports, so a process's run starts at its arguments.
TRAINING_PRELOAD = (
    *PRELOAD,
    "torchdata.stateful_dataloader",
    "datasets",
    "vlhub.training.cli",
    "vlhub.extract",
    "vlhub.demo",
)
# Under the server's own limit, so that the group's parent outlives its processes and ends every one it kills.
GROUP_TIMEOUT_S = TIMEOUT_S - 60

_GROUP = """
import json, socket, time
target, arguments, environment, cwd, outputs, timeout_s = json.loads({request!r})
with socket.socket() as probe:  # a free port for the processes' rendezvous, as the launcher's port 0 picks one
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
world = len(outputs)


def process(rank, stdout, stderr):
    os.environ.clear()
    os.environ.update(environment)
    if world > 1:  # one process: a plain `python` run
        os.environ.update(
            RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0", WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), ACCELERATE_USE_CPU="true",
            ACCELERATE_MIXED_PRECISION="no",
        )
    os.chdir(cwd)
    import torch

    torch.set_num_threads(int(environment.get("OMP_NUM_THREADS", "1")))  # read at torch's import, in the server
    if target.startswith("-m "):
        main = f"runpy.run_module({{target[3:]!r}}, run_name='__main__', alter_sys=True)"
    else:
        main = f"runpy.run_path({{target!r}}, run_name='__main__')"
    argv = [target[3:] if target.startswith("-m ") else target, *arguments]
    run(f"import runpy, sys; sys.argv = {{argv!r}}; {{main}}", stdout, stderr)


pids = []
for rank, (stdout, stderr) in enumerate(outputs):
    pid = os.fork()
    if pid == 0:
        process(rank, stdout, stderr)
    pids.append(pid)
deadline = time.monotonic() + timeout_s
codes = {{}}
while len(codes) < len(pids) and time.monotonic() < deadline:
    for pid in pids:
        if pid not in codes and (done := os.waitpid(pid, os.WNOHANG))[0]:
            codes[pid] = os.waitstatus_to_exitcode(done[1])
    time.sleep(0.02)
for pid in pids:
    if pid not in codes:  # still running at the deadline: a hang
        os.kill(pid, 9)
        codes[pid] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps([codes[pid] for pid in pids]))
"""


@dataclass
class Finished:
    """One process's end: its exit code (-9: killed at the group's deadline), stdout and stderr."""

    returncode: int
    stdout: str
    stderr: str


def run_processes(
    target: str, arguments: list[str], environment: dict[str, str], cwd: Path, num_processes: int = 2
) -> list[Finished]:
    """Run `target` (a script's path, or "-m module") with `arguments` in `num_processes` processes of one distributed
    run, each with only `environment`'s variables and the distributed ones (none for one process: a plain `python`
    run), in `cwd`. Returns each process's end, rank by rank; a process still running after GROUP_TIMEOUT_S is
    killed."""
    with tempfile.TemporaryDirectory(prefix="vlhub-group-") as folder:
        outputs = [(str(Path(folder, f"out{rank}")), str(Path(folder, f"err{rank}"))) for rank in range(num_processes)]
        request = json.dumps([target, arguments, environment, str(cwd), outputs, GROUP_TIMEOUT_S])
        codes = json.loads(
            run_python(RUN_CHILD + _GROUP.format(request=request), preload=TRAINING_PRELOAD).splitlines()[-1]
        )
        read = lambda path: Path(path).read_text(errors="replace") if Path(path).exists() else ""  # noqa: E731
        return [Finished(code, read(out), read(err)) for code, (out, err) in zip(codes, outputs, strict=True)]
