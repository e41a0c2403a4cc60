"""Text the log can hold: valid Unicode without NUL characters.

A Python ``str`` may hold lone surrogates (``"\\ud800"`` from a JSON escape), which no UTF-8
encoder accepts, and NUL characters, which PostgreSQL text columns refuse. Either would fail far
from its source (the Avro encoder, a projection), so callers check text where it comes in.
"""

from __future__ import annotations

import re

from .errors import InputError, MessageTooLargeError

_SURROGATE = re.compile("[\ud800-\udfff]")
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def unicode_problem(text: str) -> str | None:
    """Why ``text`` is not valid Unicode (a lone surrogate), or None."""
    return _describe(_SURROGATE.search(text))


def text_problem(text: str) -> str | None:
    """What makes ``text`` unfit to be stored as text, or None: a lone surrogate or a NUL."""
    return _describe(_UNSTORABLE.search(text))


def check_message_text(text: str, limit_bytes: int) -> None:
    """Raise what a user message is refused with: empty, not valid Unicode text (a lone
    surrogate, a NUL), or over ``limit_bytes`` (UTF-8)."""
    if not text.strip():
        raise InputError("the message is empty; send some text")
    problem = text_problem(text)
    if problem is not None:
        raise InputError(f"the message holds {problem}; send UTF-8 text without NUL characters")
    size = len(text.encode("utf-8"))
    if size > limit_bytes:
        raise MessageTooLargeError(size, limit_bytes)


def _describe(found: re.Match[str] | None) -> str | None:
    if found is None:
        return None
    char, where = found.group(), found.start()
    if char == "\x00":
        return f"a NUL character at position {where}"
    return f"a lone surrogate U+{ord(char):04X} at position {where}, which is not valid Unicode"
