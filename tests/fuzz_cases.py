"""Hostile and unlucky inputs, one table (issue 25): what each should give, and a classifier of what it gives.

Every case names its category (processors, pipelines, converters, store readers, feature-file readers, images, CLI
arguments) and either the error it must raise (exception type, and a regular expression the message must match:
it names the input and the problem) or, for inputs that are fine, that it is accepted with a finite result.
Cases that once hung or killed the process run in a child process with a time limit.

`classify(case)` runs a case and says what happened, in the issue's words: "clear error", "correctly accepted",
"traceback" (another exception, or a message that does not name the input), "silent" (accepted where an error was
due, or a NaN/inf result), "hang" (past the time limit) or "crash" (killed by a signal). tests/test_fuzz_inputs.py
asserts every case is a clear error or correctly accepted; bench/fuzz_tally.py prints the tally per category.
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
import pickle
import re
import tempfile
import time
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from vlhub.processing.stores import FeatureFileError

REPOSITORY = Path(__file__).resolve().parent.parent
FIXTURES = Path(os.environ.get("VLHUB_FIXTURES_DIR", REPOSITORY / "tests" / "fixtures"))
CATEGORIES = (
    "processors",
    "pipelines",
    "converters",
    "store readers",
    "feature-file readers",
    "images",
    "CLI arguments",
)
OUTCOMES = ("clear error", "correctly accepted", "traceback", "silent", "hang", "crash")
# The cases run in a child took > 900 s (a hang) or died of SIGBUS before the fix; they take seconds on an idle core,
# but a minute or more when the suite's workers share busy cores, so the limit sits well between the two.
CHILD_TIMEOUT_S = float(os.environ.get("VLHUB_FUZZ_CHILD_TIMEOUT_S", 400))


@dataclass(frozen=True)
class Case:
    category: str
    name: str
    run: Callable[[], Any]
    error: type | None = None  # the exception expected; None: the input is fine and must be accepted
    match: str = ""  # a regular expression the message must match (searched)
    in_child: bool = False  # run in a child process with CHILD_TIMEOUT_S (cases that hung or crashed)

    @property
    def id(self) -> str:
        return f"{self.category}/{self.name}"


# --------------------------------------------------------------------------------------------- what happened
def _non_finite(result) -> bool:
    """Whether a result holds NaN or inf anywhere (tensors, arrays, floats, nested containers)."""
    if isinstance(result, torch.Tensor):
        return result.is_floating_point() and not bool(torch.isfinite(result).all())
    if isinstance(result, np.ndarray):
        return result.dtype.kind == "f" and not bool(np.isfinite(result).all())
    if isinstance(result, float):
        return not math.isfinite(result)
    if isinstance(result, dict) or hasattr(result, "items"):
        return any(_non_finite(v) for v in result.values())
    if isinstance(result, (list, tuple)):
        return any(_non_finite(v) for v in result)
    if hasattr(result, "features") and isinstance(getattr(result, "features"), torch.Tensor):
        return _non_finite(result.features)
    return False


def classify_here(case: Case) -> tuple[str, str]:
    """`(outcome, detail)` of running `case` in this process."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = case.run()
    except Exception as err:  # what the case raised is what is judged
        message = f"{type(err).__name__}: {err}"
        if case.error is not None and isinstance(err, case.error) and re.search(case.match, str(err), re.S):
            return "clear error", message
        return "traceback", message
    if case.error is not None:
        return "silent", f"accepted, expected {case.error.__name__} matching {case.match!r}: {str(result)[:200]}"
    if _non_finite(result):
        return "silent", f"NaN or inf in the result: {str(result)[:200]}"
    return "correctly accepted", str(result)[:200]


# What the child processes need, imported once by the fork server they are forked from (a fresh interpreter per case
# spent 10-25 s importing these); each case still runs in a process of its own. The server is forked from
# tests/fresh_interpreter.py's, which has imported torch and the third-party libraries already (a server of its own
# spent ~4 CPU-s more on the first case, importing them again).
CHILD_PRELOAD = ("tests.fuzz_cases", "vlhub.cli", "vlhub.data", "vlhub.processing.detector.image_io", "h5py", "lmdb")


def _classify_in_child(case_id: str, verdict: str) -> None:
    """A child's work (its stdout and stderr go to files, read back on a crash): its verdict, as JSON, to `verdict`."""
    os.chdir(REPOSITORY)
    outcome = classify_here(CASES[case_id])
    Path(verdict + ".part").write_text(json.dumps(outcome))
    os.replace(verdict + ".part", verdict)  # whole or absent


def classify(case: Case) -> tuple[str, str]:
    """`(outcome, detail)` of `case`, in a child process with a time limit when the case asks for one (forked from a
    server that has imported vlhub once)."""
    if not case.in_child:
        return classify_here(case)
    from tests.fresh_interpreter import PRELOAD, run_python_status

    with tempfile.TemporaryDirectory(prefix="vlhub-fuzz-child-") as folder:
        verdict = Path(folder, "verdict.json")
        code = f"from tests.fuzz_cases import _classify_in_child\n_classify_in_child({case.id!r}, {str(verdict)!r})\n"
        start = time.monotonic()
        exitcode, out, err = run_python_status(code, (*PRELOAD, *CHILD_PRELOAD), CHILD_TIMEOUT_S)
        elapsed = time.monotonic() - start
        if verdict.is_file():
            return tuple(json.loads(verdict.read_text()))
    log = out + err
    if exitcode == -9 and elapsed >= CHILD_TIMEOUT_S:  # killed by the server at the time limit
        return "hang", f"still running after {CHILD_TIMEOUT_S:g} s"
    if exitcode < 0 or exitcode >= 128:
        return "crash", f"exit code {exitcode}: {log[-300:]}"
    return "traceback", f"exit code {exitcode}: {log[-500:]}"


# --------------------------------------------------------------------------------------------- shared material
@functools.cache
def workdir() -> Path:
    """One temporary folder per process for the files the cases write (models, feature files, images)."""
    return Path(tempfile.mkdtemp(prefix="vlhub-fuzz-"))


@functools.cache
def tokenizer():
    from transformers import BertTokenizer

    words = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "a",
        "red",
        "blue",
        "circle",
        "square",
        "what",
        "is",
        "it",
        "?",
        "the",
        "colour",
    ]
    path = workdir() / "vocab.txt"
    path.write_text("\n".join(words) + "\n", encoding="utf-8")
    return BertTokenizer(vocab=str(path), do_lower_case=True)


FEATURE_DIM = 16


def regions(num: int = 4, features: torch.Tensor | None = None, seed: int = 0):
    import vlhub

    generator = torch.Generator().manual_seed(seed)
    xy = torch.rand(num, 2, generator=generator) * 20
    boxes = torch.cat([xy, xy + 5 + torch.rand(num, 2, generator=generator) * 10], dim=1)
    return vlhub.RegionFeatures(
        features=torch.rand(num, FEATURE_DIM, generator=generator) if features is None else features,
        boxes=boxes,
        image_size=(40, 40),
        scores=torch.linspace(1.0, 0.5, num),
        class_probs=torch.softmax(torch.rand(num, 1601, generator=generator), dim=-1),
    )


def big_regions(value: float, num: int = 4):
    features = torch.rand(num, FEATURE_DIM)
    features[1, 2] = value
    return regions(num, features)


@functools.cache
def processor(architecture: str):
    from vlhub.registry import get_architecture

    return get_architecture(architecture).build_processor(tokenizer(), FEATURE_DIM)


@functools.cache
def model_folder(architecture: str, task: str) -> Path:
    """A tiny random model of `architecture` for `task` ("vqa", "captioning", "retrieval"), saved with its processor."""
    from vlhub.registry import get_architecture
    from vlhub.training.pretraining import build_config

    spec = get_architecture(architecture)
    config = build_config(spec, spec.config_fields("tiny"), processor(architecture), regions())
    if task == "vqa":
        config.id2label, config.label2id = {0: "yes", 1: "no", 2: "red"}, {"yes": 0, "no": 1, "red": 2}
        if architecture == "tden":
            config.bidirectional_decoder = True
    if architecture == "unified_vlp":  # the tiny preset's 64 positions hold no text after VLP's region slots
        config.max_position_embeddings, config.num_regions = 160, 100
    torch.manual_seed(0)
    model = spec.resolve(spec.task_models[task])(config).eval()
    folder = workdir() / f"{architecture}-{task}"
    model.save_pretrained(folder)
    processor(architecture).for_task(task).save_pretrained(folder)
    return folder


PIPELINE_TASKS = {
    "vqa": "visual-question-answering",
    "captioning": "image-captioning",
    "retrieval": "image-text-retrieval",
}


@functools.cache
def pipe(architecture: str, task: str, dtype: str = "float32", nan_weights: bool = False):
    from transformers import pipeline

    built = pipeline(PIPELINE_TASKS[task], model=str(model_folder(architecture, task)))
    if dtype == "float16":
        built.model.half()
        built.processor.feature_extractor.float16_storage = False  # the model's own limit is what is tried
    if nan_weights:  # a model whose weights went NaN after loading (the converters refuse such files)
        with torch.no_grad():
            for name, parameter in built.model.named_parameters():
                if "LayerNorm.weight" in name:
                    parameter.fill_(float("nan"))
    return built


def ask(architecture: str, image, dtype: str = "float32", nan_weights: bool = False, **kwargs):
    return pipe(architecture, "vqa", dtype, nan_weights)(image=image, question="what colour is it ?", **kwargs)


def caption(architecture: str, image, dtype: str = "float32", nan_weights: bool = False):
    return pipe(architecture, "captioning", dtype, nan_weights)(image, max_new_tokens=3)


def rank(architecture: str, image, nan_weights: bool = False, **kwargs):
    return pipe(architecture, "retrieval", "float32", nan_weights)(
        image=image, texts=["a red circle", "a blue square"], **kwargs
    )


# --------------------------------------------------------------------------------------------- the cases
CASES: dict[str, Case] = {}


def case(
    category: str, name: str, run: Callable[[], Any], error: type | None = None, match: str = "", in_child: bool = False
) -> None:
    item = Case(category, name, run, error, match, in_child)
    assert item.id not in CASES, item.id
    CASES[item.id] = item


ARCHITECTURES = ("uniter", "vl_bert", "vilbert", "unified_vlp", "tden")

# processors: ids, texts, regions, arguments — for every architecture's processor
for arch in ARCHITECTURES:
    call = lambda arch=arch, **kw: processor(arch)(**kw)  # noqa: E731
    for name, ids, error, match in (
        ("float ids", [[1.5, 2.7]], TypeError, r"token_ids\[0\] must hold integer ids, got 1\.5"),
        ("float tensor ids", torch.tensor([5.0, 6.0]), TypeError, r"token_ids\[0\] must hold integer ids"),
        ("empty ids", [], ValueError, r"token_ids is empty"),
        ("empty row", [[5], []], ValueError, r"token_ids\[1\] is empty"),
        (
            "id past the vocabulary",
            [[5, 10**6]],
            ValueError,
            r"token_ids\[0\] holds id 1000000.*outside the vocabulary",
        ),
        ("negative id", [[-1, 5]], ValueError, r"token_ids\[0\] holds id -1.*outside"),
        ("string ids", "what", TypeError, r"token_ids must be a list"),
        ("None inside ids", [[5, None]], TypeError, r"token_ids\[0\] must hold integer ids"),
        ("ids mixed with rows", [5, [6]], ValueError, r"token_ids mixes ids and lists"),
        ("huge int id", [[5, 2**70]], ValueError, r"token_ids\[0\] holds id 1180591620717411303424 at position 1"),
    ):
        case(
            "processors",
            f"{arch}: {name}",
            lambda call=call, ids=ids: call(
                token_ids=ids,
                regions=[regions()] * (len(ids) if isinstance(ids, list) and ids and isinstance(ids[0], list) else 1),
            ),
            error,
            match,
        )
    case("processors", f"{arch}: valid ids", lambda call=call: call(token_ids=[[5, 6], [7]], regions=[regions()] * 2))
    case(
        "processors",
        f"{arch}: empty text",
        lambda call=call: call(text=["a red circle", "  "], regions=[regions()] * 2),
        ValueError,
        r"text\[1\] is empty",
    )
    case(
        "processors",
        f"{arch}: wrong feature size",
        lambda call=call: call(
            text="a red circle",
            regions=[regions()]
            + [
                __import__("vlhub").RegionFeatures(
                    features=torch.rand(3, 7), boxes=torch.tensor([[0.0, 0, 5, 5]] * 3), image_size=(40, 40)
                )
            ],
        ),
        ValueError,
        r"regions\[1\] has 7-d features",
    )
    case(
        "processors",
        f"{arch}: a dict for regions",
        lambda call=call: call(text="a red circle", regions=[{"a": 1}]),
        TypeError,
        r"regions\[0\] must be a vlhub.RegionFeatures",
    )
    case(
        "processors",
        f"{arch}: texts and images differ in number",
        lambda call=call: call(text=["a", "red", "circle"], regions=[regions(), regions()]),
        ValueError,
        r"got 3 texts but 2 images",
    )
    case(
        "processors",
        f"{arch}: unknown argument",
        lambda call=call: call(text="a", regions=[regions()], colour=3),
        TypeError,
        r"unexpected argument.*colour",
    )

# pipelines: top_k, magnitudes per dtype, NaN models, empty inputs
for value, error, match in (
    (1.7, TypeError, r"top_k must be a positive integer, got 1\.7"),
    ("abc", TypeError, r"top_k must be a positive integer, got 'abc'"),
    (0, ValueError, r"top_k must be a positive integer \(at least 1\), got 0"),
    (-2, ValueError, r"top_k must be a positive integer \(at least 1\), got -2"),
    (True, TypeError, r"top_k must be a positive integer, got True"),
    (np.int64(2), None, ""),
    (2, None, ""),
):
    case("pipelines", f"vqa top_k={value!r}", lambda value=value: ask("uniter", regions(), top_k=value), error, match)
case("pipelines", "retrieval top_k=0", lambda: rank("uniter", regions(), top_k=0), ValueError, r"top_k")
case("pipelines", "retrieval top_k=1.5", lambda: rank("uniter", regions(), top_k=1.5), TypeError, r"top_k")
for arch in ("vl_bert", "vilbert", "tden", "unified_vlp"):
    for value in (1e20, 1e30):
        case(
            "pipelines",
            f"{arch} vqa float32 features {value:g}",
            lambda arch=arch, value=value: ask(arch, big_regions(value)),
            ValueError,
            rf"image features hold {re.escape(f'{value:g}')}.*float32 takes region features up to",
        )
    case(
        "pipelines",
        f"{arch} vqa float16 features 1e5",
        lambda arch=arch: ask(arch, big_regions(1e5), "float16"),
        ValueError,
        r"image features hold 100000.*float16 takes region features up to",
    )
    case("pipelines", f"{arch} vqa float32 features 1e4 (fine)", lambda arch=arch: ask(arch, big_regions(1e4)))
    case(
        "pipelines",
        f"{arch} vqa with NaN weights",
        lambda arch=arch: ask(arch, regions(), nan_weights=True),
        ValueError,
        r"answer logits hold NaN or infinite",
    )
case(
    "pipelines",
    "uniter vqa float32 features 1e30 (float16 storage)",
    lambda: ask("uniter", big_regions(1e30)),
    ValueError,
    r"image: features hold 1e\+30.*float16 limit of 65504",
)
case(
    "pipelines",
    "uniter vqa float16 features 1e5",
    lambda: ask("uniter", big_regions(1e5), "float16"),
    ValueError,
    r"image features hold 100000.*float16",
)
for arch in ("tden", "unified_vlp"):
    case(
        "pipelines",
        f"{arch} captioning float32 features 1e30",
        lambda arch=arch: caption(arch, big_regions(1e30)),
        ValueError,
        r"image features hold 1e\+30",
    )
    case(
        "pipelines",
        f"{arch} captioning float16 features 1e5",
        lambda arch=arch: caption(arch, big_regions(1e5), "float16"),
        ValueError,
        r"image features hold 100000.*float16",
    )
    case(
        "pipelines",
        f"{arch} captioning with NaN weights",
        lambda arch=arch: caption(arch, regions(), nan_weights=True),
        ValueError,
        r"next-token scores hold NaN",
    )
    case("pipelines", f"{arch} captioning (fine)", lambda arch=arch: caption(arch, regions()))
case(
    "pipelines",
    "retrieval float32 features 1e30",
    lambda: rank("uniter", big_regions(1e30)),
    ValueError,
    r"image: features hold 1e\+30",
)
case(
    "pipelines",
    "retrieval with NaN weights",
    lambda: rank("uniter", regions(), nan_weights=True),
    ValueError,
    r"retrieval scores hold NaN",
)
case(
    "pipelines",
    "vqa empty question",
    lambda: pipe("uniter", "vqa")(image=regions(), question="   "),
    ValueError,
    r"question is empty",
)
case(
    "pipelines",
    "vqa question=None",
    lambda: pipe("uniter", "vqa")(image=regions(), question=None),
    ValueError,
    r"needs image= and question=",
)
case("pipelines", "vqa empty image list", lambda: pipe("uniter", "vqa")(image=[], question=["a"]), ValueError, r"empty")
case(
    "pipelines",
    "vqa a number as image",
    lambda: pipe("uniter", "vqa")(image=3, question="what ?"),
    ValueError,
    r"image is a int but this processor has no region extractor",
)
case("pipelines", "captioning empty list", lambda: pipe("tden", "captioning")([]), ValueError, r"empty list of images")
case(
    "pipelines",
    "captioning unknown argument",
    lambda: pipe("tden", "captioning")(regions(), colour=1),
    TypeError,
    r"unexpected argument.*colour",
)


# converters: non-finite weights (each named), damaged files
def _uniter_checkpoint(mutate) -> Path:
    state = torch.load(FIXTURES / "uniter" / "original" / "uniter-vqa.pt", map_location="cpu", weights_only=True)
    mutate(state)
    path = workdir() / f"uniter-{len(list(workdir().glob('uniter-*.pt')))}.pt"
    torch.save(state, path)
    return path


def _convert_uniter(checkpoint) -> Any:
    from vlhub.conversion import convert_uniter

    original = FIXTURES / "uniter" / "original"
    vocab = workdir() / "uniter-vocab.txt"
    size = json.loads((original / "config.json").read_text())["vocab_size"]
    names = [f"[unused{i}]" for i in range(size)]
    for token, index in {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}.items():
        names[index] = token
    vocab.write_text("\n".join(names) + "\n", encoding="utf-8")
    output = workdir() / f"converted-{Path(checkpoint).stem}"
    return convert_uniter(
        checkpoint,
        output,
        config=original / "config.json",
        task="vqa",
        tokenizer=vocab,
        answers=original / "ans2label.json",
    ).summary()


def _poison(key_part: str, value: float):
    def mutate(state):
        key = next(k for k in state if key_part in k)
        state[key] = state[key].clone()
        state[key].view(-1)[1] = value

    return mutate


def _detector(mutate=None) -> Any:
    from vlhub.conversion.detector import convert_detector

    source = FIXTURES / "detector_frcnn" / "original"
    folder = workdir() / f"detector-{len(list(workdir().glob('detector-*')))}"
    folder.mkdir()
    state = torch.load(source / "pytorch_model.bin", map_location="cpu", weights_only=True)
    if mutate is not None:
        mutate(state)
    torch.save(state, folder / "pytorch_model.bin")
    (folder / "config.yaml").write_bytes((source / "config.yaml").read_bytes())
    return convert_detector(folder / "pytorch_model.bin", folder / "out").summary()


for key_part, value in (
    ("vqa_output", float("nan")),
    ("img_embeddings.img_linear.weight", float("inf")),
    ("word_embeddings", float("-inf")),
):
    case(
        "converters",
        f"uniter {value} in {key_part}",
        lambda k=key_part, v=value: _convert_uniter(_uniter_checkpoint(_poison(k, v))),
        Exception,
        rf"tensor '[^']*{re.escape(key_part)}[^']*' holds 1 NaN or infinite",
    )
case("converters", "uniter (fine)", lambda: _convert_uniter(FIXTURES / "uniter" / "original" / "uniter-vqa.pt"))
case(
    "converters",
    "detector NaN in a weight",
    lambda: _detector(_poison("conv1", float("nan"))),
    Exception,
    r"tensor '[^']*conv1[^']*' holds 1 NaN or infinite",
)
case(
    "converters",
    "uniter truncated checkpoint",
    lambda: _convert_uniter(_write("cut.pt", (FIXTURES / "uniter" / "original" / "uniter-vqa.pt").read_bytes()[:4000])),
    Exception,
    r"cut\.pt.*truncated, corrupt",
)
case(
    "converters",
    "uniter empty checkpoint",
    lambda: _convert_uniter(_write("empty.pt", b"")),
    Exception,
    r"empty\.pt.*empty \(0 bytes\)",
)
case(
    "converters",
    "uniter text file as checkpoint",
    lambda: _convert_uniter(_write("text.pt", b"hello\n" * 50)),
    Exception,
    r"cannot read '.*text\.pt'",
)
case(
    "converters",
    "uniter missing checkpoint",
    lambda: _convert_uniter(workdir() / "nope.pt"),
    Exception,
    r"nope\.pt.*does not exist",
)


def _write(name: str, data: bytes) -> Path:
    path = workdir() / name
    path.write_bytes(data)
    return path


# store readers: LMDBs (truncated ones used to kill the process), vlhub stores
def _lmdb(name: str, entries: dict[bytes, bytes], cut: float | None = None) -> Path:
    import lmdb

    path = workdir() / name
    env = lmdb.open(str(path), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for key, value in entries.items():
            txn.put(key, value)
    env.close()
    if cut is not None:
        data = path / "data.mdb"
        os.truncate(data, int(data.stat().st_size * cut))
    return path


def _vilbert_entries(count: int = 40, payload=None) -> dict[bytes, bytes]:
    ids = [str(i).encode() for i in range(count)]
    entries = {b"keys": pickle.dumps(ids)}
    for i in ids:
        entries[i] = (
            payload
            if payload is not None
            else pickle.dumps(
                {
                    "image_id": i,
                    "image_w": 40,
                    "image_h": 40,
                    "num_boxes": 2,
                    "boxes": np.array([[0, 0, 5, 5], [1, 1, 9, 9]], np.float32),
                    "features": np.random.default_rng(0).random((2, 2048), dtype=np.float32),
                }
            )
        )
    return entries


def _uniter_entries(count: int = 40, npz: bytes | None = None) -> dict[bytes, bytes]:
    buffer = io.BytesIO()
    np.savez_compressed(
        buffer,
        features=np.random.default_rng(0).random((10, 2048)).astype(np.float16),
        norm_bb=np.tile(np.array([0.1, 0.1, 0.5, 0.5, 0.4, 0.4], np.float16), (10, 1)),
    )
    return {f"img{i}.npz".encode(): npz or buffer.getvalue() for i in range(count)}


def _read_all(reader) -> int:
    return sum(len(reader[image_id].features) for image_id in reader)


def _open(format: str, path, **options):
    from vlhub.processing.stores import open_feature_file

    return open_feature_file(format, path, **options)


class _HugeArray:
    """Pickles to `numpy.ndarray((2**36,), uint8)`: 64 GiB declared by a few bytes."""

    def __reduce__(self):
        return (np.ndarray, ((1 << 36,), np.dtype(np.uint8)))


for fmt, entries in (("vilbert-lmdb", _vilbert_entries), ("uniter-lmdb", _uniter_entries)):
    case(
        "store readers",
        f"{fmt} truncated to half",
        lambda f=fmt, e=entries: _read_all(_open(f, _lmdb(f"{f}-half", e(), 0.5))),
        FeatureFileError,
        r"the LMDB is truncated: its header counts",
        in_child=True,
    )
    case(
        "store readers",
        f"{fmt} truncated to 3 pages",
        lambda f=fmt, e=entries: _read_all(_open(f, _cut_to(_lmdb(f"{f}-3p", e()), 3 * 4096))),
        FeatureFileError,
        r"truncated|not a readable LMDB",
        in_child=True,
    )
    case(
        "store readers",
        f"{fmt} truncated inside its meta pages",
        lambda f=fmt, e=entries: _read_all(_open(f, _cut_to(_lmdb(f"{f}-1p", e()), 5000))),
        FeatureFileError,
        r"truncated|not a readable LMDB",
        in_child=True,
    )
    case(
        "store readers",
        f"{fmt} garbage file",
        lambda f=fmt: _open(f, _write(f"{f}.garbage", b"\x00\x01" * 9000)),
        FeatureFileError,
        r"garbage.*not a readable LMDB",
    )
    case(
        "store readers",
        f"{fmt} missing",
        lambda f=fmt: _open(f, workdir() / "no-such-lmdb"),
        FileNotFoundError,
        r"no LMDB at .*no-such-lmdb",
    )
    case("store readers", f"{fmt} (fine)", lambda f=fmt, e=entries: _read_all(_open(f, _lmdb(f"{f}-fine", e()))))
case(
    "store readers",
    "vilbert-lmdb entry pickling a 64 GiB array",
    lambda: _read_all(_open("vilbert-lmdb", _lmdb("vilbert-huge", _vilbert_entries(2, pickle.dumps(_HugeArray()))))),
    FeatureFileError,
    r"image 0.*declares an array of shape \(68719476736,\)",
    in_child=True,
)
case(
    "store readers",
    "uniter-lmdb npz declaring 16 GiB",
    lambda: _read_all(_open("uniter-lmdb", _lmdb("uniter-huge", _uniter_entries(2, _npz_bytes(shape=(1 << 32,)))))),
    FeatureFileError,
    r"img0\.npz.*member 'features.npy' declares an array",
    in_child=True,
)
case("store readers", "vlhub store missing", lambda: _open("vlhub", workdir() / "no-store"), Exception, r"no-store")
case(
    "store readers",
    "vlhub store empty folder",
    lambda: _open("vlhub", _mkdir("empty-store")),
    Exception,
    r"empty-store",
)


def _cut_to(path: Path, size: int) -> Path:
    os.truncate(path / "data.mdb", size)
    return path


def _mkdir(name: str) -> Path:
    path = workdir() / name
    path.mkdir(exist_ok=True)
    return path


# feature-file readers: npz, h5, tsv, VL-BERT json
def _npz_bytes(
    shape=(2, 2048), declared_extra: int = 0, dtype="<f4", data: bytes | None = None, boxes: bool = False
) -> bytes:
    """An npz whose `features.npy` header declares `shape` (the data written may be less)."""
    header = {"descr": dtype, "fortran_order": False, "shape": tuple(shape)}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        with archive.open("features.npy", "w") as member:
            np.lib.format.write_array_header_1_0(member, header)
            member.write(data if data is not None else b"\x00" * 64)
        if boxes:
            for name, value in (
                ("boxes", np.array([[0, 0, 5, 5], [1, 1, 9, 9]], np.float32)),
                ("image_h", np.array([40])),
                ("image_w", np.array([40])),
                ("num_boxes", np.array([2])),
            ):
                with archive.open(f"{name}.npy", "w") as member:
                    np.lib.format.write_array(member, value)
    return buffer.getvalue()


def _npz_folder(name: str, data: bytes) -> Path:
    folder = _mkdir(name)
    (folder / "1.npz").write_bytes(data)
    return folder


def _npz_read(name: str, data: bytes):
    return _open("npz", _npz_folder(name, data))["1"]


def _good_npz() -> bytes:
    buffer = io.BytesIO()
    np.savez(
        buffer,
        features=np.random.default_rng(0).random((2, 8), dtype=np.float32),
        boxes=np.array([[0, 0, 5, 5], [1, 1, 9, 9]], np.float32),
        image_h=[40],
        image_w=[40],
        num_boxes=[2],
    )
    return buffer.getvalue()


case(
    "feature-file readers",
    "npz declaring 16 GiB",
    lambda: _npz_read("npz-huge", _npz_bytes((1 << 32,), boxes=True)),
    FeatureFileError,
    r"1\.npz.*member 'features.npy' declares an array of shape \(4294967296,\)",
    in_child=True,
)
case(
    "feature-file readers",
    "npz declaring more than it holds",
    lambda: _npz_read("npz-short", _npz_bytes((2, 2048), boxes=True)),
    FeatureFileError,
    r"1\.npz.*declares 16384 bytes.*holds only 64",
)
case(
    "feature-file readers",
    "npz negative dimension",
    lambda: _npz_read("npz-neg", _npz_bytes((-2, 8), boxes=True)),
    FeatureFileError,
    r"1\.npz",
)
case(
    "feature-file readers",
    "npz object array",
    lambda: _npz_read("npz-object", _npz_bytes((2,), dtype="|O")),
    FeatureFileError,
    r"1\.npz.*object array.*without pickle",
)
case(
    "feature-file readers",
    "npz garbage member",
    lambda: _npz_read("npz-garbage", _zip({"features.npy": b"\x93NUMPYxx"})),
    FeatureFileError,
    r"1\.npz",
)
case(
    "feature-file readers",
    "npz not a zip",
    lambda: _npz_read("npz-text", b"not a zip at all" * 10),
    FeatureFileError,
    r"1\.npz.*not a readable npz",
)
case(
    "feature-file readers",
    "npz empty file",
    lambda: _npz_read("npz-empty", b""),
    FeatureFileError,
    r"1\.npz.*not a readable npz",
)
case(
    "feature-file readers",
    "npz truncated",
    lambda: _npz_read("npz-cut", _good_npz()[:300]),
    FeatureFileError,
    r"1\.npz",
)
case(
    "feature-file readers",
    "npz without boxes",
    lambda: _npz_read("npz-noboxes", _zip_arrays(features=np.zeros((2, 8), np.float32))),
    FeatureFileError,
    r"1\.npz.*missing field",
)
case("feature-file readers", "npz (fine)", lambda: _npz_read("npz-fine", _good_npz()))


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _zip_arrays(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _vlp(name: str, make_features) -> Any:
    import h5py

    folder = _mkdir(name)
    with h5py.File(folder / "bbox.h5", "w") as handle:
        handle["1"] = np.array([[0, 0, 10, 10, 1, 0.9], [2, 2, 20, 20, 2, 0.8]], np.float32)
    make_features(folder / "feat.h5")
    return _open("vlp-h5", folder / "feat.h5", boxes=folder / "bbox.h5", image_sizes={"1": (30, 30)})["1"]


def _h5(shape=None, data=None, cut: int = 0):
    def make(path):
        import h5py

        with h5py.File(path, "w") as handle:
            if data is not None:
                handle["1"] = data
            else:
                handle.create_dataset("1", shape=shape, dtype=np.float32)
        if cut:
            os.truncate(path, path.stat().st_size - cut)

    return make


case(
    "feature-file readers",
    "h5 declaring 16 GiB",
    lambda: _vlp("h5-huge", _h5(shape=(2, 1 << 31))),
    FeatureFileError,
    r"feat\.h5: dataset '1' declares an array of shape \(2, 2147483648\)",
    in_child=True,
)
case(
    "feature-file readers",
    "h5 never written",
    lambda: _vlp("h5-unwritten", _h5(shape=(2, 8))),
    FeatureFileError,
    r"feat\.h5: dataset '1' declares 64 bytes.*stores 0",
)
case(
    "feature-file readers",
    "h5 truncated",
    lambda: _vlp("h5-cut", _h5(data=np.ones((2, 512), np.float32), cut=2000)),
    FeatureFileError,
    r"feat\.h5.*(truncated|cannot be read)",
)
case(
    "feature-file readers",
    "h5 wrong rows",
    lambda: _vlp("h5-rows", _h5(data=np.ones((3, 8), np.float32))),
    FeatureFileError,
    r"features.*3 rows",
)
case(
    "feature-file readers",
    "h5 text file",
    lambda: _vlp("h5-text", lambda p: p.write_text("hello")),
    FeatureFileError,
    r"feat\.h5: not a readable HDF5",
)
case("feature-file readers", "h5 (fine)", lambda: _vlp("h5-fine", _h5(data=np.ones((2, 8), np.float32))))


def _tsv(name: str, line: str):
    path = workdir() / f"{name}.tsv"
    path.write_text(line + "\n", encoding="utf-8")
    return _open("butd-tsv", path)["1"]


def _b64(array) -> str:
    import base64

    return base64.b64encode(np.ascontiguousarray(array, dtype=np.float32).tobytes()).decode()


_BOXES = _b64([[0, 0, 5, 5], [1, 1, 9, 9]])
_FEATURES = _b64(np.ones((2, 8)))
case(
    "feature-file readers",
    "tsv too few columns",
    lambda: _tsv("tsv-cols", "1\t40\t40\t2"),
    FeatureFileError,
    r"tsv \(image 1\): line has 4 tab-separated columns",
)
case(
    "feature-file readers",
    "tsv bad base64",
    lambda: _tsv("tsv-b64", f"1\t40\t40\t2\t{_BOXES}\t@@@!"),
    FeatureFileError,
    r"tsv \(image 1\).*features",
)
case(
    "feature-file readers",
    "tsv zero boxes",
    lambda: _tsv("tsv-zero", f"1\t40\t40\t0\t{_BOXES}\t{_FEATURES}"),
    FeatureFileError,
    r"num_boxes is 0",
)
case(
    "feature-file readers",
    "tsv boxes not a multiple",
    lambda: _tsv("tsv-mult", f"1\t40\t40\t3\t{_BOXES}\t{_FEATURES}"),
    FeatureFileError,
    r"field 'boxes'.*not a multiple of num_boxes=3",
)
case(
    "feature-file readers",
    "tsv NaN feature",
    lambda: _tsv("tsv-nan", f"1\t40\t40\t2\t{_BOXES}\t{_b64(np.full((2, 8), np.nan))}"),
    FeatureFileError,
    r"tsv \(image 1\).*NaN",
)
case(
    "feature-file readers",
    "tsv non-numeric size",
    lambda: _tsv("tsv-size", f"1\tforty\t40\t2\t{_BOXES}\t{_FEATURES}"),
    Exception,
    r"tsv \(image 1\)",
)
case("feature-file readers", "tsv (fine)", lambda: _tsv("tsv-fine", f"1\t40\t40\t2\t{_BOXES}\t{_FEATURES}"))


def _vl_bert_json(name: str, text: str):
    folder = _mkdir(name)
    (folder / "1.json").write_text(text, encoding="utf-8")
    return _open("vl-bert-json", folder)["1"]


case(
    "feature-file readers",
    "vl-bert json not json",
    lambda: _vl_bert_json("json-bad", "{not json"),
    FeatureFileError,
    r"1\.json: not a readable json",
)
case(
    "feature-file readers",
    "vl-bert json a list",
    lambda: _vl_bert_json("json-list", "[1, 2]"),
    FeatureFileError,
    r"1\.json: expected a json object",
)
case(
    "feature-file readers",
    "vl-bert json without features",
    lambda: _vl_bert_json("json-nofeat", json.dumps({"image_w": 40, "image_h": 40, "num_boxes": 2, "boxes": _BOXES})),
    FeatureFileError,
    r"1\.json: missing field 'features'",
)
case(
    "feature-file readers",
    "vl-bert json (fine)",
    lambda: _vl_bert_json(
        "json-fine", json.dumps({"image_w": 40, "image_h": 40, "num_boxes": 2, "boxes": _BOXES, "features": _FEATURES})
    ),
)


# images: the shapes world's extractor and the detector's loader
def _shapes(image):
    from vlhub.data import ShapesRegionExtractor

    return ShapesRegionExtractor(feature_dim=8)(image)


def _png(name: str, make) -> Path:
    from PIL import Image

    path = workdir() / f"{name}.png"
    image = make(Image)
    image.save(path)
    return path


def _serpentine(Image):
    height, width = 510, 512
    mask = np.zeros((height, width), bool)
    for row in range(2, height - 4, 4):
        mask[row, 2 : width - 2] = True
        mask[row : row + 4, width - 3 if (row // 4) % 2 == 0 else 2] = True
    return Image.fromarray(np.where(mask[:, :, None], [200, 30, 30], [255, 255, 255]).astype(np.uint8))


def _load(image, **kwargs):
    from vlhub.processing.detector.image_io import load_rgb_image

    return load_rgb_image(image, "picture", **kwargs)


case("images", "shapes: 512x510 serpentine line", lambda: _shapes(_png("serpentine", _serpentine)), in_child=True)
case(
    "images",
    "shapes: 11000 px image",
    lambda: _shapes(_png("huge", lambda Image: Image.new("1", (11000, 11000)))),
    ValueError,
    r"images\[0\].*11000x11000 pixels is above the .*limit",
    in_child=True,
)
case(
    "images",
    "shapes: decompression bomb",
    lambda: _shapes(_png("bomb", lambda Image: Image.new("1", (20000, 20000)))),
    ValueError,
    r"images\[0\].*(cannot read the image|above the)",
    in_child=True,
)
case(
    "images",
    "shapes: huge array",
    lambda: _shapes(np.zeros((3000, 3000, 3), np.uint8)),
    ValueError,
    r"images\[0\]: 3000x3000 pixels is above",
)
case(
    "images",
    "shapes: huge tensor",
    lambda: _shapes(torch.zeros(3, 3000, 3000)),
    ValueError,
    r"images\[0\]: 3000x3000 pixels is above",
)
case(
    "images",
    "shapes: truncated png",
    lambda: _shapes(
        _write("cut.png", _png("whole", lambda Image: Image.new("RGB", (64, 64), (200, 10, 10))).read_bytes()[:60])
    ),
    ValueError,
    r"images\[0\].*cannot read the image",
)
case(
    "images",
    "shapes: text file",
    lambda: _shapes(_write("text.png", b"hello")),
    ValueError,
    r"images\[0\].*cannot read the image",
)
case(
    "images",
    "shapes: missing file",
    lambda: _shapes(workdir() / "missing.png"),
    FileNotFoundError,
    r"images\[0\].*no such image file",
)
case(
    "images",
    "shapes: float array",
    lambda: _shapes(np.zeros((8, 8, 3), np.float32)),
    ValueError,
    r"images\[0\] must be an \(height, width, 3\) uint8",
)
case("images", "shapes: 4-d tensor", lambda: _shapes(torch.zeros(1, 3, 8, 8)), ValueError, r"images\[0\] as a tensor")
case("images", "shapes: a number", lambda: _shapes(3), TypeError, r"images\[0\] must be an image path")
case(
    "images",
    "shapes: noise picture",
    lambda: _shapes(np.random.default_rng(0).integers(0, 256, (256, 256, 3)).astype(np.uint8)),
)
case(
    "images",
    "shapes: plain picture",
    lambda: _shapes(_png("plain", lambda Image: Image.new("RGB", (64, 64), (250, 250, 250)))),
    ValueError,
    r"image 0 has no regions",
)
case(
    "images",
    "detector: decompression bomb",
    lambda: _load(_png("bomb2", lambda Image: Image.new("1", (20000, 20000)))),
    ValueError,
    r"picture.*(cannot read the image|above the limit)",
    in_child=True,
)
case(
    "images",
    "detector: too small",
    lambda: _load(np.zeros((8, 8, 3), np.uint8)),
    ValueError,
    r"picture: 8x8 pixels is too small",
)
case(
    "images",
    "detector: float array",
    lambda: _load(np.zeros((32, 32, 3), np.float32)),
    ValueError,
    r"picture: numpy images must be uint8",
)
case(
    "images",
    "detector: 16-bit out of range",
    lambda: _load(np.full((32, 32), 70000, np.int32)),
    ValueError,
    r"picture: numpy images must be uint8",
)


# CLI arguments: one line per user error, an exit status
def _cli_line(*argv):
    """Run the CLI; a failure must be an exit status and one line on stderr (argparse: its usage, then one error
    line), raised here as a `ValueError` of that line so a case can match it; a traceback is a `RuntimeError`."""
    import contextlib

    from vlhub.cli import main

    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            status = main([str(a) for a in argv])
        except SystemExit as exit_:  # argparse
            status = exit_.code
    if status == 0:
        return status
    text = stderr.getvalue()
    lines = [line for line in text.splitlines() if "error" in line]  # not argparse's usage nor progress bars
    if "Traceback" in text or len(lines) != 1:
        raise RuntimeError(f"exit status {status} with {len(lines)} lines on stderr: {text[-500:]}")
    raise ValueError(lines[0])


for fmt, entries in (("uniter-lmdb", _uniter_entries), ("vilbert-lmdb", _vilbert_entries)):
    case(
        "CLI arguments",
        f"import-features {fmt} truncated",
        lambda f=fmt, e=entries: _cli_line(
            "import-features", _lmdb(f"cli-{f}", e(), 0.5), "--format", f, "--output", workdir() / f"out-{f}"
        ),
        ValueError,
        r"the LMDB is truncated",
        in_child=True,
    )
case(
    "CLI arguments",
    "import-features unknown format",
    lambda: _cli_line("import-features", workdir(), "--format", "nope", "--output", workdir() / "o"),
    ValueError,
    r"invalid choice: 'nope'",
)
case(
    "CLI arguments",
    "import-features missing source",
    lambda: _cli_line(
        "import-features", workdir() / "missing.tsv", "--format", "butd-tsv", "--output", workdir() / "o2"
    ),
    ValueError,
    r"missing\.tsv",
)
case(
    "CLI arguments",
    "import-features npz declaring 16 GiB",
    lambda: _cli_line(
        "import-features",
        _npz_folder("cli-npz", _npz_bytes((1 << 32,), boxes=True)),
        "--format",
        "npz",
        "--output",
        workdir() / "o3",
    ),
    ValueError,
    r"1\.npz.*declares an array",
    in_child=True,
)
case(
    "CLI arguments",
    "import-features shard size 0",
    lambda: _cli_line(
        "import-features",
        _npz_folder("cli-npz0", _good_npz()),
        "--format",
        "npz",
        "--output",
        workdir() / "o4",
        "--shard-size",
        "0",
    ),
    ValueError,
    r"shard",
)
case(
    "CLI arguments",
    "import-features shard size 'x'",
    lambda: _cli_line(
        "import-features", workdir(), "--format", "npz", "--output", workdir() / "o5", "--shard-size", "x"
    ),
    ValueError,
    r"--shard-size: invalid int value: 'x'",
)
case(
    "CLI arguments",
    "convert uniter missing checkpoint",
    lambda: _cli_line("convert", "uniter", workdir() / "missing.pt", "--output-dir", workdir() / "o6"),
    ValueError,
    r"missing\.pt",
)
case("CLI arguments", "unknown command", lambda: _cli_line("frobnicate"), ValueError, r"invalid choice: 'frobnicate'")
case(
    "CLI arguments",
    "import-features (fine)",
    lambda: _cli_line(
        "import-features", _npz_folder("cli-fine", _good_npz()), "--format", "npz", "--output", workdir() / "o7"
    ),
)


def tally(outcomes: dict[str, str]) -> dict[str, dict[str, int]]:
    """Counts per category and outcome (`outcomes`: case id → outcome)."""
    counts = {category: dict.fromkeys(OUTCOMES, 0) for category in CATEGORIES}
    for case_id, outcome in outcomes.items():
        counts[CASES[case_id].category][outcome] += 1
    return counts
