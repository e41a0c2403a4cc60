"""Catch up with the log and rebuild: read records in batches, apply each batch in one transaction.

A sink (the projection store, the analytics tables) applies a batch on its writer thread; while
it does, the next batches are read from the log, so reading overlaps the database's work, and
the event loop never waits for the database.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Protocol, Sequence

from turnlog.engine.errors import EventError
from turnlog.engine.log.base import EventLog, LogRecord

from .store import ProjectionStore

BATCH = 5000
"""Records per transaction (from one partition or several)."""


class BatchSink(Protocol):
    """What a catch-up writes to: offsets and records applied together, exactly once."""

    async def offsets_async(self) -> dict[int, int]:
        """Each partition's next offset to apply (absent: 0)."""

    async def apply_async(self, records: Sequence[LogRecord]) -> int:
        """Apply records and their offsets in one transaction; return what was applied."""


@dataclass(frozen=True)
class AppliedBatch:
    """One committed batch (``on_batch`` hooks get these: progress bars, lag and delay metrics)."""

    records: int
    """Records read in the batch."""
    applied: int
    """What the sink applied of them (replays and redeliveries are not counted)."""
    offsets: dict[int, int]
    """Each partition's next offset once the batch is committed (partitions in the batch only)."""
    oldest_event_ms: int
    """The oldest event time in the batch: ``committed_ms - oldest_event_ms`` is how long the
    oldest event waited to be visible."""
    committed_ms: int
    """Wall-clock time when the transaction had committed."""


OnBatch = Callable[[AppliedBatch], None]


@dataclass(frozen=True)
class PartitionLag:
    partition: int
    end_offset: int
    """The offset the log's next record in the partition gets."""
    applied_offset: int
    """The next offset the sink will apply."""
    caught_up: bool
    """No record at or after ``applied_offset`` (on Kafka the end offset also counts transaction
    markers, so the offsets alone cannot tell)."""
    oldest_pending_ms: int | None
    """The event time of the first record not applied yet (None when caught up, or when that
    record does not decode)."""

    @property
    def records(self) -> int:
        """Offsets between the applied one and the end (records, and on Kafka their markers)."""
        return 0 if self.caught_up else max(0, self.end_offset - self.applied_offset)

    def behind_ms(self, now_ms: int | None = None) -> int:
        """How long the oldest record not applied yet has waited (0 when caught up)."""
        if self.oldest_pending_ms is None:
            return 0
        return max(0, (int(time.time() * 1000) if now_ms is None else now_ms) - self.oldest_pending_ms)


async def partition_lag(log: EventLog, partition: int, applied: int) -> PartitionLag:
    """The lag of a sink at ``applied`` in ``partition``: one end offset and one record read."""
    end = await log.end_offset(partition)
    try:
        pending = await log.read_partition(partition, applied, 1) if end > applied else []
    except EventError:
        return PartitionLag(partition, end, applied, caught_up=False, oldest_pending_ms=None)
    oldest = pending[0].event.time_ms if pending else None
    return PartitionLag(partition, end, applied, caught_up=not pending, oldest_pending_ms=oldest)


async def read_batches(
    log: EventLog, offsets: dict[int, int], size: int = BATCH
) -> AsyncIterator[list[LogRecord]]:
    """Everything beyond ``offsets`` in batches of about ``size`` records, partition after
    partition (a batch takes several partitions when they have little); ``offsets`` advances as
    records are read. A read that fails (an undecodable record) first yields what was read
    before it, then raises."""
    batch: list[LogRecord] = []
    for partition in await log.partitions_to_read({p: offsets.get(p, 0) for p in range(log.partitions)}):
        while True:
            want = size - len(batch)
            try:
                records = await log.read_partition(partition, offsets.get(partition, 0), want)
            except Exception:
                if batch:
                    yield batch
                raise
            if records:
                offsets[partition] = records[-1].offset + 1
                batch.extend(records)
            if len(batch) >= size:
                yield batch
                batch = []
            if len(records) < want:
                break
    if batch:
        yield batch


READ_AHEAD = 2
"""Batches read from the log ahead of the one being written."""

_Read = list[LogRecord] | BaseException | None


async def catch_up(
    log: EventLog,
    sink: BatchSink,
    *,
    batch: int = BATCH,
    on_batch: OnBatch | None = None,
    offsets: dict[int, int] | None = None,
) -> int:
    """Apply everything the log has beyond the sink's offsets (or ``offsets``, read from the
    sink by the caller); return what was applied.

    One transaction per batch, in log order; a reader task stays up to ``READ_AHEAD`` batches
    ahead. If reading fails, the batches read before the failure are applied, then it is raised.
    """
    start = dict(await sink.offsets_async() if offsets is None else offsets)
    read: asyncio.Queue[_Read] = asyncio.Queue(maxsize=READ_AHEAD)
    reader = asyncio.create_task(_read_ahead(log, start, batch, read))
    applied = 0
    try:
        while (records := await read.get()) is not None:
            if isinstance(records, BaseException):
                raise records
            done = await sink.apply_async(records)
            applied += done
            if on_batch is not None:
                on_batch(_applied_batch(records, done))
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    return applied


async def _read_ahead(log: EventLog, offsets: dict[int, int], size: int, into: asyncio.Queue[_Read]) -> None:
    try:
        async for records in read_batches(log, offsets, size):
            await into.put(records)
    except Exception as exc:
        await into.put(exc)
        return
    await into.put(None)


def _applied_batch(records: list[LogRecord], applied: int) -> AppliedBatch:
    offsets: dict[int, int] = {}
    for record in records:
        offsets[record.partition] = record.offset + 1
    return AppliedBatch(
        records=len(records),
        applied=applied,
        offsets=offsets,
        oldest_event_ms=min(r.event.time_ms for r in records),
        committed_ms=int(time.time() * 1000),
    )


async def rebuild(
    log: EventLog, store: ProjectionStore, *, batch: int = BATCH, on_batch: OnBatch | None = None
) -> int:
    """Reset the store and replay the whole log into it; return events applied."""
    await store.reset_async()
    return await catch_up(log, store, batch=batch, on_batch=on_batch)


class Follower:
    """Keeps a sink caught up with a log, one pass at a time, and remembers the offsets it
    applied, so its lag is read without a database query."""

    def __init__(
        self, log: EventLog, sink: BatchSink, *, batch: int = BATCH, on_batch: OnBatch | None = None
    ) -> None:
        self.log = log
        self.sink = sink
        self.batch = batch
        self.on_batch = on_batch
        self.last_batch: AppliedBatch | None = None
        """The newest committed batch (its delay: ``committed_ms - oldest_event_ms``)."""
        self._applied: dict[int, int] | None = None
        self._lock = asyncio.Lock()

    async def catch_up(self) -> int:
        """One pass; a caller that finds a pass running waits for it and then runs its own, so
        everything appended before the call is applied when it returns."""
        async with self._lock:
            self._applied = await self.sink.offsets_async()
            return await catch_up(
                self.log, self.sink, batch=self.batch, on_batch=self._committed, offsets=self._applied
            )

    def _committed(self, batch: AppliedBatch) -> None:
        if self._applied is not None:
            self._applied.update(batch.offsets)
        self.last_batch = batch
        if self.on_batch is not None:
            self.on_batch(batch)

    async def lag(self) -> dict[int, PartitionLag]:
        """Per partition: the log's end offset against the next offset to apply, and the age of
        the oldest record not applied yet. The applied offsets are kept in memory once a pass has
        run, so this reads no database; it reads one end offset and at most one record per
        partition from the log (on Kafka, the end offsets ask the broker)."""
        if self._applied is None:
            self._applied = await self.sink.offsets_async()
        applied = dict(self._applied)
        return {p: await partition_lag(self.log, p, applied.get(p, 0)) for p in range(self.log.partitions)}
