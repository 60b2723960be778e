"""The parity tests run on any fixture set of a release's format, not only on the public fixture's file names.

Each architecture's fixture is copied with its config and checkpoint files renamed (and the references to them in
the fixture's README and the original configs renamed alike), nothing else changed. The file finders
(`release_files`) find the renamed files; and (slow) the architecture's parity module, run on the copy through
$VLHUB_FIXTURES_DIR, passes. Names the original code itself fixes stay: Unified VLP's `bert_config.json` (read as
`<bert_model>/bert_config.json`) and X-modaler's dumped `config.yaml`.
"""

import os
import re
import shutil
from pathlib import Path
from xml.etree import ElementTree

import pytest

from . import release_files
from .conftest import fixtures_root
from .fresh_interpreter import run_module_status

ARCHITECTURES = ("uniter", "vl_bert", "vilbert", "unified_vlp", "tden")


def _renamed_vl_bert(original: Path) -> dict[Path, Path]:
    """Fine-tuned checkpoints follow their config's MODEL_PREFIX, the pre-trained one the configs' PARTIAL_PRETRAIN:
    both are renamed in the configs too (and the configs themselves)."""
    files = release_files.vl_bert_files(original)
    renames = {path: path.with_name(f"renamed_{task}.yaml") for task, path in files["configs"].items()}
    for task, checkpoint in files["checkpoints"].items():
        if task == "pretrain":
            renames[checkpoint] = checkpoint.with_name("renamed-prec.model")
        else:
            epoch = checkpoint.stem.rsplit("-", 1)[1]
            renames[checkpoint] = checkpoint.with_name(f"renamed_{task}_prefix-{epoch}.model")
    return renames


def _renamed(architecture: str, original: Path) -> dict[Path, Path]:
    """Old path → new path of every config and checkpoint file the original takes by name."""
    if architecture == "vl_bert":
        return _renamed_vl_bert(original)
    files = getattr(release_files, f"{architecture}_files")(original)
    if architecture == "tden":
        renames = {}
        for index, run in enumerate(files["runs"].values()):
            renames[run["checkpoint"]] = run["checkpoint"].with_name(f"model_{index + 1:07d}.pth")
            for yaml in run["checkpoint"].parent.glob("*.yaml"):  # the source config (config.yaml is X-modaler's dump)
                if yaml.name != "config.yaml":
                    renames[yaml] = yaml.with_name(f"renamed_{index}.yaml")
        return renames
    name = {"uniter": "model_step_{}.pt", "vilbert": "pytorch_model_{}.bin", "unified_vlp": "model.{}.bin"}[
        architecture
    ]
    renames = {path: path.with_name(name.format(index + 3)) for index, path in enumerate(files["checkpoints"].values())}
    if architecture != "unified_vlp":  # VLP's name is fixed by the original (`<bert_model>/bert_config.json`)
        renames[files["config"]] = files["config"].with_name(f"renamed_{architecture}_config.json")
    return renames


def renamed_copy(architecture: str, destination: Path) -> dict[str, str]:
    """Copy `$VLHUB_FIXTURES_DIR/<architecture>` to `destination/<architecture>` with its configs and checkpoints
    renamed, and every mention of their old names in README.md and the YAML configs replaced. Returns
    `{old relative path: new relative path}` (relative to the fixture folder)."""
    source = fixtures_root() / architecture
    copy = destination / architecture
    shutil.copytree(source, copy)
    renames = {
        old.relative_to(source).as_posix(): new.relative_to(source).as_posix()
        for old, new in _renamed(architecture, source / "original").items()
    }
    for old, new in renames.items():
        (copy / old).rename(copy / new)
    texts = [copy / "README.md", *(copy / "original").rglob("*.yaml")]
    for path in texts:
        text = path.read_text(encoding="utf-8")
        for old, new in renames.items():
            text = text.replace(old, new)  # README tables name files by their path in the fixture
            if path.suffix == ".yaml":  # configs name them by file name (PARTIAL_PRETRAIN) or prefix (MODEL_PREFIX)
                text = re.sub(rf"(?<=[/ ]){re.escape(Path(old).name)}\b", Path(new).name, text)
                if old.endswith(".model") and "-" in Path(old).stem:
                    prefix, new_prefix = Path(old).stem.rsplit("-", 1)[0], Path(new).stem.rsplit("-", 1)[0]
                    text = re.sub(
                        rf"^MODEL_PREFIX: {re.escape(prefix)}$", f"MODEL_PREFIX: {new_prefix}", text, flags=re.M
                    )
        path.write_text(text, encoding="utf-8")
    return renames


def _present(architecture):
    return pytest.mark.skipif(
        not (fixtures_root() / architecture / "original").is_dir(),
        reason=f"no {architecture} fixture at {fixtures_root() / architecture}",
    )


@pytest.mark.parametrize("architecture", [pytest.param(a, marks=_present(a)) for a in ARCHITECTURES])
def test_renamed_files_are_found_as_the_original_finds_them(tmp_path, architecture):
    renames = renamed_copy(architecture, tmp_path)
    assert renames and all(old != new for old, new in renames.items())
    copy = tmp_path / architecture
    assert not any((copy / old).exists() for old in renames)
    finder = getattr(release_files, f"{architecture}_files")
    original, renamed = finder(fixtures_root() / architecture / "original"), finder(copy / "original")
    relative = lambda files, root: {str(p.relative_to(root)) for p in release_files.paths_of(files)}  # noqa: E731
    expected = {renames.get(path, path) for path in relative(original, fixtures_root() / architecture)}
    assert relative(renamed, copy) == expected
    assert all(p.exists() for p in release_files.paths_of(renamed))


@pytest.fixture(scope="module")
def parity_runs_on_renamed_copies(tmp_path_factory) -> dict[str, dict[str, list[str]]]:
    """Every present architecture's fixture copied with its files renamed into one $VLHUB_FIXTURES_DIR, and the
    architectures' parity modules run on it in one pytest process (one interpreter start-up, not five). Returns
    {"runs": {architecture: {outcome: [test names]}}} from the run's JUnit report and the run's "output"."""
    root = tmp_path_factory.mktemp("renamed-fixtures")
    present = [a for a in ARCHITECTURES if (fixtures_root() / a / "original").is_dir()]
    for architecture in present:
        renamed_copy(architecture, root)
    report = root / "report.xml"
    modules = [str(Path(__file__).parent / f"test_{architecture}_parity.py") for architecture in present]
    env = {**os.environ, "VLHUB_FIXTURES_DIR": str(root), "HF_HUB_OFFLINE": "1"}
    # `python -m pytest` forked from tests/fresh_interpreter.py's server (torch imported once per test process, ~10 s
    # of a new interpreter's start-up saved); a fresh process all the same: it has imported nothing of vlhub or tests.
    returncode, stdout, stderr = run_module_status(
        "pytest", ["-q", "-p", "no:cacheprovider", f"--junitxml={report}", *modules], env, Path(__file__).parents[1]
    )
    runs = {a: {"passed": [], "failed": [], "skipped": []} for a in present}
    for testcase in ElementTree.parse(report).iter("testcase") if report.is_file() else ():
        module = re.search(r"test_(\w+?)_parity\b", testcase.get("classname", ""))
        outcome = "passed"
        if testcase.find("skipped") is not None:
            outcome = "skipped"
        elif testcase.find("failure") is not None or testcase.find("error") is not None:
            outcome = "failed"
        runs.setdefault(module.group(1) if module else "?", {"passed": [], "failed": [], "skipped": []})[
            outcome
        ].append(testcase.get("name"))
    return {"runs": runs, "output": f"exit status {returncode}\n{stdout[-4000:]}{stderr[-2000:]}"}


@pytest.mark.slow
@pytest.mark.parametrize("architecture", [pytest.param(a, marks=_present(a)) for a in ARCHITECTURES])
def test_parity_module_passes_on_the_renamed_fixture(parity_runs_on_renamed_copies, architecture):
    run = parity_runs_on_renamed_copies["runs"][architecture]
    output = parity_runs_on_renamed_copies["output"]
    assert run["passed"], f"no {architecture} parity test passed on the renamed copy\n{output}"
    assert not run["failed"] and not run["skipped"], f"{run}\n{output}"
    unattributed = parity_runs_on_renamed_copies["runs"].get("?")
    assert not unattributed, f"results outside the parity modules: {unattributed}\n{output}"
