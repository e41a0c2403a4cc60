"""What one append of the embedded log does inside the group commit's write transaction
(engine.log.sqlite_commit): the jobs ``SqliteEventLog`` hands it. A job runs under the file's
write lock, after every job queued before it in the transaction, so the session's head and the
log's last position it reads cannot move before it writes. Three kinds: an append's row written
at once (``row_job``), a redoable append held in memory (``held_job``, engine.log.sqlite_held),
and a producer's submission, given its version there (``next_job``), so it never loses a
version race to another append.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from ..errors import ConcurrencyError, DuplicateSubmissionError, SessionNotFoundError
from ..events import Event
from .sealing import PLAIN, RecordCodec
from .sqlite_batch import delimited_events
from .sqlite_held import HeldRows
from .sqlite_layout import SESSION_KEY
from .submissions import submission_keys
from .zdict import pack

T = TypeVar("T")
HEADS = (
    "SELECT s.key, (SELECT version + count - 1 FROM batches WHERE session = s.key ORDER BY version DESC "
    "LIMIT 1), (SELECT position + count - 1 FROM batches ORDER BY position DESC LIMIT 1) "
    "FROM (SELECT (" + SESSION_KEY + ") AS key) AS s"
)
"""The session's key, its last version and the log's last position (each NULL if none), read
under the write lock in one statement."""

Keys = list[tuple[str, str, int]]
"""An append's submission keys: (session id, key, version) (engine.log.submissions)."""
Job = Callable[[sqlite3.Connection], T]
"""A write job: run by the group commit inside its transaction (engine.log.sqlite_commit)."""
RaiseLost = Callable[[str], None]
"""Raises, once, the error a session's redoable append left when its COMMIT failed after it
returned (``SqliteEventLog._lose``): the session's writer must fold again."""


@dataclass(frozen=True, slots=True)
class Head:
    """Where an append goes: its session and partition, the version it expects the session at,
    how many events it holds and the version of its first snapshot that holds a state."""

    session_id: str
    partition: int
    expected_version: int
    count: int
    snapshot: int | None


def row_job(head: Head, keys: Keys, value: bytes, raise_lost: RaiseLost) -> Job[range]:
    """An append's job that writes its row at once (every append but a held one); ``value`` is
    the stored batch. Returns its positions."""
    sid = head.session_id

    def write(db: sqlite3.Connection) -> range:
        raise_lost(sid)
        if keys:
            refuse_held(db, keys)
        session, actual, last = db.execute(HEADS, (sid,)).fetchone()
        if (actual or 0) != head.expected_version:
            raise ConcurrencyError(sid, head.expected_version, actual or 0)
        if session is None:
            session = new_session_key(db, sid)
        row = (head.partition, session, head.expected_version + 1, head.count, head.snapshot, value)
        return insert_batch(db, keys, (last or 0) + 1, row)

    return write


def held_job(rows: HeldRows, head: Head, body: bytes, raise_lost: RaiseLost) -> Job[range]:
    """A redoable append's job (engine.log.sqlite_held): checked against the session's head as
    the held appends left it (read from the file if it has none), its row held until the
    transaction's next other write or its COMMIT. It writes nothing it would have to undo: it
    runs without a savepoint."""
    sid = head.session_id

    def write(db: sqlite3.Connection) -> range:
        raise_lost(sid)
        held, last = rows.head(sid), rows.last_position()
        if held is None:
            session, actual, file_last = db.execute(HEADS, (sid,)).fetchone()
            held = (session, actual or 0)
            if last is None:  # nothing held: the file has the log's last position
                last = file_last
        session, actual = held
        if actual != head.expected_version:
            raise ConcurrencyError(sid, head.expected_version, actual)
        position = (last or 0) + 1
        if session is None:  # the session's first append (the last write: nothing to undo after it)
            session = new_session_key(db, sid)
        version = head.expected_version + 1
        rows.add(sid, session, head.partition, position, version, head.count, head.snapshot, body)
        return range(position, position + head.count)

    return write


def next_job(
    event: Event, partition: int, compress: bool, records: RecordCodec = PLAIN
) -> Job[tuple[Event, range, int]]:
    """A submission to an existing session (``EventLog._append_next``), given the session's next
    version as the transaction sees it: concurrent submissions in one group commit take
    consecutive versions, and none is refused. It does not take a lost redoable append's error
    (``RaiseLost``): that belongs to the writer whose batch was lost. Returns the event as
    appended, its position and its encoded size (uncompressed)."""
    sid = event.session_id

    def write(db: sqlite3.Connection) -> tuple[Event, range, int]:
        session, actual, last = db.execute(HEADS, (sid,)).fetchone()
        if session is None:
            raise SessionNotFoundError(sid)
        sequenced = dataclasses.replace(event, version=actual + 1)
        keys = [(sid, key, sequenced.version) for key in submission_keys(sequenced)]
        if keys:
            refuse_held(db, keys)
        body = delimited_events([sequenced], records)
        row = (partition, session, sequenced.version, 1, None, pack(body) if compress else body)
        return sequenced, insert_batch(db, keys, (last or 0) + 1, row), len(body)

    return write


def new_session_key(db: sqlite3.Connection, session_id: str) -> int:
    """Inside the append's transaction: a rolled-back append takes its key back with it."""
    key = db.execute("INSERT INTO sessions (session_id) VALUES (?)", (session_id,)).lastrowid
    assert key is not None
    return key


def insert_batch(db: sqlite3.Connection, keys: Keys, position: int, row: tuple[Any, ...]) -> range:
    """Write one append's ``batches`` row (``row``: partition, session key, version, count,
    snapshot, value) at ``position``, and its submission keys; the positions it takes."""
    if keys:
        db.executemany("INSERT INTO submissions VALUES (?, ?, ?)", keys)
    db.execute("INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?, ?)", (position, *row))
    return range(position, position + row[3])


def refuse_held(db: sqlite3.Connection, keys: Keys) -> None:
    """DuplicateSubmissionError if the session already holds one of the batch's keys."""
    session_id = keys[0][0]
    marks = ",".join("?" * len(keys))
    held = db.execute(
        f"SELECT key, version FROM submissions WHERE session_id = ? AND key IN ({marks}) LIMIT 1",
        (session_id, *(key for _, key, _ in keys)),
    ).fetchone()
    if held is not None:
        raise DuplicateSubmissionError(session_id, held[0], held[1])
