"""The embedded log: one SQLite file in WAL mode.

Durability: an append is one transaction, committed before ``append`` returns. With
``durability="process"`` (default) SQLite runs ``synchronous=NORMAL``: a committed append
survives the process being killed (it is in the WAL), and only an OS crash or power loss can
lose the last commits. ``durability="power"`` runs ``synchronous=FULL``: one fsync per append.

Appends go through group commit (engine.log.sqlite_commit): the appends of many sessions made
while the previous transaction was being committed share the next one. In "power" mode that
shares the fsync, and the COMMIT runs off the event-loop thread; in "process" mode the COMMIT
(no fsync) runs on the loop, and batching saves the per-transaction work. What each append
does inside that transaction is engine.log.sqlite_jobs (a submission is given its version there).
Reads run on the caller's thread, on a connection of their own. An in-memory database commits
each append alone.
"""

from __future__ import annotations

import functools
import sqlite3
from pathlib import Path
from typing import Any, Awaitable, Callable, Literal, Sequence, TypeVar, cast

from .. import codec
from ..errors import (
    ConfigurationError,
    LogError,
    LogUnavailableError,
)
from ..events import Event
from .base import (
    SESSIONS_PAGE,
    EventLog,
    LogRecord,
    SessionSummary,
    check_batch,
    first_state_snapshot,
    holds_state,
    partition_for,
)
from .local_live import LocalLive
from .sealing import RecordCodec, Sealer
from .sqlite_batch import decode_at, delimited_events, records_at
from .sqlite_commit import HOLD_S, GroupCommit, commit_every_hold
from .sqlite_held import HeldRows
from .sqlite_jobs import Head, held_job, next_job, row_job
from .sqlite_layout import (
    BATCHES,
    FROM_POSITION,
    FROM_VERSION,
    LAST_VERSION,
    SCHEMA,
    SESSIONS_OF,
    SNAPSHOTS_FROM,
    SessionKeys,
    migrate,
)
from .sqlite_recent import RecentRecords
from .submissions import SUBMITTED_TYPES, submission_keys
from .waiters import Waiters
from .zdict import pack

Durability = Literal["process", "power"]
T = TypeVar("T")
R = TypeVar("R", bound=Callable[..., Awaitable[Any]])

SNAPSHOT = "SnapshotTaken"
MAX_HOLD_S = 1.0
"""The longest ``hold_s`` taken: other processes' writers wait up to that long for the write lock
(their busy timeout is 5 s)."""


def _after_own_writes(read: R) -> R:
    """A read of the log's connection that first waits until every append of this process that
    has returned is committed (a redoable one may be held: engine.log.sqlite_commit), so it
    reads what this process's writers were told is appended."""

    @functools.wraps(read)
    async def caught_up_first(self: SqliteEventLog, *args: Any, **kwargs: Any) -> Any:
        commit_every_hold()  # this log's, and another's on this thread (nothing to do if none)
        if self.group is not None and self.group.behind():
            await self.group.caught_up()
        return await read(self, *args, **kwargs)

    return cast(R, caught_up_first)


class SqliteEventLog(EventLog):
    """The embedded log: one SQLite file, no services; the default backend (module docstring:
    durability and group commit)."""

    def __init__(
        self,
        path: str | Path,
        *,
        partitions: int = 8,
        durability: Durability = "process",
        compress: bool = True,
        hold_s: float = HOLD_S,
        encrypt: bool = True,
        sealer: Sealer | None = None,
    ):
        """``hold_s``: how long redoable appends may wait, held in an open transaction, for the
        next append that waits for its COMMIT (engine.log.sqlite_commit): how late other
        processes may see them, and how much a crash makes a writer redo. 0 commits them on the
        loop's next turn.

        ``encrypt``: content is encrypted per session (engine.crypto) with ``sealer``, by
        default with the key store and master key beside the file (``log.keys.db``,
        ``master.key``; ``TURNLOG_KEYSTORE`` / ``TURNLOG_MASTER_KEY`` name others). An
        in-memory database is never encrypted. Values written unencrypted are read either way."""
        if durability not in ("process", "power"):
            raise ConfigurationError(f"durability must be 'process' or 'power', not {durability!r}")
        if not 0 <= hold_s <= MAX_HOLD_S:
            raise ConfigurationError(
                f"hold_s must be from 0 to {MAX_HOLD_S} seconds (a held transaction keeps other "
                f"processes' writers waiting), not {hold_s!r}"
            )
        self.path = Path(path)
        self.compress = compress
        self.records = RecordCodec(
            sealer if sealer is not None else _default_sealer(path, encrypt, durability)
        )
        """How events become records: the Avro codec, through the content cipher if encrypted."""
        self._owns_sealer = sealer is None
        """Store new values compressed with the shipped zstd dictionary (engine.log.zdict);
        values are read either way."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        commit_every_hold()  # another log's on this thread: opening writes, and must not wait for it
        self._db = _connect(self.path, durability)
        migrate(self._db, BATCHES, compress=compress)
        self._db.executescript(SCHEMA)
        self.partitions = self._fix_partitions(partitions)
        self._index_old_submissions()
        self._waiters = Waiters()
        self._lost: dict[str, LogUnavailableError] = {}  # redoable appends lost after returning
        self.group: GroupCommit | None = None  # the appends' group commit (none in memory)
        self.live: LocalLive | None = None
        """The processes on this machine sharing the file, told of each append (``share_live``)."""
        self.recent, self._keys = RecentRecords(), SessionKeys()  # what spares reads of the file
        self.records.on_forget(self.recent.forget)
        self.held_rows = HeldRows(compress=compress)
        """The rows of the redoable appends held in the group commit's open transaction (a
        group commit without held rows holds no append)."""
        if not _in_memory(path):
            self.group = GroupCommit(
                lambda: _connect(self.path, durability),
                off_loop=durability == "power",
                hold_s=hold_s,
                held_rows=self.held_rows,
            )

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

    def _index_old_submissions(self) -> None:
        """Fill ``submissions`` from a log written before it existed (once)."""
        if self._db.execute("SELECT 1 FROM log_meta WHERE key = 'submissions_indexed'").fetchone():
            return
        wanted = set(SUBMITTED_TYPES)
        rows = self._db.execute("SELECT partition, position, version, value FROM batches").fetchall()
        events = [
            decode_at(p, o + i, record)
            for p, o, _v, value in rows
            for i, record in enumerate(records_at(p, o, value))
            if codec.type_of(record) in wanted
        ]
        keys = [(e.session_id, key, e.version) for e in events for key in submission_keys(e)]
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.executemany("INSERT OR IGNORE INTO submissions VALUES (?, ?, ?)", keys)
            self._db.execute("INSERT OR IGNORE INTO log_meta VALUES ('submissions_indexed', '1')")
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    async def append(
        self, events: Sequence[Event], *, expected_version: int, redoable: bool = False
    ) -> list[LogRecord]:
        session_id = check_batch(events, expected_version)
        partition = partition_for(session_id, self.partitions)
        body = delimited_events(events, self.records)
        snapshot = first_state_snapshot(events)  # restore points are not indexed: loads skip them
        keys = [(session_id, key, e.version) for e in events for key in submission_keys(e)]
        group = self.group
        head = Head(session_id, partition, expected_version, len(events), snapshot)
        if redoable and not keys and group is not None and group.held_rows is not None:
            held = held_job(group.held_rows, head, body, self._raise_lost)
            positions = await group.write(held, on_lost=lambda error: self._lose(session_id, error))
        else:
            value = pack(body) if self.compress else body
            positions = await self._write(row_job(head, keys, value, self._raise_lost))
        self._notify()
        if self.live is not None:  # a held append is announced once committed (other processes read it)
            behind = group is not None and group.behind()
            self.live.appended(session_id, events[-1].version, events[-1].type, committed=not behind)
        records = [LogRecord(partition, pos, e) for pos, e in zip(positions, events, strict=True)]
        self._hold_recent(records, expected_version, len(body))
        return records

    async def _append_next(self, event: Event) -> LogRecord:
        """Sequenced in the write transaction (``sqlite_jobs.next_job``): concurrent submissions
        take consecutive versions."""
        partition = partition_for(event.session_id, self.partitions)
        job = next_job(event, partition, self.compress, self.records)
        sequenced, positions, size = await self._write(job)
        self._notify()
        record = LogRecord(partition, positions[0], sequenced)
        self._hold_recent([record], sequenced.version - 1, size)
        return record

    def _hold_recent(self, records: list[LogRecord], expected_version: int, encoded_bytes: int) -> None:
        """Keep an append's records for this process's reads, unless its session is erased:
        then the file holds them as erased, and so must every read."""
        session_id = records[0].event.session_id
        if self.records.erased(session_id):
            self.recent.drop_session(session_id)
        else:
            self.recent.add(records, expected_version, encoded_bytes)

    def _raise_lost(self, session_id: str) -> None:
        """Raise the error a lost redoable append of the session left (``_lose``), once."""
        lost = self._lost.pop(session_id, None)
        if lost is not None:
            raise lost

    def _lose(self, session_id: str, error: BaseException) -> None:
        """A redoable append of the session returned and then its COMMIT failed: its next
        append fails with this, whatever its version (once; then the session goes on). The
        records held for reads go: the lost ones' positions may be taken by other appends."""
        self.recent.clear()
        self._lost[session_id] = LogUnavailableError(
            f"an earlier append of session {session_id} returned before its COMMIT and then could not "
            f"be committed ({type(error).__name__}: {error}); it is not on the log. Fold the session "
            "again from the log (what it recorded is redone from there), and check the disk the log "
            "file is on (space, permissions)."
        )

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

    async def share_live(self, role: str) -> LocalLive:
        """Tell the other processes on this machine that share this file (and call this) of each
        append, and hear of theirs: waits for appends and event streams wake at once instead
        of on their next poll. The channel also carries a worker's deltas (engine.log.local_live)."""
        live = LocalLive(self.path, role=role, on_append=self._notify)
        await live.start()
        self.live = live
        if self.group is not None:
            self.group.on_settled = live.release
        return live

    def _notify(self) -> None:
        self._waiters.wake()

    async def wait_for_append(self, timeout: float) -> None:
        await self._waiters.wait(timeout)

    async def read_session(self, session_id: str, after_version: int = 0) -> list[Event]:
        return [record.event for record in await self.read_session_records(session_id, after_version)]

    @_after_own_writes
    async def read_session_records(self, session_id: str, after_version: int = 0) -> list[LogRecord]:
        key = self._session(session_id)
        if key is None:
            return []
        decode = self._decoder()
        last = self.recent.held_through(session_id, after_version)
        if last is not None and last == self._last_version(key):  # this process appended them
            held = self.recent.session_after(session_id, after_version, last)
            if held is not None:
                return held
        out: list[LogRecord] = []
        for p, o, v, value in self._db.execute(FROM_VERSION, (key, after_version + 1)).fetchall():
            records = records_at(p, o, value)
            for i in range(max(after_version + 1 - v, 0), len(records)):
                out.append(LogRecord(p, o + i, decode(p, o + i, records[i])))
        return out

    @_after_own_writes
    async def read_session_records_through(
        self, session_id: str, after_version: int, version: int
    ) -> list[LogRecord]:
        """From the records held (``recent``) when they hold every one through ``version``."""
        self.records.reading()  # the cipher learns of other processes' erasures: their records go
        held = self.recent.session_after(session_id, after_version, version)
        return held if held is not None else await self.read_session_records(session_id, after_version)

    @_after_own_writes
    async def latest_snapshot(self, session_id: str, at_or_before: int | None = None) -> Event | None:
        """One walk back the session's batches to the newest holding a snapshot with a state;
        only the snapshots from the end of that batch back to it are decoded (restore points
        before it in a row of held steps are small)."""
        last = (1 << 63) - 1 if at_or_before is None else at_or_before
        key = self._session(session_id)
        if key is None:
            return None
        rows = self._db.execute(SNAPSHOTS_FROM, (key, last, last)).fetchall()
        decode = self._decoder()
        for p, o, v, value in reversed(rows):  # a row may hold several (a turn's held steps): decode one
            records = records_at(p, o, value)
            for i in range(min(len(records), last - v + 1) - 1, -1, -1):
                if codec.type_of(records[i]) == SNAPSHOT:
                    event = decode(p, o + i, records[i])
                    if holds_state(event):
                        return event
        return None

    @_after_own_writes
    async def snapshots_between(self, session_id: str, first: int, last: int) -> list[Event]:
        """One range read of the session's batches from ``first``'s snapshot to ``last``."""
        key = self._session(session_id)
        if key is None:
            return []
        rows = self._db.execute(SNAPSHOTS_FROM, (key, first, last)).fetchall()
        decode = self._decoder()
        found = [
            decode(p, o + i, record)
            for p, o, v, value in rows
            for i, record in enumerate(records_at(p, o, value))
            if first <= v + i <= last and codec.type_of(record) == SNAPSHOT
        ]
        return [event for event in found if holds_state(event)]

    @_after_own_writes
    async def versions_of(self, session_id: str, types: Sequence[str], before: int) -> list[tuple[int, str]]:
        """Reads the session's batches before ``before`` without decoding their events: a
        record's type is in its header."""
        key = self._session(session_id)
        if key is None:
            return []
        wanted = set(types)
        rows = self._db.execute(
            "SELECT partition, position, version, value FROM batches WHERE session = ? AND version < ? "
            "ORDER BY version",
            (key, before),
        ).fetchall()
        found: list[tuple[int, str]] = []
        for p, o, v, value in rows:
            for i, record in enumerate(records_at(p, o, value)):
                kind = codec.type_of(record)
                if v + i < before and kind in wanted:
                    found.append((v + i, kind))
        return found

    @_after_own_writes
    async def session_version(self, session_id: str) -> int:
        key = self._session(session_id)
        return 0 if key is None else self._last_version(key)

    def _last_version(self, key: int) -> int:
        row = self._db.execute(LAST_VERSION, (key,)).fetchone()
        return 0 if row is None else int(row[0])

    @_after_own_writes
    async def list_sessions(
        self, partition: int, *, after: str = "", limit: int = SESSIONS_PAGE
    ) -> list[SessionSummary]:
        """From the sessions table and the batches' index: no event is read."""
        self._check_partition(partition)
        rows = self._db.execute(SESSIONS_OF, (partition, after, max(limit, 0))).fetchall()
        return [SessionSummary(sid, partition, int(version)) for sid, version in rows]

    @_after_own_writes
    async def read_partition(self, partition: int, offset: int, limit: int = 500) -> list[LogRecord]:
        self._check_partition(partition)
        out: list[LogRecord] = []
        if limit <= 0:
            return out
        decode = self._decoder()
        held = self.recent.partition_run(partition, offset, limit)
        if held is not None:
            return held
        cursor = self._db.execute(FROM_POSITION, (partition, offset))
        try:  # row by row: a batch is decompressed only if its events are wanted
            for position, value in cursor:
                records = records_at(partition, position, value)
                start = max(offset - position, 0)
                for i in range(start, min(len(records), start + limit - len(out))):
                    event = decode(partition, position + i, records[i])
                    out.append(LogRecord(partition, position + i, event))
                if len(out) >= limit:
                    break
        finally:
            cursor.close()
        return out

    @_after_own_writes
    async def end_offset(self, partition: int) -> int:
        self._check_partition(partition)
        row = self._db.execute(
            "SELECT position + count FROM batches WHERE partition = ? ORDER BY position DESC LIMIT 1",
            (partition,),
        ).fetchone()
        return 0 if row is None else int(row[0])

    def _decoder(self) -> Callable[[int, int, bytes], Event]:
        """How a read decodes records: through the sealer, told first that a read begins (so
        it drops the keys of sessions other processes erased)."""
        self.records.reading()
        return self.records.decode_at

    def _session(self, session_id: str) -> int | None:
        """The session's key, as the committed log has it (None: no events)."""
        return self._keys.of(self._db, session_id)

    @_after_own_writes
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
        if self.live is not None:
            await self.live.close()
        self._db.close()
        self.records.on_forget(self.recent.forget, remove=True)
        if self._owns_sealer and self.records.sealer is not None:
            self.records.sealer.close()

    def _check_partition(self, partition: int) -> None:
        if not 0 <= partition < self.partitions:
            raise LogError(f"partition {partition} out of range 0..{self.partitions - 1}")


def _default_sealer(path: str | Path, encrypt: bool, durability: Durability) -> Sealer | None:
    """The embedded default: the content cipher on the key store beside the file."""
    if not encrypt or _in_memory(path):
        return None
    from ..crypto.setup import embedded_cipher  # the engine's cipher, handed over as a Sealer

    return embedded_cipher(path, durable=durability == "power")


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
