"""Uploads to the Hugging Face Hub with huggingface_hub's own API (`HfApi.create_repo`, `HfApi.upload_folder`).

Intermediate checkpoints go up in the background (`run_as_future=True`) so training never waits for the network; a
failed background upload is reported and training goes on, the local checkpoint untouched. The repository is created
before training starts, so a wrong token or an unreachable Hub fails at once rather than after hours of training.

No call waits forever: huggingface_hub's shared HTTP client has no timeout by default, so the uploader gives it one
(`timeout` seconds without progress on a connection, read or write; a client the user configured with
`huggingface_hub.set_client_factory` and a timeout of its own is left as it is). Creating the repository is tried
`attempts` times on network errors and timeouts; uploads are already retried that way inside huggingface_hub
(`http_backoff`: 5 retries, waits growing to 8 s), so vlhub adds no loop of its own around them. Either ends in a
`HubError` (the local folder untouched) instead of waiting forever.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Callable, TypeVar

import httpx2
from huggingface_hub import HfApi
from huggingface_hub.utils import get_session

__all__ = ["HubError", "HubUploader", "CHECKPOINT_UPLOAD_IGNORE", "DEFAULT_HUB_TIMEOUT", "DEFAULT_HUB_ATTEMPTS"]

logger = logging.getLogger(__name__)

# Optimizer/RNG state stays local: it is only useful to resume on this machine and can be several times the model.
CHECKPOINT_UPLOAD_IGNORE = ["training_state/*", "training_state/**", "checkpoint-*/**", "checkpoint-*"]


DEFAULT_HUB_TIMEOUT = 60.0  # seconds without progress before a request is given up
DEFAULT_HUB_ATTEMPTS = 3
_RETRYABLE = (httpx2.TimeoutException, httpx2.NetworkError)
_T = TypeVar("_T")


class HubError(RuntimeError):
    """The Hub could not be reached or refused a request; the message says what, where, and what is still local."""


def _ensure_timeout(seconds: float) -> None:
    """Give huggingface_hub's shared client a timeout if it has none (its default), so a stalled server ends a call."""
    session = get_session()
    current = session.timeout
    if all(value is None for value in (current.connect, current.read, current.write, current.pool)):
        session.timeout = httpx2.Timeout(seconds)


def _with_retries(call: Callable[[], _T], attempts: int, what: str) -> _T:
    """`call()`, retried with a growing pause on network errors and timeouts; other errors (HTTP 4xx) end at once."""
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except _RETRYABLE as err:
            if attempt == attempts:
                raise
            logger.warning(f"{what}: {type(err).__name__} ({err}); attempt {attempt + 1} of {attempts}")
            time.sleep(min(2.0 ** (attempt - 1), 10.0))
    raise AssertionError("unreachable")


class HubUploader:
    """Creates `repo_id` (if needed) and uploads folders to it.

    Args:
        repo_id: `user/name` or `org/name`.
        token: a Hub token (default: the logged-in one / `HF_TOKEN`).
        private: create the repository private.
        endpoint: the Hub's URL (default: `HF_ENDPOINT` as set now, or https://huggingface.co).
        timeout: seconds a connection may make no progress before the request is given up.
        attempts: tries of `create_repo` on network errors and timeouts (HTTP errors such as 401/403 end at once).
    """

    def __init__(self, repo_id: str, token: str | None = None, private: bool = False, endpoint: str | None = None,
                 timeout: float = DEFAULT_HUB_TIMEOUT, attempts: int = DEFAULT_HUB_ATTEMPTS):
        if not timeout > 0 or attempts < 1:
            raise ValueError(f"HubUploader needs timeout > 0 and attempts >= 1, got {timeout} and {attempts}")
        # HF_ENDPOINT is read here rather than at huggingface_hub's import, so setting it later still counts.
        self.api = HfApi(endpoint=endpoint or os.environ.get("HF_ENDPOINT") or None, token=token)
        self.endpoint = self.api.endpoint
        self.timeout, self.attempts = timeout, attempts
        self._pending: list[tuple[int | str, Future]] = []
        _ensure_timeout(timeout)
        try:
            self.repo_id = _with_retries(
                lambda: self.api.create_repo(repo_id, private=private, exist_ok=True).repo_id,
                attempts, f"creating {repo_id} at {self.endpoint}")
        except Exception as err:  # connection errors, timeouts, HTTP errors, auth errors: all end the same way
            raise HubError(
                f"could not create or reach the Hub repository {repo_id!r} at {self.endpoint}: "
                f"{type(err).__name__}: {err}. Check the network, HF_ENDPOINT and your token "
                "(huggingface-cli login or HF_TOKEN), or train without --push_to_hub."
            ) from err

    def upload_in_background(self, folder: str | os.PathLike, step: int) -> Future:
        """Start uploading a checkpoint folder (weights, config, processor, model card) to the repository root."""
        _ensure_timeout(self.timeout)
        future = self.api.run_as_future(self._upload_folder, folder, f"Training in progress, step {step}")
        self._pending.append((step, future))
        return future

    def upload(self, folder: str | os.PathLike, commit_message: str) -> str:
        """Upload a folder and wait; raises `HubError` (the folder itself is left as it is)."""
        _ensure_timeout(self.timeout)
        try:
            info = self._upload_folder(folder, commit_message)
        except Exception as err:
            raise HubError(
                f"uploading {folder} to {self.repo_id} at {self.endpoint} failed: {type(err).__name__}: {err}. "
                f"The local copy in {Path(folder).resolve()} is complete; push it later with "
                f"`huggingface-cli upload {self.repo_id} {folder}`."
            ) from err
        return str(getattr(info, "commit_url", info))

    def _upload_folder(self, folder: str | os.PathLike, commit_message: str):
        return self.api.upload_folder(repo_id=self.repo_id, folder_path=str(folder), commit_message=commit_message,
                                      ignore_patterns=CHECKPOINT_UPLOAD_IGNORE)

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
