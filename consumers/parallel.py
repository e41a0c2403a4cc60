"""A consumer group member that handles the records of different keys at the same time and the
records of one key strictly in order: the parallel-consumer pattern (key-ordered processing with
an offset map, as Confluent's Parallel Consumer does it). The turn worker runs on it, keyed by
session, so one slow model call never delays another session's turn.

Offsets. Each partition is read in order and its records are handed to their key's queue. The
offset committed for the group is the partition's low-water mark: the first record handed out
and not yet done (the read position when none is open). A record is committed only once it and
every record before it are done, so a member that dies re-delivers at most the records after
the mark, and the handler (idempotent, like every consumer of this log) finds them done.

Order. Each key with records waiting has one task that handles them one at a time, in offset
order; different keys run concurrently, at most ``max_in_flight`` handlers at once. Reading
stops while ``max_buffered`` records are handed out and not done.

Failures. In ``run()``, a handler that fails because the log is unavailable, the partition
moved or a concurrent writer won (``LogUnavailableError``, ``ConcurrencyError``) is retried
after a back-off while the partition is still this member's; once it is not, the member drops
the partition (its next owner reads it from the committed offset). Any other failure is a bug in
the handler: logged with its traceback and retried after a longer back-off, stalling that key
only. ``poll_once()`` retries nothing: a failed record stays uncommitted for the next poll.

Stopping. ``stop()`` ends ``run()``: no more reading, ``on_drain`` asks the handlers to stop at
their next safe point, the ones in flight get ``drain_timeout_s`` and are then cancelled.
Records whose handler returns after the stop was asked for are not marked done (a drained
handler may have left work), so the successor handles them again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Sequence

import structlog

from turnlog.engine.errors import ConcurrencyError, LogUnavailableError
from turnlog.engine.log.base import EventLog, LogRecord

Handler = Callable[[LogRecord], Awaitable[None]]
log = structlog.get_logger("turnlog.consumer")

RETRY_S = 0.5
"""First back-off after a handler failed; it doubles up to RETRY_MAX_S."""
RETRY_MAX_S = 5.0
BUG_RETRY_S = 10.0
"""Back-off after an unexpected error (a bug): long enough not to flood the logs."""
COMMIT_EVERY_S = 0.1
"""How often ``run()`` commits a moved low-water mark (every poll commits at its end)."""


def session_key(record: LogRecord) -> str:
    return record.event.session_id


@dataclass(eq=False)
class _Partition:
    """One partition's reading position and the offsets handed out, in order, with done flags."""

    partition: int
    read_from: int
    committed: int
    open: OrderedDict[int, bool] = field(default_factory=OrderedDict)
    failed: bool = False
    """A handler gave up on one of its records (poll mode): re-read from the low-water mark."""

    def low_water(self) -> int:
        while self.open:
            offset, done = next(iter(self.open.items()))
            if not done:
                return offset
            del self.open[offset]
        return self.read_from


@dataclass(eq=False)
class _KeyQueue:
    """A key's records waiting to be handled, each with the partition state it was read into."""

    records: deque[tuple[_Partition, LogRecord]] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None


class KeyedConsumer:
    def __init__(
        self,
        log: EventLog,
        group: str,
        handler: Handler,
        *,
        key: Callable[[LogRecord], str] = session_key,
        wanted: Callable[[LogRecord], bool] = lambda _: True,
        partitions: Sequence[int] | None = None,
        max_in_flight: int = 256,
        max_buffered: int | None = None,
        batch: int = 500,
        idle_wait_s: float = 0.5,
        drain_timeout_s: float = 30.0,
        on_drain: Callable[[], None] | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.log = log
        self.group = group
        self.handler = handler
        self.key = key
        self.wanted = wanted
        self.partitions = list(partitions) if partitions is not None else None
        self.max_in_flight = max_in_flight
        self.max_buffered = max_buffered or max(1024, 4 * max_in_flight)
        self.batch = batch
        self.idle_wait_s = idle_wait_s
        self.drain_timeout_s = drain_timeout_s
        self.on_drain = on_drain
        self._slots = asyncio.Semaphore(max_in_flight)
        self._parts: dict[int, _Partition] = {}
        self._queues: dict[str, _KeyQueue] = {}
        self._buffered = 0
        self._handled = 0
        self._retrying = False
        self._changed = asyncio.Event()
        self._stop = asyncio.Event()
        self._bugs: list[BaseException] = []

    @property
    def in_flight(self) -> int:
        """Records handed out and not done (handled or waiting behind their key)."""
        return self._buffered

    # -- the two ways to run ---------------------------------------------------------------------

    async def poll_once(self) -> int:
        """Handle everything on the partitions now (concurrently by key), wait until every
        handler is done or has failed, commit; return the records handled. A failed record is
        left uncommitted and handled again by the next poll; a handler's unexpected error is
        raised once every other handler has finished."""
        self._retrying = False
        before = self._handled
        while True:
            read = await self._read(wait_for_room=True)
            await self._commit()  # what is done so far, before the handlers take their time
            await self._settle()
            if read == 0:
                break
        await self._commit()
        self._rewind_failed()
        if self._bugs:
            bug, self._bugs = self._bugs[0], []
            raise bug
        return self._handled - before

    async def run(self) -> None:
        """Read and hand out records as they come until ``stop()``, then drain."""
        log.info("consumer.start", group=self.group, partitions=self.partitions, limit=self.max_in_flight)
        self._retrying = True
        loop = asyncio.get_running_loop()
        committed_at = loop.time()
        try:
            while not self._stop.is_set():
                self._changed.clear()
                read = await self._read(wait_for_room=False)
                if loop.time() - committed_at >= COMMIT_EVERY_S:
                    await self._commit()
                    committed_at = loop.time()
                if read == 0 or self._buffered >= self.max_buffered:
                    await self._wait(self.idle_wait_s)
        finally:
            await self._drain()
        log.info("consumer.stop", group=self.group)

    def stop(self) -> None:
        self._stop.set()
        self._changed.set()

    # -- reading and handing out -------------------------------------------------------------------

    async def _read(self, *, wait_for_room: bool) -> int:
        """Read the partitions from where each stopped and hand the records out; return how many
        were read. At ``max_buffered`` it waits for room (``wait_for_room``) or returns."""
        read = 0
        for part in await self._current_partitions():
            while not self._stop.is_set():
                if self._buffered >= self.max_buffered:
                    if not wait_for_room:
                        return read
                    self._changed.clear()
                    await self._changed.wait()
                    continue
                if self._parts.get(part.partition) is not part:
                    break  # dropped while we waited
                records = await self.log.read_partition(part.partition, part.read_from, self.batch)
                if not records:
                    break
                for record in records:
                    self._hand_out(part, record)
                part.read_from = records[-1].offset + 1
                read += len(records)
        return read

    async def _current_partitions(self) -> list[_Partition]:
        """The partitions to read now: the explicit list, or the ones the log says this process
        owns (the consumer group's assignment on Kafka). A new one starts at the committed offset."""
        current = self.partitions if self.partitions is not None else list(self.log.owned_partitions())
        for p in [p for p in self._parts if p not in current]:
            del self._parts[p]
        for p in current:
            if p not in self._parts:
                offset = await self.log.committed(self.group, p)
                self._parts[p] = _Partition(p, offset, offset)
        return [self._parts[p] for p in current if p in self._parts]

    def _hand_out(self, part: _Partition, record: LogRecord) -> None:
        if not self.wanted(record):
            return  # done the moment it is read: the low-water mark passes it
        part.open[record.offset] = False
        self._buffered += 1
        key = self.key(record)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = _KeyQueue()
        queue.records.append((part, record))
        if queue.task is None:
            queue.task = asyncio.create_task(self._work(key, queue), name=f"{self.group}:{key}")

    # -- handling one key ------------------------------------------------------------------------

    async def _work(self, key: str, queue: _KeyQueue) -> None:
        try:
            while queue.records:
                part, record = queue.records[0]
                if self._parts.get(part.partition) is part and not self._stop.is_set():
                    if not await self._handle(part, record):
                        self._give_up(part)
                        break
                    if not self._stop.is_set():  # a handler drained by stop() may have left work
                        part.open[record.offset] = True
                        self._handled += 1
                queue.records.popleft()
                self._buffered -= 1
                self._changed.set()
        finally:
            self._buffered -= len(queue.records)
            queue.records.clear()
            queue.task = None
            if self._queues.get(key) is queue:
                del self._queues[key]
            self._changed.set()

    async def _handle(self, part: _Partition, record: LogRecord) -> bool:
        """Run the handler on ``record``; True once it returned, False if this member gave up
        on it (poll mode, the partition moved away, or a stop)."""
        delay = RETRY_S
        while True:
            try:
                async with self._slots:
                    await self.handler(record)
                return True
            except (LogUnavailableError, ConcurrencyError) as exc:
                log.warning(
                    "consumer.retry_later", group=self.group, partition=part.partition, error=str(exc)
                )
                if not self._retrying or not self._still_ours(part.partition):
                    return False
                wait, delay = delay, min(delay * 2, RETRY_MAX_S)
            except Exception as exc:
                if not self._retrying:
                    self._bugs.append(exc)
                    return False
                log.exception("consumer.handler_failed", group=self.group, offset=record.offset)
                wait = BUG_RETRY_S
            if await self._stopped_within(wait):
                return False

    def _give_up(self, part: _Partition) -> None:
        """Leave the key's records unhandled and uncommitted: the next poll reads the partition
        again from the low-water mark (poll mode), its next owner does (moved away), or the
        successor of a stopped member."""
        if self._stop.is_set():
            return
        if not self._retrying:
            part.failed = True
        elif self._parts.get(part.partition) is part:
            del self._parts[part.partition]  # moved away: drop what we read of it

    def _still_ours(self, partition: int) -> bool:
        return self.partitions is not None or partition in self.log.owned_partitions()

    async def _stopped_within(self, seconds: float) -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop.wait()
        return self._stop.is_set()

    # -- settling, committing, draining ----------------------------------------------------------

    async def _settle(self) -> None:
        """Wait until no key has a handler running."""
        while tasks := [q.task for q in self._queues.values() if q.task is not None]:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _commit(self) -> None:
        for part in list(self._parts.values()):
            mark = part.low_water()
            if mark != part.committed:
                await self.log.commit(self.group, part.partition, mark)
                part.committed = mark

    def _rewind_failed(self) -> None:
        """After a poll: a partition with a record given up on is read again from its mark."""
        for part in self._parts.values():
            if part.failed:
                part.read_from = part.low_water()
                part.open.clear()
                part.failed = False

    async def _wait(self, timeout: float) -> None:
        """Until something may have been appended, a handler finished, or stop()."""
        appended = asyncio.ensure_future(self.log.wait_for_append(timeout))
        changed = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait([appended, changed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (appended, changed):
                waiter.cancel()
            await asyncio.gather(appended, changed, return_exceptions=True)

    async def _drain(self) -> None:
        """Stop reading, let the handlers in flight reach a safe point, cancel the rest, commit."""
        if self.on_drain is not None:
            self.on_drain()
        tasks = [q.task for q in self._queues.values() if q.task is not None]
        if tasks:
            log.info("consumer.draining", group=self.group, handlers=len(tasks))
            _, late = await asyncio.wait(tasks, timeout=self.drain_timeout_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if late:
                log.warning("consumer.drain_cancelled", group=self.group, handlers=len(late))
        await self._commit()
