"""One owner at a time for a folder that a long job writes (a training run's --output_dir).

The lock is an `fcntl.flock` on `<folder>/.vlhub-run.lock`, which holds the owner's process id, host and start
time. The kernel drops the lock when its process ends, however it ends (kill -9 included), so a lock left by a dead
process is free and the next run takes it over, saying whose it was. Two runs started at the same moment cannot both
get it: `flock` is atomic. On release the file is removed while still locked; a run that opened it just before
checks after locking that the path still names the file it locked, and tries again otherwise.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import logging
import os
import socket
from pathlib import Path

from .errors import VlhubUserError

__all__ = ["FolderInUseError", "FolderLock", "LOCK_FILE"]

LOCK_FILE = ".vlhub-run.lock"
logger = logging.getLogger(__name__)


class FolderInUseError(VlhubUserError):
    """Another live process owns the folder (the message names it: process id, host, start time)."""


class FolderLock:
    """An exclusive, process-lifetime lock on `folder` (created if needed). `what` names the folder in messages,
    e.g. "--output_dir". Use as a context manager or with `acquire()` / `release()`."""

    def __init__(self, folder: str | os.PathLike, what: str = "the folder") -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self.what = what
        self._descriptor: int | None = None
        self._created_folder = False

    def acquire(self) -> "FolderLock":
        self._created_folder = not self.folder.exists()
        self.folder.mkdir(parents=True, exist_ok=True)
        while True:
            descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _describe(_read_owner(descriptor))
                os.close(descriptor)
                raise FolderInUseError(
                    f"{self.what} {self.folder} is in use by another run ({holder}): two runs writing one folder "
                    "would mix their checkpoints and logs. Wait for it to finish, stop it, or choose another "
                    f"{self.what}."
                ) from None
            try:
                current = os.stat(self.path).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(descriptor).st_ino:
                break
            os.close(descriptor)  # its owner released (and removed) it between our open and our lock: again
        previous = _read_owner(descriptor)
        if previous:  # the file outlived its owner: the process ended without releasing it (killed, crashed)
            logger.warning(
                f"{self.what} {self.folder}: taking over the lock of a run that ended without releasing "
                f"it ({_describe(previous)}{_liveness(previous)})"
            )
        owner = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, json.dumps(owner).encode(), 0)
        self._descriptor = descriptor
        return self

    def release(self) -> None:
        if self._descriptor is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # while still locked: see the module's docstring
        os.close(self._descriptor)
        self._descriptor = None
        if self._created_folder:  # leave no empty folder behind a run that wrote nothing
            with contextlib.suppress(OSError):
                self.folder.rmdir()

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_owner(descriptor: int) -> dict:
    try:
        owner = json.loads(os.pread(descriptor, 4096, 0) or b"{}")
    except ValueError:
        return {}
    return owner if isinstance(owner, dict) else {}


def _describe(owner: dict) -> str:
    if not owner:
        return "its details not yet written"
    return f"process {owner.get('pid')} on host {owner.get('host')}, started {owner.get('started')}"


def _liveness(owner: dict) -> str:
    if owner.get("host") != socket.gethostname():
        return (
            f"; if that run still runs on {owner.get('host')}, this filesystem does not share locks between "
            "hosts: stop this run"
        )
    try:
        os.kill(int(owner.get("pid")), 0)
    except (ProcessLookupError, TypeError, ValueError):
        return "; that process no longer exists"
    except PermissionError:
        pass
    return ""
