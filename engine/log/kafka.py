"""The distributed log: Apache Kafka through aiokafka.

Topics (created by ``start`` with the settings they need, see ``kafka_topics``):

* ``<topic>``: the events, partitioned by session id with Kafka's murmur2 partitioner
  (``partition_for``), Avro single-object values (``turnlog.engine.codec``), the schema
  fingerprint and event type in record headers, infinite retention.
* ``<topic>.inbox``: what producers submit without a version; same partition count.
* ``<topic>.dead-letter``: records the owner could not take (inbox records it refused, poison on
  the events topic: ``kafka_poison``), with the reason and the source in headers.

Kafka has no conditional append, so one process owns each partition: the member of the
``<topic>.owners`` consumer group that is assigned inbox partition ``p`` is the only writer of
events partition ``p``. ``KafkaEventLog`` is the front: each partition is a ``PartitionOwner``
(``kafka_owner``: its index, and while owned the transactional producer that fences older
owners); appends go through the owner's transactions and group commit (``kafka_commits``),
submissions through the inbox, sequenced by the owner (``kafka_sequencer``, admitted by the
policy it was handed: ``kafka_inbox``); reads catch a partition's index up first
(``kafka_reader``).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncGenerator, Callable, Coroutine, Iterable, Mapping, Sequence

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from ..errors import (
    ConfigurationError,
    DuplicateSubmissionError,
    LogError,
    LogUnavailableError,
)
from ..events import Event
from .base import (
    SESSIONS_PAGE,
    AdmissionPolicy,
    EventLog,
    LogRecord,
    SessionSummary,
    check_batch,
    page_of,
    pending_record,
)
from .kafka_commits import append_grouped
from .kafka_heard import HeardRecords, SessionWaiters
from .kafka_held import DEFAULT_INDEX_BYTES, HeldUse, index_budget
from .kafka_index import PartitionIndex
from .kafka_listing import owned_versions
from .kafka_offsets import DirectOffsets
from .kafka_owner import Owners, OwnersListener, PartitionOwner
from .kafka_reader import PartitionReader
from .kafka_sequencer import InboxSequencer, inbox_consumer, send_to_inbox
from .kafka_sessions import INDEX_EVERY_S
from .kafka_topics import TopicNames, committed_offset, ensure_topics
from .kafka_txn import owner_producer
from .kafka_upkeep import flush_all
from .kafka_written import WrittenValues
from .sealing import RecordCodec, Sealer
from .submissions import SUBMITTABLE
from .waiters import Waiters

log = structlog.get_logger("turnlog.kafka")
SUBMIT_WAIT_S = 30.0
"""How long ``submit`` waits for this process's own sequencer before it answers "not yet"."""
READY_TIMEOUT_S = 2.5
"""How long a readiness check waits for the broker before it reports it unreachable."""


class KafkaEventLog(EventLog):
    """An EventLog on a Kafka cluster. ``await start()`` before use, ``await close()`` after.

    ``owner=True`` joins the owners' consumer group: this process then sequences producers'
    events and may append to the partitions it is assigned. ``owner=False`` is a producer and
    reader only (an API gateway, the projector, ``turnlog rebuild``).

    ``session_index=False`` neither writes the session index nor takes a partition over from
    it (every takeover reads the partition in full); ``index_every_s`` is how often an owner
    that appends writes it.

    ``sealer``: the content cipher every topic's records go through (engine.crypto; the
    deployment's ``TURNLOG_KEYSTORE``), closed with the log if ``owns_sealer``; None: content is
    written as it is.

    ``index_bytes``: what the process holds of the partitions' records, all together, by
    estimate; past each partition's share it unloads idle sessions (``kafka_held``).
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        topic: str = "turnlog.events",
        partitions: int = 8,
        owner: bool = True,
        replication: int = 1,
        client_id: str = "turnlog",
        session_timeout_ms: int = 10_000,
        session_index: bool = True,
        index_every_s: float = INDEX_EVERY_S,
        sealer: Sealer | None = None,
        owns_sealer: bool = False,
        index_bytes: int = DEFAULT_INDEX_BYTES,
    ) -> None:
        if partitions < 1:
            raise ConfigurationError("partitions must be at least 1")
        self.bootstrap = bootstrap
        self.topics = TopicNames(topic)
        self.partitions = partitions
        self.owner = owner
        self.replication = replication
        self.client_id = client_id
        self.session_timeout_ms = session_timeout_ms
        self.records = RecordCodec(sealer)
        """How events become records on every topic (events, inbox, dead letters, live): the
        Avro codec, through the content cipher when the deployment names a key store."""
        self._owns_sealer = owns_sealer
        """``close`` closes the sealer too (its key store): the log was given one of its own."""
        self._heard = HeardRecords()
        self._hearing = SessionWaiters()
        self._reader = PartitionReader(self.topics, self.records, known=self._heard.known)
        self._written = WrittenValues()
        self.records.on_forget(self._heard.forget)
        shared = Owners(
            reader=self._reader,
            new_producer=self._owner_producer,
            assigned=self._assigned,
            spawn=self._spawn,
            notify=self._notify,
            acquired=self._forget_committed,
            session_index=session_index,
            index_every_s=index_every_s,
            name=f"{client_id}:owner",
            written=self._written,
            index_budget=index_budget(index_bytes, partitions),
        )
        self._owners = [PartitionOwner(p, shared) for p in range(partitions)]
        self._sequencer = InboxSequencer(self._owners, lambda: self.admission, self._spawn)
        self._producer: AIOKafkaProducer | None = None
        self._inbox: AIOKafkaConsumer | None = None
        self._sequencing: asyncio.Task[None] | None = None
        self._waiters = Waiters()
        self._committed: dict[tuple[str, int], int] = {}
        self._direct = DirectOffsets(bootstrap, self.topics.events, partitions)
        self._background: set[asyncio.Task[None]] = set()
        self._group_joined = False
        """The owners' group has handed this process its share (possibly none) at least once."""

    def admit_with(self, policy: AdmissionPolicy) -> AdmissionPolicy:
        """As ``EventLog.admit_with``; inbox records that waited for it are sequenced at once."""
        given = super().admit_with(policy)
        self._sequencer.policy_given.set()
        return given

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        await ensure_topics(self.bootstrap, self.topics, self.partitions, self.replication)
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, client_id=self.client_id, enable_idempotence=True, acks="all"
        )
        await self._producer.start()
        await self._reader.start(self.bootstrap, self.client_id)
        if self.owner:
            self._inbox = inbox_consumer(self.bootstrap, self.client_id, self.topics, self.session_timeout_ms)
            listener = OwnersListener(self._owners, self._joined, self._sequencer.forget)
            self._inbox.subscribe([self.topics.inbox], listener=listener)
            await self._inbox.start()
            self._sequencer.consumer = self._inbox
            self._sequencing = asyncio.create_task(self._sequencer.run(), name="turnlog-sequencer")

    async def wait_owned(self, count: int | None = None, timeout: float = 60.0) -> None:
        """Wait until this process owns ``count`` partitions (default: all of them)."""
        want = self.partitions if count is None else count
        async with asyncio.timeout(timeout):
            while len(self.owned_partitions()) < want:
                if self._sequencing is not None and self._sequencing.done():
                    self._sequencing.result()
                await asyncio.sleep(0.05)

    def persist_offsets(self, group: str) -> None:
        """Keep ``group``'s offsets on Kafka even for partitions this process does not own
        (``kafka_offsets``): for a standalone consumer, the one process of its group."""
        self._direct.groups.add(group)

    async def close(self) -> None:
        with contextlib.suppress(Exception):  # hand over offsets, session index: a successor reads less
            await flush_all(self._owners, force=True)
        await self._direct.close()
        committers = [o.committer for o in self._owners if o.committer is not None]
        for task in [*self._background, *committers, *([self._sequencing] if self._sequencing else [])]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for owner in self._owners:  # a committer cancelled before it ran never answered its queue
            owner.fail_appends(LogUnavailableError("the log was closed before this append; retry"))
        if self._inbox is not None:
            with contextlib.suppress(Exception):
                await self._inbox.stop()  # leaves the group: the revoke hook releases partitions
        for owner in self._owners:
            self._sequencer.forget(owner.partition)
            await owner.release()
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await self._producer.stop()
        await self._reader.close()
        self._producer = self._inbox = self._sequencer.consumer = None
        self.records.on_forget(self._heard.forget, remove=True)
        if self._owns_sealer and self.records.sealer is not None:
            self.records.sealer.close()
            self._owns_sealer = False

    def owned_partitions(self) -> Sequence[int]:
        return [o.partition for o in self._owners if o.owned]

    async def readiness_problem(self) -> str | None:
        """The broker answers a request for an end offset now, and an owner holds every partition
        the owners' group assigned it and has the admission policy its inbox asks for."""
        if self._reader.consumer is None:
            return "the Kafka log is not started (or was closed)"
        try:
            async with asyncio.timeout(READY_TIMEOUT_S):
                await self._reader.consumer.end_offsets([TopicPartition(self.topics.events, 0)])
        except (TimeoutError, KafkaError) as exc:
            return (
                f"the Kafka broker at {self.bootstrap} does not answer ({type(exc).__name__}); "
                "check that it runs and this process can reach it"
            )
        return self._owner_problem() if self.owner else None

    def _owner_problem(self) -> str | None:
        if not self._group_joined or self._inbox is None:
            return f"joining the owners' group {self.topics.owners_group}; no partitions assigned yet"
        missing = sorted({tp.partition for tp in self._inbox.assignment()} - set(self.owned_partitions()))
        if missing:
            return f"taking over partitions {missing}"
        if not self._sequencer.waiting:
            return None
        p, why = min(self._sequencer.waiting.items())
        return (
            f"partition {p}: {why}; this owner was given none: run turn workers (TurnWorker) or "
            "AgentSessions on it, or hand one over with EventLog.admit_with"
        )

    # -- what the partition owners call back ---------------------------------------------------

    def _owner_producer(self, partition: int) -> AIOKafkaProducer:
        """The transactional producer that makes this process the partition's only writer."""
        return owner_producer(self.bootstrap, self.client_id, self.topics.transactional_id(partition))

    def _assigned(self, partition: int) -> bool:
        inbox = self._inbox
        return inbox is not None and TopicPartition(self.topics.inbox, partition) in inbox.assignment()

    def _joined(self) -> None:
        self._group_joined = True

    def _forget_committed(self, partition: int) -> None:
        """A partition was taken: its groups' offsets are read from Kafka again."""
        for key in [k for k in self._committed if k[1] == partition]:
            del self._committed[key]

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``work`` in the background, holding a reference until it ends."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # -- writes ---------------------------------------------------------------------------------

    async def append(
        self, events: Sequence[Event], *, expected_version: int, redoable: bool = False
    ) -> list[LogRecord]:
        """Queue the batch for the partition's next transaction (group commit, kafka_commits):
        appends of many sessions made while one transaction is in flight share the next.
        ``redoable`` changes nothing here: every append waits for its transaction."""
        session_id = check_batch(events, expected_version)
        records = await append_grouped(self._owners[self.partition_of(session_id)], events, expected_version)
        self._notify()
        return records

    async def submit(self, event: Event) -> list[LogRecord]:
        """Through the inbox: sequenced by the partition's owner. In the owner's process this
        waits until it is (read your writes); elsewhere it returns a pending record."""
        if not isinstance(event, SUBMITTABLE):
            raise LogError(f"only {', '.join(c.type for c in SUBMITTABLE)} are submitted, not {event.type}")
        owner = self._owners[self.partition_of(event.session_id)]
        if owner.owned:
            await self._reader.load(owner.index, [event.session_id])
            if (held := owner.index.held_submission(event)) is not None:
                return await self._held_submission(DuplicateSubmissionError(event.session_id, *held))
        waiter: asyncio.Future[list[LogRecord]] | None = None
        if owner.owned:  # we sequence it ourselves: return it as appended (read your writes)
            waiter = self._sequencer.submitted[event.event_id] = asyncio.get_running_loop().create_future()
        try:
            await send_to_inbox(self._producer, self.topics, event, owner.partition, self.records)
            if waiter is not None:
                async with asyncio.timeout(SUBMIT_WAIT_S):
                    return await waiter
        except TimeoutError:  # durable in the inbox; the partition's next owner sequences it
            pass
        finally:
            self._sequencer.submitted.pop(event.event_id, None)
        return [pending_record(event, self.partitions)]

    # -- reads ----------------------------------------------------------------------------------

    async def _index(self, partition: int) -> PartitionIndex:
        """The partition's index, caught up with the broker's end (an owned one's always is)."""
        owner = self._owners[partition]
        return owner.index if owner.owned else await self._reader.caught_up(owner.index)

    async def _session_index(self, session_id: str, *, load: bool = True) -> PartitionIndex:
        """The session's partition index (loaded unless ``load=False``), caught up (a session new
        here: once what was in flight is resolved, ``settled``), with all that was heard of it."""
        owner = self._owners[self.partition_of(session_id)]
        index = await self._index(owner.partition)
        if not (owner.owned or index.version(session_id) or self._heard.latest(session_id)):
            await self._reader.settled(index)
        sessions = [session_id] if load else []
        await self._reader.load(index, sessions)
        if not owner.owned:
            await self._read_on_through(index, session_id, self._heard.latest(session_id), sessions)
        return index

    async def _read_on_through(self, index: PartitionIndex, sid: str, version: int, load: list[str]) -> None:
        """Unless the records heard of the session fill it to ``version`` without a gap (reads
        add them: ``HeardRecords.beyond``), read the partition on until the index holds it: the
        broker's end, asked for before a commit's markers land, is short of what its owner named
        on the live topic (``sequenced`` answered from that)."""
        indexed = index.version(sid)
        self._heard.drop_through(sid, indexed)
        if len(self._heard.beyond(sid, indexed, indexed)) < version - indexed:
            await self._reader.read_through(index, sid, version)
            await self._reader.load(index, load)  # a trim meanwhile may have unloaded it

    async def read_session(self, session_id: str, after_version: int = 0) -> list[Event]:
        index = await self._session_index(session_id)
        heard = self._heard.beyond(session_id, index.version(session_id), after_version)
        return index.session_after(session_id, after_version) + [r.event for r in heard]

    async def read_session_records(self, session_id: str, after_version: int = 0) -> list[LogRecord]:
        index = await self._session_index(session_id)
        heard = self._heard.beyond(session_id, index.version(session_id), after_version)
        return index.session_records_after(session_id, after_version) + heard

    async def read_session_records_through(
        self, session_id: str, after_version: int, version: int
    ) -> list[LogRecord]:
        """From the index, else with the records the live topic named (``heard``) when they
        fill the gap, else once the partition's reader has read on to ``version``."""
        owner = self._owners[self.partition_of(session_id)]
        index = owner.index
        await self._reader.load(index, [session_id])
        if not owner.owned:
            await self._read_on_through(index, session_id, version, [session_id])
        heard = self._heard.beyond(session_id, index.version(session_id), after_version)
        return index.session_records_after(session_id, after_version) + heard

    def on_sequenced(self, listener: Callable[[Event], None]) -> None:
        """Call ``listener`` with each event this process's sequencer commits from the inbox (a
        user's message, a decision): a live publisher, so other processes' streams hear of
        them at once, not only with the turn they start."""
        self._sequencer.sequenced = listener

    def heard(self, record: LogRecord, value: bytes) -> None:
        """A committed record the partition's owner named on the live topic (kafka_heard); not
        kept if its session is known erased (it was decoded before this process knew)."""
        if not self.records.erased(record.event.session_id):
            self._heard.add(record, value)
        self._hearing.wake(record.event.session_id)

    async def _find_sequenced(self, event: Event) -> LogRecord | None:
        """The record the partition's owner named on the live topic, else as on the log."""
        heard = self._heard.find(event.session_id, event.event_id)
        return heard if heard is not None else await super()._find_sequenced(event)

    async def wait_for_session(self, session_id: str, timeout: float) -> None:
        """Until the live topic names an event of the session (its owner applied a request, or
        something else happened to it), at most ``timeout``: a process that owns no partition
        hears of no append otherwise (a log with no live publisher waits the whole timeout)."""
        await self._hearing.wait(session_id, timeout)

    def written_value(self, record: LogRecord) -> bytes | None:
        """The value this process committed ``record`` with, taken once (``kafka_written``): its
        live publisher sends those bytes rather than encoding the event again."""
        return self._written.take(record)

    def held_use(self) -> HeldUse:
        """What this process holds of the partitions now, against its ``index_bytes`` (metrics)."""
        shared, held = self._owners[0].owners, sum(o.index.held_bytes for o in self._owners)
        return HeldUse(held, shared.index_budget * self.partitions, shared.held_counts)

    def own_record(self, session_id: str, version: int) -> LogRecord | None:
        """The record of a session's ``version`` if this process owns its partition and holds it
        (what its live items name: ``kafka_live``)."""
        owner = self._owners[self.partition_of(session_id)]
        records = owner.index.session_records.get(session_id) if owner.owned else None
        if records and 0 < version <= len(records) and records[version - 1].event.version == version:
            return records[version - 1]
        return None

    async def session_version(self, session_id: str) -> int:
        indexed = (await self._session_index(session_id, load=False)).version(session_id)
        return indexed + len(self._heard.beyond(session_id, indexed, indexed))

    async def _versions(self, partition: int) -> dict[str, int]:
        """Each session of the partition with its last version: from the index if this process
        owns it, else from the session index and the events after its watermark
        (``kafka_listing``); no session is folded."""
        self._check_partition(partition)
        owner = self._owners[partition]
        return owned_versions(owner.index) if owner.owned else await self._reader.listed_versions(partition)

    async def list_sessions(
        self, partition: int, *, after: str = "", limit: int = SESSIONS_PAGE
    ) -> list[SessionSummary]:
        return page_of(partition, await self._versions(partition), after, limit)

    async def sessions(
        self, *, partitions: Iterable[int] | None = None, page: int = SESSIONS_PAGE
    ) -> AsyncGenerator[SessionSummary, None]:
        """As ``EventLog.sessions``, reading each partition's listing once (one partition's ids
        and versions in memory at a time; ``page`` is not needed)."""
        for partition in range(self.partitions) if partitions is None else partitions:
            versions = await self._versions(partition)
            for summary in page_of(partition, versions, "", len(versions)):
                yield summary

    async def read_partition(self, partition: int, offset: int, limit: int = 500) -> list[LogRecord]:
        self._check_partition(partition)
        index = await self._index(partition)
        if offset >= index.base:
            return index.read(offset, limit)
        older = await self._reader.before_base(index, offset, limit)
        return older + index.read(index.base, limit - len(older))

    async def end_offset(self, partition: int) -> int:
        self._check_partition(partition)
        return (await self._index(partition)).next_offset

    async def partitions_to_read(self, offsets: Mapping[int, int]) -> list[int]:
        """Every partition caught up at once (their ends in one request: ``kafka_ends``), then
        those holding a record at or after the offset (the end counts markers too)."""
        parts = sorted(offsets)
        indexes = await asyncio.gather(*(self._index(p) for p in parts))
        return [p for p, index in zip(parts, indexes, strict=True) if index.holds_from(offsets[p])]

    # -- consumer groups ------------------------------------------------------------------------

    async def committed(self, group: str, partition: int) -> int:
        key = (group, partition)
        if key not in self._committed:
            self._committed[key] = await committed_offset(
                self.bootstrap, group, TopicPartition(self.topics.events, partition)
            )
        return self._committed[key]

    async def commit(self, group: str, partition: int, offset: int) -> None:
        """Recorded at once for this process; on Kafka with one of the partition's
        transactions, at most every ``OFFSETS_EVERY_S`` (kafka_commits), so a fenced zombie
        cannot move a group's offsets; for a partition this process does not own, only if
        ``persist_offsets`` named the group."""
        self._check_partition(partition)
        self._committed[(group, partition)] = offset
        owner = self._owners[partition]
        if owner.owned:
            owner.pending_commits[group] = offset
        elif group in self._direct.groups:
            self._direct.note(group, partition, offset)

    async def wait_for_append(self, timeout: float) -> None:
        # appends by other processes are not announced: poll at least every 200 ms
        await self._waiters.wait(min(timeout, 0.2))

    def _notify(self) -> None:
        self._waiters.wake()

    def _check_partition(self, partition: int) -> None:
        if not 0 <= partition < self.partitions:
            raise LogError(f"partition {partition} out of range 0..{self.partitions - 1}")
