"""The snapshot format: how a session's folded state is laid out in a ``SnapshotTaken``'s
``state_json``, and how it is read back.

The layout is positional JSON (short, fast to parse) under a format number; every format this
turnlog ever wrote is read (``READS``), and the fields a format lacks take their defaults. The
formats, and what each one added, are listed in docs/architecture.md ("Snapshot formats").
Reading returns the state's parts (``Decoded``), not a ``SessionState``: the fold reads a fork's
state through here, so this module must not import the fold, which builds the state from them.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from typing import Any

from .crypto.fields import ERASED_TEXT
from .errors import SnapshotFormatError
from .events import ToolCallSpec
from .messages import ChatMessage
from .progress import InboundMessage, ToolCallProgress, TurnProgress
from .states import SessionStatus
from .tools.guards import CallRecord

FORMAT = 6
"""The format written now. Changing a field of ``SessionState``, ``TurnProgress``,
``ToolCallProgress`` or ``InboundMessage`` means a new one (tests/test_snapshots.py holds the
current layout and fails when a dataclass drifts from it)."""
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
    "origin_calls",
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
    "first_started_ms",
    "last_started_ms",
)
RECORD_FIELDS = ("call_id", "tool_name", "arguments_json", "iteration", "status", "result")


@dataclass(frozen=True, slots=True)
class Layout:
    """What one snapshot format holds: its session and turn fields, in order, and whether each
    message row ends with its ref."""

    session: tuple[str, ...]
    turn: tuple[str, ...]
    refs: bool
    chained: bool = False
    """A delta builds on the previous snapshot of its chain (``"p"``), not on its keyframe."""
    history_chained: bool = False
    """A delta's turn history starts with the first ``"h"`` records of the previous snapshot's."""
    call: tuple[str, ...] = CALL_FIELDS
    """A tool call's fields, in order."""


_CALLS_5 = CALL_FIELDS[:8]
"""A tool call's fields up to format 5 (no start times)."""
READS = {
    1: Layout(SESSION_FIELDS[:16], TURN_FIELDS[:16], refs=False, call=_CALLS_5),
    2: Layout(SESSION_FIELDS[:18], TURN_FIELDS, refs=True, call=_CALLS_5),
    3: Layout(SESSION_FIELDS, TURN_FIELDS, refs=True, call=_CALLS_5),
    4: Layout(SESSION_FIELDS, TURN_FIELDS, refs=True, chained=True, call=_CALLS_5),
    5: Layout(SESSION_FIELDS, TURN_FIELDS, refs=True, chained=True, history_chained=True, call=_CALLS_5),
    FORMAT: Layout(SESSION_FIELDS, TURN_FIELDS, refs=True, chained=True, history_chained=True),
}
"""Every format this turnlog reads."""


@dataclass(slots=True)
class Decoded:
    """What a snapshot holds: ``SessionState``'s plain fields by name, and its inbox, history
    and turn (engine.fold.state_from makes the state of them)."""

    fields: dict[str, Any]
    inbox: deque[InboundMessage]
    messages: list[ChatMessage]
    turn: TurnProgress | None


def decode(
    text: str,
    state_format: int,
    *,
    where: str,
    base: list[ChatMessage] | None = None,
    base_version: int | None = None,
    base_turn: TurnProgress | None = None,
) -> Decoded:
    """The parts of the state a snapshot holds; a delta needs ``base``, the messages of the snapshot it
    builds on (its keyframe; from format 4 the previous snapshot of its chain), which is at
    ``base_version`` when given (checked), and from format 5 that snapshot's turn
    (``base_turn``) when it keeps some of its history. ``where`` names the record in errors.
    Format 1 messages get ref 0 (engine.snapshots.load_latest gives them theirs)."""
    if text == ERASED_TEXT:
        raise SnapshotFormatError(f"{where}: the snapshot's content was erased (its session's key is gone)")
    layout = READS.get(state_format)
    if layout is None:
        raise SnapshotFormatError(
            f"{where}: snapshot format {state_format} is not one this turnlog reads (it reads "
            f"{', '.join(map(str, READS))}); upgrade turnlog. Loading folds the session from its first "
            "event instead."
        )
    try:
        doc = json.loads(text)
        scalars = dict(zip(layout.session, doc["s"], strict=True))
        scalars["status"] = SessionStatus(scalars["status"])
        if "origin_calls" in scalars:
            scalars["origin_calls"] = {
                mid: [CallRecord(*r) for r in rows] for mid, rows in scalars["origin_calls"].items()
            }
        inbox = deque(InboundMessage(*row) for row in doc["i"])
        own = [_decode_message(row, layout.refs) for row in doc["m"]]
        messages = _inherited(doc, base, base_version, layout, where) + own
        turn = None if doc["t"] is None else _turn(doc["t"], layout)
        if layout.history_chained and doc["h"]:
            _inherit_history(turn, doc["h"], base_turn, where)
    except (ValueError, KeyError, TypeError) as exc:
        raise SnapshotFormatError(f"{where}: corrupt snapshot: {type(exc).__name__}: {exc}") from exc
    return Decoded(scalars, inbox, messages, turn)


def _inherited(
    doc: dict[str, Any], base: list[ChatMessage] | None, base_version: int | None, layout: Layout, where: str
) -> list[ChatMessage]:
    if not doc["b"]:
        return []
    on = doc["p"] if layout.chained else doc["b"]
    what = "the previous snapshot of its chain" if layout.chained else "its keyframe"
    if base is None or len(base) < doc["k"] or (base_version is not None and base_version != on):
        raise SnapshotFormatError(f"{where}: a delta snapshot needs the {doc['k']} messages of {what} v{on}")
    return base[: doc["k"]]


def _inherit_history(turn: TurnProgress | None, kept: int, base: TurnProgress | None, where: str) -> None:
    """Put the first ``kept`` history records of the previous snapshot's turn (``base``) before
    the ones this delta holds; refused unless that snapshot was of the same turn and had them."""
    if turn is None or base is None or base.turn_id != turn.turn_id or len(base.history) < kept:
        raise SnapshotFormatError(
            f"{where}: a delta snapshot needs the {kept} tool calls of its turn in the previous "
            "snapshot of its chain"
        )
    turn.history = base.history[:kept] + turn.history


def _decode_message(row: list[Any], with_ref: bool) -> ChatMessage:
    role, content, calls, call_id, name, *ref = row
    if len(ref) != int(with_ref):
        raise ValueError(f"a message row of {len(row)} fields")
    return ChatMessage(role, content, tuple(ToolCallSpec(*c) for c in calls), call_id, name, *ref)


def _turn(row: list[Any], layout: Layout) -> TurnProgress:
    *scalars, calls = row
    fields = dict(zip(layout.turn, scalars, strict=True))
    fields["history"] = [CallRecord(*r) for r in fields["history"]]
    turn = TurnProgress(**fields)
    for call in calls:
        progress = ToolCallProgress(**dict(zip(layout.call, call, strict=True)))
        turn.tool_calls[progress.call_id] = progress
    return turn


compact_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False).encode
"""JSON as the snapshots write it: compact, not ASCII-escaped."""


def message_row(m: ChatMessage) -> str:
    """A history message as its snapshot row (JSON text)."""
    calls = [[c.call_id, c.name, c.arguments_json] for c in m.tool_calls]
    return compact_json([m.role, m.content, calls, m.tool_call_id, m.name, m.ref])


__all__ = ["FORMAT", "READS", "Decoded", "Layout", "compact_json", "decode", "message_row"]
