"""Telling a local folder from a Hub repository id before anything goes to the network.

`from_pretrained("runs/does-not-exist")` takes a missing folder for a Hub id, asks the Hub (and, offline or online,
ends in a message about connecting to huggingface.co). A value that can only be a local path is refused at once.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["missing_local_folder", "is_hub_id"]

_LOCAL_PREFIXES = ("./", "../", "/", "~", ".\\", "..\\")


def _written_like_a_path(value: str) -> bool:
    """It starts like a path (`./`, `../`, `/`, `~`), or huggingface_hub would refuse it as a repository id
    (`validate_repo_id`: e.g. more than one slash), or the folder it would live in exists here (`runs/` for
    `runs/does-not-exist`)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if value.startswith(_LOCAL_PREFIXES):
        return True
    try:
        validate_repo_id(value)
    except HFValidationError:
        return True
    parent = Path(value).parent
    return parent != Path(".") and parent.is_dir()


def missing_local_folder(name_or_path: str | os.PathLike) -> bool:
    """True when `name_or_path` names nothing here and is written like a local path (see `_written_like_a_path`)."""
    value = os.fspath(name_or_path)
    return not Path(value).expanduser().exists() and _written_like_a_path(value)


def is_hub_id(name_or_path: str | os.PathLike) -> bool:
    """A Hub repository id (`org/name` or `name`): nothing exists here under that name and it is not written like a
    local path."""
    value = os.fspath(name_or_path)
    return not Path(value).expanduser().exists() and not _written_like_a_path(value)
