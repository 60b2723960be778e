import json
import os
import tempfile
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# A private HF_HOME whose accelerate configuration is the repository's configs/accelerate/cpu_processes.yaml: on a
# machine without GPUs, the plain `accelerate launch --num_processes 2 ...` of the multi-process tests then starts two
# processes, exactly as the README tells users to configure accelerate.
if "VLHUB_TESTS_KEEP_HF_HOME" not in os.environ:
    _hf_home = Path(tempfile.mkdtemp(prefix="vlhub-tests-hf-home-"))
    (_hf_home / "accelerate").mkdir()
    _config = (Path(__file__).parents[1] / "configs" / "accelerate" / "cpu_processes.yaml").read_text()
    # Port 0: each launch's processes meet on a free port, so launches in parallel test processes never share one.
    (_hf_home / "accelerate" / "default_config.yaml").write_text(_config + "main_process_port: 0\n")
    os.environ["HF_HOME"] = str(_hf_home)
    # One cache of the shapes world and its region store for the whole run (`vlhub.training.data.shapes_world`):
    # made by the first process (pytest, or pytest-xdist's controller before it starts its workers, which inherit
    # the variable), so the world is drawn and its features extracted once per run, not once per worker. Its
    # processes take turns on it under a file lock.
    if "VLHUB_TESTS_CACHE" not in os.environ:
        os.environ["VLHUB_TESTS_CACHE"] = tempfile.mkdtemp(prefix="vlhub-tests-cache-")
    os.environ["VLHUB_CACHE"] = os.environ["VLHUB_TESTS_CACHE"]
# datasets caches prepared Parquet/Arrow files; keep the suite's out of the user's cache, one folder per test process
# (pytest-xdist's workers inherit the environment of the process that started them, this folder included).
if os.environ.get("HF_DATASETS_CACHE") in (None, os.environ.get("VLHUB_TESTS_DATASETS_CACHE")):
    os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="vlhub-tests-datasets-")
    os.environ["VLHUB_TESTS_DATASETS_CACHE"] = os.environ["HF_DATASETS_CACHE"]
# The cores are shared among pytest-xdist's workers (scripts/test.sh starts one per core).
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // _workers)))

TESTS = Path(__file__).parent


def fixtures_root() -> Path:
    """Parity fixtures live under $VLHUB_FIXTURES_DIR (default tests/fixtures), so other sets of the same layout
    (another seed, another tiny config) can be checked with the same tests."""
    return Path(os.environ.get("VLHUB_FIXTURES_DIR", TESTS / "fixtures"))


@pytest.fixture(scope="session")
def fixture_root() -> Path:
    return fixtures_root()


PARITY_TOLERANCE = 1e-4
# The files every architecture's parity fixture has (tests/fixtures/README.md describes the layout).
PARITY_FILES = ("raw_inputs.json", "raw_inputs.safetensors", "model_inputs.safetensors", "outputs.safetensors")


def parity_fixture_dir(name: str, label: str):
    """`(root, pytestmark)` of a parity test module: the fixture folder `$VLHUB_FIXTURES_DIR/<name>` and a mark that
    skips the module when the fixture is absent. With $VLHUB_FIXTURES_DIR set the fixtures were asked for, so nothing
    is skipped and a missing fixture fails (`ParityFixture` checks its files)."""
    root = fixtures_root() / name
    mark = pytest.mark.skipif(
        not (root / "raw_inputs.json").is_file() and not os.environ.get("VLHUB_FIXTURES_DIR"),
        reason=f"no {label} fixture at {root}",
    )
    return root, mark


class ReadTensors(dict):
    """A fixture's tensors by name, remembering which ones a test looked up (`read`), so a module can check that its
    comparisons reached every tensor the fixture holds."""

    def __init__(self, tensors):
        super().__init__(tensors)
        self.read: set[str] = set()

    def __getitem__(self, name):
        self.read.add(name)
        return super().__getitem__(name)

    def get(self, name, default=None):
        if name in self:
            return self[name]
        return default


class ParityFixture:
    """A parity fixture's common files, loaded: `raw` (raw_inputs.json), `raw_tensors`, `model_inputs`, `outputs`.
    Fails the test (never skips) when any of `PARITY_FILES` or the subclass's `needed` files is missing (names relative
    to the fixture folder, or absolute paths). `outputs` remembers which tensors the tests read (`unread_outputs`)."""

    label = "parity"

    def __init__(self, root: Path, work: Path, needed=()):
        from safetensors.torch import load_file

        missing = [name for name in PARITY_FILES if not (root / name).is_file()]
        missing += [name for name in needed if not (root / name).exists()]  # a file or a folder (a BERT model dir)
        if missing:
            pytest.fail(f"the {self.label} fixture at {root} lacks {missing}")
        self.root, self.work = root, work
        self.raw = json.loads((root / "raw_inputs.json").read_text())
        self.raw_tensors = load_file(root / "raw_inputs.safetensors")
        self.model_inputs = load_file(root / "model_inputs.safetensors")
        self.outputs = ReadTensors(load_file(root / "outputs.safetensors"))

    def unread_outputs(self) -> list[str]:
        """The tensors of outputs.safetensors no test has looked up (to compare it) so far."""
        return sorted(set(self.outputs) - self.outputs.read)


def assert_close(actual, expected, what: str = "", atol: float = PARITY_TOLERANCE):
    """Same shape and max |actual - expected| <= atol (empty tensors of the same shape agree)."""
    assert tuple(actual.shape) == tuple(expected.shape), (
        f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    )
    diff = (actual.detach().float() - expected.float()).abs().max().item() if expected.numel() else 0.0
    assert diff <= atol, f"{what}: max abs diff {diff:.3g} > {atol}"


def write_vocab(path: Path, size: int, special_tokens: dict[str, int]) -> Path:
    """A word-piece vocabulary of `size` entries with the special tokens at the given ids (placeholders elsewhere)."""
    vocab = [f"[unused{i}]" for i in range(size)]
    for token, index in special_tokens.items():
        vocab[index] = token
    path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def tiny_uniter_config():
    from vlhub import UniterConfig

    return UniterConfig(
        vocab_size=120,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        region_feature_dim=16,
        num_region_labels=11,
    )


@pytest.fixture
def tiny_vocab(tmp_path) -> Path:
    words = ["what", "colour", "is", "the", "cat", "dog", "a", "red", "blue", "on", "table", "?", "yes", "no"]
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(specials + words) + "\n", encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def float32_pipelines(monkeypatch):
    """Pipelines keep float32 models in float32 in every test, whatever this machine's bf16 speed: on a CPU where bf16
    is fast they would otherwise run a bf16 copy, and the tests comparing pipelines with float32 forwards would depend
    on the machine. `tests/test_pipeline_dtype.py` turns the choice back on where it is what is tested."""
    from vlhub.pipelines.visual_question_answering import ProcessorPipelineMixin

    monkeypatch.setattr(ProcessorPipelineMixin, "bf16_when_fast", False)


@pytest.fixture
def fresh_accelerate_state():
    """Reset accelerate's singletons after the test (modules that train use it for every test via
    `pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")`)."""
    yield
    from tests.training_helpers import reset_accelerate_state

    reset_accelerate_state()


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: multi-process or end-to-end runs; run with VLHUB_SLOW_TESTS=1 or -m slow")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("VLHUB_SLOW_TESTS") == "1" or "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow test: set VLHUB_SLOW_TESTS=1 (or pass -m slow) to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
