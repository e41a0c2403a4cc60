"""Session expiry (issue 43): the rule that closes an idle session, and what a later message to
it gets.

An expiry is a ``SessionClosed(reason="expired", actor="lifecycle")`` request decided by a
sweeper (consumers/lifecycle.py) from the projections: the session's last event is older than its
agent's ``Lifecycle.idle_expiry``. The sweeper's read may be stale, so the request carries the
version it read (``basis_version``) and the time it decided at, and the rule (applied by
``engine.admission`` wherever the session is appended to, a Kafka owner included) takes it only
if the session is still exactly there and idle: resting, or paused for the user, with no
message waiting. Anything that happened since (a message, a decision, another close) refuses
it, so two sweepers never close a session twice and an expiry never cuts off new activity.

What it writes, all at the request's time: ``StateChanged(→FINISHED, cause expired)`` unless
the session already rests in FINISHED, a paused turn's end (``TurnFinished``, reason
``expired``), and the ``SessionClosed`` (keeping the request's event id), then the turn-end
snapshot if a turn was cut short.

A message to an expired session is refused with ``SessionExpiredError`` (when it expired), or,
if the agent's ``Lifecycle.after_expiry`` is ``new_session``, goes to the session's successor:
a session of the same agent, user and role whose id is derived from the expired one
(``successor_id``), so every process and every racing request picks the same one, and the first
creates it (metadata ``{"continues": <expired id>}``).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from typing import Any, Protocol

from . import events as ev
from . import snapshots, turn_records
from .agent import AgentDirectory
from .errors import (
    ConcurrencyError,
    SessionActiveError,
    SessionClosedError,
    SessionExpiredError,
    SessionNotFoundError,
    TurnlogError,
)
from .fold import SessionState
from .log.base import EventLog
from .states import Cause, SessionStatus
from .writer import SessionWriter

EXPIRED = "expired"
"""``SessionClosed.reason`` (and ``TurnFinished.reason`` of a paused turn it ends) of an expiry."""
ACTOR = "lifecycle"
"""``SessionClosed.actor`` of an expiry."""
IDLE_STATES = frozenset(
    {
        SessionStatus.IDLE,
        SessionStatus.FINISHED,
        SessionStatus.ERROR,
        SessionStatus.CANCELLED,
        SessionStatus.PAUSED_FOR_USER,
    }
)
"""States a session may expire in: resting, or waiting for the user's decision."""
CLOSE_TAIL = 16
"""Events read back from a closed session's end to find when it was closed (then from the start)."""
MAX_SUCCESSORS = 64
"""How many expired successors a message follows before it is refused."""


def request(session_id: str, basis_version: int, now_ms: int, producer: str) -> ev.SessionClosed:
    """A sweeper's expiry of a session it read at ``basis_version`` as idle at ``now_ms``."""
    return ev.SessionClosed(
        session_id=session_id,
        version=0,
        reason=EXPIRED,
        actor=ACTOR,
        basis_version=basis_version,
        time_ms=now_ms,
        producer=producer,
    )


def is_expiry(event: ev.Event) -> bool:
    """A sweeper's expiry request (an admin's force-finish that names the same reason is a
    force-finish; later messages are refused as expired all the same)."""
    return isinstance(event, ev.SessionClosed) and event.reason == EXPIRED and event.actor == ACTOR


def is_idle(state: SessionState) -> bool:
    """Nothing in progress: resting or paused for the user, no message waiting for a turn."""
    return state.status in IDLE_STATES and not state.inbox


def refusal(state: SessionState, expiry: ev.SessionClosed) -> TurnlogError | None:
    """Why ``expiry`` may not close the session as it is now, or None: something happened since
    the sweeper read it (the log's version check), or it is busy."""
    if state.version != expiry.basis_version:
        return ConcurrencyError(state.session_id, expiry.basis_version, state.version)
    if not is_idle(state):
        return SessionActiveError(state.session_id, str(state.status))
    return None


def expired_events(state: SessionState, expiry: ev.SessionClosed) -> list[ev.Event]:
    """The events an admitted expiry writes on ``state`` (never changed here), at its time."""
    w = SessionWriter(None, copy.deepcopy(state), expiry.producer)
    turn = w.state.turn
    if w.state.status != SessionStatus.FINISHED:
        idle_s = max(0, expiry.time_ms - state.updated_ms) // 1000
        w.transition(SessionStatus.FINISHED, Cause.EXPIRED, detail=f"no activity for {idle_s} s")
    if turn is not None:
        turn_records.add_turn_finished(w, EXPIRED, None)  # its snapshot follows the close
    w.add(ev.SessionClosed, reason=EXPIRED, actor=expiry.actor, event_id=expiry.event_id)
    if turn is not None:
        snapshots.take(w, snapshots.SnapshotEncoder())  # a cut turn's end is a turn end
    return [dataclasses.replace(e, time_ms=expiry.time_ms) for e in w.take_pending()]


def closed_now(state: SessionState) -> SessionClosedError:
    """What a request to the closed session is refused with (without reading when it closed)."""
    if state.close_reason == EXPIRED:
        return SessionExpiredError(state.session_id)
    return SessionClosedError(state.session_id, state.close_reason)


async def closed_error(log: EventLog, state: SessionState) -> SessionClosedError:
    """``closed_now``, saying when an expired session expired (its SessionClosed, read back
    from the end of its log)."""
    if state.close_reason != EXPIRED:
        return closed_now(state)
    for after in (max(0, state.version - CLOSE_TAIL), 0):
        events = await log.read_session(state.session_id, after)
        closes = [e for e in events if isinstance(e, ev.SessionClosed) and e.reason == EXPIRED]
        if closes:
            return SessionExpiredError(state.session_id, closes[-1].time_ms)
    return SessionExpiredError(state.session_id)


def successor_id(session_id: str) -> str:
    """The id of the session that continues an expired one: derived, so concurrent messages
    (in any process) all go to one successor."""
    return hashlib.sha256(f"turnlog.successor:{session_id}".encode()).hexdigest()[:32]


class Sessions(Protocol):
    """What ``open_target`` uses of the API (engine.session.AgentSessions)."""

    log: EventLog
    agents: AgentDirectory

    async def get_state(self, session_id: str) -> SessionState: ...

    async def create_session(
        self,
        agent_id: str,
        user_id: str,
        *,
        role: str = ...,
        session_id: str | None = ...,
        metadata: dict[str, Any] | None = ...,
    ) -> object: ...


async def open_target(api: Sessions, state: SessionState) -> SessionState:
    """The open session a message to ``state`` goes to: itself if open; for an expired session
    whose agent continues in a new one (``after_expiry="new_session"``), its successor (created
    on first use, followed further if it expired too). Raises the closed-session error
    otherwise."""
    for _ in range(MAX_SUCCESSORS):
        if not state.closed:
            return state
        after = api.agents.lifecycle_of(state.agent_id).after_expiry
        if state.close_reason != EXPIRED or after != "new_session":
            raise await closed_error(api.log, state)
        state = await _successor(api, state)
    raise SessionClosedError(state.session_id, f"{EXPIRED}, and so were its {MAX_SUCCESSORS} successors")


async def _successor(api: Sessions, expired: SessionState) -> SessionState:
    next_id = successor_id(expired.session_id)
    try:
        return await api.get_state(next_id)
    except SessionNotFoundError:
        pass
    try:
        await api.create_session(
            expired.agent_id,
            expired.user_id,
            role=expired.role,
            session_id=next_id,
            metadata={"continues": expired.session_id},
        )
    except ConcurrencyError:
        pass  # another request created it first: the same session
    return await api.get_state(next_id)


__all__ = [
    "ACTOR",
    "EXPIRED",
    "closed_error",
    "closed_now",
    "expired_events",
    "is_expiry",
    "open_target",
    "refusal",
    "request",
    "successor_id",
]
