"""Read-model rules for snapshots and forks (engine.snapshots, engine.admin).

``snapshots`` lists each SnapshotTaken with what had happened by then (state, last tool,
tokens), without its state body, for admins choosing where to fork. A fork's first event,
SessionForked, opens its ``sessions`` row with the inherited counts, copies the inherited
history into ``messages`` (so `turnlog show` reads the same conversation) and links the fork
to its origin in ``forks``.
"""

from __future__ import annotations

from engine import events as ev
from engine.models.base import estimate_tokens
from engine.snapshots import decode_state

from .apply import Statement, session_update


def snapshot_taken(e: ev.SnapshotTaken) -> list[Statement]:
    return [
        session_update(e),
        (
            "INSERT INTO snapshots (session_id, version, status, last_tool, turns, input_tokens, "
            "output_tokens, message_count, state_format, turn_id, taken_at_ms) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                e.session_id,
                e.version,
                e.status,
                e.last_tool,
                e.turns,
                e.input_tokens,
                e.output_tokens,
                e.message_count,
                e.state_format,
                e.correlation_id,
                e.time_ms,
            ),
        ),
    ]


def session_forked(e: ev.SessionForked) -> list[Statement]:
    where = f"session {e.session_id} v{e.version}"
    state = decode_state(e.state_json, e.state_format, where=where)
    statements: list[Statement] = [
        (
            "INSERT INTO sessions (session_id, user_id, agent_id, role, model_name, current_state, "
            "state_version, message_count, turns, input_tokens, output_tokens, start_time_ms, "
            "update_time_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                e.session_id,
                state.user_id,
                e.agent_id,
                state.role,
                e.model,
                str(state.status),
                e.version,
                len(state.messages),
                state.turns_finished,
                state.input_tokens,
                state.output_tokens,
                e.time_ms,
                e.time_ms,
            ),
        ),
        (
            "INSERT INTO forks (session_id, origin_session_id, origin_version, forked_at_ms) "
            "VALUES (?, ?, ?, ?)",
            (e.session_id, e.origin_session_id, e.origin_version, e.time_ms),
        ),
    ]
    for seq, m in enumerate(state.messages, start=1):
        statements.append(
            (
                "INSERT INTO messages (session_id, seq, message_id, role, content, tool_calls_json, "
                "tool_call_id, tool_name, token_count, turn_id, version, created_at_ms) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?)",
                (
                    e.session_id,
                    seq,
                    f"{e.event_id}:{seq}",
                    m.role,
                    m.content,
                    _calls_json(m.tool_calls),
                    m.tool_call_id,
                    m.name,
                    estimate_tokens(m.content),
                    e.version,
                    e.time_ms,
                ),
            )
        )
    return statements


def _calls_json(calls: tuple[ev.ToolCallSpec, ...]) -> str | None:
    import json

    if not calls:
        return None
    rows = [{"id": c.call_id, "name": c.name, "arguments": c.arguments_json} for c in calls]
    return json.dumps(rows, ensure_ascii=False)
