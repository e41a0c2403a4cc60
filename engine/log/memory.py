"""The log in this process's memory: for tests, notebooks and throwaway runs.

Nothing is encoded and nothing survives the process: an append keeps the events themselves
(immutable dataclasses), so a step costs no Avro encoding and no SQL. Everything else is the
interface's contract, as the embedded log keeps it: per-session versions checked on every
append (``ConcurrencyError``), idempotent submissions (``turnlog.engine.log.submissions``), partitions
with increasing positions, consumer-group offsets, and snapshot lookups that do not read the
session's history. Use ``SqliteEventLog`` for anything that must outlive the process.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Sequence

from ..errors import (
    ConcurrencyError,
    ConfigurationError,
    DuplicateSubmissionError,
    LogError,
    SessionNotFoundError,
)
from ..events import Event
from .base import (
    SESSIONS_PAGE,
    EventLog,
    LogRecord,
    SessionSummary,
    check_batch,
    holds_state,
    page_of,
    partition_for,
)
from .submissions import submission_keys
from .waiters import Waiters


class MemoryEventLog(EventLog):
    """A log in this process's memory, for tests and throwaway runs: events kept as objects
    (nothing encoded, nothing on disk), with the same version checks and submissions."""

    def __init__(self, *, partitions: int = 8) -> None:
        if partitions < 1:
            raise ConfigurationError("partitions must be at least 1")
        self.partitions = partitions
        self._sessions: dict[str, list[LogRecord]] = {}
        """Each session's records; index i holds version i + 1."""
        self._partition_records: list[list[LogRecord]] = [[] for _ in range(partitions)]
        self._partition_offsets: list[list[int]] = [[] for _ in range(partitions)]
        self._snapshots: dict[str, list[Event]] = {}
        self._submissions: dict[tuple[str, str], int] = {}
        self._offsets: dict[tuple[str, int], int] = {}
        self._position = 0
        self._waiters = Waiters()

    async def append(
        self, events: Sequence[Event], *, expected_version: int, redoable: bool = False
    ) -> list[LogRecord]:
        session_id = check_batch(events, expected_version)
        keys = [(key, e.version) for e in events for key in submission_keys(e)]
        for key, _ in keys:
            held = self._submissions.get((session_id, key))
            if held is not None:
                raise DuplicateSubmissionError(session_id, key, held)
        records = self._sessions.get(session_id)
        actual = len(records) if records is not None else 0
        if actual != expected_version:
            raise ConcurrencyError(session_id, expected_version, actual)
        if records is None:
            records = self._sessions[session_id] = []
        partition = partition_for(session_id, self.partitions)
        start = self._position + 1
        appended = [LogRecord(partition, start + i, e) for i, e in enumerate(events)]
        self._position += len(events)
        records += appended
        self._partition_records[partition] += appended
        self._partition_offsets[partition] += [r.offset for r in appended]
        for key, version in keys:
            self._submissions[(session_id, key)] = version
        snapshots = [e for e in events if holds_state(e)]
        if snapshots:
            self._snapshots.setdefault(session_id, []).extend(snapshots)
        self._notify()
        return appended

    async def _append_next(self, event: Event) -> LogRecord:
        """The session's head and the append are read and written with no await between: no
        other append can come in between them."""
        version = len(self._sessions.get(event.session_id, ()))
        if version == 0:
            raise SessionNotFoundError(event.session_id)
        sequenced = dataclasses.replace(event, version=version + 1)
        (record,) = await self.append([sequenced], expected_version=version)
        return record

    def _notify(self) -> None:
        self._waiters.wake()

    async def wait_for_append(self, timeout: float) -> None:
        await self._waiters.wait(timeout)

    async def read_session(self, session_id: str, after_version: int = 0) -> list[Event]:
        return [r.event for r in self._sessions.get(session_id, ())[max(after_version, 0) :]]

    async def read_session_records(self, session_id: str, after_version: int = 0) -> list[LogRecord]:
        return list(self._sessions.get(session_id, ())[max(after_version, 0) :])

    async def latest_snapshot(self, session_id: str, at_or_before: int | None = None) -> Event | None:
        for event in reversed(self._snapshots.get(session_id, ())):
            if at_or_before is None or event.version <= at_or_before:
                return event
        return None

    async def versions_of(self, session_id: str, types: Sequence[str], before: int) -> list[tuple[int, str]]:
        wanted = set(types)
        records = self._sessions.get(session_id, ())[: max(before - 1, 0)]
        return [(r.event.version, r.event.type) for r in records if r.event.type in wanted]

    async def session_version(self, session_id: str) -> int:
        return len(self._sessions.get(session_id, ()))

    async def list_sessions(
        self, partition: int, *, after: str = "", limit: int = SESSIONS_PAGE
    ) -> list[SessionSummary]:
        self._check_partition(partition)
        versions = {
            sid: len(records) for sid, records in self._sessions.items() if records[0].partition == partition
        }
        return page_of(partition, versions, after, limit)

    async def read_partition(self, partition: int, offset: int, limit: int = 500) -> list[LogRecord]:
        self._check_partition(partition)
        start = bisect.bisect_left(self._partition_offsets[partition], offset)
        return self._partition_records[partition][start : start + limit]

    async def end_offset(self, partition: int) -> int:
        self._check_partition(partition)
        offsets = self._partition_offsets[partition]
        return offsets[-1] + 1 if offsets else 0

    async def committed(self, group: str, partition: int) -> int:
        return self._offsets.get((group, partition), 0)

    async def commit(self, group: str, partition: int, offset: int) -> None:
        self._check_partition(partition)
        self._offsets[(group, partition)] = offset

    async def close(self) -> None:
        self._notify()

    def _check_partition(self, partition: int) -> None:
        if not 0 <= partition < self.partitions:
            raise LogError(f"partition {partition} out of range 0..{self.partitions - 1}")
