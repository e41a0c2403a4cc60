"""Session snapshots (seed §8): the folded state written to the log, so loading starts there.

After every tool step and at every turn end the turn loop adds a ``SnapshotTaken`` event to the
step's commit; its ``state_json`` is the session state as of the version before it. Loading a
session restores the latest snapshot (``EventLog.latest_snapshot``) and folds only the events
after it, so the cost of loading does not grow with the session's length.

The serialisation is positional JSON (short, fast to parse) and carries a format number.
A keyframe snapshot holds every message; most snapshots are deltas that hold the messages
added since the session's last keyframe and name it (``keyframe_version``), so a snapshot's
size stays bounded on a long session and loading reads at most two snapshots. Format history:

* 1: ``{"s": session fields, "i": inbox, "t": turn with its tool calls, "b": keyframe
  version or 0, "k": messages taken from the keyframe, "m": the other messages}``; field
  order as in the ``*_FIELDS`` tuples below.
* 2: as 1, plus the session's task state and archived count, the turn's memories, recalled
  text, context retries and budget pause, and each message's ``ref`` (context management).

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
from .log.base import EventLog
from .messages import ChatMessage
from .states import SessionStatus
from .tools.guards import CallRecord
from .writer import SessionWriter

FORMAT = 2
DELTA_LIMIT = 128
"""Messages a delta snapshot may carry beyond its keyframe before the next one is a keyframe."""
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
    "cost_micros",
    "superseded",
    "created_ms",
    "updated_ms",
    "task_state",
    "archived",
)
"""SessionState's plain fields; ``messages``, ``inbox`` and ``turn`` are written separately."""
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
    "cost_micros",
    "history",
    "guard",
    "guard_reason",
    "stop_reason",
    "stop_actor",
    "memories",
    "recalled",
    "context_retries",
    "budget_pause",
    "budget_allowance_micros",
)
"""TurnProgress's fields but ``tool_calls``, which follows them as a list in request order;
``history`` (the loop guards' CallRecords) is a list of rows in RECORD_FIELDS order."""
CALL_FIELDS = (
    "call_id",
    "tool_name",
    "arguments_json",
    "status",
    "attempts",
    "iteration",
    "approval",
    "approval_note",
)
RECORD_FIELDS = ("call_id", "tool_name", "arguments_json", "iteration", "status", "result")
_DUMP = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False).encode


def _message(m: ChatMessage) -> str:
    calls = [[c.call_id, c.name, c.arguments_json] for c in m.tool_calls]
    return _DUMP([m.role, m.content, calls, m.tool_call_id, m.name, m.ref])


@dataclass(slots=True)
class _Encoded:
    messages: list[ChatMessage]
    last: ChatMessage | None
    parts: list[str]
    keyframe_version: int = 0
    keyframe_count: int = 0


@dataclass(frozen=True, slots=True)
class Encoded:
    state_json: str
    keyframe_version: int
    """0: ``state_json`` holds every message; else the first ``len(messages) - delta`` messages
    are those of the keyframe snapshot at this version."""


class SnapshotEncoder:
    """Serialises session states for snapshots, cheaply on a long session.

    History is append-only, so each message is encoded once per session (cached), and most
    snapshots are deltas: they carry the messages added since the session's last keyframe
    (a snapshot holding every message) and name that keyframe's version. A keyframe is
    written when the delta would exceed ``delta_limit`` messages, and whenever the encoder
    has no keyframe for the session's current fold (first snapshot, a reloaded state, a cache
    eviction), so a delta never points at a keyframe that was not appended with it or before.
    """

    def __init__(self, cache_size: int = 1024, *, delta_limit: int = DELTA_LIMIT) -> None:
        self._cache: OrderedDict[str, _Encoded] = OrderedDict()
        self._cache_size = cache_size
        self._delta_limit = delta_limit

    def encode(self, state: SessionState, version: int) -> Encoded:
        """The snapshot of ``state`` that will be written as event ``version``."""
        entry = self._entry(state)
        if entry.keyframe_version and len(entry.parts) - entry.keyframe_count <= self._delta_limit:
            base, skip = entry.keyframe_version, entry.keyframe_count
        else:
            base, skip = 0, 0
            entry.keyframe_version, entry.keyframe_count = version, len(entry.parts)
        return Encoded(encode_state(state, entry.parts[skip:], base=base, skip=skip), base)

    def _entry(self, state: SessionState) -> _Encoded:
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
        return cached


def encode_state(state: SessionState, parts: list[str] | None = None, *, base: int = 0, skip: int = 0) -> str:
    """The format-1 text of ``state``; ``parts`` are its encoded messages from index ``skip``
    (all of them, encoded here, when None)."""
    if parts is None:
        parts = [_message(m) for m in state.messages[skip:]]
    turn = state.turn
    doc_turn = (
        None
        if turn is None
        else [
            *(_turn_value(turn, f) for f in TURN_FIELDS),
            [[getattr(c, f) for f in CALL_FIELDS] for c in turn.tool_calls.values()],
        ]
    )
    head = _DUMP(
        {
            "s": [str(state.status) if f == "status" else getattr(state, f) for f in SESSION_FIELDS],
            "i": [[getattr(m, f) for f in INBOX_FIELDS] for m in state.inbox],
            "t": doc_turn,
            "b": base,
            "k": skip,
        }
    )
    return head[:-1] + ',"m":[' + ",".join(parts) + "]}"


def decode_state(
    text: str, state_format: int, *, where: str, base: list[ChatMessage] | None = None
) -> SessionState:
    """The state a snapshot holds; a delta needs ``base``, its keyframe's messages.
    ``where`` names the record in errors."""
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
        state.messages = _inherited(doc, base, where) + [
            ChatMessage(role, content, tuple(ToolCallSpec(*c) for c in calls), call_id, name, ref)
            for role, content, calls, call_id, name, ref in doc["m"]
        ]
        state.turn = None if doc["t"] is None else _turn(doc["t"])
    except (ValueError, KeyError, TypeError) as exc:
        raise SnapshotFormatError(f"{where}: corrupt snapshot: {type(exc).__name__}: {exc}") from exc
    return state


def _inherited(doc: dict[str, Any], base: list[ChatMessage] | None, where: str) -> list[ChatMessage]:
    if not doc["b"]:
        return []
    if base is None or len(base) < doc["k"]:
        raise SnapshotFormatError(
            f"{where}: a delta snapshot needs the {doc['k']} messages of its keyframe v{doc['b']}"
        )
    return base[: doc["k"]]


def _turn_value(turn: TurnProgress, name: str) -> Any:
    if name == "history":
        return [[getattr(r, f) for f in RECORD_FIELDS] for r in turn.history]
    return getattr(turn, name)


def _turn(row: list[Any]) -> TurnProgress:
    *scalars, calls = row
    fields = dict(zip(TURN_FIELDS, scalars, strict=True))
    fields["history"] = [CallRecord(*r) for r in fields["history"]]
    turn = TurnProgress(**fields)
    for call in calls:
        progress = ToolCallProgress(**dict(zip(CALL_FIELDS, call, strict=True)))
        turn.tool_calls[progress.call_id] = progress
    return turn


def restore(snapshot: ev.SnapshotTaken, keyframe: ev.SnapshotTaken | None = None) -> SessionState:
    """The session's state as of ``snapshot.version - 1``; fold the snapshot event and what
    follows it on top. A delta snapshot needs its keyframe (``snapshot.keyframe_version``)."""
    where = f"session {snapshot.session_id} v{snapshot.version}"
    base = None
    if snapshot.keyframe_version:
        if (
            keyframe is None
            or keyframe.session_id != snapshot.session_id
            or keyframe.version != snapshot.keyframe_version
            or keyframe.keyframe_version
        ):
            raise SnapshotFormatError(f"{where}: its keyframe v{snapshot.keyframe_version} is missing")
        base = restore(keyframe).messages
    state = decode_state(snapshot.state_json, snapshot.state_format, where=where, base=base)
    if state.session_id != snapshot.session_id or state.version != snapshot.version - 1:
        raise SnapshotFormatError(
            f"{where}: the snapshot holds session {state.session_id} v{state.version}, "
            f"not v{snapshot.version - 1} of this session"
        )
    return state


async def load_latest(log: EventLog, session_id: str) -> SessionState | None:
    """The state of the session's newest snapshot (two index lookups at most), or None."""
    snapshot = await log.latest_snapshot(session_id)
    if not isinstance(snapshot, ev.SnapshotTaken):
        return None
    keyframe = None
    if snapshot.keyframe_version:
        found = await log.latest_snapshot(session_id, at_or_before=snapshot.keyframe_version)
        keyframe = found if isinstance(found, ev.SnapshotTaken) else None
    return restore(snapshot, keyframe)


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
    encoded = encoder.encode(state, state.version + 1)
    w.add(
        ev.SnapshotTaken,
        state_format=FORMAT,
        status=str(state.status),
        last_tool=last_tool(state),
        turns=state.turns_finished,
        input_tokens=state.input_tokens,
        output_tokens=state.output_tokens,
        message_count=len(state.messages),
        keyframe_version=encoded.keyframe_version,
        state_json=encoded.state_json,
        correlation_id=correlation_id,
    )


__all__ = [
    "FORMAT",
    "Encoded",
    "SnapshotEncoder",
    "decode_state",
    "encode_state",
    "last_tool",
    "load_latest",
    "restore",
    "restore_fork",
    "take",
]
