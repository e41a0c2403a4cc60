"""Approvals: a tool marked ``requires_approval`` pauses the turn until the user decides.

The turn loop writes ``ApprovalRequested`` per waiting call and moves the session to
PAUSED_FOR_USER; the fold keeps the waiting calls (``SessionState.pending_approvals``). A
decision is one ``ApprovalDecided`` event: approve (run as asked), edit (run with new arguments,
validated again first: bad ones raise InvalidArgumentsError and nothing is written) or reject
(the model gets a ``[DECLINED BY USER]`` result it can explain). The last decision of a batch
moves the session back to TOOL_WAIT/TOOL_LOOP, and the turn continues from exactly there, in
this process or in any worker after a restart, because all of it is on the log.

Not imported by ``turnlog.engine.tools`` itself: it needs the writer and the fold, which import tools.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from .. import events as ev
from ..errors import ApprovalError, InvalidArgumentsError
from ..fold import SessionState, ToolCallProgress
from ..states import Cause, SessionStatus
from ..writer import SessionWriter
from .execute import ToolOutcome, prepare
from .registry import ToolRegistry

Decision = Literal["approve", "edit", "reject"]
_RECORDED = {"approve": "approved", "edit": "edited", "reject": "rejected"}


def add_decision(
    w: SessionWriter,
    registry: ToolRegistry,
    call_id: str,
    decision: Decision,
    *,
    arguments: dict[str, Any] | None = None,
    note: str = "",
    actor: str = "user",
) -> None:
    """Add the decision (and, if it was the last one waiting, the resume transition) to ``w``.

    ``registry`` is the session role's view of the tools. Raises ApprovalError for a call that
    waits for nothing, InvalidArgumentsError for an edit that fails validation."""
    call = _waiting(w.state, call_id)
    if decision not in _RECORDED:
        raise ApprovalError(f"decision must be one of approve, edit, reject; got {decision!r}")
    arguments_json = call.arguments_json
    if decision == "edit":
        if arguments is None:
            raise InvalidArgumentsError(call.tool_name, "an edit needs the new arguments")
        arguments_json = json.dumps(arguments, ensure_ascii=False)
        checked = prepare(registry, call.tool_name, arguments_json)
        if isinstance(checked, ToolOutcome):
            raise InvalidArgumentsError(call.tool_name, checked.error or checked.content)
    _add(w, call, _RECORDED[decision], arguments_json, actor=actor, note=note)


def add_submitted_decision(w: SessionWriter, decided: ev.ApprovalDecided) -> None:
    """A decision a producer checked and submitted through the log's inbox (its edit validated
    against the tools there), as the partition's owner writes it: the same events as
    ``add_decision``, the ApprovalDecided keeping the submitted event's id. Raises ApprovalError
    if the call no longer waits (another decision came first)."""
    call = _waiting(w.state, decided.call_id)
    if decided.decision not in _RECORDED.values():
        raise ApprovalError(f"decision must be one of approved, edited, rejected; got {decided.decision!r}")
    _add(w, call, decided.decision, decided.arguments_json, actor=decided.actor, note=decided.note,
         event_id=decided.event_id)  # fmt: skip


def _waiting(state: SessionState, call_id: str) -> ToolCallProgress:
    waiting = {c.call_id: c for c in state.pending_approvals}
    call = waiting.get(call_id)
    if call is None or state.turn is None:
        names = ", ".join(f"{c.call_id} ({c.tool_name})" for c in waiting.values()) or "none"
        known = state.turn.tool_calls.get(call_id) if state.turn is not None else None
        if known is not None and known.approval not in ("", "pending"):  # a decision came first
            raise ApprovalError(
                f"session {state.session_id}: tool call {call_id!r} ({known.tool_name}) was already "
                f"decided: {known.approval}; it waits for no decision now; waiting: {names}"
            )
        raise ApprovalError(
            f"session {state.session_id}: tool call {call_id!r} is not waiting for approval; waiting: {names}"
        )
    return call


def _add(
    w: SessionWriter,
    call: ToolCallProgress,
    recorded: str,
    arguments_json: str,
    *,
    actor: str,
    note: str,
    event_id: str | None = None,
) -> None:
    assert w.state.turn is not None
    tid = w.state.turn.turn_id
    ids = {"event_id": event_id} if event_id else {}
    w.add(
        ev.ApprovalDecided,
        turn_id=tid,
        call_id=call.call_id,
        decision=recorded,
        arguments_json=arguments_json,
        actor=actor,
        note=note,
        correlation_id=tid,
        **ids,
    )
    if not w.state.pending_approvals:
        back = SessionStatus.TOOL_WAIT if call.iteration <= 1 else SessionStatus.TOOL_LOOP
        detail = f"{call.tool_name}: {recorded}"
        w.transition(back, Cause.USER_APPROVAL, detail=detail, correlation_id=tid)
