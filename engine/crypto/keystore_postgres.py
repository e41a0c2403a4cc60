"""The distributed backend's key store: tables in PostgreSQL (not a Kafka topic: compaction
does not delete on time), shared by every process of the deployment
(``TURNLOG_KEYSTORE=postgresql://...``).

An erased key's row is updated (``wrapped`` set to NULL) and ``purge`` vacuums the table, so
the dead row versions that still held it are removed from the table's pages.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import psycopg
from psycopg import sql as pgsql

from ..errors import KeyStoreError
from .keystore_sql import SqlKeyStore, schema

SCHEMA = schema(blob="BYTEA", integer="BIGINT")
CREATE_RACES = (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateObject, psycopg.errors.DuplicateTable)


class PostgresKeyStore(SqlKeyStore):
    """Keys in PostgreSQL, in ``schema`` (created if missing)."""

    recheck_s = 1.0
    """Every second: a read of the store is a round trip."""

    def __init__(self, dsn: str, *, schema: str = "public") -> None:
        super().__init__()
        self.where = f"the key store in PostgreSQL schema {schema}"
        try:
            self._conn = psycopg.connect(dsn, autocommit=True)
            self._conn.execute(pgsql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(pgsql.Identifier(schema)))
            self._conn.execute(pgsql.SQL("SET search_path TO {}").format(pgsql.Identifier(schema)))
            self._create()
        except psycopg.Error as exc:
            raise KeyStoreError(f"{self.where} cannot be opened: {exc}") from exc

    def _create(self, attempts: int = 5) -> None:
        """Processes that start together create the tables at once; IF NOT EXISTS is not safe
        against that race, so it is retried."""
        for attempt in range(1, attempts + 1):
            try:
                with self._conn.transaction():
                    self._conn.execute(SCHEMA)
                return
            except CREATE_RACES:
                if attempt == attempts:
                    raise
                time.sleep(0.2 * attempt)

    def _run(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            cursor = self._conn.execute(sql.replace("?", "%s"), tuple(params))
            return cursor.fetchall() if cursor.description is not None else []
        except psycopg.Error as exc:
            raise KeyStoreError(f"{self.where} failed: {exc}") from exc

    def _many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            try:
                with self._conn.cursor() as cursor:
                    cursor.executemany(sql.replace("?", "%s"), rows)
            except psycopg.Error as exc:
                raise KeyStoreError(f"{self.where} failed: {exc}") from exc

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        with self._conn.transaction():
            yield

    def purge(self) -> None:
        with self.lock:
            self._run("VACUUM data_keys")

    def close(self) -> None:
        with self.lock:
            self._conn.close()
