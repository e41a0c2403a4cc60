"""How each event changes the read models: event -> SQL statements (``?`` placeholders).

The version guard (seed §7.3) lives in ProjectionStore.apply: an event is applied only if it
is the session's next version; a replayed one is skipped, a gap is refused.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Callable

from engine import events as ev
from engine.models.base import estimate_tokens
from engine.states import SessionStatus

Statement = tuple[str, tuple[Any, ...]]


def utc_day(time_ms: int) -> str:
    """The UTC calendar day of an event time, as YYYY-MM-DD (costs are summed per day)."""
    return dt.datetime.fromtimestamp(time_ms / 1000, dt.UTC).date().isoformat()


def session_update(
    event: ev.Event, *, values: dict[str, Any] | None = None, increments: dict[str, int] | None = None
) -> Statement:
    """Advance sessions.state_version with the optimistic lock of seed §7.3.

    ``values`` set columns; ``increments`` add to them. Both are bound parameters.
    """
    values = values or {}
    increments = increments or {}
    sets = "".join(f", {name} = ?" for name in values)
    sets += "".join(f", {name} = {name} + ?" for name in increments)
    return (
        f"UPDATE sessions SET state_version = ?, update_time_ms = ?{sets} "
        "WHERE session_id = ? AND state_version = ?",
        (
            event.version,
            event.time_ms,
            *values.values(),
            *increments.values(),
            event.session_id,
            event.version - 1,
        ),
    )


def _created(e: ev.SessionCreated) -> list[Statement]:
    return [
        (
            "INSERT INTO sessions (session_id, user_id, agent_id, role, model_name, current_state, "
            "state_version, "
            "start_time_ms, update_time_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                e.session_id,
                e.user_id,
                e.agent_id,
                e.role,
                e.model,
                str(SessionStatus.IDLE),
                e.version,
                e.time_ms,
                e.time_ms,
            ),
        )
    ]


def _message(
    e: ev.Event,
    message_id: str,
    role: str,
    content: str,
    *,
    turn_id: str | None = None,
    tool_calls_json: str | None = None,
    tool_call_id: str | None = None,
    tool_name: str | None = None,
) -> list[Statement]:
    tokens = estimate_tokens(content) + (estimate_tokens(tool_calls_json) if tool_calls_json else 0)
    return [
        session_update(e, increments={"message_count": 1}),
        (
            "INSERT INTO messages (session_id, seq, message_id, role, content, tool_calls_json, "
            "tool_call_id, "
            "tool_name, token_count, turn_id, version, created_at_ms) "
            "SELECT ?, message_count, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? FROM sessions WHERE session_id = ?",
            (
                e.session_id,
                message_id,
                role,
                content,
                tool_calls_json,
                tool_call_id,
                tool_name,
                tokens,
                turn_id,
                e.version,
                e.time_ms,
                e.session_id,
            ),
        ),
    ]


def _user_message(e: ev.UserMessageReceived) -> list[Statement]:
    return _message(e, e.message_id, "user", e.text)


def _assistant(e: ev.AssistantMessage) -> list[Statement]:
    calls = (
        json.dumps(
            [{"id": c.call_id, "name": c.name, "arguments": c.arguments_json} for c in e.tool_calls],
            ensure_ascii=False,
        )
        if e.tool_calls
        else None
    )
    return _message(e, e.message_id, "assistant", e.text, turn_id=e.turn_id, tool_calls_json=calls)


def _turn_started(e: ev.TurnStarted) -> list[Statement]:
    return [
        session_update(e),
        (
            "INSERT INTO turns (session_id, turn_id, message_id, started_at_ms) VALUES (?, ?, ?, ?)",
            (e.session_id, e.turn_id, e.message_id, e.time_ms),
        ),
    ]


def _state_changed(e: ev.StateChanged) -> list[Statement]:
    return [
        session_update(e, values={"current_state": e.to_state}),
        (
            "INSERT INTO state_changes (session_id, version, from_state, to_state, cause, detail, at_ms) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (e.session_id, e.version, e.from_state, e.to_state, e.cause, e.detail, e.time_ms),
        ),
    ]


def _model_started(e: ev.ModelCallStarted) -> list[Statement]:
    return [
        session_update(e),
        (  # a call still "running" when the next one starts was cut off by a crashed worker
            "UPDATE model_calls SET status = 'abandoned' "
            "WHERE session_id = ? AND turn_id = ? AND status = 'running'",
            (e.session_id, e.turn_id),
        ),
        (
            "INSERT INTO model_calls (session_id, turn_id, step, model_name, status, message_count, "
            "estimated_input_tokens, day, started_at_ms) "
            "VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?)",
            (
                e.session_id,
                e.turn_id,
                e.step,
                e.model,
                e.message_count,
                e.estimated_input_tokens,
                utc_day(e.time_ms),
                e.time_ms,
            ),
        ),
    ]


def _model_finished(e: ev.ModelCallFinished) -> list[Statement]:
    return [
        session_update(
            e,
            increments={
                "input_tokens": e.input_tokens,
                "output_tokens": e.output_tokens,
                "cost_micros": e.cost_micros,
            },
        ),
        (
            "UPDATE model_calls SET model_name = ?, status = ?, input_tokens = ?, output_tokens = ?, "
            "cached_input_tokens = ?, cost_micros = ?, "
            "latency_ms = ?, finish_reason = ?, error = ?, finished_at_ms = ? "
            "WHERE session_id = ? AND turn_id = ? AND step = ?",
            (
                e.model,
                e.status,
                e.input_tokens,
                e.output_tokens,
                e.cached_input_tokens,
                e.cost_micros,
                e.latency_ms,
                e.finish_reason,
                e.error,
                e.time_ms,
                e.session_id,
                e.turn_id,
                e.step,
            ),
        ),
    ]


def _tool_requested(e: ev.ToolCallRequested) -> list[Statement]:
    return [
        session_update(e),
        (
            "INSERT INTO tool_calls (session_id, call_id, turn_id, tool_name, iteration, input_json, status, "
            "created_at_ms, updated_at_ms) VALUES (?, ?, ?, ?, ?, ?, 'requested', ?, ?)",
            (
                e.session_id,
                e.call_id,
                e.turn_id,
                e.tool_name,
                e.iteration,
                e.arguments_json,
                e.time_ms,
                e.time_ms,
            ),
        ),
    ]


def _tool_started(e: ev.ToolCallStarted) -> list[Statement]:
    return [
        session_update(e),
        (
            "UPDATE tool_calls SET status = 'executing', attempts = ?, updated_at_ms = ? "
            "WHERE session_id = ? AND turn_id = ? AND call_id = ?",
            (e.attempt, e.time_ms, e.session_id, e.turn_id, e.call_id),
        ),
    ]


def _tool_finished(e: ev.ToolCallFinished) -> list[Statement]:
    return [
        *_message(
            e, e.event_id, "tool", e.content, turn_id=e.turn_id, tool_call_id=e.call_id, tool_name=e.tool_name
        ),
        (
            "UPDATE tool_calls SET status = ?, output_json = ?, content = ?, error = ?, attempts = ?, "
            "elapsed_time_ms = ?, updated_at_ms = ? WHERE session_id = ? AND turn_id = ? AND call_id = ?",
            (
                e.status,
                e.output_json,
                e.content,
                e.error,
                e.attempts,
                e.elapsed_ms,
                e.time_ms,
                e.session_id,
                e.turn_id,
                e.call_id,
            ),
        ),
    ]


def _turn_finished(e: ev.TurnFinished) -> list[Statement]:
    return [
        session_update(e, increments={"turns": 1}),
        (
            "UPDATE turns SET outcome = ?, iterations = ?, model_calls = ?, input_tokens = ?, "
            "output_tokens = ?, "
            "finished_at_ms = ? WHERE session_id = ? AND turn_id = ?",
            (
                e.reason,
                e.iterations,
                e.model_calls,
                e.input_tokens,
                e.output_tokens,
                e.time_ms,
                e.session_id,
                e.turn_id,
            ),
        ),
    ]


def _closed(e: ev.SessionClosed) -> list[Statement]:
    return [session_update(e, values={"closed": True, "close_reason": e.reason})]


def _approval_requested(e: ev.ApprovalRequested) -> list[Statement]:
    return [
        session_update(e),
        (
            "UPDATE tool_calls SET status = 'awaiting_approval', approval = 'pending', updated_at_ms = ? "
            "WHERE session_id = ? AND turn_id = ? AND call_id = ?",
            (e.time_ms, e.session_id, e.turn_id, e.call_id),
        ),
    ]


def _approval_decided(e: ev.ApprovalDecided) -> list[Statement]:
    return [
        session_update(e),
        (
            "UPDATE tool_calls SET status = 'requested', approval = ?, approved_json = ?, updated_at_ms = ? "
            "WHERE session_id = ? AND turn_id = ? AND call_id = ?",
            (e.decision, e.arguments_json, e.time_ms, e.session_id, e.turn_id, e.call_id),
        ),
    ]


def _guard(e: ev.LoopGuardTriggered) -> list[Statement]:
    return [
        session_update(e),
        (
            "UPDATE turns SET guard = ?, guard_reason = ? WHERE session_id = ? AND turn_id = ?",
            (e.guard, e.reason, e.session_id, e.turn_id),
        ),
    ]


def _superseded(e: ev.ToolResultSuperseded) -> list[Statement]:
    return [
        session_update(e),
        (
            "UPDATE tool_calls SET superseded_by = ? WHERE session_id = ? AND turn_id = ? AND call_id = ?",
            (e.superseded_by, e.session_id, e.turn_id, e.call_id),
        ),
    ]


def _invoked(e: ev.ToolInvoked) -> list[Statement]:
    """A direct invocation is a tool call without a turn (turn_id '', iteration 0)."""
    return [
        session_update(e),
        (
            "INSERT INTO tool_calls (session_id, call_id, turn_id, tool_name, iteration, input_json, "
            "status, output_json, content, error, attempts, elapsed_time_ms, invoked_by, created_at_ms, "
            "updated_at_ms) "
            "VALUES (?, ?, '', ?, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                e.session_id,
                e.call_id,
                e.tool_name,
                e.arguments_json,
                e.status,
                e.output_json,
                e.content,
                e.error,
                e.attempts,
                e.elapsed_ms,
                e.actor,
                e.time_ms,
                e.time_ms,
            ),
        ),
    ]


def _archived(e: ev.Event, refs_and_reasons: list[tuple[int, str]]) -> list[Statement]:
    """The messages cut from the model's context (the archive, seed §3.2): each row keeps its
    content and says which event cut it and why; ``refs`` are the messages' own versions."""
    return [session_update(e)] + [
        (
            "UPDATE messages SET archived_by = ?, archive_reason = ? WHERE session_id = ? AND version = ?",
            (e.version, reason, e.session_id, ref),
        )
        for ref, reason in refs_and_reasons
    ]


def _context_trimmed(e: ev.ContextTrimmed) -> list[Statement]:
    items = json.loads(e.items_json)
    return _archived(e, [(i["ref"], f"{i['action']}: {i['reason']}") for i in items])


def _history_summarized(e: ev.HistorySummarized) -> list[Statement]:
    return _archived(e, [(ref, f"summarized: {e.reason}") for ref in json.loads(e.removed_refs_json)])


_RULES: dict[type[ev.Event], Callable[[Any], list[Statement]]] = {
    ev.SessionCreated: _created,
    ev.UserMessageReceived: _user_message,
    ev.TurnStarted: _turn_started,
    ev.StateChanged: _state_changed,
    ev.ModelCallStarted: _model_started,
    ev.ModelCallFinished: _model_finished,
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
    ev.ToolInvoked: _invoked,
    ev.ContextTrimmed: _context_trimmed,
    ev.HistorySummarized: _history_summarized,
}


def _snapshot_rules() -> dict[type[ev.Event], Callable[[Any], list[Statement]]]:
    from .snapshot_rows import session_forked, snapshot_taken  # builds on session_update above

    return {ev.SnapshotTaken: snapshot_taken, ev.SessionForked: session_forked}


_RULES.update(_snapshot_rules())


def statements_for(event: ev.Event) -> list[Statement]:
    """The statements that apply ``event``; the first one advances the session's version."""
    rule = _RULES.get(type(event))
    return rule(event) if rule is not None else [session_update(event)]
