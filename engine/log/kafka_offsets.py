"""Consumer-group offsets that a process which owns no partition keeps on Kafka itself.

An owner commits a group's offsets inside its next transaction on the partition (a fenced
zombie cannot move them). A process that owns nothing (a standalone memory consumer, `turnlog
memory`) has no transaction to put them in; for the groups it names (``persist``) its commits go
to the group's offsets on Kafka directly, coalesced and sent about twice a second, and once more
when the log closes, so a restart resumes near where it stopped. A record handled again after a
crash is the consumer's to tolerate (the memory consumer's writes are idempotent). One process
per such group: two would overwrite each other's offsets.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

log = structlog.get_logger("turnlog.kafka")
FLUSH_EVERY_S = 0.5


class DirectOffsets:
    """Offsets of the named groups on the events topic, committed outside any transaction."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.groups: set[str] = set()
        self._dirty: dict[str, dict[int, int]] = {}
        self._clients: dict[str, AIOKafkaConsumer] = {}
        self._flusher: asyncio.Task[None] | None = None

    def note(self, group: str, partition: int, offset: int) -> None:
        """Remember the offset; it is committed with the next flush."""
        self._dirty.setdefault(group, {})[partition] = offset
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_soon())

    async def _flush_soon(self) -> None:
        await asyncio.sleep(FLUSH_EVERY_S)
        await self.flush()

    async def flush(self) -> None:
        dirty, self._dirty = self._dirty, {}
        for group, offsets in dirty.items():
            try:
                consumer = await self._client(group)
                await consumer.commit({TopicPartition(self.topic, p): o for p, o in offsets.items()})
            except KafkaError as exc:  # kept for the next flush; the consumer re-reads a little more
                for partition, offset in offsets.items():
                    self._dirty.setdefault(group, {}).setdefault(partition, offset)
                log.warning("kafka.direct_commit_failed", group=group, error=repr(exc))

    async def _client(self, group: str) -> AIOKafkaConsumer:
        client = self._clients.get(group)
        if client is None:
            client = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap, group_id=group, enable_auto_commit=False
            )
            await client.start()
            client.assign([TopicPartition(self.topic, p) for p in range(self.partitions)])  # no group join
            self._clients[group] = client
        return client

    async def close(self) -> None:
        if self._flusher is not None and not self._flusher.done():
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        with contextlib.suppress(Exception):
            await self.flush()
        for client in self._clients.values():
            with contextlib.suppress(Exception):
                await client.stop()
        self._clients.clear()
