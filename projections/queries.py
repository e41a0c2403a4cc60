"""Reads the gateway needs from the read models: a user's sessions, filtered lists, counts."""

from __future__ import annotations

from typing import Any

from turnlog.engine.experiments.namespace import sql_exclusion

from .store import ProjectionStore, Row

PRODUCTION = sql_exclusion()
"""Listings and counts leave experiment sessions out (engine.experiments.namespace); a session's
own reads (timeline, messages) do not, so every replay stays inspectable."""

HISTORY_TABLES = ("messages", "turns", "model_calls", "tool_calls", "state_changes")


def list_sessions(
    store: ProjectionStore,
    *,
    user_id: str | None = None,
    state: str | None = None,
    agent_id: str | None = None,
    limit: int = 50,
) -> list[Row]:
    """Sessions newest first, optionally of one user, in one state, of one agent."""
    where, params = [PRODUCTION], []
    for column, value in (("user_id", user_id), ("current_state", state), ("agent_id", agent_id)):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    clause = f"WHERE {' AND '.join(where)} "
    sql = f"SELECT * FROM sessions {clause}ORDER BY start_time_ms DESC, session_id LIMIT ?"
    return store._query(sql, [*params, limit])


def session_ids_of(store: ProjectionStore, user_id: str) -> list[str]:
    """Every session of a user the read models know (an erasure's sessions beyond the key store's)."""
    return [
        str(r["session_id"])
        for r in store._query("SELECT session_id FROM sessions WHERE user_id = ?", [user_id])
    ]


def state_counts(store: ProjectionStore) -> dict[str, int]:
    """Open sessions by current state."""
    rows = store._query(
        f"SELECT current_state, COUNT(*) AS n FROM sessions WHERE closed = ? AND {PRODUCTION} "
        "GROUP BY current_state",
        [False],
    )
    return {str(r["current_state"]): int(r["n"]) for r in rows}


def last_messages(store: ProjectionStore, session_id: str, limit: int) -> list[Row]:
    """The last ``limit`` messages of a session, oldest first."""
    rows = store._query(
        "SELECT * FROM messages WHERE session_id = ? ORDER BY seq DESC LIMIT ?", [session_id, limit]
    )
    return rows[::-1]


def archived_messages(store: ProjectionStore, session_id: str) -> list[Row]:
    """The messages cut from a session's context, oldest first, with the event that cut them."""
    return store._query(
        "SELECT * FROM messages WHERE session_id = ? AND archived_by IS NOT NULL ORDER BY seq", [session_id]
    )


def session_timeline(store: ProjectionStore, session_id: str) -> dict[str, Any]:
    """Everything the read models hold about one session, table by table."""
    return {name: store.rows_of(name, session_id) for name in HISTORY_TABLES}
