"""How a Kafka partition's owner takes inbox records: each becomes its session's next event,
or is refused with a reason (and goes to the dead-letter topic); an undecodable record moves
the resting session it names to ERROR (``kafka_poison.poisoned``)."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from .. import codec
from ..errors import ConcurrencyError, EventError, LogError, SessionClosedError, SessionNotFoundError
from ..events import Event, SessionCreated, UserMessageReceived
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


def event_id(msg: Any) -> str | None:
    """The event id of an inbox record, if it decodes (to answer the submitter)."""
    with contextlib.suppress(EventError):
        return codec.decode(msg.value).event_id
    return None
