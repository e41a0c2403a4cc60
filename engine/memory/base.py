"""Long-term memory (seed §3.3): facts about a user that outlive a session.

A memory is a short fact with a tag (a user preference, a business conclusion, an agreement).
Stores keep every version: a write that nearly duplicates a live memory supersedes it (the old
one gets ``valid_to_ms`` and stays readable for audit) instead of being stored twice. Every
search is scoped to one user; nothing crosses users.

The engine only needs ``MemoryStore.search`` on a turn's path; writes happen in a consumer.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, Sequence


class MemoryTag(StrEnum):
    PREFERENCE = "preference"
    """What the user likes or wants done a certain way ("ship with DHL", "reports in Chinese")."""
    CONCLUSION = "conclusion"
    """A business conclusion reached in a task ("order 1042 was lost by the carrier")."""
    AGREEMENT = "agreement"
    """Something agreed with the user ("refund orders late by more than 5 days")."""


@dataclass(frozen=True, slots=True)
class Memory:
    memory_id: str
    user_id: str
    text: str
    tag: str
    valid_from_ms: int
    valid_to_ms: int | None = None
    """None while the memory is current; set when a newer version superseded it."""
    supersedes: str | None = None
    """The memory_id of the version this one replaced."""
    source: str = ""
    """Where it came from: a session id, "remember", "extracted"."""
    score: float = 0.0
    """Similarity to the query that found it (search results only)."""

    @property
    def current(self) -> bool:
        return self.valid_to_ms is None


@dataclass(frozen=True, slots=True)
class MemoryWrite:
    memory: Memory
    """The memory as stored now."""
    superseded: Memory | None = None
    """The near-duplicate it replaced, now closed (``valid_to_ms`` set); None for a new fact."""


class MemoryStore(Protocol):
    async def search(
        self,
        user_id: str,
        query: str,
        *,
        tags: Sequence[str] = (),
        min_score: float = 0.0,
        limit: int = 5,
    ) -> list[Memory]:
        """The user's current memories most similar to ``query``, best first, each at least
        ``min_score``; only those tagged with one of ``tags`` when given."""
        ...

    async def remember(
        self, user_id: str, text: str, tag: str, *, source: str = "", time_ms: int | None = None
    ) -> MemoryWrite:
        """Store a fact for the user, merging it into a near-duplicate current memory."""
        ...

    async def history(self, user_id: str, memory_id: str) -> list[Memory]:
        """Every version of one memory, oldest first, following ``supersedes`` links both ways."""
        ...

    async def forget(self, user_id: str | None = None, *, sessions: Sequence[str] = ()) -> int:
        """Delete every memory (every version) of ``user_id``, or those that came from one of
        ``sessions`` (``Memory.source``); how many. An erasure (engine.erasure) calls it, then
        ``compact``."""
        ...

    async def compact(self) -> None:
        """Make deleted memories leave the store's files (engine.memory.edge and .qdrant say how)."""
        ...
