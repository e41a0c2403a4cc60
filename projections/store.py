"""Projection stores: the read models' tables and the exactly-once apply.

A batch of log records is applied in one transaction together with the projector's offsets,
so a crash between the two cannot double-apply or skip. Each event is applied only if it is
its session's next version (seed §7.3): a replay is a no-op, a gap raises OutOfOrderError.
"""

from __future__ import annotations

import abc
import datetime as dt
import sqlite3
from pathlib import Path
from typing import Any, Iterable, Sequence

from engine.errors import OutOfOrderError
from engine.events import Event
from engine.log.base import LogRecord

from .apply import Statement, statements_for
from .schema import ORDER_BY, READ_MODELS, SCHEMA_ID, SCHEMA_TABLE, TABLES

Row = dict[str, Any]


class ProjectionStore(abc.ABC):
    """SQL read models; subclasses supply the connection and the placeholder style."""

    @abc.abstractmethod
    def _execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; return the number of rows it changed."""

    @abc.abstractmethod
    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]: ...

    @abc.abstractmethod
    def _transaction(self) -> Any:
        """A context manager around one transaction."""

    def create(self) -> None:
        """Create the read models; if they were made by another schema, drop and recreate them.

        The read models are derived data, so a schema change is migrated by refolding: the
        offsets go with the tables, and the projector rebuilds every row from offset 0.
        """
        with self._transaction():
            self._execute(SCHEMA_TABLE)
            found = self._query("SELECT schema_id FROM projection_schema")
        if found and found[0]["schema_id"] != SCHEMA_ID:
            self._drop_read_models()
        with self._transaction():
            for ddl in TABLES.values():
                self._execute(ddl)
            self._execute("DELETE FROM projection_schema")
            self._execute("INSERT INTO projection_schema (schema_id) VALUES (?)", (SCHEMA_ID,))

    def _drop_read_models(self) -> None:
        with self._transaction():
            for table in TABLES:
                self._execute(f"DROP TABLE IF EXISTS {table}")

    def reset(self) -> None:
        """Drop every read model and the offsets; ``create`` runs again."""
        self._drop_read_models()
        self.create()

    def next_offset(self, partition: int) -> int:
        rows = self._query("SELECT next_offset FROM projection_offsets WHERE log_partition = ?", (partition,))
        return int(rows[0]["next_offset"]) if rows else 0

    def apply(self, records: Iterable[LogRecord]) -> int:
        """Apply records (any partitions) and advance the offsets, atomically; return events applied."""
        applied = 0
        ends: dict[int, int] = {}
        with self._transaction():
            for record in records:
                applied += self._apply_event(record.event)
                ends[record.partition] = record.offset + 1
            for partition, offset in ends.items():
                self._execute(
                    "INSERT INTO projection_offsets (log_partition, next_offset) VALUES (?, ?) "
                    "ON CONFLICT (log_partition) DO UPDATE SET next_offset = excluded.next_offset",
                    (partition, offset),
                )
        return applied

    def apply_events(self, events: Iterable[Event]) -> int:
        """Apply events without touching offsets (tests, replays of one session)."""
        with self._transaction():
            return sum(self._apply_event(e) for e in events)

    def _apply_event(self, event: Event) -> int:
        rows = self._query("SELECT state_version FROM sessions WHERE session_id = ?", (event.session_id,))
        current = int(rows[0]["state_version"]) if rows else 0
        if event.version <= current:
            return 0  # already applied: replays and redeliveries are no-ops
        if event.version != current + 1:
            raise OutOfOrderError(
                f"projection of session {event.session_id} is at version {current}; "
                f"refusing {event.type} v{event.version} (missing v{current + 1}). "
                "Rebuild with `turnlog rebuild`."
            )
        statements: list[Statement] = statements_for(event)
        for i, (sql, params) in enumerate(statements):
            changed = self._execute(sql, params)
            if i == 0 and changed != 1:
                raise OutOfOrderError(
                    f"session {event.session_id}: state_version moved while applying v{event.version}"
                )
        return 1

    # -- reads -------------------------------------------------------------------------------

    def table(self, name: str) -> list[Row]:
        """Every row of a read model in a stable order (for comparisons and exports)."""
        if name not in ORDER_BY:
            raise ValueError(f"unknown read model {name!r}; known: {', '.join(READ_MODELS)}")
        return self._query(f"SELECT * FROM {name} ORDER BY {ORDER_BY[name]}")

    def sessions(self, limit: int = 50) -> list[Row]:
        return self._query("SELECT * FROM sessions ORDER BY start_time_ms DESC, session_id LIMIT ?", (limit,))

    def session(self, session_id: str) -> Row | None:
        rows = self._query("SELECT * FROM sessions WHERE session_id = ?", (session_id,))
        return rows[0] if rows else None

    def rows_of(self, name: str, session_id: str) -> list[Row]:
        if name not in ORDER_BY or name == "sessions":
            raise ValueError(f"unknown per-session read model {name!r}")
        return self._query(
            f"SELECT * FROM {name} WHERE session_id = ? ORDER BY {ORDER_BY[name]}", (session_id,)
        )

    # -- costs (seed §5.3) ----------------------------------------------------------------------

    def spent_micros(self, user_id: str, day: dt.date) -> int:
        """What a user's model calls cost on a UTC day (the engine's SpendLedger for daily budgets)."""
        rows = self._query(
            "SELECT COALESCE(SUM(m.cost_micros), 0) AS spent FROM model_calls m "
            "JOIN sessions s ON s.session_id = m.session_id WHERE s.user_id = ? AND m.day = ?",
            (user_id, day.isoformat()),
        )
        return int(rows[0]["spent"])

    def costliest_sessions(self, limit: int = 10) -> list[Row]:
        return self._query(
            "SELECT session_id, user_id, agent_id, cost_micros, input_tokens, output_tokens FROM sessions "
            "ORDER BY cost_micros DESC, session_id LIMIT ?",
            (limit,),
        )

    def costliest_users(self, limit: int = 10) -> list[Row]:
        return self._query(
            "SELECT user_id, SUM(cost_micros) AS cost_micros, COUNT(*) AS sessions FROM sessions "
            "GROUP BY user_id ORDER BY SUM(cost_micros) DESC, user_id LIMIT ?",
            (limit,),
        )

    def cost_by_day(self) -> list[Row]:
        return self._query(
            "SELECT day, SUM(cost_micros) AS cost_micros, COUNT(*) AS calls FROM model_calls "
            "GROUP BY day ORDER BY day"
        )

    @abc.abstractmethod
    def close(self) -> None: ...


class SqliteProjectionStore(ProjectionStore):
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self.create()

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self._db.execute(sql, tuple(params)).rowcount

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return [dict(r) for r in self._db.execute(sql, tuple(params)).fetchall()]

    def _transaction(self) -> _SqliteTransaction:
        return _SqliteTransaction(self._db)

    def close(self) -> None:
        self._db.close()


class _SqliteTransaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")
