"""One partition of a Kafka log as this process holds it (``PartitionOwner``): its index, and,
while the owners' consumer group assigns the partition to this process, the transactional
producer that makes the process the partition's only writer.

Taking a partition starts that producer, whose transactional id is the partition's
(``<topic>.owner.<p>``): ``init_transactions`` bumps its epoch on the broker, which fences any
previous owner still alive (a zombie) and aborts its open transaction. Only then is the
partition indexed: from the session index its predecessor wrote (``kafka_sessions``), or by
reading it to its end. A producer the broker fences drops the partition (a newer owner writes
now); a transaction whose outcome is unknown drops it too, and it is taken again and re-read.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Coroutine

import structlog
from aiokafka import AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from ..errors import LogError, LogUnavailableError, PartitionNotOwnedError
from .kafka_appends import PendingAppend, fail_group
from .kafka_held import HeldCounts
from .kafka_index import PartitionIndex
from .kafka_reader import PartitionReader
from .kafka_written import WrittenValues

log = structlog.get_logger("turnlog.kafka")
REACQUIRE_DELAY_S = 3.0
"""How long a process fenced while the group still assigns it the partition waits before it
takes the partition back."""
Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]


@dataclass
class Owners:
    """What the partition owners of one process share."""

    reader: PartitionReader
    new_producer: Callable[[int], AIOKafkaProducer]
    """The transactional producer of a partition (``kafka_txn.owner_producer``)."""
    assigned: Callable[[int], bool]
    """Whether the owners' group assigns the partition to this process now."""
    spawn: Spawn
    """Runs a coroutine in the background, holding it until it ends."""
    notify: Callable[[], None]
    """Wakes the waiters for an append (``EventLog.wait_for_append``)."""
    acquired: Callable[[int], None]
    """Called when the process has taken the partition (before appends go through it)."""
    session_index: bool
    """Take partitions over from the session index (and write it: ``kafka_commits``)."""
    index_every_s: float
    name: str
    """The producer name an owner's own events carry (ERROR markers for poison)."""
    written: WrittenValues
    """The values of the events committed last, for the live publisher (``kafka_written``)."""
    index_budget: int
    """What each partition's index may hold, in estimated bytes (``kafka_held``)."""
    held_counts: HeldCounts = field(default_factory=HeldCounts)
    """Sessions the partitions' indexes unloaded and read back, together."""


class PartitionOwner:
    """One partition: its index for every reader, its producer and append queue for its owner."""

    def __init__(self, partition: int, owners: Owners) -> None:
        self.partition = partition
        self.owners = owners
        self.index = PartitionIndex(
            partition, codec=owners.reader.codec, budget=owners.index_budget, counts=owners.held_counts
        )
        self.owned = False
        self.lost = ""
        """Why this process last lost the partition (fenced), for the errors of appends after it."""
        self.producer: AIOKafkaProducer | None = None
        """The transactional producer whose id is this partition's: holding it fences older owners."""
        self.lock = asyncio.Lock()
        """Held by whoever appends to the partition (one Kafka transaction at a time)."""
        self.acquiring = asyncio.Lock()
        """Held while taking ownership, so one process never runs two producers of one id."""
        self.pending_commits: dict[str, int] = {}
        """Consumer-group offsets on this partition to commit with its next transaction."""
        self.inbox_pending: int | None = None
        """The next inbox offset the partition's events say, not yet the owners' group's."""
        self.appends: list[PendingAppend] = []
        """Appends waiting for the partition's next transaction (group commit: kafka_commits)."""
        self.committer: asyncio.Task[None] | None = None
        """The task that commits queued appends, group by group, while any are queued."""
        self.indexed_at = 0.0
        """When the owner last wrote the session index (event-loop time)."""
        self.offsets_at: dict[str, float] = {}
        """When the owner last committed each consumer group's offsets (event-loop time)."""

    async def acquire(self) -> None:
        """Take the partition (once: the rebalance hook and a re-acquire after a failed
        transaction may race, and two producers of one transactional id fence each other)."""
        async with self.acquiring:
            if not self.owned:
                await self._start_owning()

    async def _start_owning(self) -> None:
        producer = self.owners.new_producer(self.partition)
        try:
            await producer.start()  # init_transactions: bumps the epoch, aborts a zombie's transaction
            async with self.lock:
                await self._index_taken()
                self.producer = producer
                self.owned, self.lost = True, ""
                self.indexed_at = asyncio.get_running_loop().time()  # the first index write: in a second
                self.owners.acquired(self.partition)
        except BaseException:
            await quiet_stop(producer)
            raise
        log.info("kafka.partition_acquired", partition=self.partition, offset=self.index.next_offset)
        self.owners.notify()

    async def _index_taken(self) -> None:
        """Index the partition just fenced: from the session index if it is usable (and nothing
        was read yet), else by reading it; then the dead letters already written."""
        index, reader = self.index, self.owners.reader
        from_index = self.owners.session_index and index.next_offset == 0 and not index.sessions
        if not (from_index and await reader.from_session_index(index)):
            # no entries of ours may be missing from the index (nor those of idle sessions unloaded)
            index.dirty.update(index.sessions, index.unloaded)
        await reader.catch_up(index)
        index.dead_sources = await reader.dead_sources(self.partition)

    async def release(self) -> None:
        """Give the partition up (revoked, or closing): appends to it are refused from now on."""
        async with self.acquiring, self.lock:
            producer, self.producer, self.owned = self.producer, None, False
            self.pending_commits.clear()
            self.inbox_pending = None
        if producer is not None:
            await quiet_stop(producer)
            log.info("kafka.partition_released", partition=self.partition)

    def fail_appends(self, error: LogError) -> None:
        """Answer every queued append with ``error`` (the log closes, the partition is lost)."""
        fail_group(self.appends, error)
        self.appends = []

    def fenced(self, reason: str) -> PartitionNotOwnedError:
        """The producer was fenced: drop it (a newer owner writes now)."""
        producer, self.producer, self.owned = self.producer, None, False
        self.lost = reason
        if producer is not None:
            self.owners.spawn(quiet_stop(producer))
        log.warning("kafka.partition_fenced", partition=self.partition, reason=reason)
        # fenced while the group still assigns it to us: our view or the fencer's is stale; if the
        # assignment stands after the group settles, this process is the owner and takes it back
        self.owners.spawn(self.reacquire(delay=REACQUIRE_DELAY_S))
        return PartitionNotOwnedError(self.partition, reason)

    async def reset(self, exc: Exception) -> LogError:
        """A transaction's outcome is unknown: drop the producer (aborting what it left open when
        the partition is taken again) and take the partition again, re-reading it."""
        producer, self.producer, self.owned = self.producer, None, False
        if producer is not None:
            await quiet_stop(producer)
        log.warning("kafka.transaction_failed", partition=self.partition, error=repr(exc))
        self.owners.spawn(self.reacquire())
        return LogUnavailableError(
            f"partition {self.partition}: a Kafka transaction failed ({exc!r}); the owner re-reads "
            "the partition before appending again, retry the operation"
        )

    async def reacquire(self, delay: float = 0.0) -> None:
        """Take the partition again while the group assigns it here, retrying failed reads."""
        await asyncio.sleep(delay)
        while self.owners.assigned(self.partition):
            if self.owned:
                return
            try:
                await self.acquire()
                return
            except (KafkaError, LogError) as exc:  # a catch-up read fails with LogUnavailableError
                log.warning("kafka.reacquire_failed", partition=self.partition, error=repr(exc))
                await asyncio.sleep(1.0)


class OwnersListener(ConsumerRebalanceListener):
    """The owners' group hands partitions to this process and takes them away."""

    def __init__(
        self, owners: list[PartitionOwner], joined: Callable[[], None], revoked: Callable[[int], None]
    ) -> None:
        self.owners = owners
        self.joined = joined
        self.revoked = revoked

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        for tp in revoked:
            self.revoked(tp.partition)
            await self.owners[tp.partition].release()

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.joined()
        await asyncio.gather(*(self._acquire(self.owners[tp.partition]) for tp in assigned))

    async def _acquire(self, owner: PartitionOwner) -> None:
        for attempt in range(1, 31):
            try:
                await owner.acquire()
                return
            except (KafkaError, LogError) as exc:
                log.warning(
                    "kafka.acquire_retry", partition=owner.partition, attempt=attempt, error=repr(exc)
                )
                await asyncio.sleep(1.0)
        log.error("kafka.acquire_failed", partition=owner.partition, then="retrying while assigned")
        owner.owners.spawn(owner.reacquire(delay=1.0))


async def quiet_stop(producer: AIOKafkaProducer) -> None:
    with contextlib.suppress(Exception):
        await producer.stop()
