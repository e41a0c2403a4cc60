"""The rows of held appends, kept in memory until their transaction is committed.

A redoable append (engine.log.sqlite_commit) returns before its COMMIT, and its transaction is
held open for the next appends to join. While it is held, this process holds the file's write
lock, so nothing but this process's own appends can move a session's head or the log's last
position. A held append so needs no statement at all: its version is checked against the
session's head as the held appends left it (read from the file once per session and
transaction), its positions follow the last held one, and its events wait here, encoded but
not compressed. Just before anything else writes in the transaction (an append that waits for
its COMMIT, an offset commit) and before the COMMIT, ``flush`` writes them, each session's
consecutive held appends as one ``batches`` row compressed once: a turn's tool steps become
one row instead of one each (one INSERT, one index entry, one zstd frame, which compresses the
steps' shared ids and names better together).

A row stays within ``MAX_ROW_EVENTS`` events (a single append is never split), so a reader that
wants one event of it (a snapshot, when a session is loaded) decompresses a bounded row.
Readers already take rows of several appends (the layout migration writes them too): a row is
a session's consecutive events, whatever appended them.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from .zdict import pack

MAX_ROW_EVENTS = 64
"""The most events a row of several held appends holds."""
_INSERT = "INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?, ?)"


@dataclass(slots=True)
class _Row:
    session_id: str
    key: int
    partition: int
    position: int
    version: int
    count: int
    snapshot: int | None
    body: bytearray
    """The events' records, each behind its length (engine.log.sqlite_batch), not compressed."""

    def takes(self, session_id: str, position: int, count: int) -> bool:
        """Whether an append of ``count`` events at ``position`` continues this row."""
        return (
            session_id == self.session_id
            and position == self.position + self.count
            and self.count + count <= MAX_ROW_EVENTS
        )


class HeldRows:
    """The held appends of the open transaction, as the rows ``flush`` will write."""

    def __init__(self, *, compress: bool) -> None:
        self._compress = compress
        self._rows: list[_Row] = []
        self._heads: dict[str, tuple[int, int]] = {}
        """Each session with held appends: its key and its last held version."""

    def __bool__(self) -> bool:
        return bool(self._rows)

    def head(self, session_id: str) -> tuple[int, int] | None:
        """The session's key and last version if it has held appends (else the file has its
        head)."""
        return self._heads.get(session_id)

    def last_position(self) -> int | None:
        """The log's last position if any append is held: the held ones follow everything in
        the file."""
        if not self._rows:
            return None
        last = self._rows[-1]
        return last.position + last.count - 1

    def add(
        self,
        session_id: str,
        key: int,
        partition: int,
        position: int,
        version: int,
        count: int,
        snapshot: int | None,
        body: bytes,
    ) -> None:
        """Hold one checked append (its version follows the session's head, its position the
        log's last)."""
        rows = self._rows
        if rows and rows[-1].takes(session_id, position, count):
            row = rows[-1]
            row.count += count
            row.body += body
            if row.snapshot is None:
                row.snapshot = snapshot
        else:
            rows.append(_Row(session_id, key, partition, position, version, count, snapshot, bytearray(body)))
        self._heads[session_id] = (key, version + count - 1)

    def flush(self, db: sqlite3.Connection) -> None:
        """Write the held rows in the open transaction, all or none (a savepoint); they are
        dropped from here once written, kept if the INSERT fails (the caller decides)."""
        if not self._rows:
            return
        values = [
            (
                row.position,
                row.partition,
                row.key,
                row.version,
                row.count,
                row.snapshot,
                pack(bytes(row.body)) if self._compress else bytes(row.body),
            )
            for row in self._rows
        ]
        if len(values) == 1:  # one statement is all or none by itself
            db.execute(_INSERT, values[0])
        else:
            db.execute("SAVEPOINT held_rows")
            try:
                db.executemany(_INSERT, values)
            except BaseException:
                db.execute("ROLLBACK TO held_rows")
                db.execute("RELEASE held_rows")
                raise
            db.execute("RELEASE held_rows")
        self.drop()

    def drop(self) -> None:
        """Forget the held rows (written, or rolled back with their transaction)."""
        self._rows = []
        self._heads = {}
