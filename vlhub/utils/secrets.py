"""Keeping credentials out of everything vlhub writes or uploads (model cards, state files, logs).

Two layers: flags named like a secret have their values replaced in a recorded command line (`redact_secrets`), and
the actual values of every secret vlhub knows of (the `--hub_token` given, `HF_TOKEN`, environment variables named
like a token/password/key) are scrubbed from any text before it is written (`scrub_secrets`). The second layer
catches what names cannot: an abbreviated flag (`--hub_tok`), a token pasted into another argument.
"""

from __future__ import annotations

import os
import re
from typing import Iterable

__all__ = ["redact_secrets", "secret_values", "scrub_secrets", "REDACTED"]

REDACTED = "***"

# A name is secret when one of these words ends a part of it (`--hub_token`, `--api-key`, `HF_TOKEN`), not
# `--tokenizer_name`.
_SECRET_WORDS = r"(token|password|passwd|secret|api[_-]?key|auth|credentials?)"
_SECRET_FLAG = re.compile(rf"^--?[\w-]*{_SECRET_WORDS}([_-][\w-]*)?$", re.IGNORECASE)
_SECRET_ENV = re.compile(rf"^[\w]*{_SECRET_WORDS}(_[\w]*)?$", re.IGNORECASE)
# Shorter values are too likely to occur by chance (a "1" or "true" in a token-named variable).
_MIN_SECRET_LENGTH = 6


def redact_secrets(argv: list[str]) -> list[str]:
    """`argv` with the value of every flag named like a secret (`--hub_token`, `--password`, `--api_key`, ...)
    replaced by `***`, in both `--flag value` and `--flag=value` form."""
    redacted, hide_next = [], False
    for arg in argv:
        if hide_next:
            redacted.append(REDACTED)
            hide_next = False
            continue
        name, has_value, _ = arg.partition("=")
        if _SECRET_FLAG.match(name):
            redacted.append(f"{name}={REDACTED}" if has_value else arg)
            hide_next = not has_value
        else:
            redacted.append(arg)
    return redacted


def secret_values(extra: Iterable[str | None] = ()) -> list[str]:
    """The secrets in play: `extra` (e.g. the `--hub_token` given) and the values of environment variables named like
    a secret (`HF_TOKEN`, `WANDB_API_KEY`, ...). Longest first, so a secret containing another is scrubbed whole."""
    found = {value for value in extra if value}
    found |= {value for name, value in os.environ.items() if _SECRET_ENV.match(name)}
    return sorted((v for v in found if len(v) >= _MIN_SECRET_LENGTH), key=len, reverse=True)


def scrub_secrets(text: str, extra: Iterable[str | None] = ()) -> str:
    """`text` with every known secret value (see `secret_values`) replaced by `***`."""
    for value in secret_values(extra):
        text = text.replace(value, REDACTED)
    return text
