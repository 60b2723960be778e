r"""Pieces every original-checkpoint conversion shares: safe loading, strict key accounting, provenance.

An architecture's converter writes only what is specific to its release (how to read its config, its key map and
its special cases); the generic core does the rest. A minimal converter for a made-up architecture whose original
checkpoint has `net.*` keys, a tied `out.weight` and an auxiliary head the converted model does not keep:

    from vlhub.conversion.common import ConversionReport, KeyMap, Provenance, convert_state_dict, save_converted
    from vlhub.conversion.common import load_torch_state_dict

    def convert_tiny(checkpoint, output_dir):
        source = load_torch_state_dict(checkpoint)               # {original key: tensor}, fp32, no code executed
        model = TinyModel(TinyConfig(hidden_size=source["net.embed.weight"].shape[1]))
        report = ConversionReport(source=Path(checkpoint).name)
        key_map = KeyMap(
            renames=[(r"^net\.", "tiny.")],                       # regex → replacement, applied in order
            drops={r"^aux_head\.": "auxiliary loss head, used only in training"},
            ties={"out.weight": "tiny.embed.weight"},            # must be identical; dropped, re-tied on load
        )
        convert_state_dict(source, model, key_map, report)        # strict: unknown key / wrong shape → CheckpointError
        save_converted(output_dir, model, report, provenance=Provenance(checkpoint, "https://github.com/o/tiny", "abc123"),
                       title="Tiny converted", architecture="tiny")
        return report

and its command line (`vlhub convert tiny CHECKPOINT --output-dir DIR`):

    from vlhub.conversion.registry import register_converter

    def add_arguments(parser):
        parser.add_argument("checkpoint")
        parser.add_argument("--output-dir", required=True)

    register_converter("tiny", lambda args: convert_tiny(args.checkpoint, args.output_dir), add_arguments)
"""

import inspect
import json
import os
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ..utils.choices import check_choice
from ..utils.files import sha256_file, staging_folder
from ..utils.tensors import all_finite

if TYPE_CHECKING:  # annotations only: importing transformers here would slow `vlhub convert --help`
    import argparse
    import logging
    from collections.abc import Callable
    from contextlib import AbstractContextManager

    from transformers import PreTrainedConfig, PreTrainedModel, PreTrainedTokenizerBase, ProcessorMixin

    from .reported import CardResults

__all__ = [
    "CheckpointError",
    "check_finite_weights",
    "converted_folder",
    "ConversionReport",
    "KeyMap",
    "Provenance",
    "convert_state_dict",
    "load_torch_state_dict",
    "save_converted",
    "sha256_of",
    "strip_prefix",
    "write_model_card",
    "load_bert_tokenizer",
    "vlhub_usage",
    "load_checked_tokenizer",
    "check_task",
    "read_json_config",
    "find_answer_file",
    "set_answer_labels",
    "read_answer_vocabulary",
    "answer_labels",
    "save_converted_model",
    "OriginalRelease",
    "OriginalConversion",
    "converter_command_line",
    "add_source_arguments",
    "call_with_arguments",
    "load_renamed_state_dict",
    "BERT_ATTENTION_HEADS",
    "PIPELINE_TAGS",
    "inferred_attention_heads",
    "bert_sizes",
    "layer_count",
    "sizes_over_config",
    "looks_like",
]

# The Hub pipeline tag of a converted model, by task (tasks without a transformers pipeline have none).
PIPELINE_TAGS = {"vqa": "visual-question-answering", "gqa": "visual-question-answering", "captioning": "image-to-text"}
# The attention heads of the BERT sizes the originals were built on (base, large), for checkpoints converted
# without their config.
BERT_ATTENTION_HEADS = {768: 12, 1024: 16}


class CheckpointError(ValueError):
    """The file is not a checkpoint of the kind the converter was asked to read."""


def inferred_attention_heads(
    size: int,
    notes: list[str],
    config_name: str,
    heads_field: str = "num_attention_heads",
    size_field: str = "hidden size",
    known: Mapping[int, int] = BERT_ATTENTION_HEADS,
) -> int:
    """The number of attention heads of a layer of width `size` when the original config is not given: from `known`
    (width → heads), with a note in `notes`; a width it does not know is a `CheckpointError` asking for the
    original config (`config_name`, e.g. "the original YAML")."""
    if size not in known:
        raise CheckpointError(
            f"cannot infer {heads_field} (the number of attention heads) for {size_field} {size}; pass "
            f"{config_name} (--config)"
        )
    notes.append(f"{heads_field}={known[size]} inferred from {size_field} {size}")
    return known[size]


def bert_sizes(state_dict: Mapping[str, torch.Tensor], embeddings: str, layers: str) -> dict[str, int]:
    """The BERT text sizes of an original checkpoint, read from its tables: `vocab_size`, `hidden_size`,
    `max_position_embeddings`, `type_vocab_size` (the `{embeddings}word_embeddings` / `position_embeddings` /
    `token_type_embeddings` weights), `num_hidden_layers` and `intermediate_size` (the layers `{layers}N.`)."""
    word = state_dict[f"{embeddings}word_embeddings.weight"]
    num_layers = layer_count(state_dict, layers)
    if not num_layers:
        raise CheckpointError(f"the checkpoint has no encoder layers ({layers}N.*)")
    return {
        "vocab_size": word.shape[0],
        "hidden_size": word.shape[1],
        "max_position_embeddings": state_dict[f"{embeddings}position_embeddings.weight"].shape[0],
        "type_vocab_size": state_dict[f"{embeddings}token_type_embeddings.weight"].shape[0],
        "num_hidden_layers": num_layers,
        "intermediate_size": state_dict[f"{layers}0.intermediate.dense.weight"].shape[0],
    }


def layer_count(state_dict: Mapping[str, torch.Tensor], prefix: str) -> int:
    """How many numbered modules `{prefix}N.` a state dict holds: 1 + the largest N, 0 when it has none."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    indices = {int(match.group(1)) for key in state_dict if (match := pattern.match(key))}
    return 1 + max(indices) if indices else 0


def sizes_over_config(
    original_config: Mapping | None,
    sizes: Mapping[str, int],
    notes: list[str],
    config_name: str | None,
    enlarged: Collection[str] = (),
) -> dict:
    """The original config's fields (`original_config`, may be None) with the `sizes` read from the checkpoint: a
    size the config states differently is a `CheckpointError`, but for the `enlarged` tables (the original enlarges
    them after reading its config), taken from the checkpoint with a note in `notes`; `num_attention_heads`, when
    the config does not give it, inferred from the hidden size (`inferred_attention_heads`; `config_name` names the
    config to pass instead; None: the caller infers the heads itself)."""
    fields = dict(original_config or {})
    for name, value in sizes.items():
        if name in fields and fields[name] != value:
            if name not in enlarged:
                raise CheckpointError(f"the config says {name}={fields[name]} but the checkpoint has {value}")
            notes.append(f"{name} taken from the checkpoint ({value}) instead of the config ({fields[name]})")
        fields[name] = value
    if config_name is not None and "num_attention_heads" not in fields:
        fields["num_attention_heads"] = inferred_attention_heads(sizes["hidden_size"], notes, config_name)
    return fields


def looks_like(state_dict: Mapping[str, torch.Tensor], hints: Mapping[str, Sequence[str]]) -> str:
    """What a state dict that is not the converter's looks like, for its error message: the first name of `hints`
    (name → substrings of keys that give it away) whose substring a key holds, else "unknown"."""
    for name, needles in hints.items():
        if any(needle in key for key in state_dict for needle in needles):
            return name
    return "unknown"


sha256_of = sha256_file  # the source file's digest in the provenance (one implementation: vlhub.utils.files)


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
        refused = _refused_global(path, err)
        if refused is not None:
            raise CheckpointError(
                f"refusing to load {refused} from {str(path)!r}: the checkpoint's pickle references it, and only "
                "tensors and plain containers are loaded (weights_only=True) because unpickling anything else can run "
                "arbitrary code. Re-save the state dict from a trusted environment (torch.save(model.state_dict()))"
            ) from err
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


def _refused_global(path: Path, err: Exception) -> str | None:
    """The global a weights-only `torch.load` refused, when `path` holds a complete pickle that names it (an unsafe
    file); None for every other failure. A legacy (non-zip) file cut inside a pickled global name also fails as an
    "unsupported global" (the cut name), so the pickle is first checked to be complete."""
    import io
    import pickle
    import pickletools
    import zipfile

    match = re.search(r"GLOBAL (\S+)", str(err)) if isinstance(err, pickle.UnpicklingError) else None
    if match is None:
        return None

    def complete(stream, count: int) -> bool:
        try:
            for _ in range(count):
                for _ in pickletools.genops(stream):
                    pass
        except Exception:  # an incomplete or malformed pickle: damage, reported as such
            return False
        return True

    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                pickles = [n for n in archive.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
                if len(pickles) != 1 or not complete(io.BytesIO(archive.read(pickles[0])), 1):
                    return None
        except (OSError, zipfile.BadZipFile):
            return None
    else:
        with open(path, "rb") as stream:  # torch's legacy format: magic number, protocol, system info, the object
            if not complete(stream, 4):
                return None
    return match.group(1)


def strip_prefix(state_dict: dict, prefix: str) -> dict:
    if all(k.startswith(prefix) for k in state_dict):
        return {k[len(prefix) :]: v for k, v in state_dict.items()}
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

    def use(self, target: str, source: str) -> None:
        self.used[target] = source

    def drop(self, source: str, reason: str) -> None:
        self.dropped[source] = reason

    def initialize(self, target: str, reason: str) -> None:
        self.initialized[target] = reason

    def check_complete(self, source_keys: Iterable[str]) -> None:
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

    def save(self, path: str | os.PathLike) -> None:
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
    reported: "CardResults | None" = None,
) -> Path:
    """A Hub model card (README.md) recording where the weights came from and how they were converted, and, with
    `reported` (a `reported.CardResults`), what the original authors published for the release and task: as
    unverified `model-index` results and a table naming each figure's source."""
    from huggingface_hub import ModelCard, ModelCardData

    from .reported import eval_results

    rows = reported.rows if reported is not None else []
    data = ModelCardData(
        library_name="transformers",
        pipeline_tag=pipeline_tag,
        tags=["vlhub", architecture, "region-features", *(tags or [])],
        model_name=title if rows else None,
        eval_results=eval_results(rows) or None,
    )
    reported_text = f"\n{reported.section()}" if reported is not None else ""
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
{reported_text}
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


@dataclass(frozen=True)
class KeyMap:
    """How the keys of an original checkpoint become the keys of a vlhub model.

    Args:
        renames: `(regex, replacement)` pairs applied in order with `re.sub` to every source key.
        drops: `{regex: reason}`: a renamed key matching a regex (`re.search`, first match wins) is dropped and the
            reason recorded. Use it for every source parameter the target model does not own.
        ties: `{target key: target key of its source}`: copies the target model re-ties on load (in addition to the
            model's `_tied_weights_keys`); they must be identical to their source and are dropped.
    """

    renames: Sequence[tuple[str, str]] = ()
    drops: Mapping[str, str] = field(default_factory=dict)
    ties: Mapping[str, str] = field(default_factory=dict)

    def rename(self, key: str) -> str:
        for pattern, replacement in self.renames:
            key = re.sub(pattern, replacement, key)
        return key

    def drop_reason(self, target_key: str) -> str | None:
        for pattern, reason in self.drops.items():
            if re.search(pattern, target_key):
                return reason
        return None

    def rename_all(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, tuple[str, torch.Tensor]]:
        """`{target key: (source key, tensor)}`; two source keys renamed to one target key are an error."""
        renamed: dict[str, tuple[str, torch.Tensor]] = {}
        for key, value in state_dict.items():
            target = self.rename(key)
            if target in renamed:
                raise CheckpointError(f"source keys {renamed[target][0]!r} and {key!r} both map to {target!r}")
            renamed[target] = (key, value)
        return renamed


def convert_state_dict(
    source_state_dict: Mapping[str, torch.Tensor],
    model: torch.nn.Module,
    key_map: KeyMap,
    report: ConversionReport,
    derived: Mapping[str, tuple[torch.Tensor, str]] | None = None,
) -> dict[str, torch.Tensor]:
    """Load an original state dict into `model` through `key_map`, accounting for every key in `report`.

    Every source key is used (`report.used[target] = source`) or dropped with a reason: by `key_map.drops`, or as a
    tied copy (checked identical to its source, re-tied on load). A key that maps to nothing in the model, or to a
    tensor of another shape, raises `CheckpointError` naming it. `derived` adds target tensors computed from the
    source, `{target key: (tensor, description of where it came from)}`. Target parameters nothing filled are listed
    in `report.initialized` (they keep the model's fresh initialisation). Returns the loaded `{target: tensor}`.
    """
    targets = model.state_dict()
    ties = {**(model._tied_weights_keys or {}), **key_map.ties}
    renamed = key_map.rename_all(source_state_dict)
    mapped: dict[str, torch.Tensor] = {}
    model_name = type(model).__name__
    for target, (source_key, value) in renamed.items():
        reason = key_map.drop_reason(target)
        if reason is not None:
            report.drop(source_key, reason)
            continue
        if target in ties:
            tied_to = ties[target]
            if tied_to not in renamed:
                raise CheckpointError(
                    f"{report.source}: {source_key!r} is a tied copy of {tied_to!r}, which is missing"
                )
            original = renamed[tied_to][1]
            if value.shape != original.shape or not torch.equal(value, original):
                raise CheckpointError(
                    f"{report.source}: {source_key!r} should be tied to {tied_to!r} (identical) but "
                    + (f"has shape {tuple(value.shape)}" if value.shape != original.shape else "differs in value")
                )
            report.drop(source_key, f"tied to {tied_to} (identical values); re-tied on load")
            continue
        if target not in targets:
            raise CheckpointError(f"{report.source}: key {source_key!r} has no counterpart in {model_name}")
        _check_shape(report, source_key, value, targets[target], model_name)
        mapped[target] = value
        report.use(target, source_key)
    for target, (value, description) in (derived or {}).items():
        if target not in targets:
            raise CheckpointError(f"derived tensor {target!r} ({description}) has no counterpart in {model_name}")
        _check_shape(report, description, value, targets[target], model_name)
        mapped[target] = value
        report.use(target, description)

    check_finite_weights(mapped, report.source, report.used)
    result = model.load_state_dict(mapped, strict=False)
    if result.unexpected_keys:
        raise CheckpointError(f"unexpected keys while loading into {model_name}: {result.unexpected_keys}")
    for key in result.missing_keys:
        if key not in ties:
            report.initialize(key, "not in the source checkpoint")
    report.check_complete(source_state_dict.keys())
    model.tie_weights()
    return mapped


def check_finite_weights(
    weights: Mapping[str, torch.Tensor], source: str, names: Mapping[str, str] | None = None
) -> None:
    """Refuse weights holding NaN or infinity (a damaged or diverged checkpoint would convert into a model whose every
    output is NaN): a `CheckpointError` naming `source`, the tensor (by its source name from `names`, target key ->
    source key, when given) and how many values are not finite."""
    for key, value in weights.items():
        if value.is_floating_point() and not all_finite(value):
            count = int((~torch.isfinite(value)).sum())
            name = (names or {}).get(key, key)
            raise CheckpointError(
                f"{source}: tensor {name!r} holds {count} NaN or infinite value(s) of {value.numel()}; a converted "
                "model would answer NaN. The checkpoint is damaged or the run it comes from diverged"
            )


def _check_shape(report: ConversionReport, source: str, value: torch.Tensor, target: torch.Tensor, model_name: str):
    if tuple(value.shape) != tuple(target.shape):
        raise CheckpointError(
            f"{report.source}: {source!r} has shape {tuple(value.shape)}, {model_name} expects {tuple(target.shape)}"
        )


@dataclass(frozen=True)
class Provenance:
    """Where converted weights came from: the original file and the code release that wrote it."""

    source_file: str | os.PathLike
    original_repository: str
    original_commit: str

    @property
    def source_sha256(self) -> str:
        return sha256_of(self.source_file)

    def card_fields(self) -> dict[str, Any]:
        """The provenance as `write_model_card`'s keyword arguments: the dataclass's fields and `source_sha256`."""
        return {**asdict(self), "source_sha256": self.source_sha256}


def save_converted(
    output_dir: str | os.PathLike,
    model: "PreTrainedModel",
    report: ConversionReport,
    *,
    provenance: Provenance,
    title: str,
    architecture: str,
    processor: "ProcessorMixin | None" = None,
    pipeline_tag: str | None = None,
    usage: str | None = None,
    tags: list[str] | None = None,
    reported: "CardResults | None" = None,
) -> Path:
    """Write a converted model: `save_pretrained` (safetensors + config), the processor (if any),
    `conversion_report.json` and a model card (README.md) with the provenance and the authors' `reported` figures
    (`write_model_card`). Returns the folder."""
    output_dir = Path(output_dir)
    if usage is None:
        cls, folder = type(model), output_dir.name
        usage = f'from {cls.__module__} import {cls.__name__}\nmodel = {cls.__name__}.from_pretrained("{folder}")'
        if processor is not None:
            usage += f'\nfrom transformers import AutoProcessor\nprocessor = AutoProcessor.from_pretrained("{folder}")'
    with converted_folder(output_dir) as staging:
        model.save_pretrained(staging)
        if processor is not None:
            processor.save_pretrained(staging)
        report.save(staging / "conversion_report.json")
        write_model_card(
            staging,
            title=title,
            architecture=architecture,
            **provenance.card_fields(),
            report=report,
            pipeline_tag=pipeline_tag,
            usage=usage,
            tags=tags,
            reported=reported,
        )
    return output_dir


def converted_folder(output_dir: str | os.PathLike) -> "AbstractContextManager[Path]":
    """Write a converted folder completely before it appears: a context manager giving a staging folder whose files
    move into `output_dir` only when the block succeeds (a failure leaves `output_dir` as it was). Unrelated files
    already in `output_dir` are kept; an existing, different README.md is kept as README.md.orig."""
    return staging_folder(output_dir, keep_replaced=("README.md",))


def load_bert_tokenizer(
    tokenizer: "PreTrainedTokenizerBase | str | os.PathLike", do_lower_case: bool, original_name: str
) -> "PreTrainedTokenizerBase":
    """A word-piece tokenizer for a converted folder's processor: an already built tokenizer, a bare `vocab.txt`, or a
    name/folder for `AutoTokenizer`, with the original's casing. `original_name` (e.g. "bert-base-cased") goes into the
    error message when it cannot be loaded (offline, the user must point at a local folder or vocab.txt)."""
    from transformers import AutoTokenizer, BertTokenizer, PreTrainedTokenizerBase

    if isinstance(tokenizer, PreTrainedTokenizerBase):
        return tokenizer
    name = str(tokenizer)
    try:
        if os.path.isfile(name):  # a bare vocab.txt
            return BertTokenizer(vocab=name, do_lower_case=do_lower_case)
        return AutoTokenizer.from_pretrained(name, do_lower_case=do_lower_case)
    except (OSError, ValueError) as err:
        raise OSError(
            f"could not load the tokenizer {name!r} ({err}). The original uses {original_name}; offline, pass "
            "--tokenizer with a local folder or vocab.txt"
        ) from err


def vlhub_usage(model_class: type, output_dir: str | os.PathLike) -> str:
    """The model card's usage snippet for a converted folder: the model class from `vlhub` (importing vlhub
    registers the architecture with transformers) and the processor from `AutoProcessor`."""
    folder = Path(output_dir).name
    return (
        f"import vlhub\nfrom transformers import AutoProcessor\n"
        f'model = vlhub.{model_class.__name__}.from_pretrained("{folder}")\n'
        f'processor = AutoProcessor.from_pretrained("{folder}")'
    )


def load_checked_tokenizer(
    tokenizer: "PreTrainedTokenizerBase | str | os.PathLike", vocab_size: int, do_lower_case: bool, original_name: str
) -> "PreTrainedTokenizerBase":
    """`load_bert_tokenizer`, refusing a tokenizer with more tokens than the model has word embeddings (its extra ids
    would index past the embedding table). A folder holding only a `vocab.txt` (the originals' BERT_MODEL_NAME
    folders) is read as that vocab.txt."""
    if isinstance(tokenizer, (str, os.PathLike)):
        folder = Path(tokenizer)
        if (folder / "vocab.txt").is_file() and not any(
            (folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")
        ):
            tokenizer = folder / "vocab.txt"
    tok = load_bert_tokenizer(tokenizer, do_lower_case=do_lower_case, original_name=original_name)
    if len(tok) > vocab_size:
        raise ValueError(f"the tokenizer has {len(tok)} tokens but the model only {vocab_size} word embeddings")
    return tok


def check_task(task: str, tasks: Collection[str]) -> str:
    """`task` if it is one of `tasks`, else a ValueError listing them."""
    return check_choice(task, sorted(tasks), "task")


def read_json_config(config: Mapping[str, Any] | str | os.PathLike | None) -> dict | None:
    """An original JSON config given as a dict (copied) or a path; None stays None."""
    if config is None:
        return None
    if isinstance(config, Mapping):
        return dict(config)
    return json.loads(Path(config).read_text(encoding="utf-8"))


def find_answer_file(
    checkpoint: Path, answers: str | os.PathLike | None, beside: Sequence[str], levels: int = 2
) -> Path | None:
    """The answer-vocabulary file: `answers` when given (FileNotFoundError if it is missing), else the first of the
    file names `beside` found in the checkpoint's folder (and, with `levels=2`, its parent); None when there is none."""
    if answers:
        path = Path(answers)
        if not path.is_file():
            raise FileNotFoundError(f"answer vocabulary {str(answers)!r} not found")
        return path
    for folder in (checkpoint.parent, checkpoint.parent.parent)[:levels]:
        for name in beside:
            if (folder / name).is_file():
                return folder / name
    return None


def read_answer_vocabulary(answers: str | os.PathLike | Sequence[str] | Mapping[str, int]) -> list[str]:
    """The answers of a VQA head in the order of its output rows, from any form the originals write them in: a file of
    one answer a line, a JSON file or a pickle (read without running code, `.pkl`) holding a list (label2ans) or an
    `{answer: index}` dict (ans2label), or such a list or dict itself. A dict whose indices are not 0..N-1, or
    anything else, is a `CheckpointError`; a missing file a FileNotFoundError."""
    source = "the answer vocabulary"
    data: Any = answers
    if isinstance(answers, (str, os.PathLike)):
        path = Path(answers)
        if not path.is_file():
            raise FileNotFoundError(f"answer vocabulary {str(answers)!r} not found")
        source = path.name
        if path.suffix == ".pkl":
            from ..utils.safe_pickle import safe_loads

            data = safe_loads(path.read_bytes())
        elif path.suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
        else:
            data = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if isinstance(data, Mapping):
        if sorted(data.values()) != list(range(len(data))):
            raise CheckpointError(f"{source}: an {{answer: index}} dict must map its answers to the indices 0..N-1")
        data = [answer for answer, _ in sorted(data.items(), key=lambda item: item[1])]
    if not isinstance(data, (list, tuple)) or not all(isinstance(answer, str) for answer in data):
        raise CheckpointError(f"{source} is not an answer list (label2ans) or an {{answer: index}} dict (ans2label)")
    return list(data)


def answer_labels(answers: str | os.PathLike | Sequence[str] | Mapping[str, int], num_answers: int | None) -> list[str]:
    """`read_answer_vocabulary(answers)`, refused with a `CheckpointError` unless it has `num_answers` answers (the
    rows of the checkpoint's answer head; None: a new head, any number)."""
    labels = read_answer_vocabulary(answers)
    if num_answers is not None and len(labels) != num_answers:
        raise CheckpointError(
            f"the answer vocabulary has {len(labels)} entries but the head predicts {num_answers} answers"
        )
    return labels


def set_answer_labels(config: "PreTrainedConfig", labels: Sequence[str]) -> None:
    """`config.id2label` / `label2id` from the answer list (index = the head's output row)."""
    config.id2label = dict(enumerate(labels))
    config.label2id = {label: index for index, label in enumerate(labels)}


def save_converted_model(
    output_dir: str | os.PathLike,
    model: "PreTrainedModel",
    report: ConversionReport,
    *,
    usage: str | None = None,
    logger: "logging.Logger | None" = None,
    **settings: Any,
) -> ConversionReport:
    """`save_converted` (`settings`: its other keyword arguments) with the usage snippet of a model exported by vlhub
    (`vlhub.<Class>.from_pretrained` and `AutoProcessor`) unless `usage` is given; logs the report's summary. Returns
    the report."""
    output_dir = Path(output_dir)
    if usage is None:
        usage = vlhub_usage(type(model), output_dir)
    save_converted(output_dir, model, report, usage=usage, **settings)
    if logger is not None:
        logger.info(report.summary())
    return report


@dataclass(frozen=True)
class OriginalRelease:
    """The original code an architecture's converter reads the checkpoints of, and what every converter records the
    same way when it saves a converted task head (`save`).

    Attributes:
        architecture: the architecture's `registry.Architecture` (its `name` titles the model card, its
            `model_type` tags it, its `original_repository` is the provenance's unless `repository` is given).
        commit: the commit of the original code that wrote the checkpoints.
        reported_results: the authors' published figures (`reported_results.REPORTED_RESULTS`).
        logger: the converter's logger; the conversion report's summary goes to it.
        repository: the original code's repository, where it is not the architecture's (ViLBERT's 12-in-1 release).

    The original's BERT vocabulary (`original_tokenizer`) follows the architecture's declared `lowercase`.
    """

    architecture: Any
    commit: str
    reported_results: Sequence = ()
    logger: Any = None
    repository: str | None = None

    @property
    def original_tokenizer(self) -> str:
        """The BERT vocabulary the original was trained with: bert-base-uncased or bert-base-cased."""
        return "bert-base-uncased" if self.architecture.lowercase else "bert-base-cased"

    @property
    def default_tokenizer(self) -> str:
        """The Hub tokenizer a converter builds its processor from unless told otherwise: the original's vocabulary."""
        return f"google-bert/{self.original_tokenizer}"

    @property
    def original_repository(self) -> str:
        """The original code's repository: `repository`, else the architecture's."""
        return self.repository or self.architecture.original_repository

    def load_tokenizer(
        self, tokenizer: "PreTrainedTokenizerBase | str | os.PathLike", vocab_size: int
    ) -> "PreTrainedTokenizerBase":
        """`load_checked_tokenizer` with the original's casing: the converted processor's word pieces."""
        return load_checked_tokenizer(
            tokenizer, vocab_size, do_lower_case=self.architecture.lowercase, original_name=self.original_tokenizer
        )

    def save(
        self,
        output_dir: str | os.PathLike,
        model: "PreTrainedModel",
        report: ConversionReport,
        checkpoint: Path,
        task: str,
        *,
        processor: "ProcessorMixin | None",
        reported_task: str | None = None,
        reported: "CardResults | None" = None,
        title_suffix: str = "",
        usage: str | None = None,
    ) -> ConversionReport:
        """`save_converted_model` for the `task` head converted from `checkpoint`: the title "<name> (<task>)
        converted from <file><title_suffix>", the provenance, the task's Hub pipeline tag and, unless `reported`
        (a `CardResults`) is given, the figures the authors reported for `reported_task` (default: `task`) with a
        model of this size (`size_release`). Returns the report."""
        from .reported import CardResults, size_release

        if reported is None:
            release = size_release(model.config.hidden_size)
            reported = CardResults(self.reported_results, release, reported_task or task)
        return save_converted_model(
            output_dir,
            model,
            report,
            processor=processor,
            provenance=Provenance(checkpoint, self.original_repository, self.commit),
            title=f"{self.architecture.name} ({task}) converted from {checkpoint.name}{title_suffix}",
            architecture=self.architecture.model_type,
            pipeline_tag=PIPELINE_TAGS.get(task),
            usage=usage,
            logger=self.logger,
            reported=reported,
        )


_CONVERTER_RETURNS = "Returns the `ConversionReport` (also saved as `conversion_report.json`)."


class OriginalConversion:
    """One conversion of an original checkpoint into a vlhub folder, in the steps every architecture's converter takes
    (`run`): read the checkpoint (`load`) and the original config (`read_config`), tell which task saved it
    (`detect`), settle the task (`default_task`, `check_task`, then `check`), build the model config (`model_config`,
    with `bert_fields`) and the conversion report, set the head's settings (`configure`, with `set_answer_file_labels`
    or `set_given_answer_labels`), build the head (`model_class`), load the weights through the key map (`key_map`,
    `derived`, `convert_state_dict`), finish the model (`finish`), build the processor (`processor`) and save it all
    with the release's provenance (`OriginalRelease.save`, with `save_settings`).

    An architecture subclasses it with its `release` and `tasks` (default: the architecture's declared heads) and,
    for the default `load`, the `renames`, `required` keys and `other_checkpoints` hints of `load_renamed_state_dict`;
    it overrides the steps that are its own, and makes its public `convert_<model_type>` and the
    `vlhub convert <model_type>` command line with `public_functions`. The subclass's docstring documents
    `convert_<model_type>`.

    Attributes (one conversion's state): the arguments as given (`checkpoint` as a `Path`, `options`: the extra ones
    the architecture declares in `extra_parameters`), then, as the steps run, `raw` (the state dict as saved),
    `state_dict` (renamed: what the config is read from), `original_config` (`read_config`'s), `detected` and `task`.
    """

    release: ClassVar[OriginalRelease]
    tasks: ClassVar[Mapping[str, Any]]  # default: the architecture's declared heads (`Architecture.task_heads`)
    renames: ClassVar[Sequence[tuple[str, str]]] = ()
    required: ClassVar[Sequence[str]] = ()
    other_checkpoints: ClassVar[Mapping[str, Sequence[str]] | None] = None
    # Parameters of `convert_<model_type>` after the common ones (one with a common name replaces it).
    extra_parameters: ClassVar[Sequence[inspect.Parameter]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "tasks" not in vars(cls) and "release" in vars(cls):
            cls.tasks = cls.release.architecture.task_heads()

    def __init__(
        self,
        checkpoint: str | os.PathLike,
        output_dir: str | os.PathLike,
        config: str | os.PathLike | dict | None = None,
        task: str | None = None,
        tokenizer: "PreTrainedTokenizerBase | str | os.PathLike | None" = None,
        answers: str | os.PathLike | None = None,
        **options: Any,
    ) -> None:
        self.checkpoint = Path(checkpoint)
        self.output_dir = output_dir
        self.config = config
        self.task = task
        self.tokenizer = self.release.default_tokenizer if tokenizer is None else tokenizer
        self.answers = answers
        self.options = options

    def run(self) -> ConversionReport:
        """Convert: every step in order. Returns the `ConversionReport` (also saved as `conversion_report.json`)."""
        self.raw, self.state_dict = self.load()
        self.original_config = self.read_config()
        self.detected = self.detect()
        self.task = check_task(self.task or self.default_task(), self.tasks)
        self.check()
        model_config, notes = self.model_config()
        report = ConversionReport(source=self.checkpoint.name, notes=notes)
        self.configure(model_config, report)
        model = self.model_class()(model_config)
        derived = self.derived(model, report)
        convert_state_dict(self.source_weights(), model, self.key_map(model_config), report, derived=derived)
        self.finish(model, report)
        processor = self.processor(model_config, report)
        settings = self.save_settings(model, report)
        return self.release.save(
            self.output_dir, model, report, self.checkpoint, self.task, processor=processor, **settings
        )

    def load(self) -> tuple[dict, dict]:
        """`(raw, renamed)`: `load_renamed_state_dict` with the class's `renames`, `required` keys and, in its error
        message, the `hint` on what the file is instead."""
        return load_renamed_state_dict(
            self.checkpoint, self.renames, self.required, self.release.architecture.name, self.hint
        )

    def hint(self, raw: dict, missing: list[str]) -> str:
        """What a file lacking the `missing` required keys looks like instead, for its error message: by default
        the architecture `looks_like` among `other_checkpoints`, or nothing."""
        if self.other_checkpoints is None:
            return ""
        return f" (it looks like: {looks_like(raw, self.other_checkpoints)})"

    def read_config(self) -> Any:
        """The original config, `config` as given (a dict or a file): by default a JSON file's dict
        (`read_json_config`), None without one."""
        return read_json_config(self.config)

    def bert_fields(
        self,
        original_config: Mapping | None,
        bert: str,
        notes: list[str],
        config_name: str | None,
        enlarged: Collection[str] = (),
        sizes: Mapping[str, int] | None = None,
    ) -> dict:
        """`sizes_over_config`: the original config's fields with the sizes read from the checkpoint laid over them,
        its BERT sizes (`bert_sizes` of the renamed state dict's `{bert}embeddings.` and `{bert}encoder.layer.N.`)
        and the architecture's own `sizes`."""
        sizes = {**bert_sizes(self.state_dict, f"{bert}embeddings.", f"{bert}encoder.layer."), **(sizes or {})}
        return sizes_over_config(original_config, sizes, notes, config_name, enlarged)

    def detect(self) -> str:
        """Which task (or release) saved the checkpoint, from its keys."""
        raise NotImplementedError

    def default_task(self) -> str:
        """The task converted to when none is asked for: the detected one."""
        return self.detected

    def check(self) -> None:
        """Refuse a checkpoint that cannot become the `task` head (`CheckpointError`); nothing by default."""

    def model_config(self) -> "tuple[PreTrainedConfig, list[str]]":
        """The model config read from the checkpoint and the original config, and the notes on how."""
        raise NotImplementedError

    def configure(self, model_config: "PreTrainedConfig", report: ConversionReport) -> None:
        """Set the task head's settings on `model_config` (answer vocabulary, head kind); nothing by default."""

    def model_class(self) -> type:
        """The head class of `task`."""
        return self.tasks[self.task]

    def set_answer_file_labels(
        self, model_config: "PreTrainedConfig", num_answers: int | None, beside: Sequence[str], levels: int, how: str
    ) -> None:
        """id2label / label2id on `model_config` from the answer vocabulary: `answers`, else the first of the file
        names `beside` found next to the checkpoint (`find_answer_file`, `levels`); checked to have `num_answers`
        answers (None: a new head, any number). Without one, a FileNotFoundError saying `how` to pass it."""
        path = find_answer_file(self.checkpoint, self.answers, beside, levels)
        if path is None:
            raise FileNotFoundError(f"the VQA answer vocabulary is needed for id2label: pass answers=/--answers {how}")
        set_answer_labels(model_config, answer_labels(path, num_answers))

    def set_given_answer_labels(
        self, model_config: "PreTrainedConfig", num_answers: int, notes: list[str], placeholder_note: str
    ) -> list[str]:
        """id2label / label2id on `model_config` from `answers` (checked to have `num_answers` answers) or, without
        it, the placeholders `answer_<i>` (with `placeholder_note` in `notes`). Returns the labels."""
        if self.answers is not None:
            labels = answer_labels(self.answers, num_answers)
        else:
            labels = [f"answer_{i}" for i in range(num_answers)]
            notes.append(placeholder_note)
        set_answer_labels(model_config, labels)
        return labels

    def derived(self, model: "PreTrainedModel", report: ConversionReport) -> dict[str, tuple[torch.Tensor, str]]:
        """Target tensors computed from the checkpoint (`convert_state_dict`'s `derived`); none by default."""
        return {}

    def source_weights(self) -> dict:
        """The state dict `convert_state_dict` reads (the key map applies to its keys): the checkpoint as saved."""
        return self.raw

    def key_map(self, model_config: "PreTrainedConfig") -> KeyMap:
        """How the checkpoint's keys become the `task` head's."""
        raise NotImplementedError

    def finish(self, model: "PreTrainedModel", report: ConversionReport) -> None:
        """Adjust the loaded model (noted in `report`); nothing by default."""

    def processor(self, model_config: "PreTrainedConfig", report: ConversionReport) -> "ProcessorMixin":
        """The converted folder's processor, with the original's text and region rules."""
        raise NotImplementedError

    def save_settings(self, model: "PreTrainedModel", report: ConversionReport) -> dict[str, Any]:
        """`OriginalRelease.save`'s other keyword arguments (`reported_task`, `usage`, ...); none by default."""
        return {}

    @classmethod
    def signature(cls) -> inspect.Signature:
        """`convert_<model_type>`'s signature: `__init__`'s with the release's tokenizer as the default, and the
        architecture's `extra_parameters`."""
        parameters = {
            name: parameter
            for name, parameter in list(inspect.signature(cls.__init__).parameters.items())[1:]
            if parameter.kind is not inspect.Parameter.VAR_KEYWORD
        }
        tokenizer = parameters["tokenizer"]
        parameters["tokenizer"] = tokenizer.replace(
            default=cls.release.default_tokenizer, annotation="PreTrainedTokenizerBase | str | os.PathLike"
        )
        parameters.update({parameter.name: parameter for parameter in cls.extra_parameters})
        return inspect.Signature(list(parameters.values()), return_annotation=ConversionReport)

    @classmethod
    def public_functions(
        cls, **command_line: Any
    ) -> "tuple[Callable[..., ConversionReport], Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], ConversionReport]]":
        """`(convert_<model_type>, add_arguments, convert_from_args)`: the public converter (`signature`; its docstring
        is the class's and what every converter returns; it runs one conversion) and its command line
        (`converter_command_line` with the `command_line` help texts and extra arguments: `checkpoint_help`,
        `config_help`, `answers_help`, ...)."""
        signature = cls.signature()

        def convert(*args: Any, **kwargs: Any) -> ConversionReport:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return cls(**bound.arguments).run()

        model_type = cls.release.architecture.model_type
        convert.__name__ = convert.__qualname__ = f"convert_{model_type}"
        convert.__module__ = cls.__module__
        convert.__doc__ = f"{inspect.cleandoc(cls.__doc__ or '')}\n{_CONVERTER_RETURNS}"
        convert.__signature__ = signature
        return convert, *converter_command_line(convert, model_type, tasks=cls.tasks, **command_line)


def add_source_arguments(
    parser: "argparse.ArgumentParser", *, source: str = "checkpoint", source_help: str, config_help: str
) -> None:
    """The arguments every `vlhub convert <name>` takes: the original file (positional `source`), --output-dir (the
    folder to write) and --config (the original's config file)."""
    parser.add_argument(source, help=source_help)
    parser.add_argument("--output-dir", required=True, help="folder to write")
    parser.add_argument("--config", help=config_help)


def call_with_arguments(
    function: "Callable[..., Any]", args: "argparse.Namespace", positional: Sequence[str], keywords: Sequence[str]
) -> Any:
    """`function` called with the parsed command-line `args` of the names `positional` (in order) and `keywords`
    (as keyword arguments of the same names)."""
    values = vars(args)
    return function(*(values[name] for name in positional), **{name: values[name] for name in keywords})


def converter_command_line(
    convert: "Callable[..., ConversionReport]",
    architecture: str,
    *,
    checkpoint_help: str,
    config_help: str,
    tasks: Collection[str],
    answers_help: str,
    tokenizer_default: str | None = None,
    task_help: str | None = None,
    extra_arguments: Mapping[str, dict] | None = None,
) -> "tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], ConversionReport]]":
    """`(add_arguments, convert_from_args)` of `vlhub convert <architecture>` for a converter taking
    `convert(checkpoint, output_dir, config=, task=, tokenizer=, answers=, **extra)`: the positional checkpoint,
    --output-dir, --config, --task (one of `tasks`), --tokenizer (default `tokenizer_default`, else `convert`'s own
    default), --answers, and each of `extra_arguments` (flag → `add_argument` settings; `--task-id` is passed on as
    `task_id=`)."""
    if tokenizer_default is None:
        tokenizer_default = inspect.signature(convert).parameters["tokenizer"].default
    extra_arguments = dict(extra_arguments or {})
    keywords = (
        "config",
        "task",
        "tokenizer",
        "answers",
        *(flag.lstrip("-").replace("-", "_") for flag in extra_arguments),
    )

    def add_arguments(parser) -> None:
        add_source_arguments(parser, source_help=checkpoint_help, config_help=config_help)
        parser.add_argument(
            "--task", choices=sorted(tasks), help=task_help or "head to build (default: detected from the keys)"
        )
        parser.add_argument("--tokenizer", default=tokenizer_default, help="tokenizer name, folder or vocab.txt")
        parser.add_argument("--answers", help=answers_help)
        for flag, settings in extra_arguments.items():
            parser.add_argument(flag, **settings)

    def convert_from_args(args) -> ConversionReport:
        return call_with_arguments(convert, args, ("checkpoint", "output_dir"), keywords)

    add_arguments.__doc__ = f"The arguments of `vlhub convert {architecture}`."
    convert_from_args.__doc__ = (
        f"`vlhub convert {architecture}`: `{convert.__name__}` with the parsed arguments of `add_arguments`."
    )
    return add_arguments, convert_from_args


def load_renamed_state_dict(
    checkpoint: Path,
    renames: Sequence[tuple[str, str]],
    required: Sequence[str],
    architecture: str,
    hint: "Callable[[dict, list[str]], str] | None" = None,
) -> tuple[dict, dict]:
    """`(raw, renamed)`: the checkpoint's state dict as saved and with `renames` applied, refused with a
    CheckpointError naming the missing keys unless every `required` (renamed) key is there. `hint(raw, missing)`
    may add a sentence on what the file looks like instead."""
    raw = load_torch_state_dict(checkpoint)
    renamed = {target: value for target, (_, value) in KeyMap(renames=renames).rename_all(raw).items()}
    missing = [k for k in required if k not in renamed]
    if missing:
        extra = hint(raw, missing) if hint is not None else ""
        raise CheckpointError(f"{Path(checkpoint).name} is not a {architecture} checkpoint: it lacks {missing}{extra}")
    return raw, renamed
