"""Uploads to the Hugging Face Hub with huggingface_hub's own API (`HfApi.create_repo`, `HfApi.upload_folder`).

Intermediate checkpoints go up in the background (a daemon thread, one after another) so training never waits for the
network; a
failed background upload is reported and training goes on, the local checkpoint untouched. The repository is created
before training starts, so a wrong token or an unreachable Hub fails at once rather than after hours of training.

No call waits forever (`vlhub.utils.network`): each read or write may wait `timeout` seconds (huggingface_hub's
shared client gets that timeout if it has none), and each operation, retries included, ends at `total_timeout`
seconds even when a server trickles bytes. Creating the repository is tried `attempts` times on network errors and
timeouts; uploads are already retried that way inside huggingface_hub (`http_backoff`: 5 retries, waits growing to
8 s), so vlhub adds no loop of its own around them. Either ends in a `HubError` (the local folder untouched)
instead of waiting forever. Uploads run in a daemon thread, so an upload stuck on a server never holds the process.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Callable, TypeVar

import httpx2
from huggingface_hub import HfApi

from ..utils.network import (
    DEFAULT_HUB_TIMEOUT,
    DEFAULT_HUB_TOTAL_TIMEOUT,
    SerialDaemonExecutor,
    set_read_timeout,
    with_deadline,
)

__all__ = [
    "HubError",
    "HubUploader",
    "CHECKPOINT_UPLOAD_IGNORE",
    "DEFAULT_HUB_TIMEOUT",
    "DEFAULT_HUB_TOTAL_TIMEOUT",
    "DEFAULT_HUB_ATTEMPTS",
]

logger = logging.getLogger(__name__)

# Optimizer/RNG state stays local: it is only useful to resume on this machine and can be several times the model.
# The run's lock file (vlhub.utils.locks.LOCK_FILE) names a process and a host: local too.
CHECKPOINT_UPLOAD_IGNORE = [
    "training_state/*",
    "training_state/**",
    "checkpoint-*/**",
    "checkpoint-*",
    ".vlhub-run.lock",
]


DEFAULT_HUB_ATTEMPTS = 3
_RETRYABLE = (httpx2.TimeoutException, httpx2.NetworkError)
_T = TypeVar("_T")


class HubError(RuntimeError):
    """The Hub could not be reached or refused a request; the message says what, where, and what is still local."""


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
        total_timeout: seconds one operation (creating the repository, one upload) may take, retries included.
        attempts: tries of `create_repo` on network errors and timeouts (HTTP errors such as 401/403 end at once).
    """

    def __init__(
        self,
        repo_id: str,
        token: str | None = None,
        private: bool = False,
        endpoint: str | None = None,
        timeout: float = DEFAULT_HUB_TIMEOUT,
        attempts: int = DEFAULT_HUB_ATTEMPTS,
        total_timeout: float = DEFAULT_HUB_TOTAL_TIMEOUT,
    ) -> None:
        if not timeout > 0 or not total_timeout > 0 or attempts < 1:
            raise ValueError(
                f"HubUploader needs timeout > 0, total_timeout > 0 and attempts >= 1, got {timeout}, "
                f"{total_timeout} and {attempts}"
            )
        # HF_ENDPOINT is read here rather than at huggingface_hub's import, so setting it later still counts.
        self.api = HfApi(endpoint=endpoint or os.environ.get("HF_ENDPOINT") or None, token=token)
        self.endpoint = self.api.endpoint
        self.timeout, self.total_timeout, self.attempts = timeout, total_timeout, attempts
        self._pending: list[tuple[int | str, Future, float]] = []  # (step, upload, when it started)
        self._uploads = SerialDaemonExecutor("vlhub hub uploads")
        set_read_timeout(timeout)
        try:
            self.repo_id = with_deadline(
                f"creating the repository {repo_id}",
                lambda: _with_retries(
                    lambda: self.api.create_repo(repo_id, private=private, exist_ok=True).repo_id,
                    attempts,
                    f"creating {repo_id} at {self.endpoint}",
                ),
                total=total_timeout,
                read=timeout,
                endpoint=self.endpoint,
            )
        except Exception as err:  # connection errors, timeouts, HTTP errors, auth errors: all end the same way
            raise HubError(
                f"could not create or reach the Hub repository {repo_id!r} at {self.endpoint}: "
                f"{type(err).__name__}: {err}. Check the network, HF_ENDPOINT and your token "
                "(huggingface-cli login or HF_TOKEN), or train without --push_to_hub."
            ) from err

    def upload_in_background(self, folder: str | os.PathLike, step: int) -> Future:
        """Start uploading a checkpoint folder (weights, config, processor, model card) to the repository root."""
        set_read_timeout(self.timeout)
        future = self._uploads.submit(lambda: self._upload_folder(folder, f"Training in progress, step {step}"))
        self._pending.append((step, future, time.monotonic()))
        return future

    def upload(self, folder: str | os.PathLike, commit_message: str) -> str:
        """Upload a folder and wait; raises `HubError` (the folder itself is left as it is)."""
        try:
            info = with_deadline(
                f"uploading {folder} to {self.repo_id}",
                lambda: self._upload_folder(folder, commit_message),
                total=self.total_timeout,
                read=self.timeout,
                endpoint=self.endpoint,
            )
        except Exception as err:
            raise HubError(
                f"uploading {folder} to {self.repo_id} at {self.endpoint} failed: {type(err).__name__}: {err}. "
                f"The local copy in {Path(folder).resolve()} is complete; push it later with "
                f"`huggingface-cli upload {self.repo_id} {folder}`."
            ) from err
        return str(getattr(info, "commit_url", info))

    def _upload_folder(self, folder: str | os.PathLike, commit_message: str):
        return self.api.upload_folder(
            repo_id=self.repo_id,
            folder_path=str(folder),
            commit_message=commit_message,
            ignore_patterns=CHECKPOINT_UPLOAD_IGNORE,
        )

    def collect_finished(self, wait: bool = False) -> list[str]:
        """Check background uploads; returns a message per failed one (and logs it). `wait`: wait until each ends or
        reaches its total deadline (counted from when it was queued)."""
        failures, still_running = [], []
        for step, future, started in self._pending:
            if not wait and not future.done():
                still_running.append((step, future, started))
                continue
            try:
                err = future.exception(timeout=max(0.0, started + self.total_timeout - time.monotonic()))
            except FutureTimeout:
                err = TimeoutError(f"it did not finish within {self.total_timeout:g} s (the total deadline)")
            if err is not None:
                message = (
                    f"background upload of step {step} to {self.repo_id} at {self.endpoint} failed: "
                    f"{type(err).__name__}: {err}; the local checkpoint is kept"
                )
                logger.warning(message)
                failures.append(message)
        self._pending = still_running
        return failures
