"""Projection stores: the read models' tables and the exactly-once apply.

A batch of log records is applied in ONE transaction together with the projector's offsets,
so a crash between the two cannot double-apply or skip. Each event is applied only if it is
its session's next version (seed §7.3): a replay is a no-op, a gap raises OutOfOrderError
(``batch.plan_batch``: the guard runs in memory, the batch's new rows go in bulk, its updates of
older rows in groups of one ``executemany`` each).

Every write runs on the store's one writer thread (``write`` / ``write_async``), never on the
caller's: an event loop that awaits ``apply_async`` keeps running while the database works (a
slow or locked database delays the projection, not the loop). Reads (``_query`` and the methods
below it) stay synchronous on the caller's thread and see committed rows only.
"""

from __future__ import annotations

import abc
import asyncio
import datetime as dt
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol, Sequence, TypeVar

from turnlog.engine.errors import OutOfOrderError
from turnlog.engine.events import Event
from turnlog.engine.experiments.namespace import sql_exclusion
from turnlog.engine.log.base import LogRecord

from .batch import Group, NewRows, load_rows, plan_batch
from .changes import insert_sql
from .schema import INDEXES, ORDER_BY, READ_MODELS, SCHEMA_ID, SCHEMA_TABLE, TABLES

Row = dict[str, Any]
PRODUCTION = sql_exclusion()
"""Leaves experiment sessions out of listings, spend and cost reports (engine.experiments)."""
T = TypeVar("T")

OFFSETS_UPSERT = (
    "INSERT INTO projection_offsets (log_partition, next_offset) VALUES (?, ?) "
    "ON CONFLICT (log_partition) DO UPDATE SET next_offset = CASE "
    "WHEN excluded.next_offset > projection_offsets.next_offset THEN excluded.next_offset "
    "ELSE projection_offsets.next_offset END"
)
"""Offsets only move forward: a pass that read an older batch cannot take one back."""


class Writer(Protocol):
    """One open transaction on a store's write connection (only on the store's writer thread)."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; return the number of rows it changed."""

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]: ...

    def run_groups(self, groups: Sequence[Group]) -> list[int]:
        """Run each group's statement once per parameter row, groups in order; return the rows
        each group changed."""

    def insert_rows(self, rows: NewRows) -> None:
        """Insert many rows of one table (COPY on PostgreSQL)."""


class ProjectionStore(abc.ABC):
    """SQL read models; subclasses supply the connections and the placeholder style."""

    def __init__(self) -> None:
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="projections-writer")
        self._writer_thread: int | None = None

    @abc.abstractmethod
    def _transaction(self) -> AbstractContextManager[Writer]:
        """One transaction on the write connection (called on the writer thread only)."""

    @abc.abstractmethod
    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """A read of committed rows, on the caller's thread."""

    @abc.abstractmethod
    def _disconnect(self) -> None:
        """Close the connections (the writer thread has stopped)."""

    # -- the writer thread ---------------------------------------------------------------------

    def write(self, work: Callable[[Writer], T]) -> T:
        """Run ``work`` in one transaction on the writer thread and wait for it (blocks the caller)."""
        if threading.get_ident() == self._writer_thread:
            raise RuntimeError("projection transactions do not nest")
        return self._writer.submit(self._in_transaction, work).result()

    async def write_async(self, work: Callable[[Writer], T]) -> T:
        """Run ``work`` in one transaction on the writer thread; the event loop runs on meanwhile."""
        return await asyncio.wrap_future(self._writer.submit(self._in_transaction, work))

    def _in_transaction(self, work: Callable[[Writer], T]) -> T:
        self._writer_thread = threading.get_ident()
        with self._transaction() as writer:
            return work(writer)

    # -- schema ------------------------------------------------------------------------------------

    def create(self) -> None:
        """Create the read models; if they were made by another schema, drop and recreate them.

        The read models are derived data, so a schema change is migrated by refolding: the
        offsets go with the tables, and the projector rebuilds every row from offset 0.
        """
        self.write(_create)

    def reset(self) -> None:
        """Drop every read model and the offsets and create them again (a rebuild starts here)."""
        self.write(_reset)

    async def reset_async(self) -> None:
        await self.write_async(_reset)

    # -- the exactly-once apply -----------------------------------------------------------------

    def apply(self, records: Iterable[LogRecord]) -> int:
        """Apply records (any partitions) and advance the offsets, atomically; return events applied."""
        return self.write(partial(_apply_records, list(records)))

    async def apply_async(self, records: Iterable[LogRecord]) -> int:
        """``apply`` on the writer thread, awaited without blocking the event loop."""
        return await self.write_async(partial(_apply_records, list(records)))

    def apply_events(self, events: Iterable[Event]) -> int:
        """Apply events without touching offsets (tests, replays of one session)."""
        return self.write(partial(_apply, list(events), {}))

    async def replace_sessions(self, events: dict[str, list[Event]]) -> None:
        """Drop every read-model row of these sessions and fold them again from ``events`` (each
        session's events from version 1), in one transaction; offsets untouched. An erasure's
        scrub (projections/erasure.py): the rows equal what a rebuild gives. ``SessionsMoved``
        if the projector applied events of one of them past what ``events`` holds meanwhile."""
        await self.write_async(partial(_replace_sessions, events))

    async def purge_async(self) -> None:
        """Make deleted and overwritten content leave the storage files."""
        await asyncio.wrap_future(self._writer.submit(self._purge))

    def _purge(self) -> None:  # noqa: B027 - nothing to purge unless a store says how
        """On the writer thread, outside any transaction. PostgreSQL and SQLite say how."""

    def next_offset(self, partition: int) -> int:
        rows = self._query("SELECT next_offset FROM projection_offsets WHERE log_partition = ?", (partition,))
        return int(rows[0]["next_offset"]) if rows else 0

    async def offsets_async(self) -> dict[int, int]:
        """Every partition's next offset to apply (partitions never applied are absent)."""
        return await self.write_async(_offsets)

    # -- reads -------------------------------------------------------------------------------

    def table(self, name: str) -> list[Row]:
        """Every row of a read model in a stable order (for comparisons and exports)."""
        if name not in ORDER_BY:
            raise ValueError(f"unknown read model {name!r}; known: {', '.join(READ_MODELS)}")
        return self._query(f"SELECT * FROM {name} ORDER BY {ORDER_BY[name]}")

    def sessions(self, limit: int = 50) -> list[Row]:
        return self._query(
            f"SELECT * FROM sessions WHERE {PRODUCTION} ORDER BY start_time_ms DESC, session_id LIMIT ?",
            (limit,),
        )

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
            f"JOIN sessions s ON s.session_id = m.session_id WHERE s.user_id = ? AND m.day = ? "
            f"AND {sql_exclusion('s.session_id')}",
            (user_id, day.isoformat()),
        )
        return int(rows[0]["spent"])

    def costliest_sessions(self, limit: int = 10) -> list[Row]:
        return self._query(
            "SELECT session_id, user_id, agent_id, cost_micros, input_tokens, output_tokens FROM sessions "
            f"WHERE {PRODUCTION} ORDER BY cost_micros DESC, session_id LIMIT ?",
            (limit,),
        )

    def costliest_users(self, limit: int = 10) -> list[Row]:
        return self._query(
            "SELECT user_id, SUM(cost_micros) AS cost_micros, COUNT(*) AS sessions FROM sessions "
            f"WHERE {PRODUCTION} GROUP BY user_id ORDER BY SUM(cost_micros) DESC, user_id LIMIT ?",
            (limit,),
        )

    def cost_by_day(self) -> list[Row]:
        return self._query(
            "SELECT day, SUM(cost_micros) AS cost_micros, COUNT(*) AS calls FROM model_calls "
            f"WHERE {PRODUCTION} GROUP BY day ORDER BY day"
        )

    def close(self) -> None:
        """Wait for the write in progress, then close the connections."""
        self._writer.shutdown(wait=True)
        self._disconnect()


def _create(writer: Writer) -> None:
    writer.execute(SCHEMA_TABLE)
    found = writer.query("SELECT schema_id FROM projection_schema")
    if found and found[0]["schema_id"] != SCHEMA_ID:
        _drop_read_models(writer)
    for ddl in (*TABLES.values(), *INDEXES):
        writer.execute(ddl)
    writer.execute("DELETE FROM projection_schema")
    writer.execute("INSERT INTO projection_schema (schema_id) VALUES (?)", (SCHEMA_ID,))


def _drop_read_models(writer: Writer) -> None:
    for table in TABLES:
        writer.execute(f"DROP TABLE IF EXISTS {table}")


def _reset(writer: Writer) -> None:
    _drop_read_models(writer)
    _create(writer)


def _offsets(writer: Writer) -> dict[int, int]:
    rows = writer.query("SELECT log_partition, next_offset FROM projection_offsets")
    return {int(r["log_partition"]): int(r["next_offset"]) for r in rows}


def _apply_records(records: list[LogRecord], writer: Writer) -> int:
    ends: dict[int, int] = {}
    for record in records:
        ends[record.partition] = max(ends.get(record.partition, 0), record.offset + 1)
    return _apply([r.event for r in records], ends, writer)


class SessionsMoved(OutOfOrderError):
    """A session's rows moved past the events a replacement was made from: read them again."""


def _replace_sessions(events: dict[str, list[Event]], writer: Writer) -> None:
    sids = sorted(events)
    for i in range(0, len(sids), 500):
        chunk = sids[i : i + 500]
        marks = ",".join("?" * len(chunk))
        for row in writer.query(
            f"SELECT session_id, state_version FROM sessions WHERE session_id IN ({marks})", chunk
        ):
            if int(row["state_version"]) > len(events[row["session_id"]]):
                raise SessionsMoved(f"session {row['session_id']} was projected past the events read for it")
        for table in READ_MODELS:
            writer.execute(f"DELETE FROM {table} WHERE session_id IN ({marks})", chunk)
    _apply([e for sid in sids for e in events[sid]], {}, writer)


def _apply(events: list[Event], ends: dict[int, int], writer: Writer) -> int:
    """One batch in one transaction: updates of older rows, the batch's new rows, then its
    offsets and the guarded session updates (projections/batch.py says why that order)."""
    plan = plan_batch(events, load_rows(writer.query, (e.session_id for e in events)))
    if plan.updates:
        writer.run_groups(plan.updates)
    for rows in plan.inserts:
        writer.insert_rows(rows)
    last = [Group(OFFSETS_UPSERT, sorted(ends.items()))] if ends else []
    if plan.session_updates is not None:
        last.append(plan.session_updates)
    changed = writer.run_groups(last) if last else []
    if plan.session_updates is not None and changed[-1] != len(plan.session_updates.rows):
        expected = len(plan.session_updates.rows)
        raise OutOfOrderError(
            f"{expected - changed[-1]} of {expected} sessions moved to another state_version while the "
            "batch was applied (does another projector write to this store?); the batch was rolled "
            "back and is applied again on the next pass"
        )
    return plan.applied


class SqliteProjectionStore(ProjectionStore):
    """Read models in a SQLite file: the writer thread has its own connection, and reads use
    another, so they see committed rows only and never wait for a batch (WAL). ``":memory:"``
    has one connection, so its reads run on the writer thread."""

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = Path(path)
        in_memory = str(path) == ":memory:"
        if not in_memory:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = _connect(str(path), busy_timeout_ms=WRITE_BUSY_TIMEOUT_MS)
        self.create()
        self._read_db = self._db if in_memory else _connect(str(path), busy_timeout_ms=5000)

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        if self._read_db is self._db:
            return self._writer.submit(_fetch, self._db, sql, params).result()
        return _fetch(self._read_db, sql, params)

    @contextmanager
    def _transaction(self) -> Iterator[Writer]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield _SqliteWriter(self._db)
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _disconnect(self) -> None:
        if self._read_db is not self._db:
            self._read_db.close()
        self._db.close()

    def _purge(self) -> None:
        """Checkpoint the WAL into the file and truncate it, vacuum, truncate again: with
        ``secure_delete`` (every connection) what a statement freed was overwritten, and no
        page of either file keeps an old version of a row."""
        for statement in ("PRAGMA wal_checkpoint(TRUNCATE)", "VACUUM", "PRAGMA wal_checkpoint(TRUNCATE)"):
            self._db.execute(statement)


WRITE_BUSY_TIMEOUT_MS = 60_000
"""How long a batch waits for another process's write lock (on the writer thread, so the loop
does not wait with it)."""


def _connect(path: str, *, busy_timeout_ms: int) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA secure_delete=ON")  # freed content is overwritten: an erasure leaves no copy
    db.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
    return db


def _fetch(db: sqlite3.Connection, sql: str, params: Sequence[Any]) -> list[Row]:
    return [dict(r) for r in db.execute(sql, tuple(params)).fetchall()]


class _SqliteWriter:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self.db.execute(sql, tuple(params)).rowcount

    def run_groups(self, groups: Sequence[Group]) -> list[int]:
        return [self.db.executemany(g.sql, g.rows).rowcount for g in groups]

    def insert_rows(self, rows: NewRows) -> None:
        self.db.executemany(insert_sql(rows.table, rows.columns), rows.rows)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return _fetch(self.db, sql, params)
