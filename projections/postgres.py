"""The read models in PostgreSQL (psycopg 3 with a connection pool).

The same DDL (``schema.py``), the same event -> SQL code (``apply.py``) and the same
exactly-once apply with the state_version guard (``store.py``) as on SQLite; only the
placeholder style and the connection handling differ. A batch is one transaction: its new rows
go in with COPY, its updates as ``executemany`` groups in pipeline mode (sent without waiting
for each other; bench/README.md section 10 compares this with executemany inserts and with one
``execute`` per statement). The engine creates the schema (and the tables in it) on open;
``reset`` drops and recreates them for a rebuild.
"""

from __future__ import annotations

import functools
import re
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from turnlog.engine.errors import ConfigurationError

from .batch import Group, NewRows
from .schema import READ_MODELS
from .store import ProjectionStore, Row, Writer

_PLACEHOLDER = re.compile(r"\?")
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@functools.lru_cache(maxsize=512)
def to_pyformat(statement: str) -> str:
    """``?`` placeholders (the portable SQL in apply.py) as psycopg's ``%s``."""
    return _PLACEHOLDER.sub("%s", statement.replace("%", "%%"))


class PostgresWriter:
    """One transaction on a pooled connection: groups of statements in pipeline mode (sent
    without waiting for each other, one wait at the end), new rows with COPY."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self.conn.execute(to_pyformat(sql), tuple(params)).rowcount

    def run_groups(self, groups: Sequence[Group]) -> list[int]:
        cursors = []
        with self.conn.pipeline():
            for group in groups:
                cursor = self.conn.cursor()
                cursor.executemany(to_pyformat(group.sql), group.rows)
                cursors.append(cursor)
        return [c.rowcount for c in cursors]

    def insert_rows(self, rows: NewRows) -> None:
        statement = pgsql.SQL("COPY {} ({}) FROM STDIN").format(
            pgsql.Identifier(rows.table), pgsql.SQL(", ").join(map(pgsql.Identifier, rows.columns))
        )
        with self.conn.cursor().copy(statement) as copy:
            for row in rows.rows:
                copy.write_row(row)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return _rows(self.conn.execute(to_pyformat(sql), tuple(params)).fetchall())


class PostgresProjectionStore(ProjectionStore):
    """Read models in ``schema`` of the database at ``dsn``."""

    writer_class: type[PostgresWriter] = PostgresWriter

    def __init__(self, dsn: str, *, schema: str = "public", min_size: int = 1, max_size: int = 4) -> None:
        if not _SCHEMA_NAME.match(schema):
            raise ConfigurationError(f"schema name {schema!r} must be lower-case letters, digits and _")
        super().__init__()
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
        self.create()

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        with self._pool.connection() as conn:
            return _rows(conn.execute(to_pyformat(sql), tuple(params)).fetchall())

    @contextmanager
    def _transaction(self) -> Iterator[Writer]:
        with self._pool.connection() as conn, conn.transaction():
            yield self.writer_class(conn)

    def drop_schema(self) -> None:
        """Remove the schema and everything in it (tests use one schema each)."""
        drop = pgsql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(pgsql.Identifier(self.schema))
        with self._pool.connection() as conn:
            conn.execute(drop)

    def _disconnect(self) -> None:
        self._pool.close()

    def _purge(self) -> None:
        """VACUUM the read models (outside a transaction): the dead row versions an erasure's
        updates and deletes left are removed from the tables' pages."""
        with self._pool.connection() as conn:
            conn.autocommit = True
            try:
                for table in READ_MODELS:
                    conn.execute(pgsql.SQL("VACUUM {}").format(pgsql.Identifier(table)))
            finally:
                conn.autocommit = False


def _rows(fetched: list[Any]) -> list[Row]:
    """The pool's connections use dict_row, so each row is already a dict."""
    return [dict(r) for r in fetched]
