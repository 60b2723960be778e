"""Deadlines for every call vlhub makes to the Hugging Face Hub: downloads and uploads end, in time, with an error
naming the operation and the endpoint.

Two bounds, because one is not enough:

- per read (`read_timeout`, default 60 s): huggingface_hub's shared HTTP client has no timeout by default, so calls
  without one of their own (`HfApi.model_info`, `create_repo`, uploads) would wait forever on a silent server;
  `set_read_timeout` gives the client one (a client the user configured with `huggingface_hub.set_client_factory`
  and a timeout of its own is left as it is). File downloads keep huggingface_hub's own per-read settings
  (`HF_HUB_DOWNLOAD_TIMEOUT`, `HF_HUB_ETAG_TIMEOUT`).
- in total (`total_timeout`, default 1 hour): a server that trickles a byte every few seconds satisfies any per-read
  timeout, and libraries retry. `with_deadline` runs the operation in a daemon thread and stops waiting at the
  deadline with a `HubTimeoutError`; the abandoned thread cannot keep the process alive.

The defaults can be changed with `VLHUB_HUB_TIMEOUT` and `VLHUB_HUB_TOTAL_TIMEOUT` (seconds), or per training run with
`--hub_timeout` and `--hub_total_timeout`.
"""

from __future__ import annotations

import os
import queue
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, Callable, TypeVar

from .errors import VlhubUserError, one_line
from .local_paths import is_hub_id

__all__ = [
    "HubTimeoutError",
    "HubConnectionError",
    "DEFAULT_HUB_TIMEOUT",
    "DEFAULT_HUB_TOTAL_TIMEOUT",
    "hub_endpoint",
    "hub_timeouts",
    "configure_hub_timeouts",
    "set_read_timeout",
    "with_deadline",
    "in_daemon_thread",
    "SerialDaemonExecutor",
    "download_snapshot",
    "local_or_download",
]

DEFAULT_HUB_TIMEOUT = 60.0  # seconds a request may wait for the next bytes
DEFAULT_HUB_TOTAL_TIMEOUT = 3600.0  # seconds one operation (a download, an upload, with its retries) may take
_T = TypeVar("_T")


class HubTimeoutError(VlhubUserError, TimeoutError):
    """A Hub operation did not finish within its deadline (the message names the operation and the endpoint)."""


class HubConnectionError(VlhubUserError, ConnectionError):
    """A Hub operation could not reach the server (the message names the operation, the endpoint and the cause)."""


def hub_endpoint() -> str:
    """The Hub that downloads go to (huggingface_hub's `HF_ENDPOINT`, as read at its import)."""
    from huggingface_hub import constants

    return constants.ENDPOINT


def _seconds(variable: str, default: float) -> float:
    value = os.environ.get(variable)
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        raise VlhubUserError(f"{variable}={value!r}: expected a number of seconds") from None
    if not seconds > 0:
        raise VlhubUserError(f"{variable}={value!r}: expected a positive number of seconds")
    return seconds


_configured: dict[str, float] = {}  # a command line's own settings (--hub_timeout, --hub_total_timeout)


def configure_hub_timeouts(read: float, total: float) -> None:
    """The process's per-read and total deadlines from now on (a training run's --hub_timeout/--hub_total_timeout)."""
    _configured.update(read=read, total=total)


def hub_timeouts(read: float | None = None, total: float | None = None) -> tuple[float, float]:
    """(per-read, total) seconds: the values given, else those of `configure_hub_timeouts`, else
    `VLHUB_HUB_TIMEOUT` / `VLHUB_HUB_TOTAL_TIMEOUT`, else the defaults."""
    if read is None:
        read = _configured.get("read") or _seconds("VLHUB_HUB_TIMEOUT", DEFAULT_HUB_TIMEOUT)
    if total is None:
        total = _configured.get("total") or _seconds("VLHUB_HUB_TOTAL_TIMEOUT", DEFAULT_HUB_TOTAL_TIMEOUT)
    if not (read > 0 and total > 0):
        raise VlhubUserError(f"Hub timeouts must be positive seconds, got {read} per read and {total} in total")
    return read, total


def set_read_timeout(seconds: float) -> None:
    """Give huggingface_hub's shared client a timeout if it has none (its default), so a stalled server ends a call."""
    import httpx2
    from huggingface_hub.utils import get_session

    session = get_session()
    current = session.timeout
    if all(value is None for value in (current.connect, current.read, current.write, current.pool)):
        session.timeout = httpx2.Timeout(seconds)


def in_daemon_thread(call: Callable[[], _T], name: str) -> Future:
    """`call()` in a daemon thread; its Future. Unlike an executor's worker, a thread stuck on a silent server does
    not hold the process at exit."""
    future: Future = Future()
    threading.Thread(target=_settle, args=(future, call), name=name, daemon=True).start()
    return future


def _settle(future: Future, call: Callable[[], object]) -> None:
    """Run `call` for `future` (unless it was cancelled): its result or its exception go to whoever waits."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(call())
    except BaseException as err:  # noqa: BLE001 — handed to whoever waits on the future
        future.set_exception(err)


class SerialDaemonExecutor:
    """Runs submitted calls one after another in one daemon thread (uploads to one repository must not overlap)."""

    def __init__(self, name: str) -> None:
        self._calls: queue.Queue = queue.Queue()
        self._name = name
        self._thread: threading.Thread | None = None

    def submit(self, call: Callable[[], _T]) -> Future:
        future: Future = Future()
        self._calls.put((call, future))
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
            self._thread.start()
        return future

    def _work(self):
        while True:
            call, future = self._calls.get()
            _settle(future, call)


def with_deadline(
    operation: str,
    call: Callable[[], _T],
    total: float | None = None,
    read: float | None = None,
    endpoint: str | None = None,
) -> _T:
    """`call()` (a Hub operation described by `operation`, e.g. "downloading org/model") with a per-read timeout on
    huggingface_hub's client and a total deadline; raises `HubTimeoutError` naming the operation and the endpoint
    when the deadline passes. Errors of the call itself are raised as they are."""
    read, total = hub_timeouts(read, total)
    set_read_timeout(read)
    endpoint = endpoint or hub_endpoint()
    future = in_daemon_thread(call, name=f"vlhub hub: {operation}")
    try:
        return future.result(timeout=total)
    except _unreachable_types() as err:
        raise HubConnectionError(f"{operation} at {endpoint} failed: {type(err).__name__}: {one_line(err)}") from err
    except FutureTimeout:
        raise HubTimeoutError(
            f"{operation} at {endpoint} did not finish within {total:g} s (the total deadline; each read may wait "
            f"{read:g} s). Check the network and HF_ENDPOINT, raise the deadline (VLHUB_HUB_TOTAL_TIMEOUT, or "
            "--hub_total_timeout for training), or use a local folder."
        ) from None


def _unreachable_types() -> tuple[type[BaseException], ...]:
    """Errors that say the server could not be reached or did not answer in time (each read's timeout)."""
    import httpx2
    from huggingface_hub.errors import LocalEntryNotFoundError

    return httpx2.TransportError, LocalEntryNotFoundError


# Weight formats vlhub never loads (it saves safetensors; transformers falls back to pytorch_model.bin).
_FOREIGN_WEIGHTS = ["*.h5", "*.msgpack", "*.onnx", "*.ot", "tf_model*", "flax_model*", "*.ckpt"]


def download_snapshot(repo_id: str, what: str, **kwargs: Any) -> Path:
    """`huggingface_hub.snapshot_download(repo_id, **kwargs)` within the deadlines; the local folder. Without
    `allow_patterns`, other frameworks' weight files are left out."""
    from huggingface_hub import snapshot_download

    if "allow_patterns" not in kwargs:
        kwargs.setdefault("ignore_patterns", _FOREIGN_WEIGHTS)
    return Path(with_deadline(f"downloading {what} {repo_id}", lambda: snapshot_download(repo_id, **kwargs)))


def local_or_download(name_or_path: str, what: str) -> str:
    """A local path as it is; a Hub id's files downloaded within the deadlines (the snapshot folder)."""
    return str(download_snapshot(name_or_path, what)) if is_hub_id(name_or_path) else str(name_or_path)
