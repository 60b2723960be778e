"""Pieces every original-checkpoint conversion shares: safe loading, a strict key report, provenance."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

__all__ = [
    "CheckpointError",
    "ConversionReport",
    "load_torch_state_dict",
    "sha256_of",
    "strip_prefix",
    "write_model_card",
]


class CheckpointError(ValueError):
    """The file is not a checkpoint of the kind the converter was asked to read."""


def sha256_of(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(chunk_size), b""):
            digest.update(chunk)
    return digest.hexdigest()


_WRAPPER_KEYS = ("model_state", "state_dict", "model")


def load_torch_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a `torch.save`d state dict without executing code (`weights_only=True`), on the CPU.

    Accepts a flat `{name: tensor}` dict or one wrapped under `model_state`/`state_dict`/`model`; strips the
    `module.` prefix of DistributedDataParallel; casts floating tensors (fp16 from apex O2 included) to float32.
    A missing, empty, truncated or non-checkpoint file raises `CheckpointError` naming the problem.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist or is not a file")
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {str(path)!r} is empty (0 bytes)")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for a damaged file (IndexError, EOFError, ...)
        raise CheckpointError(
            f"cannot read {str(path)!r} as a PyTorch checkpoint (truncated, corrupt, or not a torch.save file): {err}"
        ) from err
    if isinstance(data, dict):
        for key in _WRAPPER_KEYS:
            if key in data and isinstance(data[key], dict) and not isinstance(data[key], torch.Tensor):
                data = data[key]
                break
    if not isinstance(data, dict) or not data:
        raise CheckpointError(f"{str(path)!r} does not hold a state dict (got {type(data).__name__})")
    non_tensors = [k for k, v in data.items() if not isinstance(v, torch.Tensor)]
    if non_tensors:
        raise CheckpointError(f"{str(path)!r} is not a flat state dict: entries {non_tensors[:5]} are not tensors")
    state_dict = strip_prefix(data, "module.")
    return {k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in state_dict.items()}


def strip_prefix(state_dict: dict, prefix: str) -> dict:
    if all(k.startswith(prefix) for k in state_dict):
        return {k[len(prefix):]: v for k, v in state_dict.items()}
    return dict(state_dict)


@dataclass
class ConversionReport:
    """Where every source key went. Nothing is silently lost: each source key is `used` (target ← source) or
    `dropped` with a reason, and each target parameter is filled or listed as `initialized` (new, random)."""

    source: str
    used: dict[str, str] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    initialized: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def use(self, target: str, source: str):
        self.used[target] = source

    def drop(self, source: str, reason: str):
        self.dropped[source] = reason

    def initialize(self, target: str, reason: str):
        self.initialized[target] = reason

    def check_complete(self, source_keys) -> None:
        accounted = set(self.used.values()) | set(self.dropped)
        unaccounted = sorted(set(source_keys) - accounted)
        if unaccounted:
            raise CheckpointError(
                f"{len(unaccounted)} key(s) of {self.source!r} have no place in the target model: {unaccounted[:10]}"
            )

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "used": self.used,
            "dropped": self.dropped,
            "initialized": self.initialized,
            "notes": self.notes,
        }

    def save(self, path: str | os.PathLike):
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    def summary(self) -> str:
        lines = [f"{len(self.used)} tensors converted from {self.source}"]
        for key, reason in sorted(self.dropped.items()):
            lines.append(f"dropped {key}: {reason}")
        for key, reason in sorted(self.initialized.items()):
            lines.append(f"newly initialised {key}: {reason}")
        lines.extend(self.notes)
        return "\n".join(lines)


def write_model_card(
    output_dir: str | os.PathLike,
    *,
    title: str,
    architecture: str,
    source_file: str | os.PathLike,
    source_sha256: str,
    original_repository: str,
    original_commit: str,
    report: ConversionReport,
    pipeline_tag: str | None,
    usage: str,
    tags: list[str] | None = None,
) -> Path:
    """A Hub model card (README.md) recording where the weights came from and how they were converted."""
    from huggingface_hub import ModelCard, ModelCardData

    data = ModelCardData(
        library_name="transformers",
        pipeline_tag=pipeline_tag,
        tags=["vlhub", architecture, "region-features", *(tags or [])],
    )
    dropped = "\n".join(f"- `{k}`: {v}" for k, v in sorted(report.dropped.items())) or "- none"
    initialized = "\n".join(f"- `{k}`: {v}" for k, v in sorted(report.initialized.items())) or "- none"
    notes = "\n".join(f"- {n}" for n in report.notes) or "- none"
    content = f"""---
{data.to_yaml()}
---

# {title}

Converted with [vlhub](https://github.com/vlhub/vlhub) from the original release.

## Provenance

| | |
| --- | --- |
| source file | `{Path(source_file).name}` |
| source sha256 | `{source_sha256}` |
| original code | {original_repository} at commit `{original_commit}` |
| tensors converted | {len(report.used)} |

## Usage

```python
{usage.strip()}
```

## Conversion report

Source keys dropped:
{dropped}

Parameters newly initialised (not in the source):
{initialized}

Notes:
{notes}
"""
    path = Path(output_dir) / "README.md"
    ModelCard(content).save(path)
    return path
