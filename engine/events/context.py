"""The events of context management and memory: history trimmed, summarised and recalled,
memories retrieved and noted, and the agent's task state changed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .envelope import Event


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextTrimmed(Event):
    turn_id: str
    step: int
    """The model step the trim was made for."""
    items_json: str
    """JSON list of what was cut: {"ref", "action": "removed"|"shortened", "reason", "tokens",
    "text"}; ``ref`` is the version of the event the message came from (its original stays on
    the log), ``text`` the shortened content (empty when removed)."""
    history_tokens_before: int
    history_tokens_after: int
    history_budget: int
    type: ClassVar[str] = "ContextTrimmed"


@dataclass(frozen=True, slots=True, kw_only=True)
class HistorySummarized(Event):
    turn_id: str
    step: int
    removed_refs_json: str
    """JSON list of the refs (source event versions) the summary replaces."""
    summary: str
    """The text that now stands in front of the history as one message."""
    summarizer: str
    """The model that wrote it, or ``extractive`` for the deterministic fallback."""
    reason: str
    """tokens (90 % of the history budget), turns (the agent's verbatim-turn limit),
    context_length (the provider refused the request) or budget (a cost budget)."""
    fallback: bool = False
    """The summariser failed and the deterministic extractive summary stands in."""
    error: str = ""
    """Why the summariser failed, when ``fallback``."""
    tokens_before: int = 0
    tokens_after: int = 0
    type: ClassVar[str] = "HistorySummarized"


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryRecalled(Event):
    turn_id: str
    query: str
    refs_json: str
    """JSON list of the archived refs brought back for this turn."""
    text: str
    """What the model is shown, quoting the archived messages."""
    type: ClassVar[str] = "HistoryRecalled"


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoriesRetrieved(Event):
    turn_id: str
    query: str
    memories_json: str
    """JSON list of {"memory_id", "text", "tag", "score"} shown to the model this turn."""
    tokens: int = 0
    type: ClassVar[str] = "MemoriesRetrieved"


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryNoted(Event):
    turn_id: str
    call_id: str
    """The ``remember`` tool call that asked for it; empty when noted another way."""
    user_id: str
    text: str
    tag: str
    """preference | conclusion | agreement (engine.memory.MemoryTag)."""
    type: ClassVar[str] = "MemoryNoted"


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskStateChanged(Event):
    turn_id: str
    call_id: str
    op: str
    """set (replace the named fields) | overwrite (replace the whole state) | reset (defaults)."""
    patch_json: str
    """The change as a JSON Patch (RFC 6902) list, the shape of AG-UI's STATE_DELTA."""
    state_json: str
    """The whole task state after the change."""
    type: ClassVar[str] = "TaskStateChanged"
