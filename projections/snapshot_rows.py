"""Read-model rules for snapshots and forks (engine.snapshots, engine.admin).

``snapshots`` lists each SnapshotTaken with what had happened by then (state, last tool,
tokens), without its state body, for admins choosing where to fork. A fork's first event,
SessionForked, opens its ``sessions`` row with the inherited counts, copies the inherited
history into ``messages`` (so `turnlog show` reads the same conversation) and links the fork
to its origin in ``forks``.
"""

from __future__ import annotations

import json

from turnlog.engine import events as ev
from turnlog.engine.models.base import estimate_tokens
from turnlog.engine.snapshots import forked_state

from .changes import Change, insert
from .session_row import SessionRow


def snapshot_taken(e: ev.SnapshotTaken, row: SessionRow) -> list[Change]:
    return [
        insert(
            "snapshots",
            session_id=e.session_id,
            version=e.version,
            status=e.status,
            last_tool=e.last_tool,
            turns=e.turns,
            input_tokens=e.input_tokens,
            output_tokens=e.output_tokens,
            message_count=e.message_count,
            state_format=e.state_format,
            turn_id=e.correlation_id,
            taken_at_ms=e.time_ms,
        )
    ]


def session_forked(e: ev.SessionForked, row: SessionRow) -> list[Change]:
    state = forked_state(e)
    row.create(
        {
            "session_id": e.session_id,
            "user_id": state.user_id,
            "agent_id": e.agent_id,
            "role": state.role,
            "model_name": e.model,
            "current_state": str(state.status),
            "turns": state.turns_finished,
            "input_tokens": state.input_tokens,
            "output_tokens": state.output_tokens,
            "start_time_ms": e.time_ms,
        },
        e.version,
        message_count=len(state.messages),
    )
    changes: list[Change] = [
        insert(
            "forks",
            session_id=e.session_id,
            origin_session_id=e.origin_session_id,
            origin_version=e.origin_version,
            forked_at_ms=e.time_ms,
        )
    ]
    for seq, m in enumerate(state.messages, start=1):
        changes.append(
            insert(
                "messages",
                session_id=e.session_id,
                seq=seq,
                message_id=f"{e.event_id}:{seq}",
                role=m.role,
                content=m.content,
                tool_calls_json=_calls_json(m.tool_calls),
                tool_call_id=m.tool_call_id,
                tool_name=m.name,
                token_count=estimate_tokens(m.content),
                turn_id=None,
                version=e.version,
                created_at_ms=e.time_ms,
            )
        )
    return changes


def _calls_json(calls: tuple[ev.ToolCallSpec, ...]) -> str | None:
    if not calls:
        return None
    rows = [{"id": c.call_id, "name": c.name, "arguments": c.arguments_json} for c in calls]
    return json.dumps(rows, ensure_ascii=False)
