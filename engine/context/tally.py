"""Token counts of a session's history, each message counted once.

The history grows by appends between compactions, so a session's counts are extended with the
new messages only; a compaction (or a reload) makes a new message list, which is counted afresh.
Per-step counting therefore costs the step's new messages, not the history's length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence, TypeVar

from ..messages import ChatMessage
from ..models.tokens import TOKENS_PER_MESSAGE, TokenCounter
from ..session_cache import ENTRY_BYTES, Kind, SessionCache


def message_tokens(counter: TokenCounter, message: ChatMessage) -> int:
    """One message's tokens with its framing and tool calls (as ``count_chat_tokens`` counts)."""
    total = TOKENS_PER_MESSAGE + counter.count(message.content)
    for call in message.tool_calls:
        total += counter.count(call.name) + counter.count(call.arguments_json)
    return total


T = TypeVar("T")


def within_budget(items: Sequence[T], tokens: Callable[[T], int], budget: int) -> tuple[list[T], int]:
    """The leading items (best first) whose tokens fit ``budget``, and the tokens they take."""
    kept: list[T] = []
    used = 0
    for item in items:
        cost = tokens(item)
        if used + cost > budget:
            break
        kept.append(item)
        used += cost
    return kept, used


@dataclass(slots=True)
class _Counts:
    messages: list[ChatMessage]
    counter: TokenCounter
    per_message: list[int] = field(default_factory=list)
    total: int = 0


COUNTS: Kind[_Counts] = Kind("token counts")
"""A session's per-message token counts, in the runner's ``SessionCache``."""
COUNT_BYTES = 40
"""A counted message's cost: its int and its list slot."""


class TokenTally:
    """Per-message token counts of the sessions a runner serves (bounded, least recent dropped)."""

    def __init__(self, cache: SessionCache | None = None) -> None:
        self._cache = cache if cache is not None else SessionCache()

    def counts(
        self, session_id: str, messages: list[ChatMessage], counter: TokenCounter
    ) -> tuple[Sequence[int], int]:
        """Tokens of each message of ``messages`` (the session's history list), in order, and
        their sum."""
        entry = self._cache.get(session_id, COUNTS)
        n = len(entry.per_message) if entry else 0
        if (
            entry is None
            or entry.messages is not messages
            or entry.counter is not counter
            or len(messages) < n
        ):
            entry, n = _Counts(messages, counter), 0
        for message in messages[n:]:
            tokens = message_tokens(counter, message)
            entry.per_message.append(tokens)
            entry.total += tokens
        self._cache.put(session_id, COUNTS, entry, ENTRY_BYTES + COUNT_BYTES * len(entry.per_message))
        return entry.per_message, entry.total
