"""Telling a local folder from a Hub repository id before anything goes to the network.

`from_pretrained("runs/does-not-exist")` takes a missing folder for a Hub id, asks the Hub (and, offline or online,
ends in a message about connecting to huggingface.co). A value that can only be a local path is refused at once.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["missing_local_folder"]

_LOCAL_PREFIXES = ("./", "../", "/", "~", ".\\", "..\\")


def missing_local_folder(name_or_path: str | os.PathLike) -> bool:
    """True when `name_or_path` looks like a local path and names nothing there: it starts like a path (`./`, `../`,
    `/`, `~`), or huggingface_hub would refuse it as a repository id (`validate_repo_id`: e.g. more than one slash),
    or the folder it would live in exists here (`runs/` for `runs/does-not-exist`)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    value = os.fspath(name_or_path)
    if Path(value).expanduser().exists():
        return False
    if value.startswith(_LOCAL_PREFIXES):
        return True
    try:
        validate_repo_id(value)
    except HFValidationError:
        return True
    parent = Path(value).parent
    return parent != Path(".") and parent.is_dir()
