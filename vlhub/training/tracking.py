"""`log_history.jsonl`: every logged step as one JSON object, written through accelerate's tracker interface."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from accelerate.tracking import GeneralTracker, on_main_process

from ..utils.files import atomic_write_text

__all__ = ["JsonlTracker", "LOG_HISTORY", "read_log_history", "write_log_history"]

LOG_HISTORY = "log_history.jsonl"


def read_log_history(path: str | os.PathLike) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_log_history(path: str | os.PathLike, records: list[dict]) -> None:
    """Replace the file's records atomically (used when resuming: the checkpoint's history is the truth)."""
    atomic_write_text(path, "".join(json.dumps(record) + "\n" for record in records))


class JsonlTracker(GeneralTracker):
    """Appends `{"step": ..., **values}` per `accelerator.log` call to `<output_dir>/log_history.jsonl`."""

    name = "jsonl"
    requires_logging_directory = False
    main_process_only = True

    def __init__(self, output_dir: str | os.PathLike) -> None:
        super().__init__()
        self.path = Path(output_dir) / LOG_HISTORY

    @property
    def tracker(self) -> Path:
        return self.path

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        pass  # the configuration is recorded in each checkpoint's trainer_state.json and model card

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        record = {"step": step, **values}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
