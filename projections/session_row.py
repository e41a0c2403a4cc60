"""One session's ``sessions`` row while a batch of its events is planned.

The row's version guard (seed §7.3) runs in memory: the batch reads each session's
``state_version`` and ``message_count`` once, and every event advances the in-memory row. A
session that starts in the batch is then inserted whole (``insert_row``); any other gets ONE
guarded statement for the whole batch (``UPDATE_SESSION``) that changes nothing unless the row
is still at the version it was read at.
"""

from __future__ import annotations

from typing import Any

SESSION_VALUES = ("current_state", "closed", "close_reason", "user_id", "closed_at_ms")
"""Columns an event may set (the last value in the batch wins)."""

SESSION_COUNTERS = ("message_count", "turns", "input_tokens", "output_tokens", "cost_micros")
"""Columns an event may add to (the batch adds the sum)."""

UPDATE_SESSION = (
    "UPDATE sessions SET state_version = ?, update_time_ms = ?, "
    + "".join(f"{c} = COALESCE(?, {c}), " for c in SESSION_VALUES)
    + ", ".join(f"{c} = {c} + ?" for c in SESSION_COUNTERS)
    + " WHERE session_id = ? AND state_version = ?"
)
"""One statement shape for every session a batch touches, so they go to the database together."""


class SessionRow:
    """The in-memory ``sessions`` row of one session during one batch."""

    __slots__ = ("session_id", "version", "message_count", "exists", "base_version", "created", "time_ms",
                 "values", "increments")  # fmt: skip

    def __init__(self, session_id: str, version: int = 0, message_count: int = 0) -> None:
        self.session_id = session_id
        self.version = version
        """The version the projection is at, advanced by each event the batch applies."""
        self.message_count = message_count
        self.exists = version > 0
        """Whether the row exists (in the database, or created earlier in this batch)."""
        self.base_version = version
        """The version the guarded update expects to find in the database."""
        self.created: dict[str, Any] | None = None
        """The row's columns as its first event sets them, when the session starts in this batch."""
        self.time_ms = 0
        self.values: dict[str, Any] = {}
        self.increments: dict[str, int] = {}

    def create(self, columns: dict[str, Any], version: int, *, message_count: int = 0) -> None:
        """The session's first event (at ``version``) makes the row with ``columns``."""
        self.created = dict(columns, message_count=message_count)
        self.exists = True
        self.base_version = version
        self.message_count = message_count

    def advance(self, version: int, time_ms: int) -> None:
        """An event at ``version`` was applied: the row moves to it."""
        self.version = version
        self.time_ms = time_ms

    def set(self, **values: Any) -> None:
        for column, value in values.items():
            if column not in SESSION_VALUES:
                raise ValueError(f"sessions.{column} is not settable by an event; see SESSION_VALUES")
            self.values[column] = value

    def add(self, **increments: int) -> None:
        for column, added in increments.items():
            if column not in SESSION_COUNTERS:
                raise ValueError(f"sessions.{column} is not a counter; see SESSION_COUNTERS")
            self.increments[column] = self.increments.get(column, 0) + added

    def next_message_seq(self) -> int:
        """Count one more message and return its ``seq`` (1-based, per session)."""
        self.message_count += 1
        self.increments["message_count"] = self.increments.get("message_count", 0) + 1
        return self.message_count

    def insert_row(self) -> dict[str, Any] | None:
        """The whole row of a session that starts in this batch, with everything the batch did to it."""
        if self.created is None:
            return None
        row = dict(self.created, state_version=self.version, update_time_ms=self.time_ms)
        row.update(self.values)
        for column, added in self.increments.items():
            row[column] = row.get(column, 0) + added
        return row

    def update(self) -> tuple[Any, ...] | None:
        """Parameters of ``UPDATE_SESSION`` for what the batch did to an existing row, else None."""
        if self.created is not None or self.version == self.base_version:
            return None
        return (
            self.version,
            self.time_ms,
            *(self.values.get(c) for c in SESSION_VALUES),
            *(self.increments.get(c, 0) for c in SESSION_COUNTERS),
            self.session_id,
            self.base_version,
        )
