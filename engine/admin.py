"""Admin tools on the log (seed §8, the design card's "admins replay sessions from snapshots"):
list a session's snapshots, fork a new session from any of them, replay a session read-only.

Nothing here changes an existing session: a fork is a new session whose first event,
``SessionForked``, carries the origin's state at the snapshot and names its origin. A snapshot
taken in the middle of a turn (or with messages waiting) leaves the fork unfinished work, and
the admin says what to do with it (``unfinished``):

* ``continue``: the fork carries the turn on at once (a TurnWorker takes the SessionForked
  record; in-process, ``AgentSessions.run_pending``). A tool call that had started in the
  origin is finished as interrupted in the fork's first commit and never run again there: its
  effect, if any, happened in the origin, and a keyed call's key is the origin's.
* ``rest``: the fork's first commit closes the turn (CANCELLED, cause admin, every open call
  given a result) and drops the waiting messages (``UserMessageDropped``, reason
  ``fork_rest``); the fork waits for a new message.

Continue a fork like any session (``send_user_message`` starts a new turn), e.g. with another
agent and model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import AsyncIterator, Literal

from . import events as ev
from . import interrupts, snapshots
from .crypto.cipher import is_erased_session
from .errors import InputError, SessionErasedError, SessionNotFoundError, SnapshotNotFoundError
from .fold import SessionState, fold
from .log.base import EventLog, LogRecord
from .states import Cause, SessionStatus
from .tools import execute as tool_exec
from .turn_records import add_tool_finished, drop_waiting
from .writer import SessionWriter

Unfinished = Literal["continue", "rest"]
TOOL_STATES = (SessionStatus.TOOL_WAIT, SessionStatus.TOOL_LOOP)


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """What had happened by one snapshot (the state body stays on the log)."""

    session_id: str
    version: int
    status: str
    last_tool: str
    turns: int
    input_tokens: int
    output_tokens: int
    message_count: int
    time_ms: int
    turn_id: str | None


@dataclass(frozen=True, slots=True)
class ReplayStep:
    """One event of a replay and the session as folded up to and including it.

    ``state`` is the replay's own fold, advanced in place by the next step: read it, copy
    what you need, do not change it.
    """

    event: ev.Event
    state: SessionState


class SessionAdmin:
    """What an admin does with a session's history: list its snapshots, fork a new session from
    one of them, and replay it read-only, event by event with the state folded up to each."""

    def __init__(self, log: EventLog, *, producer: str = "admin") -> None:
        self.log = log
        self.producer = producer

    async def snapshots(self, session_id: str) -> list[SnapshotInfo]:
        """Every snapshot of the session, oldest first."""
        events = await self._events(session_id)
        return [_info(e) for e in events if isinstance(e, ev.SnapshotTaken)]

    async def fork(
        self,
        session_id: str,
        version: int,
        *,
        unfinished: Unfinished | None = None,
        new_session_id: str | None = None,
        agent_id: str | None = None,
        model: str | None = None,
    ) -> ev.SessionForked:
        """Start a new session from the snapshot at ``version`` of ``session_id``.

        The fork has the origin's history and state up to the snapshot, its own id, and the
        origin's agent unless ``agent_id`` names another (to continue with another model). A
        snapshot with a turn running or messages waiting needs ``unfinished`` (see the module
        doc); ``fork_events`` returns everything the fork's first commit wrote.
        """
        records = await self.fork_events(
            session_id,
            version,
            unfinished=unfinished,
            new_session_id=new_session_id,
            agent_id=agent_id,
            model=model,
        )
        forked = records[0].event
        assert isinstance(forked, ev.SessionForked)
        return forked

    async def fork_events(
        self,
        session_id: str,
        version: int,
        *,
        unfinished: Unfinished | None = None,
        new_session_id: str | None = None,
        agent_id: str | None = None,
        model: str | None = None,
    ) -> list[LogRecord]:
        """``fork``, returning the records of the SessionForked and of the events that settle
        the inherited unfinished work, appended together (one pending record where another
        process owns the fork's partition: ``EventLog.submit``)."""
        if is_erased_session(self.log, session_id):
            raise SessionErasedError(session_id)
        snapshot = await self._snapshot_at(session_id, version)
        origin = await snapshots.state_before(self.log, snapshot)  # refuses an unreadable one before we write
        pending = _unfinished_work(origin)
        if pending and unfinished not in ("continue", "rest"):
            raise InputError(
                f"the snapshot at v{version} of session {session_id} has {pending}; say what the fork "
                "does with it: unfinished='continue' (carry it on now; calls started in the origin are "
                "not repeated) or unfinished='rest' (close the turn, drop the waiting messages)"
            )
        carry_on = bool(pending) and unfinished == "continue"
        later = await self.log.read_session(session_id, snapshot.version) if carry_on else []
        forked = ev.SessionForked(
            session_id=new_session_id or ev.new_id(),
            version=1,
            producer=self.producer,
            causation_id=snapshot.event_id,
            origin_session_id=session_id,
            origin_version=snapshot.version,
            agent_id=agent_id or origin.agent_id,
            model=model if model is not None else origin.model,
            state_format=snapshots.FORMAT,
            state_json=snapshots.encode_state(origin),  # self-contained: every message
            unfinished=(unfinished or "") if pending else "",
            refs_renumbered=True,
            origin_calls_json=json.dumps(started_after(later, origin)),
        )
        settled: list[ev.Event] = forked_with_settlement(forked) if pending else [forked]
        if len(settled) == 1 or self.log.partition_of(forked.session_id) not in self.log.owned_partitions():
            # through the inbox where another process owns the fork's partition (then version 0):
            # its owner writes the settlement (engine.log.kafka_inbox)
            return await self.log.submit(forked)
        return await self.log.append(settled, expected_version=0)

    async def replay(
        self, session_id: str, *, from_version: int = 0, to_version: int | None = None
    ) -> AsyncIterator[ReplayStep]:
        """The session's events from ``from_version + 1`` on, each with the state it leads to.

        Read-only: folds a private copy and writes nothing.
        """
        state = SessionState(session_id)
        for event in await self._events(session_id):
            if to_version is not None and event.version > to_version:
                return
            state.apply(event)
            if event.version > from_version:
                yield ReplayStep(event, state)

    async def _events(self, session_id: str) -> list[ev.Event]:
        events = await self.log.read_session(session_id)
        if not events:
            raise SessionNotFoundError(session_id)
        return events

    async def _snapshot_at(self, session_id: str, version: int) -> ev.SnapshotTaken:
        """The snapshot at ``version``: one that holds a state (an index lookup) or a restore
        point (the event read at its version)."""
        found = await self.log.latest_snapshot(session_id, at_or_before=version)
        if isinstance(found, ev.SnapshotTaken) and found.version == version:
            return found
        at = await self.log.read_session(session_id, version - 1) if version > 0 else []
        if at and isinstance(at[0], ev.SnapshotTaken) and at[0].version == version:
            return at[0]
        available = [s.version for s in await self.snapshots(session_id)]
        raise SnapshotNotFoundError(session_id, version, available)


def started_after(events: list[ev.Event], origin: SessionState) -> list[dict[str, str]]:
    """The tool calls the origin started in ``events`` (those after a snapshot of ``origin``)
    while answering a message a fork carries on (the running turn's, the waiting ones'), each
    with what it got (SessionForked.origin_calls_json)."""
    carried = {m.message_id for m in origin.inbox}
    answering: dict[str, str] = {}  # turn id -> the message it answers
    arguments: dict[tuple[str, str], tuple[str, str]] = {}  # (turn, call) -> (tool, arguments)
    if origin.turn is not None:
        carried.add(origin.turn.message_id)
        answering[origin.turn.turn_id] = origin.turn.message_id
        for c in origin.turn.tool_calls.values():
            arguments[(origin.turn.turn_id, c.call_id)] = (c.tool_name, c.arguments_json)
    started: dict[tuple[str, str], dict[str, str]] = {}
    for e in events:
        if isinstance(e, ev.TurnStarted):
            answering[e.turn_id] = e.message_id
        elif isinstance(e, ev.ToolCallRequested):
            arguments[(e.turn_id, e.call_id)] = (e.tool_name, e.arguments_json)
        elif isinstance(e, ev.ApprovalDecided):  # the arguments the call runs with
            arguments[(e.turn_id, e.call_id)] = (arguments[(e.turn_id, e.call_id)][0], e.arguments_json)
        elif isinstance(e, ev.ToolCallStarted) and answering.get(e.turn_id) in carried:
            tool_name, args = arguments.get((e.turn_id, e.call_id), (e.tool_name, "{}"))
            row = {"message_id": answering[e.turn_id], "call_id": e.call_id, "tool_name": tool_name}
            started.setdefault((e.turn_id, e.call_id), {**row, "arguments_json": args, "status": "started"})
        elif isinstance(e, ev.ToolCallFinished) and (found := started.get((e.turn_id, e.call_id))):
            found["status"], found["content"] = e.status, e.content
    return [{"content": "", **row} for row in started.values()]


def _unfinished_work(state: SessionState) -> str:
    """What a fork of ``state`` would inherit unfinished, in words ("" if nothing)."""
    parts = []
    if state.turn is not None:
        parts.append(f"turn {state.turn.turn_id} running ({state.status})")
    if state.inbox:
        parts.append(f"{len(state.inbox)} message(s) waiting")
    return " and ".join(parts)


def forked_with_settlement(forked: ev.SessionForked) -> list[ev.Event]:
    """A fork's first commit: its SessionForked and the events that settle what it inherited
    unfinished (written by whoever owns the fork's partition: engine.admission)."""
    w = SessionWriter(None, fold(forked.session_id, [forked]), forked.producer)
    _settle_inherited(w, forked, forked.unfinished == "rest")
    return [forked, *w.take_pending()]


def _settle_inherited(w: SessionWriter, forked: ev.SessionForked, rest: bool) -> None:
    """The fork's own events for what it inherited unfinished: calls started in the origin end
    interrupted (never repeated); to rest, the turn is closed and waiting messages dropped."""
    turn = w.state.turn
    origin = f"session {forked.origin_session_id} (forked at v{forked.origin_version})"
    if rest:
        drop_waiting(w, "fork_rest", f"inherited waiting by a fork of {origin} made to rest; answered there")
    if turn is not None:
        if turn.model_call_open and not rest:  # made (and paid for) in the origin; the fork calls anew
            w.add(
                ev.ModelCallFinished,
                turn_id=turn.turn_id,
                step=turn.model_calls_started - 1,
                model=forked.model,
                status="cancelled",
                error=f"started in {origin}",
                correlation_id=turn.turn_id,
            )
        for call in turn.unfinished_calls():
            if call.status == "started":
                outcome = tool_exec.ToolOutcome(
                    tool_exec.ToolStatus.INTERRUPTED,
                    f"{tool_exec.MARKERS[tool_exec.ToolStatus.INTERRUPTED]} {call.tool_name} was running in "
                    f"{origin} when this fork was made; a fork never repeats a call started in its origin. "
                    "It may or may not have taken effect there.",
                    attempts=0,
                    error=f"started in {origin}",
                )
                add_tool_finished(w, turn.turn_id, call, outcome, attempts=call.attempts)
        if rest:
            stop = interrupts.Stop(f"the fork of {origin} was made to rest", Cause.ADMIN)
            interrupts.stop_turn(w, stop, forked.model, snapshots.SnapshotEncoder())
        elif not turn.unfinished_calls() and w.state.status in TOOL_STATES:
            w.transition(SessionStatus.PROCESSING, Cause.TOOL_RESULT, correlation_id=turn.turn_id)


def _info(e: ev.SnapshotTaken) -> SnapshotInfo:
    return SnapshotInfo(
        e.session_id,
        e.version,
        e.status,
        e.last_tool,
        e.turns,
        e.input_tokens,
        e.output_tokens,
        e.message_count,
        e.time_ms,
        e.correlation_id,
    )


__all__ = ["ReplayStep", "SessionAdmin", "SnapshotInfo", "Unfinished"]
