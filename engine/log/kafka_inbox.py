"""How a Kafka partition's owner takes inbox records: each becomes its session's next event
(a force-finish request: the events that close the session; a cancel: the request and the drops
of the messages waiting for a turn; a user message to a closed session: the message and its
UserMessageDropped, since its sender may already have been answered 202),
is recognised as a submission the session already holds (skipped: ``turnlog.engine.log.submissions``),
or is refused with a reason (and goes to the dead-letter topic); an undecodable record moves the
resting session it names to ERROR (``kafka_poison.poisoned``)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import structlog

from .. import codec
from ..errors import (
    ApprovalError,
    ConcurrencyError,
    EventError,
    InputError,
    LogError,
    NotAwaitingBudgetError,
    SessionClosedError,
    SessionNotFoundError,
)
from ..events import (
    ApprovalDecided,
    AuxiliaryModelCall,
    BudgetDecided,
    CancelRequested,
    Event,
    SessionClosed,
    SessionForked,
    UserMessageReceived,
)
from ..fold import fold
from .base import EventLog
from .kafka_index import PartitionIndex
from .submissions import DECISIONS, NEW_SESSIONS, SUBMITTABLE, submission_keys

log = structlog.get_logger("turnlog.kafka")
AFTER_CLOSE = (UserMessageReceived, AuxiliaryModelCall)
"""Submissions a closed session still takes: a message (dropped at once, its sender told why)
and a model call's usage (it was made and paid for)."""


@dataclass
class Admission:
    """What the owner makes of one inbox record."""

    events: list[Event] = field(default_factory=list)
    """The session's next events (empty if the record is refused or repeats a submission)."""
    event_id: str | None = None
    """The submitted event's id, if the record decodes (to answer its submitter)."""
    refused: Exception | None = None
    """Why the record cannot be taken; it goes to the dead-letter topic."""
    held: Event | None = None
    """The event already on the log that this record repeats; nothing is written for it."""


def admit(
    part: PartitionIndex, msg: Any, versions: dict[str, int], pending: list[Event], writer_log: EventLog
) -> Admission:
    """The inbox record as the session's next events, the event it repeats, or why it cannot be
    taken. ``versions`` holds the sessions' versions after ``pending``, the events admitted
    earlier in this batch; ``writer_log`` is the log a close's writer is bound to (it never
    commits)."""
    try:
        event = codec.decode(msg.value)
    except EventError as exc:
        return Admission(refused=exc)
    if (held := _held(part, event, pending)) is not None:
        log.info(
            "kafka.inbox_repeat_skipped",
            partition=part.partition,
            offset=msg.offset,
            session=event.session_id,
            type=event.type,
            held_version=held.version,
        )
        return Admission(event_id=event.event_id, held=held)
    if (error := _refusal(part, event, versions, pending)) is not None:
        return Admission(event_id=event.event_id, refused=error)
    sid = event.session_id
    earlier = [e for e in pending if e.session_id == sid]
    if isinstance(event, SessionClosed):
        admitted = _close(part, event, earlier, writer_log)
    elif isinstance(event, DECISIONS):
        try:
            admitted = _decided(part, event, earlier, writer_log)
        except (ApprovalError, NotAwaitingBudgetError, InputError) as exc:  # decided meanwhile
            return Admission(event_id=event.event_id, refused=exc)
    elif isinstance(event, CancelRequested):
        admitted = _cancelled(part, event, earlier, writer_log)
    elif isinstance(event, UserMessageReceived) and _is_closed(part, sid, versions, pending):
        admitted = _after_close(part, event, earlier, writer_log)
    elif isinstance(event, SessionForked) and event.unfinished:
        from ..admin import forked_with_settlement  # builds on the log package

        admitted = forked_with_settlement(writer_log, event)
    else:
        admitted = [dataclasses.replace(event, version=versions.get(sid, part.version(sid)) + 1)]
    versions[sid] = admitted[-1].version
    return Admission(admitted, event.event_id)


def _held(part: PartitionIndex, event: Event, pending: list[Event]) -> Event | None:
    """The event that already holds one of ``event``'s submission keys: on the log (the
    partition index), or admitted earlier in this batch."""
    if (held := part.held_submission(event)) is not None:
        return part.session_after(event.session_id, held[1] - 1)[0]
    keys = set(submission_keys(event))
    return next(
        (e for e in pending if e.session_id == event.session_id and keys & set(submission_keys(e))), None
    )


def _refusal(
    part: PartitionIndex, event: Event, versions: dict[str, int], pending: list[Event]
) -> Exception | None:
    sid = event.session_id
    current = versions.get(sid, part.version(sid))
    if not isinstance(event, SUBMITTABLE):
        return LogError(f"{event.type} cannot be submitted through the inbox")
    if isinstance(event, NEW_SESSIONS):
        return ConcurrencyError(sid, 0, current) if current != 0 else None
    if current == 0:
        return SessionNotFoundError(sid)
    if _is_closed(part, sid, versions, pending) and not isinstance(event, AFTER_CLOSE):
        return SessionClosedError(sid, f"closed before this {event.type} was sequenced")
    return None  # a cancel that finds nothing to stop or drop is written anyway: interrupts.add_cancel


def _is_closed(part: PartitionIndex, sid: str, versions: dict[str, int], pending: list[Event]) -> bool:
    return sid in part.closed or (
        sid in versions and any(isinstance(e, SessionClosed) and e.session_id == sid for e in pending)
    )


def _close(
    part: PartitionIndex, request: SessionClosed, earlier: list[Event], writer_log: EventLog
) -> list[Event]:
    """A force-finish request as the events ``AgentSessions.force_finish`` writes (one piece of
    code: turn_records.add_force_finish); its SessionClosed keeps the request's event id."""
    from ..snapshots import SnapshotEncoder  # these build on the log package
    from ..turn_records import add_force_finish
    from ..usage import find_open_call
    from ..writer import SessionWriter

    sid = request.session_id
    events = [*part.session_after(sid, 0), *earlier]
    state = fold(sid, events)
    open_call = find_open_call(events, state)  # recorded with its tokens; unpriced here (no agents)
    w = SessionWriter(writer_log, state, request.producer)
    add_force_finish(
        w,
        request.reason,
        request.actor,
        SnapshotEncoder(cache_size=1),
        event_id=request.event_id,
        open_call=open_call,
    )
    return w.take_pending()


def _decided(
    part: PartitionIndex, decided: ApprovalDecided | BudgetDecided, earlier: list[Event], writer_log: EventLog
) -> list[Event]:
    """A submitted decision as the events ``AgentSessions.post_tool_decision`` /
    ``post_budget_decision`` write (approvals.add_submitted_decision, add_budget_decision; a
    stopped budget also ends the turn, with its snapshot), keeping the submitted event's id.
    Raises what those raise when the turn no longer waits for it."""
    from .. import snapshots  # these build on the log package
    from ..budget import add_budget_decision
    from ..tools.approvals import add_submitted_decision
    from ..turn_records import add_turn_finished
    from ..writer import SessionWriter

    sid = decided.session_id
    w = SessionWriter(writer_log, fold(sid, [*part.session_after(sid, 0), *earlier]), decided.producer)
    if isinstance(decided, ApprovalDecided):
        add_submitted_decision(w, decided)
        return w.take_pending()
    if decided.decision not in ("raise", "stop"):
        raise InputError(f"a budget decision is 'raise' or 'stop', not {decided.decision!r}")
    add_budget_decision(
        w,
        "raise" if decided.decision == "raise" else "stop",
        extra_micros=decided.extra_micros,
        note=decided.note,
        actor=decided.actor,
        event_id=decided.event_id,
    )
    if decided.decision == "stop":
        add_turn_finished(w, "budget", snapshots.SnapshotEncoder(cache_size=1))
    return w.take_pending()


def _cancelled(
    part: PartitionIndex, request: CancelRequested, earlier: list[Event], writer_log: EventLog
) -> list[Event]:
    """A submitted cancel as the events ``AgentSessions.cancel`` writes (interrupts.add_cancel:
    the request, then a drop of every message waiting for a turn), keeping the request's id."""
    from ..interrupts import add_cancel  # builds on the log package
    from ..writer import SessionWriter

    sid = request.session_id
    w = SessionWriter(writer_log, fold(sid, [*part.session_after(sid, 0), *earlier]), request.producer)
    add_cancel(w, request.reason, request.actor, event_id=request.event_id)
    return w.take_pending()


def _after_close(
    part: PartitionIndex, message: UserMessageReceived, earlier: list[Event], writer_log: EventLog
) -> list[Event]:
    """A user message that reached a closed session: its submitter may have been answered
    already (a process that does not own the partition answers once the inbox has it), so it
    is taken, and dropped at once with the reason (turn_records.drop_waiting)."""
    from ..turn_records import drop_waiting  # builds on the log package
    from ..writer import SessionWriter

    sid = message.session_id
    state = fold(sid, [*part.session_after(sid, 0), *earlier])
    received = dataclasses.replace(message, version=state.version + 1)
    state.apply(received)
    w = SessionWriter(writer_log, state, message.producer)
    drop_waiting(w, "closed", f"the session was closed ({state.close_reason}) before this message arrived")
    return [received, *w.take_pending()]


@dataclass(eq=False)
class InboxQueue:
    """One inbox partition's fetched batches waiting to be sequenced, in fetch order, and the
    task that sequences them in order (``KafkaEventLog._sequence_loop``): what waits when it
    is free goes into its next transaction together.

    A batch that must be read again seeks the inbox consumer back to its first record
    (``rewound``); the batches fetched before that seek are stale and are dropped, up to the
    batch the seek brings back, which starts at that same offset. A revoke drops them all."""

    batches: deque[list[Any]] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None
    rewound_to: int | None = None

    def next(self) -> list[Any] | None:
        """Every batch waiting, as one (they follow each other: one transaction sequences them
        all, as many as arrived while the last one was committed), stale ones skipped; None
        when none is waiting."""
        while self.batches and self.rewound_to is not None:
            if self.batches[0][0].offset == self.rewound_to:
                self.rewound_to = None
            else:
                self.batches.popleft()
        if not self.batches:
            return None
        taken = [message for batch in self.batches for message in batch]
        self.batches.clear()
        return taken

    def rewound(self, offset: int) -> None:
        self.rewound_to = offset

    def clear(self) -> None:
        self.batches.clear()
        self.rewound_to = None
