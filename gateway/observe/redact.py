"""Secret redaction for logs: by key name and by value pattern, recursively.

Usable directly (``redact(value)``) and as a structlog processor (``redact_processor``), so a
secret never reaches a log line however the logging is configured.
"""

from __future__ import annotations

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


def redact_text(text: str) -> str:
    return SECRET_VALUE.sub(REDACTED, text)


def redact(value: Any, key: str = "") -> Any:
    if key and SECRET_KEY.search(key):
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
    """A short, redacted preview of a result: enough to see what happened, not the value."""
    text = redact_text(" ".join(text.split()))
    return text if len(text) <= limit else text[: limit - 1] + "…"
