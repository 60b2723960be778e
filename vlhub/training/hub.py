"""Uploads to the Hugging Face Hub with huggingface_hub's own API (`HfApi.create_repo`, `HfApi.upload_folder`).

Intermediate checkpoints go up in the background (`run_as_future=True`) so training never waits for the network; a
failed background upload is reported and training goes on, the local checkpoint untouched. The repository is created
before training starts, so a wrong token or an unreachable Hub fails at once rather than after hours of training.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import Future
from pathlib import Path

from huggingface_hub import HfApi

__all__ = ["HubError", "HubUploader", "CHECKPOINT_UPLOAD_IGNORE"]

logger = logging.getLogger(__name__)

# Optimizer/RNG state stays local: it is only useful to resume on this machine and can be several times the model.
CHECKPOINT_UPLOAD_IGNORE = ["training_state/*", "training_state/**", "checkpoint-*/**", "checkpoint-*"]


class HubError(RuntimeError):
    """The Hub could not be reached or refused a request; the message says what, where, and what is still local."""


class HubUploader:
    """Creates `repo_id` (if needed) and uploads folders to it.

    Args:
        repo_id: `user/name` or `org/name`.
        token: a Hub token (default: the logged-in one / `HF_TOKEN`).
        private: create the repository private.
        endpoint: the Hub's URL (default: `HF_ENDPOINT` as set now, or https://huggingface.co).
    """

    def __init__(self, repo_id: str, token: str | None = None, private: bool = False, endpoint: str | None = None):
        # HF_ENDPOINT is read here rather than at huggingface_hub's import, so setting it later still counts.
        self.api = HfApi(endpoint=endpoint or os.environ.get("HF_ENDPOINT") or None, token=token)
        self.endpoint = self.api.endpoint
        self._pending: list[tuple[int | str, Future]] = []
        try:
            self.repo_id = self.api.create_repo(repo_id, private=private, exist_ok=True).repo_id
        except Exception as err:  # connection errors, HTTP errors, auth errors: all end the same way
            raise HubError(
                f"could not create or reach the Hub repository {repo_id!r} at {self.endpoint}: "
                f"{type(err).__name__}: {err}. Check the network, HF_ENDPOINT and your token "
                "(huggingface-cli login or HF_TOKEN), or train without --push_to_hub."
            ) from err

    def upload_in_background(self, folder: str | os.PathLike, step: int) -> Future:
        """Start uploading a checkpoint folder (weights, config, processor, model card) to the repository root."""
        future = self.api.upload_folder(
            repo_id=self.repo_id,
            folder_path=str(folder),
            commit_message=f"Training in progress, step {step}",
            ignore_patterns=CHECKPOINT_UPLOAD_IGNORE,
            run_as_future=True,
        )
        self._pending.append((step, future))
        return future

    def upload(self, folder: str | os.PathLike, commit_message: str) -> str:
        """Upload a folder and wait; raises `HubError` (the folder itself is left as it is)."""
        try:
            info = self.api.upload_folder(
                repo_id=self.repo_id, folder_path=str(folder), commit_message=commit_message,
                ignore_patterns=CHECKPOINT_UPLOAD_IGNORE,
            )
        except Exception as err:
            raise HubError(
                f"uploading {folder} to {self.repo_id} at {self.endpoint} failed: {type(err).__name__}: {err}. "
                f"The local copy in {Path(folder).resolve()} is complete; push it later with "
                f"`huggingface-cli upload {self.repo_id} {folder}`."
            ) from err
        return str(getattr(info, "commit_url", info))

    def collect_finished(self, wait: bool = False) -> list[str]:
        """Check background uploads; returns a message per failed one (and logs it). `wait`: block until all end."""
        failures, still_running = [], []
        for step, future in self._pending:
            if not wait and not future.done():
                still_running.append((step, future))
                continue
            err = future.exception()
            if err is not None:
                message = (f"background upload of step {step} to {self.repo_id} at {self.endpoint} failed: "
                           f"{type(err).__name__}: {err}; the local checkpoint is kept")
                logger.warning(message)
                failures.append(message)
        self._pending = still_running
        return failures
