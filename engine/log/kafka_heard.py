"""Committed records a process heard of on the live topic before its reader of the partition has
them (engine.log.kafka_live): the owner that committed them names each event's offset, so a read
that knows a version is committed (``read_session_records_through``, an SSE stream woken by the
notice) answers from them instead of fetching the partition through the transaction's markers.

They are what the partition holds: the owner's committed records, decoded by this process's
codec, with the value the owner wrote (``kafka_written``): when this process's reader of the
partition fetches the same bytes at that offset, it takes the record heard instead of decoding
them again (``known``). Only a contiguous run of versions is served (a gap goes to the
partition), a session's are dropped once its index holds them, and a session found erased drops
them (its content was decoded before the erasure). A process hears every session's events,
streamed or not, so what is kept is bounded by weight, the oldest going first; nothing here is a
source of truth.
"""

from __future__ import annotations

from collections import deque

from .base import LogRecord
from .waiters import Waiters

BUDGET_BYTES = 8 << 20
"""What the records heard may weigh: the oldest go first past it."""
RECORD_OVERHEAD = 400
"""A decoded record's weight beyond its encoded bytes, kept, and its decoded content, of about
their size (the event object, its fields, the record and the indexes' entries)."""


class HeardRecords:
    def __init__(self, budget_bytes: int = BUDGET_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self.weight = 0
        self._order: deque[tuple[LogRecord, int]] = deque()
        self._sessions: dict[str, dict[int, LogRecord]] = {}
        self._values: dict[tuple[int, int], tuple[bytes, LogRecord]] = {}
        """Each record with the value it was heard as, by (partition, offset)."""

    def add(self, record: LogRecord, value: bytes) -> None:
        """Keep ``record``, heard as ``value``."""
        weight = 2 * len(value) + RECORD_OVERHEAD
        self._sessions.setdefault(record.event.session_id, {})[record.event.version] = record
        self._values[(record.partition, record.offset)] = (value, record)
        self._order.append((record, weight))
        self.weight += weight
        while self.weight > self.budget_bytes and self._order:
            oldest, oldest_weight = self._order.popleft()
            self.weight -= oldest_weight
            self._drop(oldest)

    def latest(self, session_id: str) -> int:
        """The session's newest version heard and still kept, 0 if none."""
        return max(self._sessions.get(session_id) or (0,))

    def beyond(self, session_id: str, indexed: int, after_version: int) -> list[LogRecord]:
        """The records heard of the session that follow on, without a gap, past ``indexed`` (what
        the partition's reader holds) and ``after_version``: commits whose markers have not
        reached the reader yet."""
        versions = self._sessions.get(session_id) or {}
        run: list[LogRecord] = []
        version = max(indexed, after_version) + 1
        while (record := versions.get(version)) is not None:
            run.append(record)
            version += 1
        return run

    def find(self, session_id: str, event_id: str) -> LogRecord | None:
        """The record heard of the session's event ``event_id``, if kept."""
        kept = self._sessions.get(session_id, {}).values()
        return next((record for record in kept if record.event.event_id == event_id), None)

    def known(self, partition: int, offset: int, value: bytes) -> LogRecord | None:
        """The record heard at ``offset`` of ``partition`` if it was heard as ``value`` and its
        session is still kept (not erased since, not read through)."""
        heard = self._values.get((partition, offset))
        if heard is None or heard[0] != value:
            return None
        record = heard[1]
        versions = self._sessions.get(record.event.session_id)
        return record if versions is not None and versions.get(record.event.version) is record else None

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
        self._values.pop((record.partition, record.offset), None)
        session_id, version = record.event.session_id, record.event.version
        versions = self._sessions.get(session_id)
        if versions is not None and versions.get(version) is record:
            del versions[version]
            if not versions:
                self._sessions.pop(session_id, None)


class SessionWaiters:
    """Who waits to hear of a session on the live topic (``KafkaEventLog.wait_for_session``),
    woken when a record of it is heard."""

    def __init__(self) -> None:
        self._waiting: dict[str, Waiters] = {}

    async def wait(self, session_id: str, timeout: float) -> None:
        waiters = self._waiting.setdefault(session_id, Waiters())
        try:
            await waiters.wait(timeout)
        finally:  # the last wait of a session not woken (``wake`` pops those it wakes): no entry left
            if not waiters and self._waiting.get(session_id) is waiters:
                del self._waiting[session_id]

    def wake(self, session_id: str) -> None:
        waiters = self._waiting.pop(session_id, None)
        if waiters is not None:
            waiters.wake()
