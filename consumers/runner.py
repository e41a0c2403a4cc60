"""A consumer group member on the log: read each assigned partition from its committed offset,
hand every record to a handler, commit what the handler has returned for.

At-least-once: a record whose handler did not return (crash, kill) is delivered again to the
next member, and so are those handled since the last commit, so handlers are idempotent (the
memory consumer's store dedups a restated fact; the projector's version guard skips what it
applied). A member commits at the end of each batch it reads and, within a batch, once
``COMMIT_EVERY_S`` has passed since its last commit: a commit is a write on the embedded log,
one per record cost more than the records' handling, and after a crash at most about that long
of handling (one slow handler) is done again.

Without an explicit partition list a member works on the partitions its log owns
(``EventLog.owned_partitions``: all of them on the embedded log, the consumer group's assignment
on Kafka). A handler that fails because the log is unavailable or the partition moved to another
owner (``LogUnavailableError``) or lost a race (``ConcurrencyError``) leaves that partition's
offset where it was; the record is handled again on the next poll, by whoever owns it then.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, Sequence

import structlog

from turnlog.engine.errors import ConcurrencyError, LogUnavailableError
from turnlog.engine.log.base import EventLog, LogRecord

Handler = Callable[[LogRecord], Awaitable[None]]
log = structlog.get_logger("turnlog.consumer")
COMMIT_EVERY_S = 1.0
"""Within a batch, a member commits what it handled once this long has passed (module docstring)."""


class GroupConsumer:
    """A member of a consumer group on the log: hands each record of its partitions to a handler
    and commits what it returned for (at least once; module docstring)."""

    def __init__(
        self,
        log: EventLog,
        group: str,
        handler: Handler,
        *,
        partitions: Sequence[int] | None = None,
        batch: int = 200,
        idle_wait_s: float = 0.5,
    ) -> None:
        self.log = log
        self.group = group
        self.handler = handler
        self.partitions = list(partitions) if partitions is not None else None
        self.batch = batch
        self.idle_wait_s = idle_wait_s
        self._stop = asyncio.Event()

    async def poll_once(self) -> int:
        """Process everything currently on the assigned partitions; return records handled."""
        handled = 0
        partitions = self.partitions if self.partitions is not None else self.log.owned_partitions()
        try:
            offsets = {p: await self.log.committed(self.group, p) for p in partitions}
            reading = await self.log.partitions_to_read(offsets)
        except (LogUnavailableError, ConcurrencyError) as exc:
            log.warning("consumer.retry_later", group=self.group, error=str(exc))
            return 0
        for partition in reading:
            try:
                handled += await self._drain(partition, offsets[partition])
            except (LogUnavailableError, ConcurrencyError) as exc:
                log.warning("consumer.retry_later", group=self.group, partition=partition, error=str(exc))
        return handled

    async def _drain(self, partition: int, offset: int) -> int:
        handled = 0
        while records := await self.log.read_partition(partition, offset, self.batch):
            committed, since = offset, time.monotonic()
            try:
                for record in records:
                    await self.handler(record)
                    offset, handled = record.offset + 1, handled + 1
                    if time.monotonic() - since >= COMMIT_EVERY_S:
                        await self.log.commit(self.group, partition, offset)
                        committed, since = offset, time.monotonic()
            except BaseException:
                if offset > committed:
                    await self._commit_handled(partition, offset)
                raise
            if offset > committed:
                await self.log.commit(self.group, partition, offset)
        return handled

    async def _commit_handled(self, partition: int, offset: int) -> None:
        """After a record failed (or the member was cancelled): commit the records handled
        before it; if that commit fails too, they come again (at least once), and the record's
        own failure is the one raised."""
        try:
            await self.log.commit(self.group, partition, offset)
        except Exception as exc:
            log.warning("consumer.commit_failed", group=self.group, partition=partition, error=repr(exc))

    async def run(self) -> None:
        """Poll until ``stop()``; wakes on appends to an embedded log, else every idle_wait_s."""
        log.info("consumer.start", group=self.group, partitions=self.partitions)
        while not self._stop.is_set():
            if await self.poll_once() == 0:
                await self.log.wait_for_append(self.idle_wait_s)
        log.info("consumer.stop", group=self.group)

    def stop(self) -> None:
        self._stop.set()
