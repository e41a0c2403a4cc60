"""Session snapshots (seed §8): the folded state written to the log, so loading starts there.

After every tool step and at every turn end the turn loop adds a ``SnapshotTaken`` event to the
step's commit; its ``state_json`` is the session state as of the version before it. Loading a
session restores the latest snapshot (``EventLog.latest_snapshot``) and folds only the events
after it, so the cost of loading does not grow with the session's length.

The serialisation is positional JSON (short, fast to parse) and carries a format number.
Format history:

* 1: session scalars, inbox, turn (with its tool calls), messages; field order as in the
  ``*_FIELDS`` tuples below.

A reader refuses formats it does not know (``SnapshotFormatError``); the loader then folds from
the start, which is always correct. Changing a field of ``SessionState``, ``TurnProgress``,
``ToolCallProgress`` or ``InboundMessage`` means a new format number (tests/test_snapshots.py
holds the current layout and fails when a dataclass drifts from it).
"""

from __future__ import annotations

import dataclasses
import json
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

from . import events as ev
from .errors import SnapshotFormatError
from .events import ToolCallSpec
from .fold import InboundMessage, SessionState, ToolCallProgress, TurnProgress
from .messages import ChatMessage
from .states import SessionStatus
from .writer import SessionWriter

FORMAT = 1
SESSION_FIELDS = (
    "session_id",
    "version",
    "agent_id",
    "user_id",
    "role",
    "model",
    "status",
    "turns_finished",
    "closed",
    "close_reason",
    "input_tokens",
    "output_tokens",
    "created_ms",
    "updated_ms",
)
"""SessionState's scalar fields; ``messages``, ``inbox`` and ``turn`` are written separately."""
INBOX_FIELDS = ("message_id", "text", "event_id", "version")
TURN_FIELDS = (
    "turn_id",
    "message_id",
    "started_version",
    "iterations",
    "model_calls",
    "model_calls_started",
    "model_call_open",
    "last_answer",
    "input_tokens",
    "output_tokens",
    "stop_reason",
    "stop_actor",
)
"""TurnProgress's scalar fields; ``tool_calls`` follows them as a list in request order."""
CALL_FIELDS = ("call_id", "tool_name", "arguments_json", "status", "attempts")
_DUMP = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False).encode


def _message(m: ChatMessage) -> str:
    calls = [[c.call_id, c.name, c.arguments_json] for c in m.tool_calls]
    return _DUMP([m.role, m.content, calls, m.tool_call_id, m.name])


@dataclass(slots=True)
class _Encoded:
    messages: list[ChatMessage]
    last: ChatMessage | None
    parts: list[str]


class SnapshotEncoder:
    """Serialises session states, re-encoding only the messages added since the last snapshot
    of the same session (history is append-only), so a snapshot of a long session costs a
    string join, not a walk over every message object."""

    def __init__(self, cache_size: int = 1024) -> None:
        self._cache: OrderedDict[str, _Encoded] = OrderedDict()
        self._cache_size = cache_size

    def encode(self, state: SessionState) -> str:
        parts = self._message_parts(state)
        turn = state.turn
        doc_turn = (
            None
            if turn is None
            else [
                *(getattr(turn, f) for f in TURN_FIELDS),
                [[getattr(c, f) for f in CALL_FIELDS] for c in turn.tool_calls.values()],
            ]
        )
        head = _DUMP(
            {
                "s": [str(state.status) if f == "status" else getattr(state, f) for f in SESSION_FIELDS],
                "i": [[getattr(m, f) for f in INBOX_FIELDS] for m in state.inbox],
                "t": doc_turn,
            }
        )
        return head[:-1] + ',"m":[' + ",".join(parts) + "]}"

    def _message_parts(self, state: SessionState) -> list[str]:
        messages = state.messages
        cached = self._cache.pop(state.session_id, None)
        n = len(cached.parts) if cached is not None else 0
        if (
            cached is None
            or cached.messages is not messages
            or len(messages) < n
            or (n and messages[n - 1] is not cached.last)
        ):
            cached, n = _Encoded(messages, None, []), 0
        cached.parts.extend(_message(m) for m in messages[n:])
        cached.last = messages[-1] if messages else None
        self._cache[state.session_id] = cached
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return cached.parts


def decode_state(text: str, state_format: int, *, where: str) -> SessionState:
    """The state a snapshot holds; ``where`` names the record in errors."""
    if state_format != FORMAT:
        raise SnapshotFormatError(
            f"{where}: snapshot format {state_format} is not one this turnlog reads (it reads {FORMAT}); "
            "upgrade turnlog. Loading folds the session from its first event instead."
        )
    try:
        doc = json.loads(text)
        scalars = dict(zip(SESSION_FIELDS, doc["s"], strict=True))
        scalars["status"] = SessionStatus(scalars["status"])
        state = SessionState(**scalars)
        state.inbox = deque(InboundMessage(*row) for row in doc["i"])
        state.messages = [
            ChatMessage(role, content, tuple(ToolCallSpec(*c) for c in calls), call_id, name)
            for role, content, calls, call_id, name in doc["m"]
        ]
        state.turn = None if doc["t"] is None else _turn(doc["t"])
    except (ValueError, KeyError, TypeError) as exc:
        raise SnapshotFormatError(f"{where}: corrupt snapshot: {type(exc).__name__}: {exc}") from exc
    return state


def _turn(row: list[Any]) -> TurnProgress:
    *scalars, calls = row
    turn = TurnProgress(**dict(zip(TURN_FIELDS, scalars, strict=True)))
    for call in calls:
        progress = ToolCallProgress(**dict(zip(CALL_FIELDS, call, strict=True)))
        turn.tool_calls[progress.call_id] = progress
    return turn


def restore(snapshot: ev.SnapshotTaken) -> SessionState:
    """The session's state as of ``snapshot.version - 1``; fold the snapshot event and what
    follows it on top."""
    where = f"session {snapshot.session_id} v{snapshot.version}"
    state = decode_state(snapshot.state_json, snapshot.state_format, where=where)
    if state.session_id != snapshot.session_id or state.version != snapshot.version - 1:
        raise SnapshotFormatError(
            f"{where}: the snapshot holds session {state.session_id} v{state.version}, "
            f"not v{snapshot.version - 1} of this session"
        )
    return state


def restore_fork(state: SessionState, forked: ev.SessionForked) -> None:
    """Fold a SessionForked into an empty state: the origin's state, re-keyed to this session.

    Versions inside it (turn start, inbox arrivals) belong to the origin's numbering, so they
    are reset to 0: everything inherited happened before the fork's first event. A fork is
    open even if its origin was closed.
    """
    where = f"session {forked.session_id} v{forked.version} (fork of {forked.origin_session_id})"
    origin = decode_state(forked.state_json, forked.state_format, where=where)
    for f in dataclasses.fields(SessionState):
        if f.name not in ("session_id", "version"):
            setattr(state, f.name, getattr(origin, f.name))
    state.agent_id, state.model, state.created_ms = forked.agent_id, forked.model, forked.time_ms
    state.closed, state.close_reason = False, ""  # a fork is a new, open session
    for message in state.inbox:
        message.version = 0
    if state.turn is not None:
        state.turn.started_version = 0


def last_tool(state: SessionState) -> str:
    """Name of the last tool result of the current (or just finished) turn, "" if none."""
    for message in reversed(state.messages):
        if message.role == "user":
            return ""
        if message.role == "tool":
            return message.name or ""
    return ""


def take(w: SessionWriter, encoder: SnapshotEncoder, *, correlation_id: str | None = None) -> None:
    """Add a SnapshotTaken of the writer's state (as of its last event) to the pending batch."""
    state = w.state
    w.add(
        ev.SnapshotTaken,
        state_format=FORMAT,
        status=str(state.status),
        last_tool=last_tool(state),
        turns=state.turns_finished,
        input_tokens=state.input_tokens,
        output_tokens=state.output_tokens,
        message_count=len(state.messages),
        state_json=encoder.encode(state),
        correlation_id=correlation_id,
    )


__all__ = [
    "FORMAT",
    "SnapshotEncoder",
    "decode_state",
    "last_tool",
    "restore",
    "restore_fork",
    "take",
]
