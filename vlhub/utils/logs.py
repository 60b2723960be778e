"""Log lines that read the same in a terminal and in a file.

transformers styles its load reports with terminal (ANSI) codes — the report's title always, its statuses when
stdout is a terminal — so a log file gets raw `\\x1b[1m` sequences. `plain_text_outside_terminals` strips them from
every record of transformers' logger whose handler writes somewhere other than a terminal.
`repeated_warnings_counted` says a warning raised again and again from one line once, with its count.
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from typing import Iterator

__all__ = ["plain_text_outside_terminals", "repeated_warnings_counted", "strip_terminal_codes"]

_TERMINAL_CODES = re.compile(r"\x1b\[[0-9;]*m")


def strip_terminal_codes(text: str) -> str:
    return _TERMINAL_CODES.sub("", text)


class _PlainText(logging.Filter):
    """Strips terminal codes from a record's message when its handler's stream is not a terminal."""

    def __init__(self, handler: logging.Handler):
        super().__init__()
        self.handler = handler

    def filter(self, record: logging.LogRecord) -> bool:
        stream = getattr(self.handler, "stream", None)  # a StreamHandler's; other handlers write files or sockets
        is_terminal = stream is not None and callable(getattr(stream, "isatty", None)) and stream.isatty()
        if not is_terminal and isinstance(record.msg, str):
            record.msg = strip_terminal_codes(record.msg)
        return True


def plain_text_outside_terminals() -> None:
    """Install the filter on the handlers of transformers' library logger (and the root logger's, which
    transformers' records reach when it does not handle them itself). Idempotent."""
    from transformers.utils import logging as transformers_logging

    for logger in (transformers_logging.get_logger(), logging.getLogger()):
        for handler in logger.handlers:
            if not any(isinstance(f, _PlainText) for f in handler.filters):
                handler.addFilter(_PlainText(handler))


@contextlib.contextmanager
def repeated_warnings_counted() -> Iterator[None]:
    """Within the block, a warning raised again from the same line (e.g. "text 3 has 70 tokens …; truncated", once
    per long caption of a training run) is shown the first time only; on leaving, one line says how many times it
    was raised in all. The filters in force decide, as ever, what is shown at all."""
    counts: dict[tuple, list] = {}
    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show_first(message, category, filename, lineno, file=None, line=None):
            key = (category, filename, lineno)
            if key in counts:
                counts[key][1] += 1
                return
            counts[key] = [str(message), 1]
            shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show_first
        try:
            yield
        finally:
            for (category, filename, lineno), (message, count) in counts.items():
                if count > 1:
                    shown(
                        f"{message} (raised {count} times in all; only the first is shown)", category, filename, lineno
                    )
