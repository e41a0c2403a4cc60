"""A recorded session read back as turns: what the user said, which tools were called with which
arguments and what they returned, the final answer, how the turn ended and what it cost. The
tool server serves from it and the comparison compares two of them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .. import events as ev
from ..errors import SessionNotFoundError
from ..log.base import EventLog
from ..states import SessionStatus


@dataclass
class RecordedCall:
    call_id: str
    tool_name: str
    arguments_json: str
    status: str = ""
    """The ToolCallFinished status ("" if the call never finished)."""
    content: str = ""
    output_json: str | None = None
    error: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return self.tool_name, canonical_arguments(self.arguments_json)


@dataclass
class RecordedTurn:
    index: int
    """0 for the session's first turn in the events read (a fork's inherited turns are not)."""
    turn_id: str
    message_id: str
    text: str
    started_version: int
    started_ms: int
    calls: list[RecordedCall] = field(default_factory=list)
    answer: str = ""
    reason: str = ""
    """TurnFinished.reason ("" while the turn has not finished)."""
    errors: list[str] = field(default_factory=list)
    """Why the session went to ERROR in this turn, and failed model calls."""
    guards: list[str] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    cost_micros: int = 0
    model_calls: int = 0
    model_latency_ms: float = 0.0
    finished_ms: int = 0

    @property
    def finished(self) -> bool:
        return bool(self.reason)

    @property
    def wall_ms(self) -> int:
        return max(0, self.finished_ms - self.started_ms) if self.finished else 0


@dataclass
class Recording:
    session_id: str
    agent_id: str
    user_id: str
    model: str
    metadata: dict[str, Any]
    turns: list[RecordedTurn]
    version: int
    status: str
    role: str = "user"

    def turns_after(self, version: int) -> list[RecordedTurn]:
        """The turns started after ``version`` (what a replay from a snapshot there replays)."""
        return [t for t in self.turns if t.started_version > version]

    def turn(self, turn_id: str) -> RecordedTurn | None:
        return next((t for t in self.turns if t.turn_id == turn_id), None)


def canonical_arguments(arguments_json: str) -> str:
    """Arguments as compact JSON with sorted keys (the raw text when it is not JSON), so two calls
    that differ only in key order or spacing are the same call."""
    try:
        value = json.loads(arguments_json) if arguments_json.strip() else {}
    except json.JSONDecodeError:
        return arguments_json
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


async def load_recording(log: EventLog, session_id: str) -> Recording:
    events = await log.read_session(session_id)
    if not events:
        raise SessionNotFoundError(session_id)
    return recording_of(session_id, events)


def recording_of(session_id: str, events: list[ev.Event]) -> Recording:
    """The turns of ``events`` (a session's, oldest first)."""
    head = events[0]
    agent_id = user_id = model = ""
    role = "user"
    metadata: dict[str, Any] = {}
    if isinstance(head, ev.SessionCreated):
        agent_id, user_id, model, role = head.agent_id, head.user_id, head.model, head.role
        metadata = _json_object(head.metadata_json)
    elif isinstance(head, ev.SessionForked):
        agent_id, model = head.agent_id, head.model
    texts: dict[str, str] = {}
    turns: dict[str, RecordedTurn] = {}
    calls: dict[tuple[str, str], RecordedCall] = {}
    status = str(SessionStatus.IDLE)
    for e in events:
        turn = turns.get(e.correlation_id or "")
        if isinstance(e, ev.UserMessageReceived):
            texts[e.message_id] = e.text
            user_id = user_id or e.user_id
        elif isinstance(e, ev.TurnStarted):
            turns[e.turn_id] = RecordedTurn(
                len(turns), e.turn_id, e.message_id, texts.get(e.message_id, ""), e.version, e.time_ms
            )
        elif isinstance(e, ev.StateChanged):
            status = e.to_state
            if turn is not None and e.to_state == SessionStatus.ERROR:
                turn.errors.append(f"{e.cause}: {e.detail}")
        elif turn is not None:
            _apply(turn, calls, e)
    return Recording(
        session_id,
        agent_id,
        user_id,
        model,
        metadata,
        sorted(turns.values(), key=lambda t: t.index),
        events[-1].version,
        status,
        role,
    )


def _apply(turn: RecordedTurn, calls: dict[tuple[str, str], RecordedCall], e: ev.Event) -> None:
    """One event of a running turn."""
    if isinstance(e, ev.ToolCallRequested):
        call = RecordedCall(e.call_id, e.tool_name, e.arguments_json)
        calls[(turn.turn_id, e.call_id)] = call
        turn.calls.append(call)
    elif isinstance(e, ev.ApprovalDecided) and (found := calls.get((turn.turn_id, e.call_id))):
        found.arguments_json = e.arguments_json or found.arguments_json
    elif isinstance(e, ev.ToolCallFinished) and (found := calls.get((turn.turn_id, e.call_id))):
        found.status, found.content, found.output_json, found.error = (
            e.status,
            e.content,
            e.output_json,
            e.error,
        )
    elif isinstance(e, ev.AssistantMessage) and e.text.strip():
        turn.answer = e.text
    elif isinstance(e, ev.ModelCallFinished):
        turn.model_calls += 1
        turn.model_latency_ms += e.latency_ms
        if e.status not in ("ok", "cancelled") and e.error:
            turn.errors.append(f"model {e.status}: {e.error}")
    elif isinstance(e, ev.LoopGuardTriggered):
        turn.guards.append(e.guard)
    elif isinstance(e, ev.TurnFinished):
        turn.reason = e.reason
        turn.input_tokens, turn.output_tokens = e.input_tokens, e.output_tokens
        turn.cost_micros, turn.finished_ms = e.cost_micros, e.time_ms


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
