"""How a Kafka partition's owner takes inbox records: each becomes its session's next event,
or is refused with a reason (and goes to the dead-letter topic); an undecodable record moves
the resting session it names to ERROR."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from .. import codec
from ..errors import ConcurrencyError, EventError, LogError, SessionClosedError, SessionNotFoundError
from ..events import Event, SessionCreated, StateChanged, UserMessageReceived
from ..fold import fold
from ..states import RESTING, Cause, SessionStatus
from .kafka_index import PartitionIndex

SUBMITTABLE = (SessionCreated, UserMessageReceived)
"""What producers may submit; everything else is written by the session's owner."""


def admit(part: PartitionIndex, msg: Any, versions: dict[str, int]) -> tuple[Event | None, Exception | None]:
    """The inbox record as the session's next event, or why it cannot be."""
    try:
        event = codec.decode(msg.value)
    except EventError as exc:
        return None, exc
    sid = event.session_id
    current = versions.get(sid, part.version(sid))
    if not isinstance(event, SUBMITTABLE):
        return None, LogError(f"{event.type} cannot be submitted through the inbox")
    if isinstance(event, SessionCreated) and current != 0:
        return None, ConcurrencyError(sid, 0, current)
    if isinstance(event, UserMessageReceived):
        if current == 0:
            return None, SessionNotFoundError(sid)
        if sid in part.closed:
            return None, SessionClosedError(sid, "closed before this message was sequenced")
    versions[sid] = current + 1
    return dataclasses.replace(event, version=current + 1), None


def poisoned(
    part: PartitionIndex, msg: Any, reason: str, versions: dict[str, int], producer: str
) -> StateChanged | None:
    """The resting session an undecodable inbox record names (by its key) goes to ERROR
    with the reason; a session with a turn running is left to it (the dead letter stays)."""
    sid = msg.key.decode("utf-8", "replace") if msg.key else ""
    current = versions.get(sid, part.version(sid))
    if current == 0 or current != part.version(sid):  # unknown, or already touched in this batch
        return None
    state = fold(sid, part.session_after(sid, 0))
    if state.turn is not None or state.status not in RESTING or state.status == SessionStatus.ERROR:
        return None
    versions[sid] = current + 1
    detail = f"inbox record {msg.topic}/{msg.partition}/{msg.offset} went to the dead-letter topic: {reason}"
    return StateChanged(
        session_id=sid,
        version=current + 1,
        from_state=str(state.status),
        to_state=str(SessionStatus.ERROR),
        cause=str(Cause.POISON_RECORD),
        detail=detail[:2000],
        producer=producer,
    )


def event_id(msg: Any) -> str | None:
    """The event id of an inbox record, if it decodes (to answer the submitter)."""
    with contextlib.suppress(EventError):
        return codec.decode(msg.value).event_id
    return None
