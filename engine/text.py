"""Text the log can hold: valid Unicode without NUL characters.

A Python ``str`` may hold lone surrogates (``"\\ud800"`` from a JSON escape), which no UTF-8
encoder accepts, and NUL characters, which PostgreSQL text columns refuse. Either would fail far
from its source (the Avro encoder, a projection), so callers check text where it comes in.
"""

from __future__ import annotations

import re

_SURROGATE = re.compile("[\ud800-\udfff]")
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def unicode_problem(text: str) -> str | None:
    """Why ``text`` is not valid Unicode (a lone surrogate), or None."""
    return _describe(_SURROGATE.search(text))


def text_problem(text: str) -> str | None:
    """What makes ``text`` unfit to be stored as text, or None: a lone surrogate or a NUL."""
    return _describe(_UNSTORABLE.search(text))


def _describe(found: re.Match[str] | None) -> str | None:
    if found is None:
        return None
    char, where = found.group(), found.start()
    if char == "\x00":
        return f"a NUL character at position {where}"
    return f"a lone surrogate U+{ord(char):04X} at position {where}, which is not valid Unicode"
