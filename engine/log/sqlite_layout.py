"""The embedded log's file layouts: the current tables, the queries that read them, and the
one-time migration of older files to the current layout.

* Layout 1: an ``events`` row per event, carrying its session id; plain Avro values.
* Layout 2: an ``events`` row per event, naming its session by ``sessions.key``; values
  compressed one by one (engine.log.zdict).
* Layout 3 (current): a ``batches`` row per append (engine.log.sqlite_batch), or per run of a
  session's held appends (engine.log.sqlite_held).

A file of layout 1 or 2 is rewritten into layout 3 on open, in one transaction, and vacuumed to
give the space back. Every event keeps its partition, position and version, so consumer-group
offsets (``group_offsets``) and positions other stores kept (projections) stay valid. Old rows
are grouped into batches as they lie: consecutive positions of one session, at most
``MIGRATED_BATCH`` events a batch (the old files do not say where their appends began).
"""

from __future__ import annotations

import sqlite3
from typing import Iterable, Iterator, Sequence

from ..errors import MalformedEventError
from .sqlite_batch import pack_batch, split_batch
from .zdict import unpack

BATCHES = (
    "CREATE TABLE IF NOT EXISTS sessions (key INTEGER PRIMARY KEY, session_id TEXT NOT NULL UNIQUE)",
    """CREATE TABLE IF NOT EXISTS batches (
    position   INTEGER PRIMARY KEY,
    partition  INTEGER NOT NULL,
    session    INTEGER NOT NULL,
    version    INTEGER NOT NULL,
    count      INTEGER NOT NULL,
    snapshot   INTEGER,
    value      BLOB    NOT NULL,
    UNIQUE (session, version)
)""",
    "CREATE INDEX IF NOT EXISTS batches_by_partition ON batches (partition, position)",
)
"""The events (layout 3): one row per append (engine.log.sqlite_batch), or per run of a session's
held appends (engine.log.sqlite_held). ``position`` and ``version`` are its first event's,
``count`` how many it holds (the others follow at position + 1, version + 1, ...), ``snapshot``
the version of its first ``SnapshotTaken`` (NULL if none).
A row names its session by ``sessions.key``, a small integer, not by the session id. A session's
snapshots are found through ``UNIQUE (session, version)``: almost every append of a turn holds
one, so an index of their own (``batches_with_snapshots``, dropped on open) cost a B-tree page
in every COMMIT to save a walk over a batch or two. Files of layout 2 (an ``events`` row per
event) and layout 1 (``session_id`` in every row) are migrated once, on open (``migrate``)."""
SCHEMA = (
    ";\n".join(BATCHES)
    + """;
DROP INDEX IF EXISTS batches_with_snapshots;
CREATE TABLE IF NOT EXISTS group_offsets (
    group_id    TEXT    NOT NULL,
    partition   INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    PRIMARY KEY (group_id, partition)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS log_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS submissions (
    session_id TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    PRIMARY KEY (session_id, key)
) WITHOUT ROWID;
"""
)
"""``submissions``: the keys of every submitted event (engine.log.submissions), written in the
append's transaction, so a session takes each submission once, whichever process appends.
``group_offsets`` and ``log_meta`` are WITHOUT ROWID in files made since layout 3 (one B-tree
each instead of two; older files keep theirs, which read and write the same)."""

FROM_VERSION = (
    "SELECT partition, position, version, value FROM batches WHERE session = ?1 AND version >= "
    "COALESCE((SELECT version FROM batches WHERE session = ?1 AND version <= ?2 ORDER BY version DESC "
    "LIMIT 1), 0) AND version + count > ?2 ORDER BY version"
)
"""A session's batches from the one that holds version ?2 on: none when the session ends before
?2 (a reader that is caught up reads no value, so decompresses none)."""
SESSION_KEY = "SELECT key FROM sessions WHERE session_id = ?"
LAST_VERSION = "SELECT version + count - 1 FROM batches WHERE session = ? ORDER BY version DESC LIMIT 1"
"""A session's last version (no row: none)."""
SNAPSHOTS_FROM = (
    "SELECT partition, position, version, value FROM batches WHERE session = ?1 AND version >= "
    "COALESCE((SELECT version FROM batches WHERE session = ?1 AND version <= ?2 AND snapshot <= ?2 "
    "ORDER BY version DESC LIMIT 1), 0) AND version <= ?3 AND snapshot <= ?3 ORDER BY version"
)
"""The batches that may hold a session's snapshots between ?2 and ?3: from the last batch whose
first snapshot is at or before ?2 (it may hold more after it) to ?3. Both are range reads of
``UNIQUE (session, version)`` (a batch's first snapshot is at or after its version, so ordering
by version orders by snapshot); the walk back from ?2 passes the batches after the newest
snapshot, which a load from it reads anyway."""
FROM_POSITION = (
    "SELECT position, value FROM batches WHERE partition = ?1 AND position >= "
    "COALESCE((SELECT position FROM batches WHERE partition = ?1 AND position <= ?2 ORDER BY position "
    "DESC LIMIT 1), 0) ORDER BY position"
)
"""A partition's batches from the one that holds position ?2 on."""
SESSIONS_OF = (
    "SELECT s.session_id, (SELECT version + count - 1 FROM batches WHERE session = s.key ORDER BY version "
    "DESC LIMIT 1) FROM sessions s CROSS JOIN batches b ON b.session = s.key AND b.version = 1 "
    "WHERE b.partition = ?1 AND s.session_id > ?2 ORDER BY s.session_id LIMIT ?3"
)
"""A page of a partition's sessions with their last versions: ``sessions`` walked in id order
(its unique index; CROSS JOIN keeps it the outer loop, so a page reads about ``partitions``
times ``limit`` sessions, never a partition's history), each session's first batch (``UNIQUE
(session, version)``: every session's first append is at version 1) telling its partition, its
last batch its version."""
MIGRATED_BATCH = 64
Row = tuple[int, int, int, int, str, bytes]
"""An old event row: position, partition, session key, version, type, value."""


def layout(db: sqlite3.Connection) -> int:
    """The file's layout: 1 or 2 if it has an ``events`` table of that shape, else 3 (a new
    file is created as layout 3)."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(events)")}
    if not columns:
        return 3
    return 1 if "session_id" in columns else 2


def all_records(db: sqlite3.Connection) -> list[bytes]:
    """Every event record of a file of any layout, as the codec wrote it, in position order
    (training the dictionary, benchmarks of the decoder)."""
    if layout(db) == 3:
        rows = db.execute("SELECT value FROM batches ORDER BY position")
        return [record for (value,) in rows for record in split_batch(bytes(value))]
    return [unpack(bytes(value)) for (value,) in db.execute("SELECT value FROM events ORDER BY position")]


def migrate(db: sqlite3.Connection, create: Sequence[str], *, compress: bool) -> None:
    """Rewrite a layout-1 or layout-2 file into layout 3 (``create``: its statements), once.
    Other processes wait on the write lock and then find the file migrated."""
    if layout(db) == 3:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        old = layout(db)  # again, under the lock: another process may have migrated it
        if old != 3:
            for statement in create:
                db.execute(statement)
            if old == 1:
                db.execute(
                    "INSERT INTO sessions (session_id) SELECT session_id FROM events "
                    "GROUP BY session_id ORDER BY MIN(position)"
                )
            db.executemany(
                "INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?, ?)", _batches(_old_rows(db, old), compress)
            )
            db.execute("DROP TABLE events")  # and its indexes
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("VACUUM")


def _old_rows(db: sqlite3.Connection, old: int) -> Iterator[Row]:
    if old == 1:
        query = (
            "SELECT e.position, e.partition, s.key, e.version, e.type, e.value FROM events e "
            "JOIN sessions s USING (session_id) ORDER BY e.position"
        )
    else:
        query = "SELECT position, partition, session, version, type, value FROM events ORDER BY position"
    # a cursor of its own: the INSERTs into batches run on the same connection meanwhile
    yield from db.cursor().execute(query)


def _batches(rows: Iterable[Row], compress: bool) -> Iterator[tuple[object, ...]]:
    """Layout-3 rows for the old rows, in position order. A value that cannot be decompressed
    becomes a batch of its own, stored as it was: the migration loses nothing, and reading it
    fails as it did before, naming its position."""
    run: list[tuple[Row, bytes]] = []
    for row in rows:
        try:
            record = unpack(bytes(row[5]))
        except MalformedEventError:
            if run:
                yield _batch(run, compress)
                run = []
            yield (*row[:4], 1, None, bytes(row[5]))
            continue
        if run and not _continues(run[-1][0], len(run), row):
            yield _batch(run, compress)
            run = []
        run.append((row, record))
    if run:
        yield _batch(run, compress)


def _continues(last: Row, length: int, row: Row) -> bool:
    return (
        length < MIGRATED_BATCH
        and row[0] == last[0] + 1
        and row[1] == last[1]
        and row[2] == last[2]
        and row[3] == last[3] + 1
    )


def _batch(run: list[tuple[Row, bytes]], compress: bool) -> tuple[object, ...]:
    position, partition, session, version = run[0][0][:4]
    snapshot = next((row[3] for row, _ in run if row[4] == "SnapshotTaken"), None)
    value = pack_batch([record for _, record in run], compress=compress)
    return (position, partition, session, version, len(run), snapshot, value)


KEYS_KEPT = 65536
"""Session keys a ``SessionKeys`` keeps (a few MB); older ones are asked for again."""


class SessionKeys:
    """Session id -> its key in the ``sessions`` table, as a reader found it committed. Nothing
    updates or deletes a committed ``sessions`` row, so a key once found is kept (the last
    ``KEYS_KEPT``) and every later read of the session spares the lookup; a session without one
    is asked for again (an append may commit it)."""

    def __init__(self, kept: int = KEYS_KEPT) -> None:
        self.kept = kept
        self._keys: dict[str, int] = {}

    def of(self, db: sqlite3.Connection, session_id: str) -> int | None:
        key = self._keys.get(session_id)
        if key is not None:
            return key
        row = db.execute(SESSION_KEY, (session_id,)).fetchone()
        if row is None:
            return None
        if len(self._keys) >= self.kept:
            del self._keys[next(iter(self._keys))]  # the oldest found
        key = self._keys[session_id] = int(row[0])
        return key
