"""Redaction for logs, recursively: secrets by key name, by value pattern and written out as
``key=value`` in text (a password typed into a message), and personal data (e-mail addresses,
phone numbers, payment card numbers, IBANs) by value pattern.

Usable directly (``redact(value)``) and as a structlog processor (``redact_processor``), so a
secret or a customer's address never reaches a log line however the logging is configured. Tool
results and arguments are the usual carriers (a result summary, the sampled full context).
"""

from __future__ import annotations

import functools
import re
from typing import Any, MutableMapping

REDACTED = "[REDACTED]"

SECRET_KEY = re.compile(
    r"(^|[_\-.])(password|passwd|pwd|secret|client_secret|token|access_token|refresh_token|api[_\-]?key|"
    r"apikey|authorization|auth|credentials?|private[_\-]?key|cookie|session[_\-]?key)$",
    re.IGNORECASE,
)
"""Key names whose values are secrets. Anchored at the end, so ``input_tokens`` is not one."""

SECRET_VALUE = re.compile(
    r"(?:sk-[A-Za-z0-9_\-]{16,}"  # OpenAI-style API keys
    r"|tlk_[A-Za-z0-9_\-]{20,}"  # turnlog gateway keys
    r"|(?:ghp|gho|ghs|github_pat)_[A-Za-z0-9_]{20,}"  # GitHub tokens
    r"|AKIA[0-9A-Z]{16}"  # AWS access key ids
    r"|xox[abprs]-[A-Za-z0-9\-]{10,}"  # Slack tokens
    r"|eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"  # JWTs
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"
    r"|(?i:bearer)\s+[A-Za-z0-9._~+/\-]{8,}=*)"
)
"""Values that look like credentials wherever they appear in a string."""

SECRET_ASSIGNMENT = re.compile(
    r"""(?P<key>["']?\b[\w.\-]*?(?:password|passwd|pwd|secret|token|api[_\-]?key|apikey|authorization|auth|"""
    r"""credentials?|private[_\-]?key|session[_\-]?key|cookie)["']?)(?P<sep>\s*[:=]\s*)"""
    r"""(?:(?P<quote>["'])[^"'\n]*(?P=quote)|(?:(?:bearer|basic|digest|token)\s+)?\S*[^\s,;.)\]}])""",
    re.IGNORECASE,
)
"""A secret written out in text as ``key=value`` or ``key: value`` (``password=hunter2``, ``"api_key":
"k"``, ``Authorization: Basic dXNlcg==``): the value goes, the key name stays. The key must end in
one of the names (``db_password`` is one, ``max_tokens`` is not). An unquoted value runs to the
next space (a password may hold ``&`` or ``;``), less a closing comma, stop or bracket."""


PERSONAL_VALUES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("[EMAIL]", re.compile(r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)+")),
    ("[IBAN]", re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b")),
    (
        "[PHONE]",
        re.compile(
            r"(?<![\w+])\+\d[\d ().\-]{6,18}\d\b"  # international: +44 20 7946 0958
            r"|\(\d{3}\) ?\d{3}[ .\-]\d{4}\b|\b\d{3}[.\-]\d{3}[.\-]\d{4}\b"  # (555) 123-4567
            r"|\b1[3-9]\d{9}\b"  # mainland China mobile: 13800138000
        ),
    ),
)
"""Personal data, each with the mark that replaces it (so a reader still sees what was there)."""

CARD_NUMBER = re.compile(r"\b\d(?:[ \-]?\d){12,18}\b")
"""13 to 19 digits, optionally grouped; replaced only when the Luhn check passes (so ids and
timestamps stay)."""


MEMO_SIZE = 8192
"""Words redacted lately, and key names checked: a process's log lines repeat their sessions'
and turns' ids, states, causes and tool names many times, and each redaction runs every pattern
above. Only single words up to ``MEMO_CHARS`` are kept (not text: a summary, an error)."""
MEMO_CHARS = 64


def redact_text(text: str) -> str:
    if len(text) > MEMO_CHARS or " " in text:
        return _redact_text(text)
    return _redact_word(text)


def _redact_text(text: str) -> str:
    text = SECRET_ASSIGNMENT.sub(_assignment, text)
    text = SECRET_VALUE.sub(REDACTED, text)
    text = CARD_NUMBER.sub(_card, text)
    for mark, pattern in PERSONAL_VALUES:
        text = pattern.sub(mark, text)
    return text


def _assignment(found: re.Match[str]) -> str:
    quote = found.group("quote") or ""
    return f"{found.group('key')}{found.group('sep')}{quote}{REDACTED}{quote}"


def _card(found: re.Match[str]) -> str:
    digits = [int(c) for c in found.group() if c.isdigit()]
    total = sum(d if i % 2 == 0 else (d * 2 - 9 if d > 4 else d * 2) for i, d in enumerate(reversed(digits)))
    return "[CARD]" if total % 10 == 0 else found.group()


_redact_word = functools.lru_cache(maxsize=MEMO_SIZE)(_redact_text)


@functools.lru_cache(maxsize=MEMO_SIZE)
def secret_key(key: str) -> bool:
    """Whether values under this key name are secrets (``SECRET_KEY``)."""
    return SECRET_KEY.search(key) is not None


def redact(value: Any, key: str = "") -> Any:
    if key and secret_key(key):
        return REDACTED
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    return value


def redact_processor(logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> dict[str, Any]:
    """structlog processor: redact every field of the event."""
    return {k: redact(v, k) if k != "event" else v for k, v in event_dict.items()}


def summary(text: str, limit: int = 80) -> str:
    """A short, redacted preview of a result: enough to see what happened, not the value (no
    secrets, no personal data)."""
    text = redact_text(" ".join(text.split()))
    return text if len(text) <= limit else text[: limit - 1] + "…"
