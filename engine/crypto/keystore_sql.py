"""The key store in SQL, one implementation for SQLite (the embedded log's, a file beside it) and
PostgreSQL (the distributed backend's): the subclasses give the connection, the placeholder
style, the DDL and how destroyed keys leave the storage files.

Tables: ``data_keys`` (a row per session: user, the master key id, the wrapped key or NULL once
erased, and the erasure that did it with a sequence number other processes follow to drop
cached keys), ``erasures`` (each request: scope, subject, reason, state) and
``erasure_sessions`` (the sessions a request covers and whether each is done).
"""

from __future__ import annotations

import abc
import threading
from contextlib import AbstractContextManager
from typing import Any, Sequence

from .keystore import DataKey, ErasureRecord, Scope

_SCHEMA = """
CREATE TABLE IF NOT EXISTS data_keys (
    session_id    TEXT PRIMARY KEY,
    user_id       TEXT NOT NULL,
    master_key_id TEXT NOT NULL,
    wrapped       {blob},
    created_ms    {integer} NOT NULL,
    erased_ms     {integer},
    erasure_id    TEXT,
    erased_seq    {integer}
);
CREATE INDEX IF NOT EXISTS data_keys_user ON data_keys (user_id);
CREATE INDEX IF NOT EXISTS data_keys_erased ON data_keys (erased_seq);
CREATE TABLE IF NOT EXISTS erasures (
    erasure_id   TEXT PRIMARY KEY,
    scope        TEXT NOT NULL,
    subject      TEXT NOT NULL,
    reason       TEXT NOT NULL,
    actor        TEXT NOT NULL,
    state        TEXT NOT NULL,
    requested_ms {integer} NOT NULL,
    finished_ms  {integer}
);
CREATE TABLE IF NOT EXISTS erasure_sessions (
    erasure_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    done       {integer} NOT NULL,
    PRIMARY KEY (erasure_id, session_id)
);
CREATE TABLE IF NOT EXISTS key_meta (name TEXT PRIMARY KEY, value {integer} NOT NULL);
INSERT INTO key_meta VALUES ('erased_seq', 0) ON CONFLICT (name) DO NOTHING;
"""


def schema(*, blob: str, integer: str) -> str:
    """The key store's DDL in a dialect's column types (SQLite and PostgreSQL both take
    ``ON CONFLICT DO NOTHING``)."""
    return _SCHEMA.format(blob=blob, integer=integer)


KEY_COLUMNS = "session_id, user_id, master_key_id, wrapped, created_ms, erased_ms, erasure_id"
ERASURE_COLUMNS = (
    "e.erasure_id, e.scope, e.subject, e.reason, e.actor, e.state, e.requested_ms, e.finished_ms, "
    "(SELECT count(*) FROM erasure_sessions s WHERE s.erasure_id = e.erasure_id), "
    "(SELECT count(*) FROM erasure_sessions s WHERE s.erasure_id = e.erasure_id AND s.done = 1)"
)
CHUNK = 500
"""Sessions per statement of a bulk update (SQLite's bound on parameters is 32,766)."""


class SqlKeyStore(abc.ABC):
    """``engine.crypto.keystore.KeyStore`` in SQL. Every call takes the store's lock: the cipher
    calls it from the log's codec path, the eraser from its own tasks."""

    recheck_s = 0.0
    """How often a cipher on this store asks it for other processes' erasures (0: at every
    read, for a store that answers in microseconds)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()

    # -- what a backend gives ------------------------------------------------------------------

    @abc.abstractmethod
    def _run(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """One statement with ``?`` placeholders; the rows it returns (none for a write)."""

    @abc.abstractmethod
    def _many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...

    @abc.abstractmethod
    def _transaction(self) -> AbstractContextManager[None]: ...

    @abc.abstractmethod
    def purge(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    # -- data keys -----------------------------------------------------------------------------

    def get(self, session_id: str) -> DataKey | None:
        with self.lock:
            rows = self._run(f"SELECT {KEY_COLUMNS} FROM data_keys WHERE session_id = ?", (session_id,))
        return _key(rows[0]) if rows else None

    def put(self, key: DataKey) -> DataKey:
        with self.lock:
            with self._transaction():
                self._run(
                    f"INSERT INTO data_keys ({KEY_COLUMNS}, erased_seq) "
                    "VALUES (?, ?, ?, ?, ?, NULL, NULL, NULL) ON CONFLICT (session_id) DO NOTHING",
                    (key.session_id, key.user_id, key.master_key_id, key.wrapped, key.created_ms),
                )
            stored = self.get(key.session_id)
        assert stored is not None
        return stored

    def sessions_of(self, user_id: str) -> list[str]:
        with self.lock:
            rows = self._run(
                "SELECT session_id FROM data_keys WHERE user_id = ? ORDER BY session_id", (user_id,)
            )
        return [r[0] for r in rows]

    def destroy(self, session_ids: Sequence[str], erasure_id: str, now_ms: int) -> list[str]:
        """One transaction: the sessions' wrapped keys set to NULL, a row made for a session that
        had none, all under the store's next erasure sequence number."""
        erased: list[str] = []
        with self.lock, self._transaction():
            self._run("UPDATE key_meta SET value = value + 1 WHERE name = 'erased_seq'")
            seq = int(self._run("SELECT value FROM key_meta WHERE name = 'erased_seq'")[0][0])
            for i in range(0, len(session_ids), CHUNK):
                chunk = list(session_ids[i : i + CHUNK])
                marks = ",".join("?" * len(chunk))
                live = self._run(
                    f"SELECT session_id FROM data_keys WHERE session_id IN ({marks}) AND wrapped IS NOT NULL",
                    chunk,
                )
                known = {
                    r[0]
                    for r in self._run(
                        f"SELECT session_id FROM data_keys WHERE session_id IN ({marks})", chunk
                    )
                }
                self._run(
                    f"UPDATE data_keys SET wrapped = NULL, erased_ms = ?, erasure_id = ?, erased_seq = ? "
                    f"WHERE session_id IN ({marks}) AND wrapped IS NOT NULL",
                    (now_ms, erasure_id, seq, *chunk),
                )
                missing = [(sid, now_ms, now_ms, erasure_id, seq) for sid in chunk if sid not in known]
                self._many(
                    f"INSERT INTO data_keys ({KEY_COLUMNS}, erased_seq) "
                    "VALUES (?, '', '', NULL, ?, ?, ?, ?) ON CONFLICT (session_id) DO NOTHING",
                    missing,
                )
                erased += [r[0] for r in live] + [m[0] for m in missing]
        return erased

    def erased_since(self, seq: int) -> tuple[int, list[str]]:
        with self.lock:
            now = int(self._run("SELECT value FROM key_meta WHERE name = 'erased_seq'")[0][0])
            if now == seq:
                return now, []
            rows = self._run("SELECT session_id FROM data_keys WHERE erased_seq > ?", (seq,))
        return now, [r[0] for r in rows]

    def keys_not_wrapped_by(self, master_key_id: str, limit: int) -> list[DataKey]:
        """Live keys wrapped by another master key than ``master_key_id`` (a rotation's work)."""
        with self.lock:
            rows = self._run(
                f"SELECT {KEY_COLUMNS} FROM data_keys WHERE wrapped IS NOT NULL AND master_key_id <> ? "
                "ORDER BY session_id LIMIT ?",
                (master_key_id, limit),
            )
        return [_key(r) for r in rows]

    def rewrap(self, rows: Sequence[tuple[str, str, str, bytes]]) -> None:
        """(session, old master key id, new master key id, new wrapped key) each; a row erased
        or rewrapped meanwhile is left as it is."""
        with self.lock, self._transaction():
            self._many(
                "UPDATE data_keys SET master_key_id = ?, wrapped = ? "
                "WHERE session_id = ? AND master_key_id = ? AND wrapped IS NOT NULL",
                [(new, wrapped, sid, old) for sid, old, new, wrapped in rows],
            )

    def count_keys(self) -> tuple[int, int]:
        """(live keys, erased keys)."""
        with self.lock:
            rows = self._run(
                "SELECT count(*) FILTER (WHERE wrapped IS NOT NULL), "
                "count(*) FILTER (WHERE wrapped IS NULL) FROM data_keys"
            )
        return int(rows[0][0]), int(rows[0][1])

    # -- erasure requests ----------------------------------------------------------------------

    def begin_erasure(self, record: ErasureRecord, session_ids: Sequence[str]) -> ErasureRecord:
        with self.lock:
            with self._transaction():
                self._run(
                    "INSERT INTO erasures (erasure_id, scope, subject, reason, actor, state, requested_ms, "
                    "finished_ms) VALUES (?, ?, ?, ?, ?, 'pending', ?, NULL)",
                    (
                        record.erasure_id,
                        record.scope,
                        record.subject,
                        record.reason,
                        record.actor,
                        record.requested_ms,
                    ),
                )
                self._many(
                    "INSERT INTO erasure_sessions (erasure_id, session_id, done) VALUES (?, ?, 0) "
                    "ON CONFLICT (erasure_id, session_id) DO NOTHING",
                    [(record.erasure_id, sid) for sid in session_ids],
                )
            found = self.erasure(record.erasure_id)
        assert found is not None
        return found

    def pending_erasures(self, scope: Scope | None = None, subject: str | None = None) -> list[ErasureRecord]:
        sql = f"SELECT {ERASURE_COLUMNS} FROM erasures e WHERE e.state = 'pending'"
        params: list[Any] = []
        if scope is not None:
            sql, params = sql + " AND e.scope = ? AND e.subject = ?", [scope, subject]
        with self.lock:
            return [_erasure(r) for r in self._run(sql + " ORDER BY e.requested_ms, e.erasure_id", params)]

    def erasure(self, erasure_id: str) -> ErasureRecord | None:
        with self.lock:
            rows = self._run(
                f"SELECT {ERASURE_COLUMNS} FROM erasures e WHERE e.erasure_id = ?", (erasure_id,)
            )
        return _erasure(rows[0]) if rows else None

    def erasure_sessions(self, erasure_id: str, *, done: bool) -> list[str]:
        with self.lock:
            rows = self._run(
                "SELECT session_id FROM erasure_sessions WHERE erasure_id = ? AND done = ? "
                "ORDER BY session_id",
                (erasure_id, 1 if done else 0),
            )
        return [r[0] for r in rows]

    def sessions_done(self, erasure_id: str, session_ids: Sequence[str]) -> None:
        with self.lock, self._transaction():
            self._many(
                "UPDATE erasure_sessions SET done = 1 WHERE erasure_id = ? AND session_id = ?",
                [(erasure_id, sid) for sid in session_ids],
            )

    def finish_erasure(self, erasure_id: str, now_ms: int) -> None:
        with self.lock, self._transaction():
            self._run(
                "UPDATE erasures SET state = 'done', finished_ms = ? "
                "WHERE erasure_id = ? AND state = 'pending'",
                (now_ms, erasure_id),
            )


def _key(row: tuple[Any, ...]) -> DataKey:
    wrapped = row[3]
    return DataKey(
        row[0], row[1], row[2], None if wrapped is None else bytes(wrapped), int(row[4]), row[5], row[6]
    )


def _erasure(row: tuple[Any, ...]) -> ErasureRecord:
    return ErasureRecord(
        row[0], row[1], row[2], row[3], row[4], row[5], int(row[6]), row[7], int(row[8]), int(row[9])
    )
