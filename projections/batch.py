"""A batch of events as bulk inserts and a few groups of like updates, for one transaction.

``plan_batch`` runs the version guard (seed §7.3) for the whole batch in memory: each session's
row is read once (``load_rows``), an event is applied only if it is its session's next version
(a replay is skipped, a gap raises ``OutOfOrderError`` before anything is written). Then:

* a row the batch inserts is kept in memory and every later update of it is folded in, so it
  goes to the database once, whole, in bulk (``BatchPlan.inserts``);
* an update is sent as SQL only if it may touch a row that was there before the batch
  (``BatchPlan.updates``, grouped by ``schedule``): not if its session started in the batch,
  nor if its ``where`` names a whole primary key that a row of the batch has;
* every session the batch touches gets ONE row change: the insert of a new session, or one
  guarded ``UPDATE_SESSION`` (``BatchPlan.session_updates``).

The store runs the updates first, then the inserts, then the session updates. That equals
running every change in log order, because a change touches only its own session's rows and
reads no other table (projections/apply.py): the SQL updates run before the batch's rows exist,
so they reach exactly the rows that were there before, and the batch's rows received in memory
exactly the updates that followed their insert.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Callable, Iterable, Sequence

from turnlog.engine.errors import OutOfOrderError
from turnlog.engine.events import Event

from .apply import CREATING, changes_for
from .changes import Insert, Update
from .schema import PRIMARY_KEYS
from .session_row import UPDATE_SESSION, SessionRow

Row = dict[str, Any]
Query = Callable[[str, Sequence[Any]], list[Row]]
Statement = tuple[str, tuple[Any, ...]]

LOAD_CHUNK = 500
"""Session ids per ``SELECT ... IN (...)`` (well under SQLite's limit on bound parameters)."""


@dataclass(frozen=True)
class Group:
    """One statement and the parameter rows it runs with, in order (one ``executemany``)."""

    sql: str
    rows: list[tuple[Any, ...]]


@dataclass(frozen=True)
class NewRows:
    """Rows of one table with the same columns, inserted by the batch (one COPY or executemany)."""

    table: str
    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]


@dataclass
class BatchPlan:
    applied: int = 0
    """Events the batch applies (replays it skips are not counted)."""
    updates: list[Group] = field(default_factory=list)
    """Updates of rows that were there before the batch; they go first."""
    inserts: list[NewRows] = field(default_factory=list)
    """The rows the batch makes, with everything the batch did to them (new sessions too)."""
    session_updates: Group | None = None
    """One guarded update per existing session the batch changes: must change ``len(rows)`` rows."""


def load_rows(query: Query, session_ids: Iterable[str]) -> dict[str, SessionRow]:
    """The ``sessions`` rows of ``session_ids`` as they are in the database (version 0 if absent)."""
    ids = list(dict.fromkeys(session_ids))
    rows = {sid: SessionRow(sid) for sid in ids}
    for start in range(0, len(ids), LOAD_CHUNK):
        chunk = ids[start : start + LOAD_CHUNK]
        found = query(
            "SELECT session_id, state_version, message_count FROM sessions "
            f"WHERE session_id IN ({', '.join('?' for _ in chunk)})",
            chunk,
        )
        for r in found:
            sid = str(r["session_id"])
            rows[sid] = SessionRow(sid, int(r["state_version"]), int(r["message_count"]))
    return rows


def _key_getter(columns: tuple[str, ...]) -> Callable[[Row], tuple[Any, ...]]:
    if len(columns) == 1:
        (column,) = columns
        return lambda row: (row[column],)
    return itemgetter(*columns)


_KEY_OF = {table: _key_getter(columns) for table, columns in PRIMARY_KEYS.items()}
"""Each table's primary key of a row (or of an update's ``where``), as a tuple."""
_KEY_COLUMNS = {table: frozenset(columns) for table, columns in PRIMARY_KEYS.items()}


class _Fold:
    """The batch's new rows per (session, table), and the updates that must go to the database."""

    def __init__(self) -> None:
        self.new: defaultdict[tuple[str, str], list[Row]] = defaultdict(list)
        self.by_key: dict[tuple[str, tuple[Any, ...]], Row] = {}
        """The new rows by table and primary key."""
        self.sql: dict[tuple[str, str], deque[Statement]] = {}

    def insert(self, session_id: str, change: Insert) -> None:
        row = change.row  # a fresh dict from its rule
        self.new[(session_id, change.table)].append(row)
        self.by_key[(change.table, _KEY_OF[change.table](row))] = row

    def update(self, row: SessionRow, change: Update) -> None:
        if _KEY_COLUMNS[change.table] <= change.where.keys():
            new = self.by_key.get((change.table, _KEY_OF[change.table](change.where)))
            if new is not None and change.matches(new):
                new.update(change.values)
                return  # the row is the batch's own: nothing in the database has its key
            candidates: list[Row] = []
        else:
            candidates = [
                new for new in self.new.get((row.session_id, change.table), ()) if change.matches(new)
            ]
        for new in candidates:
            new.update(change.values)
        if row.created is None:  # a session that starts in the batch has no rows in the database
            self.sql.setdefault((row.session_id, change.table), deque()).append(
                (change.sql(), change.params())
            )

    def new_rows(self, rows: dict[str, SessionRow]) -> list[NewRows]:
        by_shape: defaultdict[tuple[str, tuple[str, ...]], list[tuple[Any, ...]]] = defaultdict(list)
        sessions = (r.insert_row() for r in rows.values())
        tables = [("sessions", r) for r in sessions if r is not None]
        tables += [(table, r) for (_, table), made in self.new.items() for r in made]
        for table, new in tables:  # rows made by the same rule and updates share their column order
            by_shape[(table, tuple(new))].append(tuple(new.values()))
        return [NewRows(table, columns, values) for (table, columns), values in sorted(by_shape.items())]


def plan_batch(events: Iterable[Event], rows: dict[str, SessionRow]) -> BatchPlan:
    """Guard and fold ``events`` (log order) against the loaded ``rows``."""
    plan, fold = BatchPlan(), _Fold()
    for event in events:
        row = rows[event.session_id]
        if event.version <= row.version:
            continue  # already applied: replays and redeliveries are no-ops
        _check_next(event, row)
        for change in changes_for(event, row):
            if isinstance(change, Insert):
                fold.insert(event.session_id, change)
            else:
                fold.update(row, change)
        row.advance(event.version, event.time_ms)
        plan.applied += 1
    plan.updates = schedule(fold.sql.values())
    plan.inserts = fold.new_rows(rows)
    updates = [params for r in rows.values() if (params := r.update()) is not None]
    plan.session_updates = Group(UPDATE_SESSION, updates) if updates else None
    return plan


def _check_next(event: Event, row: SessionRow) -> None:
    if event.version != row.version + 1:
        raise OutOfOrderError(
            f"projection of session {event.session_id} is at version {row.version}; "
            f"refusing {event.type} v{event.version} (missing v{row.version + 1}). "
            "Rebuild with `turnlog rebuild`."
        )
    if not row.exists and not isinstance(event, CREATING):
        raise OutOfOrderError(
            f"session {event.session_id} has no projection row, and its {event.type} v{event.version} "
            "does not create one (SessionCreated or SessionForked). Rebuild with `turnlog rebuild`."
        )


def schedule(chains: Iterable[deque[Statement]]) -> list[Group]:
    """Merge ordered chains of statements into groups of one SQL text each.

    Greedy: of the statements at the heads of the chains, take every one with the SQL text most
    of them share, as one group; repeat. Each chain's order is kept.
    """
    heads: defaultdict[str, list[deque[Statement]]] = defaultdict(list)
    for chain in chains:
        if chain:
            heads[chain[0][0]].append(chain)
    groups: list[Group] = []
    while heads:
        sql = max(heads, key=lambda text: len(heads[text]))
        members = heads.pop(sql)
        params = []
        for chain in members:
            params.append(chain.popleft()[1])
            if chain:
                heads[chain[0][0]].append(chain)
        groups.append(Group(sql, params))
    return groups
