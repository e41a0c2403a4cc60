"""The analytics export: the log as Parquet datasets (``turnlog export``), once or following it.

It reads the log through the public ``EventLog`` API only (``read_partition``, ``end_offset``),
so it runs the same on the embedded log and on Kafka, and keeps its own position in the
output directory rather than in a consumer group: the data and the position that says which
data is there then live and die together (copy, move or delete the directory as one).

Exactly once: each flush writes one partition's rows for a range of offsets
(``consumers/export_files.py``), makes them durable, then commits the partition's next offset.
A run that is killed leaves at most the files of the flush it was in, which the next run
recognises by their offsets, deletes and writes again. Rows are a pure function of each event
(``projections/export_rows.py``), so the files a resumed export writes hold exactly the rows
an uninterrupted one would have.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable

import structlog

from turnlog.engine.errors import ExportError
from turnlog.engine.log.base import EventLog, LogRecord
from turnlog.projections.export_rows import Row, rows_of

from .export_files import (
    ExportState,
    ParquetSink,
    check_directory,
    load_state,
    lock,
    remove_leftovers,
    save_state,
)

log = structlog.get_logger("turnlog.export")
READ_LIMIT = 5000
"""Records one ``read_partition`` call asks for."""


@dataclass(frozen=True)
class Progress:
    """Where an export is: offsets exported so far by this run, of ``total`` it set out to (None
    while following), and rows and files written."""

    done: int
    total: int | None
    rows: int
    files: int


@dataclass
class _Pending:
    """A partition's records read but not yet flushed."""

    first: int
    end: int = 0
    since: float = 0.0
    records: int = 0
    rows: list[tuple[str, Row]] = field(default_factory=list)


class Exporter:
    """Writes ``log`` as Parquet datasets into ``out``, from the position committed there.

    ``batch``: records per flush (a file per dataset and day); ``content``: export the content
    columns (message text, tool results), which must match what the directory was started with.
    """

    def __init__(
        self,
        log: EventLog,
        out: Path,
        *,
        source: str,
        content: bool = False,
        batch: int = 50_000,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> None:
        if batch < 1:
            raise ExportError(f"an export's batch must be at least 1 record, not {batch}")
        self.log = log
        self.out = out
        self.source = source
        self.content = content
        self.batch = batch
        self.on_progress = on_progress
        self.state = ExportState(source, log.partitions, content)
        self.sink = ParquetSink(out, content)
        self.done = self.events = self.rows = self.files = 0
        self.total: int | None = None
        self._lock: IO[str] | None = None

    def open(self) -> None:
        """Check and lock the directory, load its committed position, and remove what a killed
        run left beyond it."""
        check_directory(self.out)
        self._lock = lock(self.out)
        try:
            stored = load_state(self.out)
            self.state = self._resumed(stored)
            removed = remove_leftovers(self.out, self.state.next_offsets)
            if stored is None:  # the directory is this log's export from now on
                save_state(self.out, self.state)
        except BaseException:
            self.close()
            raise
        if removed:
            log.info("export.leftovers_removed", files=removed, out=str(self.out))

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def _resumed(self, stored: ExportState | None) -> ExportState:
        if stored is None:
            return ExportState(self.source, self.log.partitions, self.content)
        where = f"{self.out} holds an export of {stored.source}"
        if stored.source != self.source:
            raise ExportError(f"{where}, not of {self.source}; export this log into another directory")
        if stored.partitions != self.log.partitions:
            raise ExportError(
                f"{where} with {stored.partitions} partitions, not {self.log.partitions}; "
                "pass the log's partition count it was made with"
            )
        if stored.content != self.content:
            want = "with" if stored.content else "without"
            raise ExportError(f"{where} {want} --content; run it {want} --content, or use another directory")
        return stored

    async def export(self) -> int:
        """Export every record up to the log's end as of now; return records exported."""
        ends = {p: await self.log.end_offset(p) for p in range(self.log.partitions)}
        self.total = sum(max(0, end - self.state.next_offsets.get(p, 0)) for p, end in ends.items())
        self._report()
        exported = 0
        for partition, end in ends.items():
            exported += await self._partition_to(partition, end)
        return exported

    async def _partition_to(self, partition: int, end: int) -> int:
        exported = 0
        while (start := self.state.next_offsets.get(partition, 0)) < end:
            pending = await self._read(partition, start, end, self.batch)
            if pending.records == 0:
                break
            await self._flush(partition, pending)
            exported += pending.records
        return exported

    async def _read(self, partition: int, start: int, end: int | None, limit: int) -> _Pending:
        pending = _Pending(first=start, end=start, since=time.monotonic())
        while pending.records < limit and (end is None or pending.end < end):
            want = min(READ_LIMIT, limit - pending.records)
            records = await self.log.read_partition(partition, pending.end, want)
            if end is not None:
                records = [r for r in records if r.offset < end]
            if not records:
                break
            self._add(pending, records)
        return pending

    def _add(self, pending: _Pending, records: list[LogRecord]) -> None:
        rows, content = pending.rows, self.content
        for r in records:
            rows.extend(rows_of(r.event, r.partition, r.offset, content))
        pending.records += len(records)
        pending.end = records[-1].offset + 1

    async def _flush(self, partition: int, pending: _Pending) -> None:
        rows = pending.rows
        written = await asyncio.to_thread(self.sink.write, partition, pending.first, pending.end, rows)
        self.state.next_offsets[partition] = pending.end
        await asyncio.to_thread(save_state, self.out, self.state)
        self.done += pending.end - pending.first
        self.events += pending.records
        self.rows += len(rows)
        self.files += len(written)
        self._report()

    def _report(self) -> None:
        if self.on_progress is not None:
            self.on_progress(Progress(self.done, self.total, self.rows, self.files))

    async def follow(self, stop: asyncio.Event, *, interval_s: float = 5.0) -> None:
        """Export what is on the log, then what is appended, until ``stop`` is set; a
        partition's new records are flushed once ``batch`` have come or the oldest of them has
        waited ``interval_s``, and once more on stop."""
        self.total = None
        pending: dict[int, _Pending] = {}
        while not stop.is_set():
            read = 0
            for partition in range(self.log.partitions):
                read += await self._follow_partition(partition, pending, interval_s)
            if read == 0:
                await _wait(self.log, stop, min(interval_s, 1.0))
        for partition, waiting in sorted(pending.items()):
            await self._flush(partition, waiting)

    async def _follow_partition(self, partition: int, pending: dict[int, _Pending], interval_s: float) -> int:
        waiting = pending.get(partition)
        start = waiting.end if waiting else self.state.next_offsets.get(partition, 0)
        fresh = await self._read(partition, start, None, self.batch - (waiting.records if waiting else 0))
        if fresh.records:
            if waiting is None:
                waiting = pending[partition] = fresh
            else:
                waiting.rows += fresh.rows
                waiting.records += fresh.records
                waiting.end = fresh.end
        if waiting and (waiting.records >= self.batch or time.monotonic() - waiting.since >= interval_s):
            del pending[partition]
            await self._flush(partition, waiting)
        return fresh.records


async def _wait(event_log: EventLog, stop: asyncio.Event, timeout: float) -> None:
    """Until something may have been appended, ``stop`` is set, or ``timeout`` passes."""
    stopped = asyncio.ensure_future(stop.wait())
    appended = asyncio.ensure_future(event_log.wait_for_append(timeout))
    try:
        await asyncio.wait({stopped, appended}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (stopped, appended):
            task.cancel()
        await asyncio.gather(stopped, appended, return_exceptions=True)
