"""bench/run_all.sh: every device bench writes its figures as JSON, bench/collect_table.py makes one table of them.

The end-to-end run (`--device cpu --quick`: eight benches, tiny models, ~25 CPU-s: one import of torch, transformers and
vlhub that every bench's forked process shares, then each bench's work) is a slow test; the refusals and the
collector's handling of a missing bench run by default.
"""

import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
RUN_ALL = ROOT / "bench" / "run_all.sh"
# The rows every quick CPU run must fill: (bench, what, setting) patterns of bench/collect_table.py's table.
EXPECTED_ROWS = [
    *(
        ("encoders", f"{case} [tiny preset]", f"{dtype}, sdpa, batch 4")
        for case in ("UNITER-base VQA", "VL-BERT-base prec VQA", "ViLBERT 6-layer/6-co-attention VQA", "TDEN-base VQA")
        for dtype in ("fp32", "bf16")
    ),
    ("decoding", "Unified VLP small", "greedy, batch 1"),
    ("decoding", "Unified VLP small", "vlp-beam 2, batch 1"),
    ("decoding", "TDEN small", "greedy, batch 1"),
    ("decoding", "TDEN small", "beam 2, batch 1"),
    ("detector", "tiny detector", "fp32, batch 1"),
    ("training", "UNITER-tiny pre-training", "batch 4, mlm"),
    ("data path", "320 images", "0 workers"),
    ("dtypes", "linear layer", "fp32"),
    ("dtypes", "linear layer", "bf16"),
]


def run_all(*arguments: str, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        ["bash", str(RUN_ALL), *arguments, "--out", str(out)], capture_output=True, text=True, env=env, cwd=ROOT
    )


def table_rows(table: str) -> list[list[str]]:
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]  # without the header


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: --device cuda runs")
def test_the_refusal_of_cuda_without_a_gpu_names_the_way_out():
    """What run_all.sh and every bench's --device cuda say where torch sees no GPU (the shell's refusal below, which
    starts an interpreter for it, is slow)."""
    from bench.device import cuda_refusal

    refusal = cuda_refusal()
    assert refusal.startswith("--device cuda: torch sees no CUDA GPU here (torch ") and refusal.endswith("--device cpu")


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: --device cuda runs")
def test_cuda_without_a_gpu_is_refused_with_a_message(tmp_path):
    result = run_all("--device", "cuda", "--quick", out=tmp_path / "out")
    assert result.returncode == 2
    assert "--device cuda: torch sees no CUDA GPU here" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()  # refused before anything ran


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--device", "gpu"], "--device must be cpu or cuda, got 'gpu'"),
        ([], "--device must be cpu or cuda, got ''"),
        (["--device", "cpu", "--fast"], "unknown argument '--fast'"),
    ],
)
def test_bad_arguments_are_refused(tmp_path, arguments, message):
    result = run_all(*arguments, out=tmp_path / "out")
    assert result.returncode == 2
    assert message in result.stderr
    assert "usage: bench/run_all.sh --device cuda|cpu" in result.stderr


def run_script(script: Path, *arguments: str, monkeypatch) -> None:
    """`python script *arguments` in this process (its imports are this test process's): as `__main__`, with its
    folder first on `sys.path`; a SystemExit propagates."""
    monkeypatch.setattr(sys, "argv", [str(script), *arguments])
    monkeypatch.syspath_prepend(str(script.parent))
    runpy.run_path(str(script), run_name="__main__")


def test_the_collector_fills_a_measured_bench_and_names_the_missing_ones(tmp_path, monkeypatch, capsys):
    """One real bench's --json (the cheapest), the others absent: its rows are filled, every other bench has a
    'not measured' row, and the exit status says which are missing. Both scripts run in this process (the quick
    run above runs them as processes)."""
    folder = tmp_path / "json"
    run_script(
        ROOT / "bench" / "bench_dtypes.py",
        *("--rounds", "1", "--tokens", "8", "--width", "32", "--device", "cpu", "--json", str(folder / "dtypes.json")),
        monkeypatch=monkeypatch,
    )
    measured = json.loads((folder / "dtypes.json").read_text())
    assert measured["bench"] == "dtypes" and measured["machine"]["device"] == "cpu"
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit:
        run_script(
            ROOT / "bench" / "collect_table.py",
            *("--json-dir", str(folder), "--out", str(tmp_path / "table.md")),
            monkeypatch=monkeypatch,
        )
    # A string exit: Python prints it on stderr and exits with status 1.
    assert exit.value.code == (
        "collect_table.py: no figures from machine, encoders, vlp_decoding, tden_decoding, detector, training, data"
    )
    table = capsys.readouterr().out
    assert (tmp_path / "table.md").read_text() == table
    rows = table_rows(table)
    dtype_rows = [row for row in rows if row[0] == "dtypes"]
    assert [row[2].split(",")[0] for row in dtype_rows] == [row["dtype"] for row in measured["figures"]]
    for row, figure in zip(dtype_rows, measured["figures"]):
        assert float(row[3]) == pytest.approx(figure["gflops"], rel=6e-3)
    missing = {row[0] for row in rows if row[1].startswith("not measured")}
    assert missing == {"encoders", "vlp_decoding", "tden_decoding", "detector", "training", "data"}


def test_the_runner_runs_each_bench_as_its_own_main_and_names_the_failures(tmp_path, capsys):
    """bench/run_benches.py (run_all.sh's runner): each job in a forked process as `python SCRIPT ARGS` would run
    it, its output in its log; a bench that fails (a message exit, an exception, a status) does not stop the next,
    and the failures are named with the end of their logs."""
    from bench.run_benches import read_jobs, run_jobs

    scripts = {
        "reports": "import sys\nprint(__name__, sys.argv[1:], sys.path[0])\nprint('to stderr', file=sys.stderr)\n",
        "refuses": "import sys\nprint('a table row')\nsys.exit('refused: no such thing')\n",
        "raises": "raise ValueError('broken input')\n",
        "exits": "import sys\nsys.exit(3)\n",
        "after": "print('still run')\n",
    }
    jobs = tmp_path / "jobs"
    for name, code in scripts.items():
        (tmp_path / f"{name}.py").write_text(code)
        fields = [name, str(tmp_path / f"{name}.py"), *(["--flag", "two words"] if name == "reports" else [])]
        with jobs.open("ab") as handle:
            handle.write("".join(f"{field}\0" for field in [str(len(fields)), *fields]).encode())
    logs = tmp_path / "logs"
    logs.mkdir()
    assert read_jobs(jobs)[0] == ["reports", str(tmp_path / "reports.py"), "--flag", "two words"]
    assert run_jobs(read_jobs(jobs), logs) == ["refuses", "raises", "exits"]
    report = f"__main__ ['--flag', 'two words'] {tmp_path}"  # stdout to a file is block-buffered: it comes last
    assert sorted((logs / "reports.log").read_text().splitlines()) == sorted([report, "to stderr"])
    assert (logs / "after.log").read_text() == "still run\n"
    assert (logs / "refuses.log").read_text() == "a table row\nrefused: no such thing\n"  # the message ends the log
    progress = capsys.readouterr().err
    assert "[run_all] reports done in " in progress and "[run_all] after done in " in progress
    assert "[run_all] refuses FAILED (exit 1)" in progress and "refused: no such thing" in progress
    assert "[run_all] raises FAILED (exit 1)" in progress and "ValueError: broken input" in progress
    assert "[run_all] exits FAILED (exit 3)" in progress


@pytest.mark.slow
def test_a_quick_cpu_run_fills_every_row_of_the_table(tmp_path):
    out = tmp_path / "out"
    result = run_all("--device", "cpu", "--quick", out=out)
    assert result.returncode == 0, result.stderr[-3000:]
    table = (out / "table.md").read_text()
    assert table in result.stdout
    assert re.search(r"cpu: .*matmul peak GFLOP/s: fp32 [\d.]+ \(256²\), bf16 [\d.]+ \(256²\)", table)
    rows = table_rows(table)
    for bench, what, setting in EXPECTED_ROWS:
        matching = [row for row in rows if row[0] == bench and what in row[1] and row[2].startswith(setting)]
        assert len(matching) == 1, (bench, what, setting, table)
        assert float(matching[0][3]) > 0
    assert len(rows) == len(EXPECTED_ROWS) + 1  # and the int8 linear layer (CPU only)
    for row in rows:
        assert row[4] and float(row[3]) > 0, row
        if row[0] == "encoders":
            assert re.fullmatch(r"[\d.]+% of (fp32|bf16)", row[5]), row
    for name in ("machine", "encoders", "vlp_decoding", "tden_decoding", "detector", "training", "data", "dtypes"):
        figures = json.loads((out / "json" / f"{name}.json").read_text())
        assert figures["bench"] == name and figures["machine"]["device"] == "cpu"
