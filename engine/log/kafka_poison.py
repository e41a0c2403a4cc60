"""Poison records on a Kafka log and what the partition's owner does with them.

A record is poison when it does not decode (bytes that are not a turnlog event, a schema
fingerprint this reader does not know) or when it breaks its session's fold (a version out
of order, a StateChanged from another state, a result for a call never requested). Poison
never wedges a partition:

* on the events topic every reader (owner or not) decides the same way, record by record in
  offset order (``PartitionIndex.add_consumed``; ``kafka_records.Poison``), and leaves a poison
  record out of its index, so the projections and the owner see the same sessions;
* the owner copies each poison record to the dead-letter topic with the reason, and in the
  same transaction moves the session it names to ERROR with the reason (``poisoned``); a
  session whose turn is running gets its ERROR once the turn has ended. Inbox poison goes
  the same way (``turnlog.engine.log.kafka_inbox``).

The dead-letter topic is also the ledger of what was handled: its ``turnlog.source`` header
names the poison record, and an owner that takes the partition over reads those sources
first (``dead_letter_sources``), so nothing is dead-lettered twice.
"""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, TopicPartition

from ..events import Event, StateChanged
from ..states import RESTING, Cause, SessionStatus
from .kafka_index import PartitionIndex
from .kafka_records import SOURCE_HEADER, Poison


def poisoned(
    part: PartitionIndex, poison: Poison, versions: dict[str, int], producer: str
) -> StateChanged | None:
    """The event that moves the resting session ``poison`` names to ERROR with the reason, or
    None: no such session, already in ERROR, touched earlier in this batch, or a turn running
    (the caller decides whether to wait for the turn to end)."""
    sid = poison.session_id
    current = versions.get(sid, part.version(sid))
    if current == 0 or current != part.version(sid):
        return None
    state = part.states[sid]
    if state.turn is not None or state.status not in RESTING or state.status == SessionStatus.ERROR:
        return None
    versions[sid] = current + 1
    detail = f"record {poison.source} went to the dead-letter topic: {poison.reason}"
    return StateChanged(
        session_id=sid,
        version=current + 1,
        from_state=str(state.status),
        to_state=str(SessionStatus.ERROR),
        cause=str(Cause.POISON_RECORD),
        detail=detail[:2000],
        producer=producer,
    )


def busy(part: PartitionIndex, poison: Poison) -> bool:
    """True while the session the poison names runs a turn: its ERROR waits for the turn's end."""
    state = part.states.get(poison.session_id)
    return state is not None and state.turn is not None


def settle(part: PartitionIndex, producer: str) -> tuple[list[Event], list[Poison]]:
    """What the owner writes for the partition's events-topic poison not yet dead-lettered:
    ERROR markers and dead letters, in one transaction (a poison whose session is mid-turn
    waits for a later call)."""
    markers: list[Event] = []
    dead: list[Poison] = []
    versions: dict[str, int] = {}
    for poison in part.poison:
        if poison.source in part.dead_sources or busy(part, poison):
            continue
        dead.append(poison)
        if (marker := poisoned(part, poison, versions, producer)) is not None:
            markers.append(marker)
    return markers, dead


async def dead_letter_sources(reader: AIOKafkaConsumer, tp: TopicPartition, timeout_s: float) -> set[str]:
    """The sources of every committed record of a dead-letter partition (what was handled)."""
    sources: set[str] = set()
    async with asyncio.timeout(timeout_s):
        end = (await reader.end_offsets([tp]))[tp]
        if end == 0:
            return sources
        reader.assign([tp])
        reader.resume(tp)
        reader.seek(tp, 0)
        while await reader.position(tp) < end:
            batch = await reader.getmany(tp, timeout_ms=1000, max_records=1000)
            for msg in batch.get(tp, []):
                header = dict(msg.headers or ()).get(SOURCE_HEADER)
                if header is not None:
                    sources.add(header.decode("utf-8", "replace"))
        reader.pause(tp)
    return sources
