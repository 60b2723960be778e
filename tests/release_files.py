"""Where a release's files are in a parity fixture's `original/` folder, found the way the original code finds them
(never by the public fixture's own file names), so the parity, conversion and pipeline tests run on any fixture set
of the release's format ($VLHUB_FIXTURES_DIR).

- A name the original code fixes is used as such: Unified VLP's `<bert_model>/bert_config.json` and `vocab.txt`,
  UNITER's `ans2label.json`, X-modaler's dumped `config.yaml`, VL-BERT's `answers_vqa.txt` (the basename of
  `DATASET.ANSWER_VOCAB_FILE`).
- A name the original takes from its command line (a checkpoint, a `--config_file`) is found by the release's file
  kind (a glob) and told apart by what the file holds: a checkpoint's head keys, a JSON config's BERT fields.
- A name the original's config refers to is read from that config: VL-BERT's fine-tuned checkpoints are
  `<MODEL_PREFIX>-<epoch>.model`, its pre-trained one the basename of `NETWORK.PARTIAL_PRETRAIN`, its BERT folder the
  basename of `NETWORK.BERT_MODEL_NAME`.

Each finder fails the test (never skips) with what it looked for when the folder does not hold exactly one match.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch


def _one(found, what: str, where: Path) -> Path:
    found = sorted(found)
    if len(found) != 1:
        pytest.fail(f"expected one {what} in {where}, found {[str(p.relative_to(where)) for p in found] or 'none'}")
    return found[0]


def _keys(checkpoint: Path) -> set[str]:
    data = torch.load(checkpoint, map_location="cpu", weights_only=True)
    for wrapper in ("state_dict", "model"):  # VL-BERT's {"state_dict": ...}, X-modaler's {"model": ...}
        if isinstance(data.get(wrapper), dict):
            data = data[wrapper]
    return {key.removeprefix("module.") for key in data}


def _by_kind(checkpoints, kind_of, where: Path) -> dict[str, Path]:
    """`{kind: checkpoint}`, each checkpoint's kind told by `kind_of(its keys)`; two of one kind fail."""
    found: dict[str, Path] = {}
    for path in sorted(checkpoints):
        kind = kind_of(_keys(path))
        if kind in found:
            pytest.fail(f"two {kind} checkpoints in {where}: {found[kind].name} and {path.name}")
        found[kind] = path
    return found


def _has(keys, *prefixes) -> bool:
    return any(key.startswith(prefixes) for key in keys)


# -- UNITER (ChenRocks/UNITER): `--model_config <json>`, `--checkpoint <pt>` ------------------------------------------
def uniter_files(original: Path) -> dict:
    """`config` (the BERT-style JSON `--model_config`), `checkpoints` by fixture role ("pretrain": UniterForPretraining,
    "vqa", "itm": image-text retrieval, "re": referring expressions), `answers` (`ans2label.json`)."""

    def role(keys):
        for prefix, name in (("vqa_output.", "vqa"), ("rank_output.", "itm"), ("re_output.", "re")):
            if _has(keys, prefix):
                return name
        return "pretrain"

    configs = [p for p in original.glob("*.json") if "hidden_size" in json.loads(p.read_text(encoding="utf-8"))]
    return {
        "config": _one(configs, "model config (*.json with hidden_size)", original),
        "checkpoints": _by_kind(original.glob("*.pt"), role, original),
        "answers": original / "ans2label.json",
    }


# -- ViLBERT (jiasenlu/vilbert_beta, facebookresearch/vilbert-multi-task): `--config_file`, `--from_pretrained` -------
def vilbert_files(original: Path) -> dict:
    """`config` (the one `BertConfig` JSON both repos read) and `checkpoints` by fixture role ("pretrain":
    BertForMultiModalPreTraining, "beta_vqa": the beta VILBertForVLTasks, "mt": the 12-in-1 model with task tokens)."""

    def role(keys):
        if "bert.embeddings.task_embeddings.weight" in keys:
            return "mt"
        return "beta_vqa" if _has(keys, "vil_prediction.") else "pretrain"

    return {
        "config": _one(original.glob("*.json"), "BertConfig JSON (--config_file)", original),
        "checkpoints": _by_kind(original.rglob("*.bin"), role, original),
    }


# -- Unified VLP (LuoweiZhou/VLP): `--bert_model <dir>` (bert_config.json, vocab.txt), `--model_recover_path` -------
def unified_vlp_files(original: Path) -> dict:
    """`config` and `vocab` (the names `from_pretrained(<dir>)` reads), `checkpoints` by role ("img2txt", "vqa2": the
    one with `ans_classifier`)."""
    role = lambda keys: "vqa2" if _has(keys, "ans_classifier.") else "img2txt"  # noqa: E731
    return {
        "config": original / "bert_config.json",
        "vocab": original / "vocab.txt",
        "checkpoints": _by_kind(original.rglob("*.bin"), role, original),
    }


# -- VL-BERT (jackroos/VL-BERT): `--cfg cfgs/<task>/<yaml>`, checkpoints named by the yaml --------------------------
def _yaml(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text(encoding="utf-8"))


def vl_bert_files(original: Path) -> dict:
    """`configs` by task folder of `cfgs/` ("pretrain", "vqa", "refcoco"), `checkpoints` by the same names
    (fine-tuned: `<MODEL_PREFIX>-<epoch>.model`; "pretrain": the fine-tune configs' `PARTIAL_PRETRAIN`), `bert` (the
    folder `BERT_MODEL_NAME` names) and `answers` (`ANSWER_VOCAB_FILE`'s name)."""
    configs = {
        task.name: _one(task.glob("*.yaml"), f"YAML under cfgs/{task.name}", original)
        for task in sorted((original / "cfgs").iterdir())
        if task.is_dir()
    }
    read = {task: _yaml(path) for task, path in configs.items()}
    checkpoints = {
        task: _one(
            original.glob(f"{cfg['MODEL_PREFIX']}-*.model"),
            f"{cfg['MODEL_PREFIX']}-<epoch>.model (MODEL_PREFIX of {configs[task].name})",
            original,
        )
        for task, cfg in read.items()
        if task != "pretrain"
    }
    pretrained = {
        Path(cfg["NETWORK"]["PARTIAL_PRETRAIN"]).name for cfg in read.values() if cfg["NETWORK"].get("PARTIAL_PRETRAIN")
    }
    if len(pretrained) != 1:
        pytest.fail(f"the fine-tune configs in {original}/cfgs name {sorted(pretrained)} as PARTIAL_PRETRAIN, not one")
    checkpoints["pretrain"] = original / pretrained.pop()
    bert = {Path(cfg["NETWORK"]["BERT_MODEL_NAME"]).name for cfg in read.values()}
    datasets = [
        d for cfg in read.values() for d in (cfg["DATASET"] if isinstance(cfg["DATASET"], list) else [cfg["DATASET"]])
    ]  # pre-training lists several
    answers = {Path(d["ANSWER_VOCAB_FILE"]).name for d in datasets if d.get("ANSWER_VOCAB_FILE")}
    return {
        "configs": configs,
        "checkpoints": checkpoints,
        "bert": original / _one_name(bert, "BERT_MODEL_NAME"),
        "answers": original / _one_name(answers, "ANSWER_VOCAB_FILE"),
    }


def _one_name(names: set[str], field: str) -> str:
    if len(names) != 1:
        pytest.fail(f"the VL-BERT configs name {sorted(names)} as {field}, not one")
    return next(iter(names))


# -- TDEN (YehLi/xmodaler): a run folder per task, X-modaler's dumped `config.yaml` and its checkpoint ---------------
def tden_files(original: Path) -> dict:
    """`{task folder name: {"checkpoint": its one *.pth, "config": config.yaml}}` for every folder of `original/`
    holding a checkpoint, and `vocab` (`MODEL.PRETRAINING.MODEL_NAME`, `vocab.txt`)."""
    runs = {}
    for folder in sorted(p for p in original.iterdir() if p.is_dir() and any(p.glob("*.pth"))):
        runs[folder.name] = {
            "checkpoint": _one(folder.glob("*.pth"), "checkpoint (*.pth)", folder),
            "config": folder / "config.yaml",
        }
    return {"runs": runs, "vocab": original / "vocab.txt"}


def paths_of(files: dict) -> list[Path]:
    """Every path in a finder's answer (for `ParityFixture`'s check that they exist)."""
    paths = []
    for value in files.values():
        if isinstance(value, dict):
            paths += paths_of(value)
        elif isinstance(value, Path):
            paths.append(value)
    return paths
