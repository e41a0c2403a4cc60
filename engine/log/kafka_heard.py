"""Committed records a process heard of on the live topic before its reader of the partition has
them (engine.log.kafka_live): the owner that committed them names each event's offset, so a read
that knows a version is committed (``read_session_records_through``, an SSE stream woken by the
notice) answers from them instead of fetching the partition through the transaction's markers.

They are what the partition holds: the owner's committed records, decoded by this process's
codec. Only a contiguous run of versions is served (a gap goes to the partition), a session's
are dropped once its index holds them, and a session found erased drops them (its content was
decoded before the erasure). A process hears every session's events, streamed or not, so what
is kept is bounded by weight, the oldest going first; nothing here is a source of truth.
"""

from __future__ import annotations

from collections import deque

from .base import LogRecord

BUDGET_BYTES = 8 << 20
"""What the records heard may weigh: the oldest go first past it."""
RECORD_OVERHEAD = 400
"""A decoded record's weight beyond its encoded bytes (the event object, its fields, the record
and the indexes' entries)."""


class HeardRecords:
    def __init__(self, budget_bytes: int = BUDGET_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self.weight = 0
        self._order: deque[tuple[LogRecord, int]] = deque()
        self._sessions: dict[str, dict[int, LogRecord]] = {}

    def add(self, record: LogRecord, encoded_bytes: int) -> None:
        """Keep ``record``, ``encoded_bytes`` long on the live topic."""
        weight = encoded_bytes + RECORD_OVERHEAD
        self._sessions.setdefault(record.event.session_id, {})[record.event.version] = record
        self._order.append((record, weight))
        self.weight += weight
        while self.weight > self.budget_bytes and self._order:
            oldest, oldest_weight = self._order.popleft()
            self.weight -= oldest_weight
            self._drop(oldest)

    def run(self, session_id: str, after_version: int, version: int) -> list[LogRecord] | None:
        """The records of versions ``after_version + 1`` to ``version``, or None if one is missing."""
        versions = self._sessions.get(session_id)
        if not versions:
            return None
        run: list[LogRecord] = []
        for v in range(after_version + 1, version + 1):
            if (record := versions.get(v)) is None:
                return None
            run.append(record)
        return run

    def drop_through(self, session_id: str, version: int) -> None:
        """The partition's reader holds the session through ``version``: forget those."""
        versions = self._sessions.get(session_id)
        if versions:
            for v in [v for v in versions if v <= version]:
                del versions[v]

    def forget(self, session_id: str) -> None:
        """The session is erased (a codec's ``on_forget`` listener, on any thread: one atomic
        step, whatever ``add`` is doing)."""
        self._sessions.pop(session_id, None)

    def _drop(self, record: LogRecord) -> None:
        session_id, version = record.event.session_id, record.event.version
        versions = self._sessions.get(session_id)
        if versions is not None and versions.get(version) is record:
            del versions[version]
            if not versions:
                self._sessions.pop(session_id, None)
