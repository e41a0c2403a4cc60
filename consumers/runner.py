"""A consumer group member on the log: read each assigned partition from its committed offset,
hand every record to a handler, commit after the handler returns.

At-least-once: a record whose handler did not return (crash, kill) is delivered again to the
next member, so handlers are idempotent (the turn worker folds the session and finds nothing to
do; the projector's version guard skips what it applied).
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Sequence

import structlog

from engine.log.base import EventLog, LogRecord

Handler = Callable[[LogRecord], Awaitable[None]]
log = structlog.get_logger("turnlog.consumer")


class GroupConsumer:
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
        self.partitions = list(partitions) if partitions is not None else list(range(log.partitions))
        self.batch = batch
        self.idle_wait_s = idle_wait_s
        self._stop = asyncio.Event()

    async def poll_once(self) -> int:
        """Process everything currently on the assigned partitions; return records handled."""
        handled = 0
        for partition in self.partitions:
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
