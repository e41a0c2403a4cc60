"""What a rule asks of a read model: insert a row, or set columns of the rows that match.

Rules (projections/apply.py) return these instead of SQL text, so a batch can fold the changes
to rows it inserts itself in memory and send each table's new rows in bulk (projections/batch.py).
The SQL for the rest is rendered here, with ``?`` placeholders.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Insert:
    """A new row of ``table``: every column it names (the others keep their defaults)."""

    table: str
    row: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Update:
    """``UPDATE table SET values WHERE`` every column of ``where`` equals its value."""

    table: str
    where: dict[str, Any]
    values: dict[str, Any]

    def sql(self) -> str:
        return update_sql(self.table, tuple(self.values), tuple(self.where))

    def params(self) -> tuple[Any, ...]:
        return (*self.values.values(), *self.where.values())

    def matches(self, row: dict[str, Any]) -> bool:
        """Whether SQL would update ``row`` (an in-memory row; NULL equals nothing, as in SQL)."""
        for column, value in self.where.items():
            if column not in row:
                raise ValueError(f"{self.table}.{column} is matched on but not set by the row's INSERT")
            if value is None or row[column] != value:
                return False
        return True


Change = Insert | Update


def insert(table: str, **row: Any) -> Insert:
    return Insert(table, row)


def update(table: str, where: dict[str, Any], **values: Any) -> Update:
    if "session_id" not in where:
        raise ValueError(f"an update of {table} must be scoped to one session (session_id in where)")
    return Update(table, where, values)


@functools.lru_cache(maxsize=256)
def insert_sql(table: str, columns: tuple[str, ...]) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"


@functools.lru_cache(maxsize=256)
def update_sql(table: str, columns: tuple[str, ...], where: tuple[str, ...]) -> str:
    sets = ", ".join(f"{c} = ?" for c in columns)
    return f"UPDATE {table} SET {sets} WHERE {' AND '.join(f'{c} = ?' for c in where)}"
