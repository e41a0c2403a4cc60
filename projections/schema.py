"""The read models (seed §6.1), as portable SQL: the same DDL runs on SQLite and PostgreSQL.

Every row is derived from events only (times are event times, never the projector's clock),
so dropping the tables and refolding the log from offset 0 gives identical rows.
"""

from __future__ import annotations

import hashlib
import re

TABLES: dict[str, str] = {
    "sessions": """
        CREATE TABLE IF NOT EXISTS sessions (
            session_id     TEXT PRIMARY KEY,
            user_id        TEXT NOT NULL,
            agent_id       TEXT NOT NULL,
            role           TEXT NOT NULL,
            model_name     TEXT NOT NULL,
            current_state  TEXT NOT NULL,
            state_version  BIGINT NOT NULL,
            message_count  BIGINT NOT NULL DEFAULT 0,
            turns          BIGINT NOT NULL DEFAULT 0,
            input_tokens   BIGINT NOT NULL DEFAULT 0,
            output_tokens  BIGINT NOT NULL DEFAULT 0,
            cost_micros    BIGINT NOT NULL DEFAULT 0,
            closed         BOOLEAN NOT NULL DEFAULT FALSE,
            close_reason   TEXT NOT NULL DEFAULT '',
            start_time_ms  BIGINT NOT NULL,
            update_time_ms BIGINT NOT NULL,
            closed_at_ms   BIGINT
        )""",
    "messages": """
        CREATE TABLE IF NOT EXISTS messages (
            session_id      TEXT NOT NULL,
            seq             BIGINT NOT NULL,
            message_id      TEXT NOT NULL,
            role            TEXT NOT NULL,
            content         TEXT NOT NULL,
            tool_calls_json TEXT,
            tool_call_id    TEXT,
            tool_name       TEXT,
            token_count     BIGINT NOT NULL,
            turn_id         TEXT,
            version         BIGINT NOT NULL,
            created_at_ms   BIGINT NOT NULL,
            archived_by     BIGINT,
            archive_reason  TEXT,
            PRIMARY KEY (session_id, seq)
        )""",
    "tool_calls": """
        CREATE TABLE IF NOT EXISTS tool_calls (
            session_id      TEXT NOT NULL,
            call_id         TEXT NOT NULL,
            turn_id         TEXT NOT NULL,
            tool_name       TEXT NOT NULL,
            iteration       BIGINT NOT NULL,
            input_json      TEXT NOT NULL,
            status          TEXT NOT NULL,
            output_json     TEXT,
            content         TEXT,
            error           TEXT,
            attempts        BIGINT NOT NULL DEFAULT 0,
            elapsed_time_ms DOUBLE PRECISION,
            approval        TEXT,
            approved_json   TEXT,
            superseded_by   TEXT,
            invoked_by      TEXT,
            created_at_ms   BIGINT NOT NULL,
            updated_at_ms   BIGINT NOT NULL,
            PRIMARY KEY (session_id, turn_id, call_id)
        )""",
    "state_changes": """
        CREATE TABLE IF NOT EXISTS state_changes (
            session_id TEXT NOT NULL,
            version    BIGINT NOT NULL,
            from_state TEXT NOT NULL,
            to_state   TEXT NOT NULL,
            cause      TEXT NOT NULL,
            detail     TEXT NOT NULL,
            at_ms      BIGINT NOT NULL,
            PRIMARY KEY (session_id, version)
        )""",
    "model_calls": """
        CREATE TABLE IF NOT EXISTS model_calls (
            session_id     TEXT NOT NULL,
            turn_id        TEXT NOT NULL,
            step           BIGINT NOT NULL,
            model_name     TEXT NOT NULL,
            status         TEXT NOT NULL,
            message_count  BIGINT NOT NULL,
            input_tokens   BIGINT NOT NULL DEFAULT 0,
            output_tokens  BIGINT NOT NULL DEFAULT 0,
            cached_input_tokens    BIGINT NOT NULL DEFAULT 0,
            estimated_input_tokens BIGINT NOT NULL DEFAULT 0,
            cost_micros    BIGINT NOT NULL DEFAULT 0,
            day            TEXT NOT NULL,
            latency_ms     DOUBLE PRECISION,
            finish_reason  TEXT,
            error          TEXT,
            started_at_ms  BIGINT NOT NULL,
            finished_at_ms BIGINT,
            purpose        TEXT NOT NULL DEFAULT 'turn',
            estimated      BIGINT NOT NULL DEFAULT 0,
            PRIMARY KEY (session_id, turn_id, step)
        )""",
    "turns": """
        CREATE TABLE IF NOT EXISTS turns (
            session_id     TEXT NOT NULL,
            turn_id        TEXT NOT NULL,
            message_id     TEXT NOT NULL,
            outcome        TEXT,
            iterations     BIGINT NOT NULL DEFAULT 0,
            model_calls    BIGINT NOT NULL DEFAULT 0,
            input_tokens   BIGINT NOT NULL DEFAULT 0,
            output_tokens  BIGINT NOT NULL DEFAULT 0,
            guard          TEXT,
            guard_reason   TEXT,
            started_at_ms  BIGINT NOT NULL,
            finished_at_ms BIGINT,
            PRIMARY KEY (session_id, turn_id)
        )""",
    "snapshots": """
        CREATE TABLE IF NOT EXISTS snapshots (
            session_id     TEXT NOT NULL,
            version        BIGINT NOT NULL,
            status         TEXT NOT NULL,
            last_tool      TEXT NOT NULL,
            turns          BIGINT NOT NULL,
            input_tokens   BIGINT NOT NULL,
            output_tokens  BIGINT NOT NULL,
            message_count  BIGINT NOT NULL,
            state_format   BIGINT NOT NULL,
            turn_id        TEXT,
            taken_at_ms    BIGINT NOT NULL,
            PRIMARY KEY (session_id, version)
        )""",
    "forks": """
        CREATE TABLE IF NOT EXISTS forks (
            session_id        TEXT PRIMARY KEY,
            origin_session_id TEXT NOT NULL,
            origin_version    BIGINT NOT NULL,
            forked_at_ms      BIGINT NOT NULL
        )""",
    "projection_offsets": """
        CREATE TABLE IF NOT EXISTS projection_offsets (
            log_partition BIGINT PRIMARY KEY,
            next_offset   BIGINT NOT NULL
        )""",
}

INDEXES = (
    "CREATE INDEX IF NOT EXISTS sessions_idle ON sessions (closed, update_time_ms)",
    "CREATE INDEX IF NOT EXISTS sessions_closed_at ON sessions (closed, closed_at_ms)",
)
"""What the lifecycle sweeper looks sessions up by (projections/lifecycle.py): the open ones by
their last event's time, the closed ones by their close time."""

SCHEMA_TABLE = "CREATE TABLE IF NOT EXISTS projection_schema (schema_id TEXT NOT NULL)"
SCHEMA_ID = hashlib.sha256("".join([*TABLES.values(), *INDEXES]).encode()).hexdigest()[:16]
"""Changes with any DDL above: a store made by another schema is dropped and refolded (store.create)."""

READ_MODELS = (
    "sessions",
    "messages",
    "tool_calls",
    "state_changes",
    "model_calls",
    "turns",
    "snapshots",
    "forks",
)
"""The tables rebuilt from the log (everything but the offsets bookkeeping)."""

ORDER_BY = {
    "sessions": "session_id",
    "messages": "session_id, seq",
    "tool_calls": "session_id, created_at_ms, turn_id, call_id",
    "state_changes": "session_id, version",
    "model_calls": "session_id, turn_id, step",
    "turns": "session_id, turn_id",
    "snapshots": "session_id, version",
    "forks": "session_id",
}


def _primary_key(ddl: str) -> tuple[str, ...]:
    composite = re.search(r"PRIMARY KEY \(([^)]*)\)", ddl)
    if composite:
        return tuple(c.strip() for c in composite.group(1).split(","))
    inline = re.search(r"(\w+)\s+\w+\s+PRIMARY KEY", ddl)
    assert inline is not None, f"no primary key in {ddl[:60]!r}"
    return (inline.group(1),)


PRIMARY_KEYS: dict[str, tuple[str, ...]] = {name: _primary_key(ddl) for name, ddl in TABLES.items()}
"""Each table's key columns, read from the DDL above (projections/batch.py folds updates by them)."""
