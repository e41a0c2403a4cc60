"""A session's state as a pure fold of its events.

``fold(events)`` and ``SessionState.apply(event)`` are the only way state is derived; the turn
loop, the worker and recovery all read it from here. Applying checks version continuity and
validates every state change against the transition table.
"""

from __future__ import annotations

import dataclasses
import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from . import events as ev
from .crypto.fields import ERASED_OBJECT, ERASED_TEXT, erased_calls
from .errors import OutOfOrderError
from .messages import ChatMessage, summary_message
from .progress import InboundMessage, ToolCallProgress, TurnProgress
from .snapshot_format import Decoded, decode
from .states import SessionStatus, check_transition
from .tools.guards import CallRecord


@dataclass(slots=True)
class SessionState:
    """A session as its events make it: ``fold`` builds it, the turn loop decides from it.
    Never written to directly; every change is an event."""

    session_id: str
    version: int = 0
    agent_id: str = ""
    user_id: str = ""
    role: str = "user"
    model: str = ""
    status: SessionStatus = SessionStatus.IDLE
    messages: list[ChatMessage] = field(default_factory=list)
    """History in model order: user, assistant (+tool calls), tool results."""
    inbox: deque[InboundMessage] = field(default_factory=deque)
    """User messages received but not yet taken up by a turn, in log order."""
    turn: TurnProgress | None = None
    turns_finished: int = 0
    closed: bool = False
    close_reason: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cost_micros: int = 0
    """Model cost of the whole session, micro-dollars."""
    superseded: dict[str, str] = field(default_factory=dict)
    """call_id -> the later call whose result replaces it (context management may shorten it)."""
    created_ms: int = 0
    updated_ms: int = 0
    task_state: dict[str, Any] = field(default_factory=dict)
    """The agent's structured task state (TaskStateChanged), shown to the model every step."""
    archived: int = 0
    """Messages cut from the context or shortened so far; their originals stay on the log."""
    origin_calls: dict[str, list[CallRecord]] = field(default_factory=dict)
    """A fork's only (SessionForked): for each message it inherited unfinished, the tool calls its
    origin had started answering it after the fork's snapshot. A fork never repeats one of a tool
    that is not idempotent (engine.tools.batch); ``result`` is what the origin got, if anything."""

    @property
    def exists(self) -> bool:
        return self.version > 0

    @property
    def pending_approvals(self) -> list[ToolCallProgress]:
        """Tool calls waiting for the user's decision, in the order the model asked."""
        if self.turn is None:
            return []
        return [c for c in self.turn.tool_calls.values() if c.approval == "pending"]

    def apply(self, event: ev.Event) -> SessionState:
        """Apply the next event in place and return self; refuses gaps and replays."""
        if event.version != self.version + 1:
            raise OutOfOrderError(
                f"session {self.session_id}: event {event.type} has version {event.version}, "
                f"expected {self.version + 1}"
            )
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)
        self.version = event.version
        self.updated_ms = event.time_ms
        return self


def fold(session_id: str, events: Iterable[ev.Event], state: SessionState | None = None) -> SessionState:
    """Fold events (in version order) into a session state, optionally on top of ``state``."""
    current = state if state is not None else SessionState(session_id)
    for event in events:
        current.apply(event)
    return current


def _created(s: SessionState, e: ev.SessionCreated) -> None:
    s.agent_id, s.user_id, s.role, s.model = e.agent_id, e.user_id, e.role, e.model
    s.created_ms = e.time_ms


def _user_message(s: SessionState, e: ev.UserMessageReceived) -> None:
    s.inbox.append(InboundMessage(e.message_id, e.text, e.event_id, e.version))


def _message_dropped(s: SessionState, e: ev.UserMessageDropped) -> None:
    waiting = next((m for m in s.inbox if m.message_id == e.message_id), None)
    if waiting is None:
        raise OutOfOrderError(
            f"session {s.session_id}: UserMessageDropped v{e.version} names {e.message_id}, "
            "which is not a waiting user message"
        )
    s.inbox.remove(waiting)


def _turn_started(s: SessionState, e: ev.TurnStarted) -> None:
    if not s.inbox or s.inbox[0].message_id != e.message_id:
        raise OutOfOrderError(
            f"session {s.session_id}: turn {e.turn_id} answers {e.message_id}, "
            "which is not the oldest waiting user message"
        )
    inbound = s.inbox.popleft()
    s.messages.append(ChatMessage("user", inbound.text, ref=inbound.version))
    s.turn = TurnProgress(e.turn_id, e.message_id, e.version)


def _state_changed(s: SessionState, e: ev.StateChanged) -> None:
    if e.from_state != s.status:
        raise OutOfOrderError(
            f"session {s.session_id}: StateChanged v{e.version} leaves {e.from_state} "
            f"but the session is in {s.status}"
        )
    check_transition(e.from_state, e.to_state, e.cause)
    s.status = SessionStatus(e.to_state)


def _model_started(s: SessionState, e: ev.ModelCallStarted) -> None:
    turn = _turn(s, e)
    turn.model_call_open = True
    turn.model_calls_started += 1


def _model_finished(s: SessionState, e: ev.ModelCallFinished) -> None:
    turn = _turn(s, e)
    turn.model_call_open = False
    turn.model_calls += 1
    turn.input_tokens += e.input_tokens
    turn.output_tokens += e.output_tokens
    s.input_tokens += e.input_tokens
    s.output_tokens += e.output_tokens
    turn.cost_micros += e.cost_micros
    s.cost_micros += e.cost_micros


def _auxiliary_call(s: SessionState, e: ev.AuxiliaryModelCall) -> None:
    s.input_tokens += e.input_tokens
    s.output_tokens += e.output_tokens
    s.cost_micros += e.cost_micros
    turn = s.turn
    if turn is not None and turn.turn_id == e.turn_id:  # the turn's budget counts it too
        turn.input_tokens += e.input_tokens
        turn.output_tokens += e.output_tokens
        turn.cost_micros += e.cost_micros


def _assistant(s: SessionState, e: ev.AssistantMessage) -> None:
    turn = _turn(s, e)
    s.messages.append(ChatMessage("assistant", e.text, e.tool_calls, ref=e.version))
    if e.tool_calls:
        turn.iterations += 1
        turn.tool_calls = {}
    else:
        turn.last_answer = e.text


def _tool_requested(s: SessionState, e: ev.ToolCallRequested) -> None:
    _turn(s, e).tool_calls[e.call_id] = ToolCallProgress(
        e.call_id, e.tool_name, e.arguments_json, iteration=e.iteration
    )


def _tool_started(s: SessionState, e: ev.ToolCallStarted) -> None:
    call = _call(s, e)
    call.status = "started"
    call.attempts = e.attempt
    if e.attempt == 1 or not call.first_started_ms:
        call.first_started_ms = e.time_ms
    call.last_started_ms = e.time_ms


def _tool_finished(s: SessionState, e: ev.ToolCallFinished) -> None:
    call = _call(s, e)
    call.status = e.status
    result = e.output_json if e.output_json is not None else e.content
    _turn(s, e).history.append(
        CallRecord(
            e.call_id, e.tool_name, call.arguments_json, call.iteration, e.status, f"{e.status}:{result}"
        )
    )
    s.messages.append(ChatMessage("tool", e.content, tool_call_id=e.call_id, name=e.tool_name, ref=e.version))


def _approval_requested(s: SessionState, e: ev.ApprovalRequested) -> None:
    _call(s, e).approval = "pending"


def _approval_decided(s: SessionState, e: ev.ApprovalDecided) -> None:
    call = _call(s, e)
    if call.approval != "pending":
        raise OutOfOrderError(f"session {s.session_id}: decision on call {e.call_id}, which awaits none")
    call.approval = e.decision
    call.approval_note = e.note
    call.arguments_json = e.arguments_json


def _guard(s: SessionState, e: ev.LoopGuardTriggered) -> None:
    turn = _turn(s, e)
    turn.guard, turn.guard_reason = e.guard, e.reason


def _superseded(s: SessionState, e: ev.ToolResultSuperseded) -> None:
    s.superseded[e.call_id] = e.superseded_by


def _turn_finished(s: SessionState, e: ev.TurnFinished) -> None:
    s.turn = None
    s.turns_finished += 1


def _closed(s: SessionState, e: ev.SessionClosed) -> None:
    s.closed = True
    s.close_reason = e.reason


def _cancel_requested(s: SessionState, e: ev.CancelRequested) -> None:
    if s.turn is not None:  # a cancel that arrives after its turn ended has nothing to stop
        s.turn.stop_reason = e.reason
        s.turn.stop_actor = e.actor


def _forked(s: SessionState, e: ev.SessionForked) -> None:
    restore_fork(s, e)


def _context_trimmed(s: SessionState, e: ev.ContextTrimmed) -> None:
    removed: set[int] = set()
    shortened: dict[int, str] = {}
    for item in json.loads(e.items_json):
        if item["action"] == "removed":
            removed.add(item["ref"])
        else:
            shortened[item["ref"]] = item["text"]
    # a new list, never edited in place: the snapshot encoder treats history as append-only per list
    s.messages = [
        dataclasses.replace(m, content=shortened[m.ref]) if m.ref in shortened else m
        for m in s.messages
        if m.ref not in removed
    ]
    s.archived += len(removed) + len(shortened)


def _summarized(s: SessionState, e: ev.HistorySummarized) -> None:
    removed = set(json.loads(e.removed_refs_json))
    kept = [m for m in s.messages if m.ref not in removed]
    s.messages = [summary_message(e.summary, e.version), *kept]
    s.archived += len(removed)
    if e.reason == "context_length" and s.turn is not None:
        s.turn.context_retries += 1


def _recalled(s: SessionState, e: ev.HistoryRecalled) -> None:
    _turn(s, e).recalled = e.text


def _memories(s: SessionState, e: ev.MemoriesRetrieved) -> None:
    items = json.loads(e.memories_json)
    _turn(s, e).memories = "\n".join(f"- [{m['tag']}] {m['text']}" for m in items)


def _task_state(s: SessionState, e: ev.TaskStateChanged) -> None:
    s.task_state = json.loads(e.state_json)


def _budget_exceeded(s: SessionState, e: ev.BudgetExceeded) -> None:
    _turn(s, e).budget_pause = e.level


def _budget_decided(s: SessionState, e: ev.BudgetDecided) -> None:
    turn = _turn(s, e)
    if not turn.budget_pause:
        raise OutOfOrderError(f"session {s.session_id}: budget decision v{e.version} with no budget pause")
    turn.budget_pause = ""
    turn.budget_allowance_micros += e.extra_micros


def _erased(s: SessionState, e: ev.SessionErased) -> None:
    """The session's content is gone: a fold made before the erasure keeps none of it (what a
    fold from the log gives now has it erased at each event). Its user stays (metadata)."""
    s.user_id = s.user_id or e.user_id
    s.messages = [_erased_message(m) for m in s.messages]
    for waiting in s.inbox:
        waiting.text = ERASED_TEXT
    s.task_state = {"erased": True} if s.task_state else {}
    s.origin_calls = {}
    if s.turn is not None:
        turn = s.turn
        turn.last_answer = ERASED_TEXT if turn.last_answer else turn.last_answer
        turn.memories = turn.recalled = ""
        turn.history = [
            dataclasses.replace(r, arguments_json=ERASED_OBJECT, result=ERASED_TEXT) for r in turn.history
        ]
        for call in turn.tool_calls.values():
            call.arguments_json, call.approval_note = ERASED_OBJECT, ""


def _erased_message(m: ChatMessage) -> ChatMessage:
    return dataclasses.replace(
        m, content=ERASED_TEXT if m.content else "", tool_calls=erased_calls(m.tool_calls)
    )


def _turn(s: SessionState, e: ev.Event) -> TurnProgress:
    if s.turn is None:
        raise OutOfOrderError(f"session {s.session_id}: {e.type} v{e.version} outside a turn")
    return s.turn


def _call(
    s: SessionState, e: ev.ToolCallStarted | ev.ToolCallFinished | ev.ApprovalRequested | ev.ApprovalDecided
) -> ToolCallProgress:
    call = _turn(s, e).tool_calls.get(e.call_id)
    if call is None:
        raise OutOfOrderError(f"session {s.session_id}: {e.type} for unrequested call {e.call_id}")
    return call


_HANDLERS: dict[type[ev.Event], Callable[[SessionState, Any], None]] = {
    ev.SessionCreated: _created,
    ev.UserMessageReceived: _user_message,
    ev.UserMessageDropped: _message_dropped,
    ev.TurnStarted: _turn_started,
    ev.StateChanged: _state_changed,
    ev.ModelCallStarted: _model_started,
    ev.ModelCallFinished: _model_finished,
    ev.AuxiliaryModelCall: _auxiliary_call,
    ev.AssistantMessage: _assistant,
    ev.ToolCallRequested: _tool_requested,
    ev.ToolCallStarted: _tool_started,
    ev.ToolCallFinished: _tool_finished,
    ev.TurnFinished: _turn_finished,
    ev.SessionClosed: _closed,
    ev.ApprovalRequested: _approval_requested,
    ev.ApprovalDecided: _approval_decided,
    ev.LoopGuardTriggered: _guard,
    ev.ToolResultSuperseded: _superseded,
    ev.CancelRequested: _cancel_requested,
    ev.SessionForked: _forked,
    ev.ContextTrimmed: _context_trimmed,
    ev.HistorySummarized: _summarized,
    ev.HistoryRecalled: _recalled,
    ev.MemoriesRetrieved: _memories,
    ev.TaskStateChanged: _task_state,
    ev.BudgetExceeded: _budget_exceeded,
    ev.BudgetDecided: _budget_decided,
    ev.SessionErased: _erased,
}


def state_from(decoded: Decoded) -> SessionState:
    """The session state a snapshot holds, from its parts (engine.snapshot_format.decode)."""
    state = SessionState(**decoded.fields)
    state.inbox, state.messages, state.turn = decoded.inbox, decoded.messages, decoded.turn
    return state


def restore_fork(state: SessionState, forked: ev.SessionForked) -> None:
    """Fold a SessionForked into an empty state: the origin's state, re-keyed to this session.

    Versions inside it (turn start, inbox arrivals) belong to the origin's numbering, so they
    are reset: everything inherited happened before the fork's first event. With
    ``refs_renumbered`` (every fork written now) the inherited messages, then the waiting ones,
    take the refs -n..-1 in order (``inherited_refs``), so the fork's context events never name
    an inherited message and one of its own alike; older forks keep the origin's refs and their
    waiting messages version 0. A fork is open even if its origin was closed.
    """
    where = f"session {forked.session_id} v{forked.version} (fork of {forked.origin_session_id})"
    if forked.state_json == ERASED_TEXT:  # an erased fork: nothing of its origin's state is left
        origin = SessionState(forked.session_id)
    else:
        origin = state_from(decode(forked.state_json, forked.state_format, where=where))
    for f in dataclasses.fields(SessionState):
        if f.name not in ("session_id", "version"):
            setattr(state, f.name, getattr(origin, f.name))
    state.agent_id, state.model, state.created_ms = forked.agent_id, forked.model, forked.time_ms
    state.closed, state.close_reason = False, ""  # a fork is a new, open session
    renumbered = renumbers(forked)
    refs = inherited_refs(len(state.messages), len(state.inbox)) if renumbered else None
    if refs is not None:
        state.messages = [dataclasses.replace(m, ref=r) for m, r in zip(state.messages, refs, strict=False)]
    for i, message in enumerate(state.inbox):
        message.version = refs[len(state.messages) + i] if refs is not None else 0
    if state.turn is not None:
        state.turn.started_version = 0
    for row in json.loads(forked.origin_calls_json):
        fields = (row["call_id"], row["tool_name"], row["arguments_json"], 0, row["status"], row["content"])
        state.origin_calls.setdefault(row["message_id"], []).append(CallRecord(*fields))


def renumbers(forked: ev.SessionForked) -> bool:
    """Whether the fork's inherited messages take refs below 0 (every fork written now; a fork
    of format 1 too: its messages had no refs, and nothing in it could have named one)."""
    return forked.refs_renumbered or forked.state_format == 1


def inherited_refs(messages: int, waiting: int) -> list[int]:
    """The refs a renumbering fork gives its inherited messages, then its waiting messages."""
    total = messages + waiting
    return list(range(-total, 0))
