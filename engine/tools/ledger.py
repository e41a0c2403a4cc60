"""The tool-call ledger (DESIGN.md "crash recovery").

Before a tool runs, its intent is on the log: ``ToolCallRequested`` holds the call id and the
arguments, and ``ToolCallStarted`` (committed right before the call, one per start) holds the
call's idempotency key. After a crash the successor folds the log and decides per call started
without a result (``batch.precheck``, the rule in ``turnlog.engine.tools.recovery``):

* the tool is idempotent, or takes the key: it is run again, with the same key, paced and
  given up only after ``Tool.max_starts`` starts over ``Tool.crash_window_s`` (a tool that
  kills its worker would otherwise crash-loop every worker that takes the session over);
* otherwise it is finished as "interrupted, outcome unknown" and never run again
  (``execute.interrupted``): at most once.

A keyed tool may offer ``lookup(key)``: whether its system applied the key, and with what
result. A call given up, or cut by a stop after a crash, is then reported as what it says
(applied: the result; ``NOT_APPLIED``: not done, safe to ask again), and a call it knows
applied is finished with that result instead of being run again.

The key is derived from the call's place in the log (session, turn, call id), so every attempt
of one call, in any process, before or after a crash, gets the same key, and two calls never
share one. A tool receives it by declaring a parameter named ``idempotency_key: str``: the
engine fills it, and the model never sees it (it is not in the tool's schema). Declaring it is
a promise: the tool passes the key to the external system (an ``Idempotency-Key`` header, a
unique request id, a unique index) and that system applies a request with a key it has seen
once only. The engine relies on it: a keyed call a crash interrupted is run again, and its
effect lands exactly once. A tool whose backend cannot deduplicate must not take the key (it
is then at most once, and a crash mid-call leaves its outcome unknown).
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from .registry import KEY_PARAMETER, Tool


class _NotApplied:
    """The type of ``NOT_APPLIED`` (one instance)."""

    def __repr__(self) -> str:
        return "NOT_APPLIED"


NOT_APPLIED: Any = _NotApplied()
"""What a tool's ``lookup(key)`` returns for a key its system has not applied."""


def idempotency_key(session_id: str, turn_id: str, call_id: str) -> str:
    """The call's key: stable across attempts and crashes, distinct between calls."""
    return hashlib.sha256(f"{session_id}\x00{turn_id}\x00{call_id}".encode()).hexdigest()


def with_key(t: Tool, args: dict[str, Any], key: str) -> dict[str, Any]:
    """The arguments ``t`` is called with: the model's, plus the call's key if the tool takes
    one. A call outside a turn (a direct invocation) gets a key of its own."""
    if not t.takes_idempotency_key or KEY_PARAMETER in args:
        return args
    return {**args, KEY_PARAMETER: key or uuid.uuid4().hex}
