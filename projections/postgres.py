"""The read models in PostgreSQL (psycopg 3 with a connection pool).

The same DDL (``schema.py``), the same event -> SQL code (``apply.py``) and the same
exactly-once apply with the state_version guard (``store.py``) as on SQLite; only the
placeholder style and the connection handling differ. The engine creates the schema (and the
tables in it) on open; ``reset`` drops and recreates them for a rebuild.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from engine.errors import ConfigurationError

from .store import ProjectionStore, Row

_PLACEHOLDER = re.compile(r"\?")
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def to_pyformat(statement: str) -> str:
    """``?`` placeholders (the portable SQL in apply.py) as psycopg's ``%s``."""
    return _PLACEHOLDER.sub("%s", statement.replace("%", "%%"))


class PostgresProjectionStore(ProjectionStore):
    """Read models in ``schema`` of the database at ``dsn``."""

    def __init__(self, dsn: str, *, schema: str = "public", min_size: int = 1, max_size: int = 4) -> None:
        if not _SCHEMA_NAME.match(schema):
            raise ConfigurationError(f"schema name {schema!r} must be lower-case letters, digits and _")
        self.schema = schema
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(pgsql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(pgsql.Identifier(schema)))
        except psycopg.OperationalError as exc:
            raise ConfigurationError(
                f"cannot connect to PostgreSQL ({exc}); start it with scripts/postgres.sh start "
                "and set TURNLOG_POSTGRES_DSN to the DSN it prints"
            ) from exc
        self._pool = ConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            kwargs={"options": f"-c search_path={schema}", "row_factory": dict_row},
            open=True,
        )
        self._tx: psycopg.Connection[Any] | None = None
        self.create()

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        statement = to_pyformat(sql)
        if self._tx is not None:
            return self._tx.execute(statement, tuple(params)).rowcount
        with self._pool.connection() as conn:
            return conn.execute(statement, tuple(params)).rowcount

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        statement = to_pyformat(sql)
        if self._tx is not None:
            return _rows(self._tx.execute(statement, tuple(params)).fetchall())
        with self._pool.connection() as conn:
            return _rows(conn.execute(statement, tuple(params)).fetchall())

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        if self._tx is not None:
            raise RuntimeError("projection transactions do not nest")
        with self._pool.connection() as conn, conn.transaction():
            self._tx = conn
            try:
                yield
            finally:
                self._tx = None

    def drop_schema(self) -> None:
        """Remove the schema and everything in it (tests use one schema each)."""
        with self._pool.connection() as conn:
            conn.execute(pgsql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(pgsql.Identifier(self.schema)))

    def close(self) -> None:
        self._pool.close()


def _rows(fetched: list[Any]) -> list[Row]:
    """The pool's connections use dict_row, so each row is already a dict."""
    return [dict(r) for r in fetched]
