"""What every memory store does the same way, whatever engine holds the points (seed §3.3).

One point per version of a fact, id = ``memory_id``, payload ``user_id, text, tag,
valid_from_ms, valid_to_ms (null while current), supersedes, source``. A write first compares the
new fact with the user's closest current memories (``merge_with``): the same text again, or an
older restatement than the one stored, changes nothing (so a consumer that re-reads the log
writes nothing twice); a newer restatement supersedes the old version, which gets
``valid_to_ms`` and stays readable for audit (``history`` follows the ``supersedes`` links).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from ..errors import InputError
from .base import Memory, MemoryTag, MemoryWrite
from .dedup import normalise, same_fact

DEDUP_CANDIDATES = 8
"""How many of the user's closest current memories a write compares itself with."""
HISTORY_LIMIT = 1000
"""Versions of one fact ``history`` follows before it stops (a guard against a corrupt chain)."""
INDEXED = ("user_id", "tag", "supersedes")
"""Payload fields with a keyword index (``user_id`` is the tenant key)."""
TAGS = frozenset(t.value for t in MemoryTag)


def check_write(user_id: str, text: str, tag: str) -> None:
    if not user_id:
        raise InputError("a memory needs the user_id it belongs to; memories are never shared across users")
    if not text:
        raise InputError("a memory needs text; an empty fact is not stored")
    if tag not in TAGS:
        raise InputError(f"memory tag {tag!r} is not one of {sorted(TAGS)} (engine.memory.MemoryTag)")


def merge_with(fact: Memory, candidates: Sequence[Memory], threshold: float) -> tuple[Memory, bool] | None:
    """The stored memory ``fact`` restates, and whether ``fact`` replaces it (False: the write
    changes nothing); None for a new fact. ``candidates`` are the user's closest current
    memories, best first, each with its cosine to ``fact`` as ``score``."""
    for old in candidates:
        if normalise(old.text) == normalise(fact.text) and old.tag == fact.tag:
            return old, False
        if same_fact(old.text, fact.text, old.score, threshold):
            # an older restatement (a consumer re-reading the log) never replaces a newer one
            return old, old.valid_from_ms < fact.valid_from_ms
    return None


def superseding(old: Memory, fact: Memory) -> MemoryWrite:
    """``fact`` as the new version of ``old``, and ``old`` closed when ``fact`` starts."""
    new = dataclasses.replace(fact, supersedes=old.memory_id)
    closed = dataclasses.replace(old, valid_to_ms=new.valid_from_ms, score=0.0)
    return MemoryWrite(new, superseded=closed)


def chain(
    start: Memory | None,
    get: Callable[[str], Memory | None],
    successor: Callable[[str], Memory | None],
) -> list[Memory]:
    """Every version of ``start``'s fact, oldest first: back through ``supersedes``, then
    forward through the versions that supersede it."""
    if start is None:
        return []
    versions = [start]
    while versions[0].supersedes and len(versions) < HISTORY_LIMIT:
        older = get(versions[0].supersedes)
        if older is None:
            break
        versions.insert(0, older)
    while len(versions) < HISTORY_LIMIT and (newer := successor(versions[-1].memory_id)):
        versions.append(newer)
    return versions


def payload(fact: Memory) -> dict[str, Any]:
    return {
        "user_id": fact.user_id,
        "text": fact.text,
        "tag": fact.tag,
        "valid_from_ms": fact.valid_from_ms,
        "valid_to_ms": fact.valid_to_ms,
        "supersedes": fact.supersedes,
        "source": fact.source,
    }


def from_payload(point_id: Any, data: dict[str, Any] | None, score: float = 0.0) -> Memory:
    data = data or {}
    return Memory(
        memory_id=str(point_id),
        user_id=str(data.get("user_id", "")),
        text=str(data.get("text", "")),
        tag=str(data.get("tag", "")),
        valid_from_ms=int(data.get("valid_from_ms") or 0),
        valid_to_ms=data.get("valid_to_ms"),
        supersedes=data.get("supersedes"),
        source=str(data.get("source", "")),
        score=float(score),
    )
