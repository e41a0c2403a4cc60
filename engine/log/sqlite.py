"""The embedded log: one SQLite file in WAL mode.

Durability: an append is one transaction, committed before ``append`` returns. With
``durability="process"`` (default) SQLite runs ``synchronous=NORMAL``: a committed append
survives the process being killed (it is in the WAL), and only an OS crash or power loss can
lose the last commits. ``durability="power"`` runs ``synchronous=FULL``: one fsync per append.

Appends go through group commit (engine.log.sqlite_commit): the appends of many sessions made
while the previous transaction was being committed share the next one. In "power" mode that
shares the fsync, and the COMMIT runs off the event-loop thread; in "process" mode the COMMIT
(no fsync) runs on the loop, and batching saves the per-transaction work. Reads run on the
caller's thread, on a connection of their own. An in-memory database commits each append alone.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Callable, Literal, Sequence, TypeVar

from .. import codec
from ..errors import ConcurrencyError, ConfigurationError, DuplicateSubmissionError, EventError, LogError
from ..events import Event
from .base import EventLog, LogRecord, check_batch, partition_for
from .sqlite_commit import GroupCommit
from .submissions import SUBMITTED_TYPES, submission_keys
from .zdict import pack, unpack

Durability = Literal["process", "power"]
T = TypeVar("T")

_EVENTS = (
    "CREATE TABLE IF NOT EXISTS sessions (key INTEGER PRIMARY KEY, session_id TEXT NOT NULL UNIQUE)",
    """CREATE TABLE IF NOT EXISTS events (
    position   INTEGER PRIMARY KEY,
    partition  INTEGER NOT NULL,
    session    INTEGER NOT NULL,
    version    INTEGER NOT NULL,
    type       TEXT    NOT NULL,
    value      BLOB    NOT NULL,
    UNIQUE (session, version)
)""",
    "CREATE INDEX IF NOT EXISTS events_by_partition ON events (partition, position)",
    "CREATE INDEX IF NOT EXISTS snapshots_by_session ON events (session, version) "
    "WHERE type = 'SnapshotTaken'",
)
"""The events and their sessions (layout 2). A row names its session by ``sessions.key``, a
small integer, not by the session id: the id is stored once, not in every row and every index
entry (about 70 bytes per event). Layout 1 (files written before) had ``session_id`` in
``events``; ``_migrate`` rewrites such a file once, on open."""
_SESSION = "session = (SELECT key FROM sessions WHERE session_id = ?)"
"""A row's session, by id (the subquery is evaluated once per statement, then the index is used)."""
_SCHEMA = (
    ";\n".join(_EVENTS)
    + """;
CREATE TABLE IF NOT EXISTS group_offsets (
    group_id    TEXT    NOT NULL,
    partition   INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    PRIMARY KEY (group_id, partition)
);
CREATE TABLE IF NOT EXISTS log_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS submissions (
    session_id TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    PRIMARY KEY (session_id, key)
) WITHOUT ROWID;
"""
)
"""``submissions``: the keys of every submitted event (engine.log.submissions), written in the
append's transaction, so a session takes each submission once, whichever process appends."""


_HEADS = (
    f"SELECT (SELECT COALESCE(MAX(version), 0) FROM events WHERE {_SESSION}), "
    "(SELECT COALESCE(MAX(position), 0) FROM events)"
)
"""The session's last version and the log's last position, read under the write lock."""


class SqliteEventLog(EventLog):
    def __init__(
        self,
        path: str | Path,
        *,
        partitions: int = 8,
        durability: Durability = "process",
        compress: bool = True,
    ):
        if durability not in ("process", "power"):
            raise ConfigurationError(f"durability must be 'process' or 'power', not {durability!r}")
        self.path = Path(path)
        self.compress = compress
        """Store new values compressed with the shipped zstd dictionary (engine.log.zdict);
        values are read either way."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = _connect(self.path, durability)
        self._migrate()
        self._db.executescript(_SCHEMA)
        self.partitions = self._fix_partitions(partitions)
        self._index_old_submissions()
        self._waiters: list[asyncio.Future[None]] = []
        self.group: GroupCommit | None = None
        """The appends' group commit (None for an in-memory database)."""
        if not _in_memory(path):
            self.group = GroupCommit(lambda: _connect(self.path, durability), off_loop=durability == "power")

    def _fix_partitions(self, wanted: int) -> int:
        if wanted < 1:
            raise ConfigurationError("partitions must be at least 1")
        self._db.execute("INSERT OR IGNORE INTO log_meta VALUES ('partitions', ?)", (str(wanted),))
        stored = int(self._db.execute("SELECT value FROM log_meta WHERE key='partitions'").fetchone()[0])
        if stored != wanted:
            raise ConfigurationError(
                f"{self.path} was created with {stored} partitions, not {wanted}; a session's "
                "partition must never change. Open it with partitions="
                f"{stored} or use a new log file."
            )
        return stored

    def _migrate(self) -> None:
        """Rewrite a layout-1 file (``events.session_id``) into layout 2, once: sessions get
        their keys, plain values are compressed, and the file is vacuumed to give the space
        back. Other processes wait on the write lock and then find the file migrated."""
        db = self._db
        if not _old_layout(db):
            return
        db.create_function("turnlog_pack", 1, _migrated_value, deterministic=True)
        db.execute("BEGIN IMMEDIATE")
        try:
            if _old_layout(db):  # still: no other process migrated it while we waited
                db.execute("ALTER TABLE events RENAME TO events_layout_1")
                db.execute("DROP INDEX IF EXISTS events_by_partition")
                db.execute("DROP INDEX IF EXISTS snapshots_by_session")
                for statement in _EVENTS:
                    db.execute(statement)
                db.execute(
                    "INSERT INTO sessions (session_id) SELECT session_id FROM events_layout_1 "
                    "GROUP BY session_id ORDER BY MIN(position)"
                )
                db.execute(
                    "INSERT INTO events SELECT e.position, e.partition, s.key, e.version, e.type, "
                    "turnlog_pack(e.value) FROM events_layout_1 e JOIN sessions s USING (session_id) "
                    "ORDER BY e.position"
                )
                db.execute("DROP TABLE events_layout_1")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("VACUUM")

    def _index_old_submissions(self) -> None:
        """Fill ``submissions`` from a log written before it existed (once)."""
        if self._db.execute("SELECT 1 FROM log_meta WHERE key = 'submissions_indexed'").fetchone():
            return
        marks = ",".join("?" * len(SUBMITTED_TYPES))
        rows = self._db.execute(
            f"SELECT partition, position, value FROM events WHERE type IN ({marks})", SUBMITTED_TYPES
        ).fetchall()
        events = [_decode(*row) for row in rows]
        keys = [(e.session_id, key, e.version) for e in events for key in submission_keys(e)]
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.executemany("INSERT OR IGNORE INTO submissions VALUES (?, ?, ?)", keys)
            self._db.execute("INSERT OR IGNORE INTO log_meta VALUES ('submissions_indexed', '1')")
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    async def append(self, events: Sequence[Event], *, expected_version: int) -> list[LogRecord]:
        session_id = check_batch(events, expected_version)
        partition = partition_for(session_id, self.partitions)
        values = [codec.encode(e) for e in events]
        if self.compress:
            values = [pack(v) for v in values]
        keys = [(session_id, key, e.version) for e in events for key in submission_keys(e)]

        def write(db: sqlite3.Connection) -> range:
            """The append's writes, inside a transaction that holds the write lock: versions
            and positions cannot move under us."""
            if keys:
                _refuse_held(db, keys)
            actual, last = db.execute(_HEADS, (session_id,)).fetchone()
            if actual != expected_version:
                raise ConcurrencyError(session_id, expected_version, actual)
            if keys:
                db.executemany("INSERT INTO submissions VALUES (?, ?, ?)", keys)
            session = _session_key(db, session_id) if expected_version else _new_session_key(db, session_id)
            positions = range(last + 1, last + 1 + len(events))
            db.executemany(
                "INSERT INTO events (position, partition, session, version, type, value) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (pos, partition, session, e.version, e.type, value)
                    for pos, e, value in zip(positions, events, values, strict=True)
                ],
            )
            return positions

        positions = await self._write(write)
        self._notify()
        return [LogRecord(partition, pos, e) for pos, e in zip(positions, events, strict=True)]

    async def _write(self, job: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``job`` in a write transaction, committed when this returns: group commit, or
        for an in-memory database a transaction of its own."""
        if self.group is not None:
            return await self.group.write(job)
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            result = job(db)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return result

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def wait_for_append(self, timeout: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            pass

    async def read_session(self, session_id: str, after_version: int = 0) -> list[Event]:
        rows = self._db.execute(
            f"SELECT partition, position, value FROM events WHERE {_SESSION} AND version > ? "
            "ORDER BY version",
            (session_id, after_version),
        ).fetchall()
        return [_decode(p, o, v) for p, o, v in rows]

    async def latest_snapshot(self, session_id: str, at_or_before: int | None = None) -> Event | None:
        """One index lookup (the partial index ``snapshots_by_session``)."""
        row = self._db.execute(
            f"SELECT partition, position, value FROM events WHERE {_SESSION} AND type = 'SnapshotTaken' "
            "AND version <= ? ORDER BY version DESC LIMIT 1",
            (session_id, (1 << 63) - 1 if at_or_before is None else at_or_before),
        ).fetchone()
        return None if row is None else _decode(*row)

    async def snapshots_between(self, session_id: str, first: int, last: int) -> list[Event]:
        """One range read of the partial index ``snapshots_by_session``."""
        rows = self._db.execute(
            f"SELECT partition, position, value FROM events WHERE {_SESSION} AND type = 'SnapshotTaken' "
            "AND version BETWEEN ? AND ? ORDER BY version",
            (session_id, first, last),
        ).fetchall()
        return [_decode(*row) for row in rows]

    async def versions_of(self, session_id: str, types: Sequence[str], before: int) -> list[tuple[int, str]]:
        marks = ",".join("?" * len(types))
        rows = self._db.execute(
            f"SELECT version, type FROM events WHERE {_SESSION} AND version < ? AND type IN ({marks}) "
            "ORDER BY version",
            (session_id, before, *types),
        ).fetchall()
        return [(int(v), str(t)) for v, t in rows]

    async def read_session_records(self, session_id: str, after_version: int = 0) -> list[LogRecord]:
        rows = self._db.execute(
            f"SELECT partition, position, value FROM events WHERE {_SESSION} AND version > ? "
            "ORDER BY version",
            (session_id, after_version),
        ).fetchall()
        return [LogRecord(p, o, _decode(p, o, v)) for p, o, v in rows]

    async def session_version(self, session_id: str) -> int:
        (version,) = self._db.execute(
            f"SELECT COALESCE(MAX(version), 0) FROM events WHERE {_SESSION}", (session_id,)
        ).fetchone()
        return int(version)

    async def read_partition(self, partition: int, offset: int, limit: int = 500) -> list[LogRecord]:
        self._check_partition(partition)
        rows = self._db.execute(
            "SELECT position, value FROM events WHERE partition = ? AND position >= ? "
            "ORDER BY position LIMIT ?",
            (partition, offset, limit),
        ).fetchall()
        return [LogRecord(partition, pos, _decode(partition, pos, value)) for pos, value in rows]

    async def end_offset(self, partition: int) -> int:
        self._check_partition(partition)
        (last,) = self._db.execute(
            "SELECT MAX(position) FROM events WHERE partition = ?", (partition,)
        ).fetchone()
        return 0 if last is None else int(last) + 1

    async def committed(self, group: str, partition: int) -> int:
        row = self._db.execute(
            "SELECT next_offset FROM group_offsets WHERE group_id = ? AND partition = ?",
            (group, partition),
        ).fetchone()
        return 0 if row is None else int(row[0])

    async def commit(self, group: str, partition: int, offset: int) -> None:
        self._check_partition(partition)

        def write(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO group_offsets VALUES (?, ?, ?) ON CONFLICT (group_id, partition) "
                "DO UPDATE SET next_offset = excluded.next_offset",
                (group, partition, offset),
            )

        if self.group is not None:  # it shares the appends' fsync
            await self.group.write(write)
        else:
            write(self._db)

    async def close(self) -> None:
        if self.group is not None:
            await self.group.close()
        self._db.close()

    def _check_partition(self, partition: int) -> None:
        if not 0 <= partition < self.partitions:
            raise LogError(f"partition {partition} out of range 0..{self.partitions - 1}")


def _connect(path: Path, durability: Durability) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={'NORMAL' if durability == 'process' else 'FULL'}")
    db.execute("PRAGMA busy_timeout=5000")
    return db


def _in_memory(path: str | Path) -> bool:
    """A private in-memory database: a second connection would open another one."""
    name = str(path)
    return name in ("", ":memory:") or name.startswith("file::memory:") or "mode=memory" in name


def _session_key(db: sqlite3.Connection, session_id: str) -> int:
    row = db.execute("SELECT key FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
    return int(row[0]) if row is not None else _new_session_key(db, session_id)


def _new_session_key(db: sqlite3.Connection, session_id: str) -> int:
    """Inside the append's transaction: a rolled-back append takes its key back with it."""
    db.execute("INSERT OR IGNORE INTO sessions (session_id) VALUES (?)", (session_id,))
    (key,) = db.execute("SELECT key FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
    return int(key)


def _refuse_held(db: sqlite3.Connection, keys: list[tuple[str, str, int]]) -> None:
    """DuplicateSubmissionError if the session already holds one of the batch's keys."""
    session_id = keys[0][0]
    marks = ",".join("?" * len(keys))
    held = db.execute(
        f"SELECT key, version FROM submissions WHERE session_id = ? AND key IN ({marks}) LIMIT 1",
        (session_id, *(key for _, key, _ in keys)),
    ).fetchone()
    if held is not None:
        raise DuplicateSubmissionError(session_id, held[0], held[1])


def _decode(partition: int, position: int, value: bytes) -> Event:
    try:
        return codec.decode(unpack(value))
    except EventError as exc:
        raise type(exc)(f"partition {partition} offset {position}: {exc}") from exc


def _old_layout(db: sqlite3.Connection) -> bool:
    """Whether the file has layout 1: ``events`` rows carrying their session id."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(events)")}
    return "session_id" in columns


def _migrated_value(value: bytes) -> bytes:
    """A layout-1 value as layout 2 stores it: plain Avro compressed (never twice)."""
    return pack(value) if value[:2] == codec.MAGIC else value
