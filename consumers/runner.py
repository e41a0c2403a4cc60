"""A consumer group member on the log: read each assigned partition from its committed offset,
hand every record to a handler, commit after the handler returns.

At-least-once: a record whose handler did not return (crash, kill) is delivered again to the
next member, so handlers are idempotent (the turn worker folds the session and finds nothing to
do; the projector's version guard skips what it applied).

Without an explicit partition list a member works on the partitions its log owns
(``EventLog.owned_partitions``: all of them on the embedded log, the consumer group's assignment
on Kafka). A handler that fails because the log is unavailable or the partition moved to another
owner (``LogUnavailableError``) or lost a race (``ConcurrencyError``) leaves that partition's
offset where it was; the record is handled again on the next poll, by whoever owns it then.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Sequence

import structlog

from turnlog.engine.errors import ConcurrencyError, LogUnavailableError
from turnlog.engine.log.base import EventLog, LogRecord

Handler = Callable[[LogRecord], Awaitable[None]]
log = structlog.get_logger("turnlog.consumer")


class GroupConsumer:
    """A member of a consumer group on the log: hands each record of its partitions to a handler
    and commits once it returns (at least once; module docstring)."""

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
        for partition in partitions:
            try:
                handled += await self._drain(partition)
            except (LogUnavailableError, ConcurrencyError) as exc:
                log.warning("consumer.retry_later", group=self.group, partition=partition, error=str(exc))
        return handled

    async def _drain(self, partition: int) -> int:
        handled = 0
        while records := await self.log.read_partition(
            partition, await self.log.committed(self.group, partition), self.batch
        ):
            for record in records:
                await self.handler(record)
                await self.log.commit(self.group, partition, record.offset + 1)
                handled += 1
        return handled

    async def run(self) -> None:
        """Poll until ``stop()``; wakes on appends to an embedded log, else every idle_wait_s."""
        log.info("consumer.start", group=self.group, partitions=self.partitions)
        while not self._stop.is_set():
            if await self.poll_once() == 0:
                await self.log.wait_for_append(self.idle_wait_s)
        log.info("consumer.stop", group=self.group)

    def stop(self) -> None:
        self._stop.set()
