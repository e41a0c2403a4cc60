"""How each event changes the read models.

A rule gets the event and its session's in-memory ``sessions`` row (``SessionRow``): it sets or
adds to the row's columns there, and returns its changes to the other tables (``Insert`` and
``Update``, projections/changes.py). The version guard (seed §7.3) lives in
``batch.plan_batch``: a rule runs only for the session's next version.

Two rules keep a batch free to fold and group changes (projections/batch.py): every change
touches only rows of its event's session (``session_id`` in each update's ``where``, and in each
inserted row), and nothing reads another table. So only changes of the same session and table
depend on each other, in the order the rules made them.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Callable

from turnlog.engine import events as ev
from turnlog.engine.models.base import estimate_tokens
from turnlog.engine.states import SessionStatus

from .changes import Change, Insert, insert, update
from .session_row import SessionRow
from .snapshot_rows import session_forked, snapshot_taken


def utc_day(time_ms: int) -> str:
    """The UTC calendar day of an event time, as YYYY-MM-DD (costs are summed per day)."""
    return dt.datetime.fromtimestamp(time_ms / 1000, dt.UTC).date().isoformat()


def _created(e: ev.SessionCreated, row: SessionRow) -> list[Change]:
    row.create(
        {
            "session_id": e.session_id,
            "user_id": e.user_id,
            "agent_id": e.agent_id,
            "role": e.role,
            "model_name": e.model,
            "current_state": str(SessionStatus.IDLE),
            "start_time_ms": e.time_ms,
        },
        e.version,
    )
    return []


def _message(
    e: ev.Event,
    row: SessionRow,
    message_id: str,
    role: str,
    content: str,
    *,
    turn_id: str | None = None,
    tool_calls_json: str | None = None,
    tool_call_id: str | None = None,
    tool_name: str | None = None,
) -> Insert:
    tokens = estimate_tokens(content) + (estimate_tokens(tool_calls_json) if tool_calls_json else 0)
    return insert(
        "messages",
        session_id=e.session_id,
        seq=row.next_message_seq(),
        message_id=message_id,
        role=role,
        content=content,
        tool_calls_json=tool_calls_json,
        tool_call_id=tool_call_id,
        tool_name=tool_name,
        token_count=tokens,
        turn_id=turn_id,
        version=e.version,
        created_at_ms=e.time_ms,
    )


def _user_message(e: ev.UserMessageReceived, row: SessionRow) -> list[Change]:
    return [_message(e, row, e.message_id, "user", e.text)]


def _assistant(e: ev.AssistantMessage, row: SessionRow) -> list[Change]:
    calls = (
        json.dumps(
            [{"id": c.call_id, "name": c.name, "arguments": c.arguments_json} for c in e.tool_calls],
            ensure_ascii=False,
        )
        if e.tool_calls
        else None
    )
    return [_message(e, row, e.message_id, "assistant", e.text, turn_id=e.turn_id, tool_calls_json=calls)]


def _turn_started(e: ev.TurnStarted, row: SessionRow) -> list[Change]:
    return [
        insert(
            "turns",
            session_id=e.session_id,
            turn_id=e.turn_id,
            message_id=e.message_id,
            started_at_ms=e.time_ms,
        )
    ]


def _state_changed(e: ev.StateChanged, row: SessionRow) -> list[Change]:
    row.set(current_state=e.to_state)
    return [
        insert(
            "state_changes",
            session_id=e.session_id,
            version=e.version,
            from_state=e.from_state,
            to_state=e.to_state,
            cause=e.cause,
            detail=e.detail,
            at_ms=e.time_ms,
        )
    ]


def _model_started(e: ev.ModelCallStarted, row: SessionRow) -> list[Change]:
    return [
        # a call still "running" when the next one starts was cut off by a crashed worker
        update("model_calls", _turn(e) | {"status": "running"}, status="abandoned"),
        insert(
            "model_calls",
            **_turn(e),
            step=e.step,
            model_name=e.model,
            status="running",
            message_count=e.message_count,
            estimated_input_tokens=e.estimated_input_tokens,
            day=utc_day(e.time_ms),
            started_at_ms=e.time_ms,
        ),
    ]


def _model_finished(e: ev.ModelCallFinished, row: SessionRow) -> list[Change]:
    row.add(input_tokens=e.input_tokens, output_tokens=e.output_tokens, cost_micros=e.cost_micros)
    return [
        update(
            "model_calls",
            _turn(e) | {"step": e.step},
            model_name=e.model,
            status=e.status,
            input_tokens=e.input_tokens,
            output_tokens=e.output_tokens,
            cached_input_tokens=e.cached_input_tokens,
            cost_micros=e.cost_micros,
            estimated=int(e.estimated),
            latency_ms=e.latency_ms,
            finish_reason=e.finish_reason,
            error=e.error,
            finished_at_ms=e.time_ms,
        )
    ]


def _turn(e: ev.Event) -> dict[str, Any]:
    """The key of a turn's rows: the session and the event's turn."""
    return {"session_id": e.session_id, "turn_id": e.turn_id}  # type: ignore[attr-defined]


def _call(e: ev.Event) -> dict[str, Any]:
    """The key of a tool_calls row: the session, the turn and the call."""
    return _turn(e) | {"call_id": e.call_id}  # type: ignore[attr-defined]


def _tool_requested(e: ev.ToolCallRequested, row: SessionRow) -> list[Change]:
    return [
        insert(
            "tool_calls",
            **_call(e),
            tool_name=e.tool_name,
            iteration=e.iteration,
            input_json=e.arguments_json,
            status="requested",
            created_at_ms=e.time_ms,
            updated_at_ms=e.time_ms,
        )
    ]


def _tool_started(e: ev.ToolCallStarted, row: SessionRow) -> list[Change]:
    return [update("tool_calls", _call(e), status="executing", attempts=e.attempt, updated_at_ms=e.time_ms)]


def _tool_finished(e: ev.ToolCallFinished, row: SessionRow) -> list[Change]:
    message = _message(
        e,
        row,
        e.event_id,
        "tool",
        e.content,
        turn_id=e.turn_id,
        tool_call_id=e.call_id,
        tool_name=e.tool_name,
    )
    return [
        message,
        update(
            "tool_calls",
            _call(e),
            status=e.status,
            output_json=e.output_json,
            content=e.content,
            error=e.error,
            attempts=e.attempts,
            elapsed_time_ms=e.elapsed_ms,
            updated_at_ms=e.time_ms,
        ),
    ]


def _turn_finished(e: ev.TurnFinished, row: SessionRow) -> list[Change]:
    row.add(turns=1)
    return [
        update(
            "turns",
            _turn(e),
            outcome=e.reason,
            iterations=e.iterations,
            model_calls=e.model_calls,
            input_tokens=e.input_tokens,
            output_tokens=e.output_tokens,
            finished_at_ms=e.time_ms,
        )
    ]


def _closed(e: ev.SessionClosed, row: SessionRow) -> list[Change]:
    row.set(closed=True, close_reason=e.reason, closed_at_ms=e.time_ms)
    return []


def _erased(e: ev.SessionErased, row: SessionRow) -> list[Change]:
    """The rows' content is refolded by the erasure itself (projections/erasure.py); the user is
    set again for an erased fork, whose user was in its (erased) state."""
    if e.user_id:
        row.set(user_id=e.user_id)
    return []


def _approval_requested(e: ev.ApprovalRequested, row: SessionRow) -> list[Change]:
    return [
        update(
            "tool_calls", _call(e), status="awaiting_approval", approval="pending", updated_at_ms=e.time_ms
        )
    ]


def _approval_decided(e: ev.ApprovalDecided, row: SessionRow) -> list[Change]:
    return [
        update(
            "tool_calls",
            _call(e),
            status="requested",
            approval=e.decision,
            approved_json=e.arguments_json,
            updated_at_ms=e.time_ms,
        )
    ]


def _guard(e: ev.LoopGuardTriggered, row: SessionRow) -> list[Change]:
    return [update("turns", _turn(e), guard=e.guard, guard_reason=e.reason)]


def _superseded(e: ev.ToolResultSuperseded, row: SessionRow) -> list[Change]:
    return [update("tool_calls", _call(e), superseded_by=e.superseded_by)]


def _invoked(e: ev.ToolInvoked, row: SessionRow) -> list[Change]:
    """A direct invocation is a tool call without a turn (turn_id '', iteration 0)."""
    return [
        insert(
            "tool_calls",
            session_id=e.session_id,
            call_id=e.call_id,
            turn_id="",
            tool_name=e.tool_name,
            iteration=0,
            input_json=e.arguments_json,
            status=e.status,
            output_json=e.output_json,
            content=e.content,
            error=e.error,
            attempts=e.attempts,
            elapsed_time_ms=e.elapsed_ms,
            invoked_by=e.actor,
            created_at_ms=e.time_ms,
            updated_at_ms=e.time_ms,
        )
    ]


def _archived(e: ev.Event, refs_and_reasons: list[tuple[int, str]]) -> list[Change]:
    """The messages cut from the model's context (the archive, seed §3.2): each row keeps its
    content and says which event cut it and why; ``refs`` are the messages' own versions."""
    return [
        update(
            "messages",
            {"session_id": e.session_id, "version": ref},
            archived_by=e.version,
            archive_reason=reason,
        )
        for ref, reason in refs_and_reasons
    ]


def _context_trimmed(e: ev.ContextTrimmed, row: SessionRow) -> list[Change]:
    items = json.loads(e.items_json)
    return _archived(e, [(i["ref"], f"{i['action']}: {i['reason']}") for i in items])


def _history_summarized(e: ev.HistorySummarized, row: SessionRow) -> list[Change]:
    return _archived(e, [(ref, f"summarized: {e.reason}") for ref in json.loads(e.removed_refs_json)])


# -- the engine's own model calls (summaries, memory extraction): rows of model_calls too, so
# cost per session, user and day is the sum over every call; ``step`` is minus the event's
# version (unique, and apart from the turn's steps), ``purpose`` says what the call was for.


def _auxiliary_call(e: ev.AuxiliaryModelCall, row: SessionRow) -> list[Change]:
    row.add(input_tokens=e.input_tokens, output_tokens=e.output_tokens, cost_micros=e.cost_micros)
    return [
        insert(
            "model_calls",
            **_turn(e),
            step=-e.version,
            model_name=e.model,
            status=e.status,
            message_count=0,
            input_tokens=e.input_tokens,
            output_tokens=e.output_tokens,
            cached_input_tokens=e.cached_input_tokens,
            cost_micros=e.cost_micros,
            day=utc_day(e.time_ms),
            latency_ms=e.latency_ms,
            error=e.error or None,
            started_at_ms=e.time_ms,
            finished_at_ms=e.time_ms,
            purpose=e.purpose,
            estimated=int(e.estimated),
        )
    ]


Rule = Callable[[Any, SessionRow], list[Change]]

_RULES: dict[type[ev.Event], Rule] = {
    ev.SessionCreated: _created,
    ev.SessionForked: session_forked,
    ev.UserMessageReceived: _user_message,
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
    ev.SessionErased: _erased,
    ev.ApprovalRequested: _approval_requested,
    ev.ApprovalDecided: _approval_decided,
    ev.LoopGuardTriggered: _guard,
    ev.ToolResultSuperseded: _superseded,
    ev.ToolInvoked: _invoked,
    ev.ContextTrimmed: _context_trimmed,
    ev.HistorySummarized: _history_summarized,
    ev.SnapshotTaken: snapshot_taken,
}

CREATING = (ev.SessionCreated, ev.SessionForked)
"""The events that start a session's row (version 1 of a new or a forked session)."""


def changes_for(event: ev.Event, row: SessionRow) -> list[Change]:
    """Apply ``event`` to its session's in-memory ``row``; return its changes to the other tables.

    Events without a rule (memory, context, budget events ...) only advance the row's version.
    """
    rule = _RULES.get(type(event))
    return rule(event, row) if rule is not None else []
