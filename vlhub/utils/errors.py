"""One line for a user's mistake, a traceback for a bug: what every vlhub command line shares.

`VlhubUserError` is the base of vlhub's own errors about a bad input (a file, a setting, an unreachable server):
raise a subclass of it, with a message naming the input and the problem, and every command (`vlhub`, `pretrain.py`,
`finetune.py`, `python -m vlhub.extract`) prints that message as one line and exits with status 2.

Errors of the libraries that read user files are user errors too (a damaged SQLite index, an Arrow file that is not
one, YAML that constructs objects): `named_input(path)` turns them into a `VlhubUserError` naming the file, and
`run_command` shows any that escape as one line. Everything else is a bug and keeps its traceback;
`VLHUB_DEBUG=1` (or `vlhub --debug`) shows the traceback of user errors too.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sqlite3
import sys
import traceback
from typing import Callable, Iterator

__all__ = [
    "VlhubUserError",
    "USER_ERROR_EXIT_CODE",
    "user_error_types",
    "named_input",
    "one_line",
    "debug_enabled",
    "run_command",
]

USER_ERROR_EXIT_CODE = 2  # argparse's status for a bad command line: the same family of mistake
DEBUG_VARIABLE = "VLHUB_DEBUG"


class VlhubUserError(ValueError):
    """A bad input described in one line that names it (the file, the field, the setting, the server).

    Subclass it for new kinds of bad input; the command lines show its message without a traceback. It is a
    ValueError, so existing `except ValueError` handlers keep working.
    """


def user_error_types() -> tuple[type[BaseException], ...]:
    """Exception types that describe a bad input rather than a bug.

    Besides vlhub's own: OSError (missing or unreadable files, network errors, timeouts), ValueError (vlhub's
    checkpoint, feature-file and converter errors derive from it, and so does pyarrow's ArrowInvalid), KeyError (a
    missing field), ImportError (an optional package to install, named by the message), refused pickles, a damaged
    SQLite file, YAML that cannot be read, and MemoryError (a file declaring more data than fits in memory).
    """
    return (VlhubUserError, OSError, ValueError, KeyError, ImportError, *_library_error_types())


def _library_error_types() -> tuple[type[BaseException], ...]:
    """What `named_input` wraps: the readers' own errors, whose messages do not say which file they were reading."""
    types: list[type[BaseException]] = [sqlite3.DatabaseError, MemoryError, pickle.UnpicklingError]
    with contextlib.suppress(ImportError):
        import yaml

        types.append(yaml.YAMLError)
    with contextlib.suppress(ImportError):
        import pyarrow

        types.append(pyarrow.ArrowException)
    return tuple(types)


@contextlib.contextmanager
def named_input(path: str | os.PathLike, what: str = "", advice: str = "") -> Iterator[None]:
    """Re-raise a reading library's error (sqlite3, pyarrow, yaml, pickle, MemoryError) as a `VlhubUserError` whose
    message names `path` (and `what` it is, e.g. "the region store's id index", and `advice` on what to do),
    chained to the original."""
    try:
        yield
    except VlhubUserError:
        raise
    except _library_error_types() as err:
        kind = f" ({what})" if what else ""
        detail = one_line(err) if str(err) else "more data than fits in memory"
        raise VlhubUserError(
            f"{path}{kind} cannot be read: {type(err).__name__}: {detail}" + (f"; {advice}" if advice else "")
        ) from err


def one_line(err: BaseException) -> str:
    """The error's message on one line (KeyError's quotes removed; the type's name when there is no message)."""
    message = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    return " ".join(lines) or type(err).__name__


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_VARIABLE, "").strip().lower() not in ("", "0", "false", "no")


def run_command(prog: str, main: Callable[[], object], debug: bool = False) -> int:
    """Run a command's `main()`: a user error becomes `prog: error: <one line>` on stderr and exit status 2, with
    the traceback only under `debug` or VLHUB_DEBUG=1; any other exception (a bug) propagates with its traceback.
    Returns main's status (an int), else 0."""
    try:
        status = main()
    except user_error_types() as err:
        if debug or debug_enabled():
            traceback.print_exc()
        # One write, newline included: print() writes the newline separately, and the processes of one launch share
        # stderr, so their messages would run together on one line.
        sys.stderr.write(f"{prog}: error: {one_line(err)}\n")
        sys.stderr.flush()
        return USER_ERROR_EXIT_CODE
    return status if isinstance(status, int) else 0
