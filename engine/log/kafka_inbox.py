"""How a Kafka partition's owner takes inbox records: each becomes its session's next event
(a force-finish request: the events that close the session), or is refused with a reason (and
goes to the dead-letter topic); an undecodable record moves the resting session it names to
ERROR (``kafka_poison.poisoned``)."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from .. import codec
from ..errors import (
    ConcurrencyError,
    EventError,
    LogError,
    NoTurnRunningError,
    SessionClosedError,
    SessionNotFoundError,
)
from ..events import CancelRequested, Event, SessionClosed, SessionCreated, UserMessageReceived
from ..fold import fold
from .base import EventLog
from .kafka_index import PartitionIndex

SUBMITTABLE = (SessionCreated, UserMessageReceived, CancelRequested, SessionClosed)
"""What producers may submit; everything else is written by the session's owner. A submitted
SessionClosed is a force-finish request: the owner writes the whole close (``_close``)."""


def admit(
    part: PartitionIndex, msg: Any, versions: dict[str, int], pending: list[Event], writer_log: EventLog
) -> tuple[list[Event], Exception | None]:
    """The inbox record as the session's next events, or why it cannot be. ``versions`` holds
    the sessions' versions after ``pending``, the events admitted earlier in this batch;
    ``writer_log`` is the log a close's writer is bound to (it never commits)."""
    try:
        event = codec.decode(msg.value)
    except EventError as exc:
        return [], exc
    sid = event.session_id
    current = versions.get(sid, part.version(sid))
    if not isinstance(event, SUBMITTABLE):
        return [], LogError(f"{event.type} cannot be submitted through the inbox")
    if isinstance(event, SessionCreated):
        if current != 0:
            return [], ConcurrencyError(sid, 0, current)
    elif current == 0:
        return [], SessionNotFoundError(sid)
    elif sid in part.closed or (sid in versions and _closed_in(pending, sid)):
        return [], SessionClosedError(sid, f"closed before this {event.type} was sequenced")
    elif isinstance(event, CancelRequested) and part.states[sid].turn is None:
        return [], NoTurnRunningError(sid, str(part.states[sid].status))
    if isinstance(event, SessionClosed):
        admitted = _close(part, event, [e for e in pending if e.session_id == sid], writer_log)
    else:
        admitted = [dataclasses.replace(event, version=current + 1)]
    versions[sid] = admitted[-1].version
    return admitted, None


def _closed_in(pending: list[Event], sid: str) -> bool:
    return any(isinstance(e, SessionClosed) and e.session_id == sid for e in pending)


def _close(
    part: PartitionIndex, request: SessionClosed, earlier: list[Event], writer_log: EventLog
) -> list[Event]:
    """A force-finish request as the events ``AgentSessions.force_finish`` writes (one piece of
    code: turn_records.add_force_finish); its SessionClosed keeps the request's event id."""
    from ..snapshots import SnapshotEncoder  # these build on the log package
    from ..turn_records import add_force_finish
    from ..writer import SessionWriter

    sid = request.session_id
    w = SessionWriter(writer_log, fold(sid, [*part.session_after(sid, 0), *earlier]), request.producer)
    add_force_finish(
        w, request.reason, request.actor, SnapshotEncoder(cache_size=1), event_id=request.event_id
    )
    return w.take_pending()


def event_id(msg: Any) -> str | None:
    """The event id of an inbox record, if it decodes (to answer the submitter)."""
    with contextlib.suppress(EventError):
        return codec.decode(msg.value).event_id
    return None
