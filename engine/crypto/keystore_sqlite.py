"""The embedded log's key store: a SQLite file of its own beside the log (``log.keys.db`` beside
``log.db``), readable by its owner only.

Destroyed keys must leave the file: ``secure_delete`` makes SQLite overwrite what a statement
frees, and ``purge`` checkpoints the WAL into the file, truncates it and vacuums, so no page of
either keeps a destroyed key.
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..errors import KeyStoreError
from .keystore_sql import SqlKeyStore, schema

SCHEMA = schema(blob="BLOB", integer="INTEGER")


class SqliteKeyStore(SqlKeyStore):
    """Keys in a SQLite file (several processes may share it). ``durable``: fsync every commit
    (``synchronous=FULL``); otherwise a commit survives the process (``NORMAL``), as the embedded
    log's ``process`` durability does: a key is never less durable than the content it opens."""

    def __init__(self, path: str | Path, *, durable: bool = True) -> None:
        super().__init__()
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            if new:
                os.chmod(self.path, 0o600)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            self._db.execute("PRAGMA busy_timeout=10000")
            self._db.execute("PRAGMA secure_delete=ON")
            with self.lock:
                self._db.executescript(SCHEMA)
        except sqlite3.Error as exc:
            raise KeyStoreError(f"the key store {self.path} cannot be opened: {exc}") from exc

    def _run(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            return self._db.execute(sql, tuple(params)).fetchall()
        except sqlite3.Error as exc:
            raise KeyStoreError(f"the key store {self.path} failed: {exc}") from exc

    def _many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            try:
                self._db.executemany(sql, rows)
            except sqlite3.Error as exc:
                raise KeyStoreError(f"the key store {self.path} failed: {exc}") from exc

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._run("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._run("COMMIT")

    def purge(self) -> None:
        """Checkpoint and truncate the WAL, vacuum the file, truncate again: a destroyed key is
        in no page of either (the pages it was in were overwritten: ``secure_delete``)."""
        with self.lock:
            self._run("PRAGMA wal_checkpoint(TRUNCATE)")
            self._run("VACUUM")
            self._run("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        with self.lock:
            self._db.close()
