"""Every fenced code block of README.md and docs/**/*.md runs here, so no snippet can go stale.

The rules (docs/contributing-docs.md says them for writers):
- a ```python block runs; the python blocks of one page run in order in one namespace, in a temporary folder;
- a ```bash block runs with bash (`set -euo pipefail`), the environment's `bin` first on the PATH, in the same folder;
- ```text and ```console blocks are output and never run;
- a block whose preceding line is `<!-- snippet: skip (reason) -->` is not run (a real reason: a download, a GPU, an
  original checkout, or the demo itself, which a slow test runs);
- a page holding a block preceded by `<!-- snippet: slow (reason) -->` runs only with the slow tests;
- any other block (no language, another language) fails its page's test.

The temporary folder holds what the demo leaves in a clone (`runs/demo/uniter/...`, built once per session from a
few training steps by `demo_runs`) and the repository's scripts, so a snippet that works here works as written
after `bash scripts/demo.sh`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
RUN_LANGUAGES = ("python", "bash")
OUTPUT_LANGUAGES = ("text", "console")
_FENCE = re.compile(r"^(\s*)(```+)\s*([^\s`]*)\s*$")
_MARKER = re.compile(r"^<!--\s*snippet:\s*(skip|slow)\s*(?:\((.+)\))?\s*-->$")
# What the shared demo folders and the bash blocks see of the repository (symlinked into each page's folder).
REPOSITORY_ENTRIES = ("pretrain.py", "finetune.py", "configs", "scripts", "bench")


@dataclass
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    marker: str | None = None  # "skip" or "slow"
    reason: str | None = None


def markdown_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def fenced_blocks(path: Path, root: Path = ROOT) -> list[Block]:
    """The fenced blocks of a markdown file, with the snippet marker of the line before each (blank lines between
    them are allowed)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    page = str(path.relative_to(root))
    blocks, i = [], 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, language = match.groups()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence), None)
        if end is None:
            raise ValueError(f"{page}:{i + 1}: a code block opened with {fence} is never closed")
        body = [line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end]]
        previous = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = _MARKER.match(previous)
        block = Block(page, i + 1, language, "\n".join(body) + "\n")
        if marker:
            block.marker, block.reason = marker.group(1), marker.group(2)
        blocks.append(block)
        i = end + 1
    return blocks


def _page_params():
    params = []
    for path in markdown_pages():
        slow = any(b.marker == "slow" for b in fenced_blocks(path))
        page = str(path.relative_to(ROOT))
        params.append(pytest.param(path, id=page, marks=[pytest.mark.slow] if slow else []))
    return params


# ----------------------------------------------------------------------------------------------- the demo's folders
@pytest.fixture(scope="session")
def demo_runs(tmp_path_factory) -> Path:
    """`runs/demo/uniter/` as `bash scripts/demo.sh` leaves it (same folder names), from a few steps of each run
    through pretrain.py's and finetune.py's main functions (on the shapes world, with its region extractor)."""
    from tests.training_helpers import reset_accelerate_state
    from vlhub.training.cli import finetune_main, pretrain_main

    runs = tmp_path_factory.mktemp("snippets") / "runs"
    demo = runs / "demo" / "uniter"
    common = [
        "--seed",
        "0",
        "--logging_steps",
        "1",
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "16",
        "--max_eval_samples",
        "16",
    ]
    trainings = [
        (
            pretrain_main,
            [
                "--model_type",
                "uniter",
                "--config_name",
                "tiny",
                "--objectives",
                "itc:1,itm:1",
                "--output_dir",
                demo / "uniter-shapes",
            ],
        ),
        (finetune_main, ["--model_name_or_path", demo / "uniter-shapes", "--output_dir", demo / "uniter-shapes-vqa"]),
        (
            finetune_main,
            [
                "--task",
                "retrieval",
                "--model_name_or_path",
                demo / "uniter-shapes",
                "--output_dir",
                demo / "uniter-shapes-itr",
                "--num_sampled_negatives",
                "3",
                "--num_hard_negatives",
                "1",
                "--max_gallery_images",
                "8",
            ],
        ),
        (pretrain_main, ["--model_type", "unified_vlp", "--config_name", "tiny", "--output_dir", demo / "vlp-shapes"]),
        (
            finetune_main,
            [
                "--task",
                "captioning",
                "--model_name_or_path",
                demo / "vlp-shapes",
                "--output_dir",
                demo / "vlp-shapes-captioning",
                "--caption_metrics",
                "CIDEr",
            ],
        ),
    ]
    for main, arguments in trainings:
        reset_accelerate_state()
        main([str(a) for a in arguments] + common)
    reset_accelerate_state()
    return runs


@pytest.fixture
def page_folder(tmp_path, demo_runs, monkeypatch) -> Path:
    (tmp_path / "runs").symlink_to(demo_runs, target_is_directory=True)
    for name in REPOSITORY_ENTRIES:
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ------------------------------------------------------------------------------------------------------ the tests
def test_every_block_is_labelled():
    """A block that neither runs nor is output must not exist: an unlabelled one would never be checked."""
    bad = [
        f"{b.page}:{b.line} ```{b.language}"
        for path in markdown_pages()
        for b in fenced_blocks(path)
        if b.language not in RUN_LANGUAGES + OUTPUT_LANGUAGES
    ]
    assert not bad, (
        f"code blocks must be one of {RUN_LANGUAGES + OUTPUT_LANGUAGES} (or skipped with "
        f"`<!-- snippet: skip (reason) -->` and still labelled): {bad}"
    )
    unexplained = [
        f"{b.page}:{b.line}" for path in markdown_pages() for b in fenced_blocks(path) if b.marker and not b.reason
    ]
    assert not unexplained, f"a snippet marker needs a reason in parentheses: {unexplained}"


@pytest.mark.parametrize("path", _page_params())
def test_page_snippets_run(path, request):
    blocks = [b for b in fenced_blocks(path) if b.language in RUN_LANGUAGES and b.marker != "skip"]
    if not blocks:
        pytest.skip("no code block to run on this page")
    folder = request.getfixturevalue("page_folder")
    namespace = {"__name__": "__main__"}
    environment = dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    for block in blocks:
        where = f"{block.page}:{block.line}"
        if block.language == "python":
            exec(compile(block.code, where, "exec"), namespace)
        else:
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", block.code],
                cwd=folder,
                env=environment,
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert done.returncode == 0, (
                f"{where}: the bash block exited with {done.returncode}\n{block.code}\n"
                f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
            )


def test_readme_links_resolve():
    """mkdocs checks the links between pages of docs/; the README is outside the site, so its links are checked here
    (files, and headings of docs pages)."""
    import markdown  # mkdocs' own parser (the docs extra)

    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", (ROOT / "README.md").read_text(encoding="utf-8")):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        if not (ROOT / path).exists():
            broken.append(target)
        elif anchor:
            converter = markdown.Markdown(extensions=["toc"])
            converter.convert((ROOT / path).read_text(encoding="utf-8"))
            if anchor not in _anchors(converter.toc_tokens):
                broken.append(target)
    assert not broken, f"README.md links to missing files or headings: {broken}"


def _anchors(tokens) -> set[str]:
    return {t["id"] for t in tokens} | {a for t in tokens for a in _anchors(t["children"])}


def test_the_parser_reads_markers_languages_and_indentation(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# t\n\n```python\nx = 1\n```\n<!-- snippet: skip (needs a GPU) -->\n\n```bash\nnvidia-smi\n```\n"
        "- item\n\n  ```text\n  out\n  ```\n```\nbare\n```\n",
        encoding="utf-8",
    )
    blocks = fenced_blocks(page, root=tmp_path)
    assert [(b.language, b.marker, b.reason, b.code) for b in blocks] == [
        ("python", None, None, "x = 1\n"),
        ("bash", "skip", "needs a GPU", "nvidia-smi\n"),
        ("text", None, None, "out\n"),
        ("", None, None, "bare\n"),
    ]
