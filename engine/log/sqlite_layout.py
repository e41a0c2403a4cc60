"""The embedded log's file layouts, and the one-time migration of older files to the current one.

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
