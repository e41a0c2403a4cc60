"""Interrupts, cancels and messages that slip in mid-turn (seed §7.3, §8).

A user message or a cancel request that arrives while a turn runs is an event on the log like
any other; the running worker meets it when its next commit loses the version race. What
happens then is decided here:

* ``add_cancel``: a cancel stops the running turn and drops every message waiting for a turn
  (``UserMessageDropped``, reason ``cancelled``), in one commit; with neither it is refused
  (``check_cancel``). The admission rules (engine.admission) apply it, in the process that
  appends and in a Kafka owner admitting one sent through its inbox alike.
* ``Rebaser``: the events that slipped in are only user messages, cancel requests (with their
  drops) or another model call's usage (``REBASABLE``), so the worker's batch (tool results it
  holds, a model answer) is put on top of them and appended: nothing it learned is lost, and
  the events keep the ``basis_version`` they were decided from. Anything else that slipped in
  (an admin's force-finish, an approval, another worker) conflicts: the batch is never
  appended and the worker folds again and decides anew.
* When the fresh state calls for a stop (a cancel request, or a message under the agent's
  ``interrupt`` policy) the batch is cut at its side-effect boundary: tool results are kept,
  but no model call or tool call starts. A model answer decided before the stop arrived is a
  decision the stop supersedes, so it is not appended at all; the call is recorded cancelled,
  with the provider's usage (it was made and paid for).
* ``next_step`` then returns ``Stop``: ``stop_turn`` finishes what the turn left open, moves
  the session to CANCELLED with the reason, and the next waiting message (one that arrived
  after the cancel, or the interrupting one) starts a new turn that sees the interrupted work
  in its history.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Awaitable, Callable, Mapping

from . import events as ev
from . import snapshots, usage
from .agent import Agent
from .errors import (
    ConcurrencyError,
    IllegalTransitionError,
    NoTurnRunningError,
    OutOfOrderError,
    SessionClosedError,
)
from .fold import SessionState, ToolCallProgress, fold
from .log.base import LogRecord
from .models.pricing import PriceTable
from .states import Cause, SessionStatus
from .tools import execute as tool_exec
from .turn_records import add_tool_finished, add_turn_finished, drop_waiting
from .writer import SessionWriter

REBASABLE: frozenset[type[ev.Event]] = frozenset(
    {ev.UserMessageReceived, ev.CancelRequested, ev.UserMessageDropped, ev.AuxiliaryModelCall}
)
"""Events a running step may be rebased over (a memory extraction's cost recorded while the
next turn runs, or a cancel's drop of a message waiting behind the turn, changes no decision);
anything else that slipped in conflicts."""
REBASE_ATTEMPTS = 8


@dataclass(frozen=True, slots=True)
class Stop:
    """The running turn must stop now (a ``next_step`` result)."""

    reason: str
    cause: Cause


def stop_for(state: SessionState, agent: Agent) -> Stop | None:
    """Whether the session's running turn must stop at this step boundary; pure."""
    turn = state.turn
    if turn is None:
        return None
    if turn.stop_reason is not None:
        cause = Cause.ADMIN if turn.stop_actor == "admin" else Cause.INTERRUPT
        return Stop(f"cancelled by {turn.stop_actor or 'user'}: {turn.stop_reason}", cause)
    if agent.on_message == "interrupt" and state.inbox and state.inbox[-1].version > turn.started_version:
        arrived = next(m for m in state.inbox if m.version > turn.started_version)
        return Stop(f"interrupted by a new message: {_clip(arrived.text)}", Cause.INTERRUPT)
    return None


def stop_turn(
    w: SessionWriter,
    stop: Stop,
    model: str,
    encoder: snapshots.SnapshotEncoder | None,
    *,
    open_call: ev.ModelCallStarted | None = None,
    prices: PriceTable | None = None,
    known: Mapping[str, tool_exec.ToolOutcome] | None = None,
) -> None:
    """Close the running turn as CANCELLED; every call the model asked for gets a result, so
    the history stays a valid conversation for the next turn. A model call left open (its
    worker stopped during it) is recorded cancelled with what was sent (``open_call``, priced
    by ``prices``), or under ``model`` with nothing known. ``known``: the outcomes of calls a
    stopped worker had started, by call id, where more is known than "interrupted, not safe to
    repeat" (engine.tools.recovery.stopped_outcomes)."""
    turn = w.state.turn
    assert turn is not None
    tid = turn.turn_id
    if turn.model_call_open and open_call is not None:
        usage.add_unfinished_call(w, open_call, "cancelled", stop.reason, prices)
    elif turn.model_call_open:
        w.add(
            ev.ModelCallFinished,
            turn_id=tid,
            step=turn.model_calls_started - 1,
            model=model,
            status="cancelled",
            error=stop.reason,
            correlation_id=tid,
        )
    for call in turn.unfinished_calls():
        _finish_unrun(w, tid, call, stop.reason, (known or {}).get(call.call_id))
    w.transition(SessionStatus.CANCELLED, stop.cause, detail=stop.reason, correlation_id=tid)
    add_turn_finished(w, "cancelled", encoder)


def _finish_unrun(
    w: SessionWriter, turn_id: str, call: ToolCallProgress, reason: str, known: tool_exec.ToolOutcome | None
) -> None:
    if known is not None:
        outcome = known
    elif call.status == "started":  # a crashed worker's call: it may have taken effect
        outcome = tool_exec.interrupted(call.tool_name)
    else:
        outcome = tool_exec.ToolOutcome(
            tool_exec.ToolStatus.CANCELLED,
            f"{tool_exec.MARKERS[tool_exec.ToolStatus.CANCELLED]} {call.tool_name} was not run: {reason}.",
            attempts=0,
            error=reason,
        )
    add_tool_finished(w, turn_id, call, outcome, attempts=call.attempts)


class Rebaser:
    """A SessionWriter's ``rebase``: put a batch that lost the version race on top of the
    user messages and cancel requests that won it, or raise ConcurrencyError."""

    def __init__(
        self,
        agent: Agent,
        reload: Callable[[], Awaitable[SessionState]],
        encoder: snapshots.SnapshotEncoder | None,
    ) -> None:
        self.agent = agent
        self.reload = reload
        self.encoder = encoder

    async def __call__(self, w: SessionWriter, batch: list[ev.Event]) -> list[ev.Event]:
        expected = batch[0].version - 1
        for _ in range(REBASE_ATTEMPTS):
            fresh = await self.reload()
            newer = await w.log.read_session(fresh.session_id, expected)
            slipped = [e for e in newer if e.version <= fresh.version]
            if any(type(e) not in REBASABLE for e in slipped):
                raise ConcurrencyError(fresh.session_id, expected, fresh.version)
            keep = self._keep(fresh, batch, w.boundary)
            rebased = self._reapply(w, fresh, keep)
            if not rebased:
                return rebased
            try:
                await w.log.append(rebased, expected_version=rebased[0].version - 1)
            except ConcurrencyError:
                continue
            return rebased
        sid = batch[0].session_id
        raise ConcurrencyError(sid, expected, await w.log.session_version(sid))

    def _keep(self, fresh: SessionState, batch: list[ev.Event], boundary: int | None) -> list[ev.Event]:
        stop = stop_for(fresh, self.agent)
        if stop is None:
            return batch
        answer = next((i for i, e in enumerate(batch) if isinstance(e, ev.AssistantMessage)), None)
        if answer is None:
            return batch if boundary is None else batch[:boundary]
        # the model's decision was made without the stop: it is never appended, but the call
        # was made and paid for, so its record stays, cancelled, with the provider's usage
        finished = [i for i, e in enumerate(batch[:answer]) if isinstance(e, ev.ModelCallFinished)]
        if not finished:
            raise ConcurrencyError(fresh.session_id, batch[0].version - 1, fresh.version)
        call = batch[finished[-1]]
        assert isinstance(call, ev.ModelCallFinished)
        unused = dataclasses.replace(call, status="cancelled", error=stop.reason)
        return [*batch[: finished[-1]], unused]

    def _reapply(self, w: SessionWriter, fresh: SessionState, keep: list[ev.Event]) -> list[ev.Event]:
        w.state = fresh
        try:
            for event in keep:
                if isinstance(event, ev.SnapshotTaken):
                    if self.encoder is not None:  # the state moved: snapshot the new one
                        step = not event.holds_state  # a restore point stays one where it may
                        snapshots.take(w, self.encoder, correlation_id=event.correlation_id, step=step)
                    continue
                moved = dataclasses.replace(event, version=fresh.version + 1)
                fresh.apply(moved)
                w.queue(moved)
        except (OutOfOrderError, IllegalTransitionError):
            # e.g. our turn would answer a message that is no longer the oldest waiting one
            raise ConcurrencyError(fresh.session_id, keep[0].version - 1, fresh.version) from None
        return w.take_pending()


@dataclass(frozen=True, slots=True)
class Cancelled:
    """What a cancel did, as the log holds it: the request, the turn it stops at that turn's
    next step boundary (None if no turn ran) and the waiting messages it dropped."""

    request: ev.CancelRequested
    stopped_turn: str | None
    dropped: tuple[ev.UserMessageDropped, ...] = ()
    records: tuple[LogRecord, ...] = ()
    """The request's and the drops' records, with their log positions."""

    @property
    def events(self) -> list[ev.Event]:
        return [self.request, *self.dropped]


def check_cancel(state: SessionState) -> None:
    """Raise what a cancel of the session is refused with: it is closed, or there is nothing to
    cancel (no turn runs and no message waits for one)."""
    if state.closed:
        raise SessionClosedError(state.session_id, state.close_reason)
    if state.turn is None and not state.inbox:
        raise NoTurnRunningError(state.session_id, str(state.status))


def add_cancel(w: SessionWriter, reason: str, actor: str, *, event_id: str | None = None) -> Cancelled:
    """The cancel rule, one for whoever applies a cancel (engine.admission: in the process that
    may append, in a Kafka owner admitting one from its inbox): a CancelRequested, which stops the
    running turn (if any) at its next step boundary, then in the same commit a UserMessageDropped
    (reason ``cancelled``) for every message waiting for a turn. A user who presses stop right
    after sending means the message too; one posted after the cancel is not touched. The caller
    checks first (``check_cancel``); an owner admitting a request that finds nothing to do
    writes it anyway (it folds to nothing), and its submitter reads that from the log
    (``cancelled_on_log``).
    ``event_id``: the submitted request's id, kept."""
    turn = w.state.turn
    ids = {"event_id": event_id} if event_id is not None else {}
    request = w.add(ev.CancelRequested, reason=reason, actor=actor, **ids)
    detail = f"cancelled by {actor} before a turn took this message" + (f": {reason}" if reason else "")
    dropped = drop_waiting(w, "cancelled", detail, causation_id=request.event_id)
    return Cancelled(request, turn.turn_id if turn is not None else None, tuple(dropped))


def cancelled_by(records: list[LogRecord], after: SessionState) -> Cancelled:
    """What a cancel appended here did: ``records`` are what it wrote (the request, then its
    drops), ``after`` the session folded with them (a cancel stops a running turn only at the
    turn's next step boundary, so the turn it stops is still the running one)."""
    request = records[0].event
    assert isinstance(request, ev.CancelRequested)
    dropped = tuple(r.event for r in records[1:] if isinstance(r.event, ev.UserMessageDropped))
    turn = after.turn.turn_id if after.turn is not None else None
    return Cancelled(request, turn, dropped, tuple(records))


def cancelled_on_log(state: SessionState, newer: list[LogRecord], request_id: str) -> Cancelled:
    """What a cancel applied by another process (a Kafka owner) did: ``newer`` are the records
    after ``state``, up to the request (``request_id``) and the drops written with it. Raises
    what ``check_cancel`` raises for the session as the cancel found it (nothing to cancel)."""
    at = next(i for i, r in enumerate(newer) if r.event.event_id == request_id)
    request = newer[at].event
    assert isinstance(request, ev.CancelRequested)
    before = fold(state.session_id, [r.event for r in newer[:at]], state)
    check_cancel(before)
    mine = [newer[at]] + [
        r
        for r in newer[at + 1 :]
        if isinstance(r.event, ev.UserMessageDropped) and r.event.causation_id == request_id
    ]
    dropped = tuple(r.event for r in mine[1:] if isinstance(r.event, ev.UserMessageDropped))
    return Cancelled(request, before.turn.turn_id if before.turn is not None else None, dropped, tuple(mine))


def _clip(text: str, limit: int = 80) -> str:
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= limit else one_line[: limit - 1] + "…"


__all__ = [
    "REBASABLE",
    "Cancelled",
    "Rebaser",
    "Stop",
    "add_cancel",
    "cancelled_by",
    "cancelled_on_log",
    "check_cancel",
    "stop_for",
    "stop_turn",
]
