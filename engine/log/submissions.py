"""How a log recognises a submission it already holds, so that sequencing is idempotent.

A producer's event can reach the log more than once: a producer retries after an error whose
outcome it could not see (the record was written, the acknowledgement was lost), a client
resends a message with the id it chose, an inbox record is read again after an owner change or
a transaction whose outcome was unknown. Each submitted event is recognised by its keys (its
event id, and for a user message its message id); a session takes each key once. The embedded
log enforces it with a unique index in the append's transaction (``turnlog.engine.log.sqlite``), the
Kafka owner when it admits an inbox record (``turnlog.engine.log.kafka_inbox``), checked against the
keys its partition index holds.
"""

from __future__ import annotations

from ..events import (
    ApprovalDecided,
    AuxiliaryModelCall,
    BudgetDecided,
    CancelRequested,
    Event,
    SessionClosed,
    SessionCreated,
    SessionErased,
    SessionForked,
    UserMessageReceived,
)

NEW_SESSIONS = (SessionCreated, SessionForked)
"""Submissions that open a session (version 1): refused for a session that exists."""
DECISIONS = (ApprovalDecided, BudgetDecided)
"""A user's decision on a paused turn, checked by its submitter (an edit against the tools) and
applied by the owner with the events the API writes (engine.log.kafka_inbox)."""
SUBMITTABLE = (
    *NEW_SESSIONS,
    UserMessageReceived,
    CancelRequested,
    SessionClosed,
    *DECISIONS,
    AuxiliaryModelCall,
    SessionErased,
)
"""What producers may submit; everything else is written by the session's writer. A submitted
SessionClosed is a force-finish request: the owner writes the whole close; a decision, the
decision and what it moves (the resume transition, or the end of a turn stopped on its budget).
An AuxiliaryModelCall is a consumer's model call (memory extraction) recorded on its session; a
SessionErased an erasure (engine.erasure), which closes an open session first."""

SUBMITTED_TYPES = tuple(cls.type for cls in SUBMITTABLE)


def submission_keys(event: Event) -> tuple[str, ...]:
    """The keys under which ``event`` is recognised when it is submitted again; () for events
    that are never submitted. A user message's id is a key of its own: a client that retries
    with the id it chose makes a new event with the same message id."""
    if not isinstance(event, SUBMITTABLE):
        return ()
    if isinstance(event, UserMessageReceived):
        return (f"event:{event.event_id}", f"message:{event.message_id}")
    return (f"event:{event.event_id}",)
