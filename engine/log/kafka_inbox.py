"""How a Kafka partition's owner admits inbox records, one batch at a time.

Each record is recognised as a submission its session already holds (skipped, its submitter
answered with the event on the log: ``submissions``), refused by the log (it does not decode, or
its type may not be submitted), or handed to the admission policy the owner was given
(``EventLog.admit_with``: the engine's rules, ``turnlog.engine.admission``), which says what it
becomes on its session or why it is refused. The policy sees the session as the log will hold it
after the records admitted earlier in the batch. A refused record goes to the dead-letter topic;
an undecodable one also moves the resting session it names to ERROR (``kafka_poison.poisoned``).

Without a policy the owner takes only what needs no rule: a submission that opens a session with
nothing to settle, or a message or a model call's usage for an open session, at the session's
next version. Any other record (a close, cancel or decision request, a fork with unfinished work,
a message to a closed session) waits in the inbox, with every record after it in its partition,
until a policy is handed over: nothing is refused or reordered for want of one.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import structlog

from ..errors import ConcurrencyError, EventError, LogError, SessionNotFoundError
from ..events import AuxiliaryModelCall, Event, SessionForked, UserMessageReceived
from ..fold import SessionState
from .base import Admission, AdmissionPolicy, Admitted, History, LogRecord, Refused, check_batch
from .kafka_index import PartitionIndex
from .submissions import NEW_SESSIONS, SUBMITTABLE, submission_keys

log = structlog.get_logger("turnlog.kafka")
PLAIN = (UserMessageReceived, AuxiliaryModelCall)
"""Submissions to an open session the owner takes without a policy, at its next version."""


@dataclass
class InboxAdmission:
    """What the owner makes of one inbox record."""

    events: list[Event] = field(default_factory=list)
    """The session's next events (empty if the record is refused, repeats or waits)."""
    at: int = 0
    """Where ``events`` start in the batch's ``accepted``."""
    event_id: str | None = None
    """The submitted event's id, if the record decodes (to answer its submitter)."""
    refused: Exception | None = None
    """Why the record cannot be taken; it goes to the dead-letter topic."""
    repeat: LogRecord | None = None
    """The record already on the log that this record repeats; nothing is written for it."""
    repeat_at: int | None = None
    """Where in ``accepted`` the event this record repeats is (admitted earlier in the batch)."""
    waits: str = ""
    """Why the record waits for an admission policy ("" if it does not)."""


class InboxBatch:
    """One batch of inbox records being admitted on a partition the owner indexes."""

    def __init__(self, index: PartitionIndex, policy: AdmissionPolicy | None) -> None:
        self.index = index
        self.policy = policy
        self.accepted: list[Event] = []
        """The events admitted so far, in order: what the batch's transaction appends."""
        self.versions: dict[str, int] = {}
        """The versions the sessions touched by the batch are at after ``accepted``."""
        self._pending: dict[str, list[Event]] = {}
        """Each session's events in ``accepted``."""
        self._at: dict[str, int] = {}
        """Where each event of ``accepted`` is in it, by event id."""
        self._folds: dict[str, SessionState] = {}

    def admit(self, msg: Any) -> InboxAdmission:
        """Admit one record (in offset order): its events are added to ``accepted``."""
        try:
            event = self.index.codec.decode(msg.value)
        except EventError as exc:
            return InboxAdmission(refused=exc)
        if not isinstance(event, SUBMITTABLE):
            return InboxAdmission(
                event_id=event.event_id, refused=LogError(f"{event.type} cannot be submitted")
            )
        if (repeat := self._repeat(event)) is not None:
            log.info(
                "kafka.inbox_repeat_skipped",
                partition=self.index.partition,
                offset=msg.offset,
                session=event.session_id,
                type=event.type,
            )
            if isinstance(repeat, LogRecord):
                return InboxAdmission(event_id=event.event_id, repeat=repeat)
            return InboxAdmission(event_id=event.event_id, repeat_at=repeat)
        state = self.state(event.session_id)
        if self.policy is not None:
            admission: Admission | None = self.policy.admit(state, event, self.history(event.session_id))
        else:
            admission = plain(state, event)
        if admission is None:
            return InboxAdmission(event_id=event.event_id, waits=f"a {event.type} needs the admission rules")
        if isinstance(admission, Refused):
            return InboxAdmission(event_id=event.event_id, refused=admission.error)
        check_batch(admission.events, state.version)  # a policy's bug fails the batch, read again
        at = len(self.accepted)
        self.add(admission.events)
        return InboxAdmission(admission.events, at, event.event_id)

    def add(self, events: list[Event]) -> None:
        """Append ``events`` (one session's next ones) to the batch."""
        sid = events[0].session_id
        self._pending.setdefault(sid, []).extend(events)
        self._at.update((e.event_id, len(self.accepted) + i) for i, e in enumerate(events))
        self.accepted += events
        self.versions[sid] = events[-1].version

    def state(self, session_id: str) -> SessionState:
        """The session as the log will hold it after the batch's events so far (the index's
        fold, never changed; a copy of it once the batch added to the session)."""
        base = self.index.states.get(session_id)
        pending = self._pending.get(session_id)
        if not pending:
            return base if base is not None else SessionState(session_id)
        folded = self._folds.get(session_id)
        if folded is None:
            folded = self._folds[session_id] = (
                copy.deepcopy(base) if base is not None else SessionState(session_id)
            )
        for event in pending:
            if event.version > folded.version:
                folded.apply(event)
        return folded

    def history(self, session_id: str) -> History:
        """The session's events after a version: the indexed ones, then the batch's."""

        def after(version: int) -> list[Event]:
            pending = [e for e in self._pending.get(session_id, ()) if e.version > version]
            return [*self.index.session_after(session_id, version), *pending]

        return after

    def _repeat(self, event: Event) -> LogRecord | int | None:
        """What already holds one of ``event``'s submission keys: its record on the log (the
        partition index), or its place in ``accepted`` (admitted earlier in this batch)."""
        if (held := self.index.held_submission(event)) is not None:
            return self.index.session_records_after(event.session_id, held[1] - 1)[0]
        keys = set(submission_keys(event))
        pending = self._pending.get(event.session_id, ())
        return next((self._at[e.event_id] for e in pending if keys & set(submission_keys(e))), None)


def plain(state: SessionState, event: Event) -> Admission | None:
    """What the owner takes without an admission policy (see the module doc); None for a
    record that waits for one."""
    sid = event.session_id
    if isinstance(event, NEW_SESSIONS):
        if state.exists:
            return Refused(ConcurrencyError(sid, 0, state.version))
        if isinstance(event, SessionForked) and event.unfinished:
            return None
        return Admitted([dataclasses.replace(event, version=1)])
    if not state.exists:
        return Refused(SessionNotFoundError(sid))
    if isinstance(event, PLAIN) and not state.closed:
        return Admitted([dataclasses.replace(event, version=state.version + 1)])
    return None
