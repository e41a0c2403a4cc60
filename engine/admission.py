"""The admission rules: what a submitted event becomes on its session's log, one rule for every
writer.

A producer submits an event (``engine.log.submissions.SUBMITTABLE``); what it becomes depends
on the session as the writer finds it when the event is ordered. A message is the session's
next event, or, for a session closed meanwhile, the message and its drop (its sender may
already have had its 202); a force-finish request is the whole close
(``turn_records.add_force_finish``, its open model call priced when the agent's prices are
known), an expiry the close of a session still idle where the sweeper read it
(``engine.expiry``); a cancel is the request and the drops of the messages waiting for a turn
(``interrupts.add_cancel``); an approval or budget decision is the decision and what it moves;
a fork that inherits unfinished work is the fork and its settlement
(``admin.forked_with_settlement``); an erasure of an open session is its close and the erasure.

``AgentSessions`` applies the rules where it appends itself, and hands them to its log
(``EventLog.admit_with``), whose owner applies them to what other processes submit (the Kafka
owner's inbox): both paths write the same events. The log itself recognises repeats (a
submission the session already holds is skipped by its keys) before it asks the rules.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Callable

from . import expiry
from .admin import forked_with_settlement
from .agent import AgentDirectory
from .budget import add_budget_decision
from .errors import (
    ApprovalError,
    ConcurrencyError,
    InputError,
    NotAwaitingBudgetError,
    SessionClosedError,
    SessionNotFoundError,
    TurnlogError,
)
from .events import (
    ApprovalDecided,
    AuxiliaryModelCall,
    BudgetDecided,
    CancelRequested,
    Event,
    SessionClosed,
    SessionErased,
    SessionForked,
    UserMessageReceived,
)
from .fold import SessionState
from .interrupts import add_cancel
from .log.base import Admission, Admitted, EventLog, History, Refused
from .log.submissions import DECISIONS, NEW_SESSIONS
from .models.pricing import PriceTable
from .snapshots import SnapshotEncoder
from .tools.approvals import add_submitted_decision
from .turn_records import add_force_finish, add_turn_finished, drop_waiting
from .usage import find_open_call
from .writer import SessionWriter

PriceLookup = Callable[[str], PriceTable | None]
"""An agent's price table by agent id (None: its calls are unpriced)."""
AFTER_CLOSE = (UserMessageReceived, AuxiliaryModelCall, SessionErased)
"""Submissions a closed session still takes: a message (dropped at once, its sender told why),
a model call's usage (it was made and paid for) and an erasure."""
DECLINED = (ApprovalError, NotAwaitingBudgetError, InputError)
"""What a rule raises for a request the session no longer waits for (decided meanwhile)."""


class AdmissionRules:
    """The rules as an ``engine.log.base.AdmissionPolicy``. ``prices``: the agents' price
    tables, so a force-finish prices the model call it cuts off (None: recorded unpriced)."""

    def __init__(self, prices: PriceLookup | None = None) -> None:
        self.prices = prices

    def admit(self, state: SessionState, event: Event, history: History) -> Admission:
        """``event`` as the session's next events, or why it is refused. ``state`` is the
        session's fold as the writer holds it (never changed here); ``history`` its events
        after a version (a force-finish looks up the model call it cuts off)."""
        refusal = _refusal(state, event)
        if refusal is not None:
            return Refused(refusal)
        try:
            return Admitted(self._events(state, event, history))
        except DECLINED as exc:
            return Refused(exc)

    def _events(self, state: SessionState, event: Event, history: History) -> list[Event]:
        if isinstance(event, SessionForked) and event.unfinished:
            return forked_with_settlement(dataclasses.replace(event, version=1))
        if expiry.is_expiry(event):
            assert isinstance(event, SessionClosed)
            return expiry.expired_events(state, event)
        if isinstance(event, SessionClosed):
            return self._closed(state, event, history)
        if isinstance(event, SessionErased):
            return self._erased(state, event, history)
        if isinstance(event, DECISIONS):
            return _decided(state, event)
        if isinstance(event, CancelRequested):
            return _cancelled(state, event)
        if isinstance(event, UserMessageReceived) and state.closed:
            return _after_close(state, event)
        return [dataclasses.replace(event, version=state.version + 1)]

    def _closed(self, state: SessionState, request: SessionClosed, history: History) -> list[Event]:
        """A force-finish request as the close ``AgentSessions.force_finish`` writes; its
        SessionClosed keeps the request's event id."""
        w = _writer(state, request)
        turn = state.turn
        open_call = None
        if turn is not None and turn.model_call_open:
            open_call = find_open_call(history(max(turn.started_version - 1, 0)), state)
        prices = self.prices(state.agent_id) if self.prices is not None else None
        add_force_finish(
            w,
            request.reason,
            request.actor,
            SnapshotEncoder(),
            event_id=request.event_id,
            open_call=open_call,
            prices=prices,
        )
        return w.take_pending()

    def _erased(self, state: SessionState, erased: SessionErased, history: History) -> list[Event]:
        """An erasure: an open session is force-finished first (its running turn stopped, its
        waiting messages dropped, reason ``erased``), in the same commit."""
        closing: list[Event] = []
        if not state.closed:
            request = SessionClosed(
                session_id=state.session_id,
                version=0,
                reason="erased",
                actor=erased.actor,
                producer=erased.producer,
            )
            closing = self._closed(state, request, history)
        return [*closing, dataclasses.replace(erased, version=state.version + len(closing) + 1)]


def agent_prices(agents: AgentDirectory) -> PriceLookup:
    """The price lookup of an agent directory (an unknown agent is unpriced)."""

    def lookup(agent_id: str) -> PriceTable | None:
        return agents.get(agent_id).prices if agent_id in agents else None

    return lookup


async def admitted(log: EventLog, policy: AdmissionRules, state: SessionState, event: Event) -> list[Event]:
    """``event`` admitted on ``state`` (a writer's fold of the session, caught up with ``log``),
    as the events to append; raises the refusal. Reads the running turn's events from ``log``
    when a model call is open (a force-finish records it)."""
    turn = state.turn
    since = max(turn.started_version - 1, 0) if turn is not None and turn.model_call_open else state.version
    recent = await log.read_session(state.session_id, since) if since < state.version else []

    def history(after: int) -> list[Event]:
        return [e for e in recent if e.version > after]

    admission = policy.admit(state, event, history)
    if isinstance(admission, Refused):
        raise admission.error
    return admission.events


def _refusal(state: SessionState, event: Event) -> TurnlogError | None:
    sid = event.session_id
    if isinstance(event, NEW_SESSIONS):
        return ConcurrencyError(sid, 0, state.version) if state.exists else None
    if not state.exists:
        return SessionNotFoundError(sid)
    if state.closed and not isinstance(event, AFTER_CLOSE):
        return SessionClosedError(sid, state.close_reason)
    if expiry.is_expiry(event):
        assert isinstance(event, SessionClosed)
        return expiry.refusal(state, event)  # only a session still idle at the version read
    return None  # a cancel that finds nothing to stop or drop is written anyway: interrupts.add_cancel


def _writer(state: SessionState, event: Event) -> SessionWriter:
    """A writer that builds on a copy of ``state`` (never committed: the caller appends)."""
    return SessionWriter(None, copy.deepcopy(state), event.producer)


def _decided(state: SessionState, decided: ApprovalDecided | BudgetDecided) -> list[Event]:
    """A decision as the owner writes it (approvals.add_submitted_decision, add_budget_decision;
    a stopped budget also ends the turn, with its snapshot), keeping its event id. Raises what
    those raise when the turn no longer waits for it."""
    w = _writer(state, decided)
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
        add_turn_finished(w, "budget", SnapshotEncoder())
    return w.take_pending()


def _cancelled(state: SessionState, request: CancelRequested) -> list[Event]:
    """A cancel as ``interrupts.add_cancel`` writes it (the request, then a drop of every
    message waiting for a turn), keeping the request's id."""
    w = _writer(state, request)
    add_cancel(w, request.reason, request.actor, event_id=request.event_id)
    return w.take_pending()


def _after_close(state: SessionState, message: UserMessageReceived) -> list[Event]:
    """A user message that reached a closed session: its submitter may have been answered
    already (a process that does not own the partition answers once the inbox has it), so it
    is taken, and dropped at once with the reason (turn_records.drop_waiting)."""
    received = dataclasses.replace(message, version=state.version + 1)
    w = SessionWriter(None, copy.deepcopy(state).apply(received), message.producer)
    drop_waiting(w, "closed", f"the session was closed ({state.close_reason}) before this message arrived")
    return [received, *w.take_pending()]


__all__ = ["AdmissionRules", "PriceLookup", "admitted", "agent_prices"]
