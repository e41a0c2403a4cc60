"""Long-term memory on a turn's path: what the model is told about the user (seed §3.3).

Before each turn the user's memories most similar to their message are retrieved, with a tag
filter and a minimum score, and kept within the memory section's token budget; they are recorded
as a ``MemoriesRetrieved`` event, so the trace shows exactly what the model was told. Writing
memories happens elsewhere (the ``remember`` tool's ``MemoryNoted`` events and end-of-task
extraction, both stored by the memory consumer). A failing store never fails a turn.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Sequence

import structlog

from ..memory.base import Memory, MemoryStore
from ..models.base import Model

log = structlog.get_logger("turnlog.context")


@dataclass(frozen=True, eq=False)
class MemoryPolicy:
    """Long-term memory for an agent: the store to search before each turn, which memories to
    show, and the model that distils new ones after an answered task."""

    store: MemoryStore
    tags: Sequence[str] = field(default_factory=tuple)
    """Only memories with one of these tags are shown; empty shows every tag."""
    min_score: float = 0.3
    """Similarity below which a memory is not relevant enough to show (0.3 suits the default
    multilingual embedder: relevant facts score from about 0.31, unrelated ones mostly below 0.25)."""
    limit: int = 5
    extractor: Model | None = None
    """The model that lists the facts worth keeping at the end of each answered task (the memory
    consumer asks it, off the turn's path); None stores only what the ``remember`` tool notes."""
    remember_tool: bool = True
    """Offer the built-in ``remember`` tool. False for a small model that does better with fewer
    tools: memories are still retrieved before each turn (and extracted, with an extractor)."""


async def retrieve(policy: MemoryPolicy, user_id: str, query: str) -> list[Memory]:
    try:
        return await policy.store.search(
            user_id, query, tags=tuple(policy.tags), min_score=policy.min_score, limit=policy.limit
        )
    except Exception as exc:  # memory is an aid: the turn goes on without it
        log.warning("memory.search_failed", user=user_id, error=f"{type(exc).__name__}: {exc}")
        return []


def memories_json(memories: Sequence[Memory]) -> str:
    return json.dumps(
        [
            {"memory_id": m.memory_id, "text": m.text, "tag": m.tag, "score": round(m.score, 4)}
            for m in memories
        ],
        ensure_ascii=False,
    )
