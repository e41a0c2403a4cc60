"""The distributed log: Apache Kafka through aiokafka.

Topics (created by ``start`` with the settings they need, see ``kafka_topics``):

* ``<topic>``: the events, partitioned by session id with Kafka's murmur2 partitioner
  (``partition_for``), Avro single-object values (``turnlog.engine.codec``), the schema fingerprint and
  event type in record headers, infinite retention.
* ``<topic>.inbox``: what producers outside a partition's owner submit (SessionCreated,
  UserMessageReceived) without a version; same partition count.
* ``<topic>.dead-letter``: records the owner could not take (inbox records it refused, poison on
  the events topic: ``kafka_poison``), with the reason and the source in headers.

Kafka has no conditional append, so one process owns each partition: the member of the
``<topic>.owners`` consumer group that is assigned inbox partition ``p`` is the only writer of
events partition ``p``. On assignment it starts a transactional producer whose id is the
partition's (``<topic>.owner.<p>``) — which fences any previous owner still alive (a zombie) —
and then indexes its sessions: from the session index its predecessor wrote (``kafka_sessions``:
the live sessions at once, the others when first asked for, then the events after the index's
watermark), or, without one, by reading events partition ``p`` to its end with read_committed.
Every append is one Kafka transaction checked against that index (the expected-version lock);
the owner sequences inbox records into events in a transaction that also commits the inbox
offsets (``send_offsets_to_transaction``), so a message is sequenced exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import Any, AsyncGenerator, Coroutine, Iterable, Sequence

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError, ProducerFenced

from .. import codec
from ..errors import (
    ConfigurationError,
    DuplicateSubmissionError,
    EventError,
    LogError,
    LogUnavailableError,
    PartitionNotOwnedError,
)
from ..events import Event
from .base import SESSIONS_PAGE, AdmissionPolicy, EventLog, LogRecord, SessionSummary, check_batch, page_of
from .kafka_appends import PendingAppend, fail_group, settle_group, take_group
from .kafka_inbox import InboxBatch, InboxQueue
from .kafka_index import PartitionIndex
from .kafka_listing import session_versions
from .kafka_offsets import DirectOffsets
from .kafka_poison import (
    Poison,
    dead_letter_sources,
    decode_record,
    index_consumed,
    own_poison,
    poison_of,
    poisoned,
    settle,
)
from .kafka_sessions import (
    INDEX_EVERY_S,
    WATERMARK,
    SessionEntry,
    encode_entry,
    encode_watermark,
    read_index,
    read_runs,
)
from .kafka_topics import TopicNames, committed_offset, ensure_topics
from .kafka_txn import owner_producer
from .submissions import SUBMITTABLE

log = structlog.get_logger("turnlog.kafka")
SUBMIT_WAIT_S = 30.0
OPERATION_TIMEOUT_S = 30.0
"""A bound on one transaction or one catch-up read: past it the outcome counts as unknown."""
REACQUIRE_DELAY_S = 3.0
READY_TIMEOUT_S = 2.5
"""How long a readiness check waits for the broker before it reports it unreachable."""
WAIT_FOR_POLICY_S = 1.0
"""How long a partition whose inbox record waits for an admission policy waits before it reads
the record again (at once when the policy is handed over)."""
TAIL_EVERY_S = 1.0
"""How often an idle owner reads what others wrote to its partitions (poison, see kafka_poison)."""


def _headers(event: Event) -> list[tuple[str, bytes]]:
    return [
        ("turnlog.schema", codec.schema_fingerprint(event.type)),
        ("turnlog.type", event.type.encode()),
    ]


class KafkaEventLog(EventLog):
    """An EventLog on a Kafka cluster. ``await start()`` before use, ``await close()`` after.

    ``owner=True`` joins the owners' consumer group: this process then sequences producers'
    events and may append to the partitions it is assigned. ``owner=False`` is a producer and
    reader only (an API gateway, the projector, ``turnlog rebuild``).

    ``session_index=False`` neither writes the session index nor takes a partition over from
    it (every takeover reads the partition in full); ``index_every_s`` is how often an owner
    that appends writes it.
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
        self.session_index = session_index
        self.index_every_s = index_every_s
        self._parts = [PartitionIndex(p) for p in range(partitions)]
        self._producer: AIOKafkaProducer | None = None
        self._reader: AIOKafkaConsumer | None = None
        self._reader_lock = asyncio.Lock()
        self._inbox: AIOKafkaConsumer | None = None
        self._sequencer: asyncio.Task[None] | None = None
        self._inbox_queues = [InboxQueue() for _ in range(partitions)]
        self._waiters: list[asyncio.Future[None]] = []
        self._submitted: dict[str, asyncio.Future[Event]] = {}
        self._committed: dict[tuple[str, int], int] = {}
        self._direct = DirectOffsets(bootstrap, self.topics.events, partitions)
        self._background: set[asyncio.Task[None]] = set()
        self._group_joined = False
        """The owners' group has handed this process its share (possibly none) at least once."""
        self._admission_ready = asyncio.Event()
        self._waiting: dict[int, str] = {}
        """Partitions whose next inbox record waits for an admission policy, and why."""

    def admit_with(self, policy: AdmissionPolicy) -> AdmissionPolicy:
        """As ``EventLog.admit_with``; inbox records that waited for it are sequenced at once."""
        given = super().admit_with(policy)
        self._admission_ready.set()
        return given

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        await ensure_topics(self.bootstrap, self.topics, self.partitions, self.replication)
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, client_id=self.client_id, enable_idempotence=True, acks="all"
        )
        self._reader = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            client_id=self.client_id,
            isolation_level="read_committed",
            fetch_max_wait_ms=20,  # a catch-up waits for an in-flight fetch: keep it short
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await self._producer.start()
        await self._reader.start()
        if self.owner:
            self._inbox = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                client_id=self.client_id,
                group_id=self.topics.owners_group,
                isolation_level="read_committed",
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                session_timeout_ms=self.session_timeout_ms,
                heartbeat_interval_ms=max(100, self.session_timeout_ms // 10),
            )
            self._inbox.subscribe([self.topics.inbox], listener=_Owners(self))
            await self._inbox.start()
            self._sequencer = asyncio.create_task(self._sequence_loop(), name="turnlog-sequencer")

    async def wait_owned(self, count: int | None = None, timeout: float = 60.0) -> None:
        """Wait until this process owns ``count`` partitions (default: all of them)."""
        want = self.partitions if count is None else count
        async with asyncio.timeout(timeout):
            while len(self.owned_partitions()) < want:
                if self._sequencer is not None and self._sequencer.done():
                    self._sequencer.result()
                await asyncio.sleep(0.05)

    def persist_offsets(self, group: str) -> None:
        """Keep ``group``'s offsets on Kafka even for partitions this process does not own
        (``kafka_offsets``): for a standalone consumer, the one process of its group."""
        self._direct.groups.add(group)

    async def close(self) -> None:
        with contextlib.suppress(Exception):  # hand over offsets, session index: a successor reads less
            await self._flush_commits(force_index=True)
        await self._direct.close()
        committers = [p.committer for p in self._parts if p.committer is not None]
        for task in [*self._background, *committers, *([self._sequencer] if self._sequencer else [])]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for part in self._parts:  # a committer cancelled before it ran never answered its queue
            fail_group(part.appends, LogUnavailableError("the log was closed before this append; retry"))
            part.appends = []
        if self._inbox is not None:
            with contextlib.suppress(Exception):
                await self._inbox.stop()  # leaves the group: the revoke hook releases partitions
        for part in self._parts:
            await self._release(part)
        for client in (self._producer, self._reader):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.stop()
        self._producer = self._reader = self._inbox = None

    def owned_partitions(self) -> Sequence[int]:
        return [p.partition for p in self._parts if p.owned]

    async def readiness_problem(self) -> str | None:
        """The broker answers a request for an end offset now, and an owner holds every partition
        the owners' group assigned it."""
        if self._reader is None:
            return "the Kafka log is not started (or was closed)"
        try:
            async with asyncio.timeout(READY_TIMEOUT_S):
                await self._reader.end_offsets([TopicPartition(self.topics.events, 0)])
        except (TimeoutError, KafkaError) as exc:
            return (
                f"the Kafka broker at {self.bootstrap} does not answer ({type(exc).__name__}); "
                "check that it runs and this process can reach it"
            )
        if not self.owner:
            return None
        if not self._group_joined or self._inbox is None:
            return f"joining the owners' group {self.topics.owners_group}; no partitions assigned yet"
        missing = sorted({tp.partition for tp in self._inbox.assignment()} - set(self.owned_partitions()))
        if missing:
            return f"taking over partitions {missing}"
        if self._waiting:
            p, why = next(iter(sorted(self._waiting.items())))
            return (
                f"partition {p}: {why}; this owner was given none: run turn workers (TurnWorker) or "
                "AgentSessions on it, or hand one over with EventLog.admit_with"
            )
        return None

    # -- ownership (called by the owners' group rebalance listener) ----------------------------

    async def _acquire(self, part: PartitionIndex) -> None:
        """Take partition ownership (once: the rebalance hook and a re-acquire after a failed
        transaction may race, and two producers of one transactional id fence each other)."""
        async with part.acquiring:
            if not part.owned:
                await self._start_owning(part)

    def _owner_producer(self, partition: int) -> AIOKafkaProducer:
        """The transactional producer that makes this process the partition's only writer."""
        return owner_producer(self.bootstrap, self.client_id, self.topics.transactional_id(partition))

    async def _start_owning(self, part: PartitionIndex) -> None:
        producer = self._owner_producer(part.partition)
        try:
            await producer.start()  # init_transactions: bumps the epoch, aborts a zombie's transaction
            async with part.lock:
                from_index = self.session_index and part.next_offset == 0 and not part.sessions
                if not (from_index and await self._from_index(part)):
                    part.dirty.update(part.sessions)  # no entries of ours may be missing from the index
                await self._catch_up(part)
                part.dead_sources = await self._dead_sources(part.partition)
                part.producer = producer
                part.owned, part.lost = True, ""
                part.indexed_at = asyncio.get_running_loop().time()  # the first index write: in a second
                for key in [k for k in self._committed if k[1] == part.partition]:
                    del self._committed[key]
        except BaseException:
            await _quiet_stop(producer)
            raise
        log.info("kafka.partition_acquired", partition=part.partition, offset=part.next_offset)
        self._notify()

    async def _from_index(self, part: PartitionIndex) -> bool:
        """Start the partition's index at the session index's watermark, with its live sessions
        folded (``kafka_sessions``); False if there is no usable index (read it all instead)."""
        reader = self._reader
        assert reader is not None, "call start() first"
        p = part.partition
        tp = TopicPartition(self.topics.events, p)
        async with self._reader_lock:
            try:
                async with asyncio.timeout(OPERATION_TIMEOUT_S):
                    index_tp = TopicPartition(self.topics.sessions, p)
                    index = await read_index(reader, index_tp, OPERATION_TIMEOUT_S)
                    end = (await reader.end_offsets([tp]))[tp]
                    if index.watermark is None or index.watermark > end:
                        log.info("kafka.session_index_unused", partition=p, watermark=index.watermark)
                        return False
                    part.unloaded = dict(index.entries)
                    part.next_offset = part.base = index.watermark
                    live = {sid: e for sid, e in index.entries.items() if e.live}
                    await self._load_locked(reader, part, live)
                    if tp in reader.assignment():
                        reader.pause(tp)
            except (KafkaError, TimeoutError, LogError) as exc:
                log.warning("kafka.session_index_failed", partition=p, error=repr(exc), then="full read")
                part.reset()
                return False
        log.info(
            "kafka.session_index_read",
            partition=p,
            watermark=index.watermark,
            sessions=len(index.entries),
            live=len(live),
        )
        return True

    async def _load(self, part: PartitionIndex, session_ids: Iterable[str]) -> None:
        """Fold the sessions the session index names that this process has not read yet."""
        wanted = {sid for sid in session_ids if sid in part.unloaded}
        if not wanted:
            return
        reader = self._reader
        assert reader is not None, "call start() first"
        tp = TopicPartition(self.topics.events, part.partition)
        async with self._reader_lock:
            entries = {sid: part.unloaded[sid] for sid in wanted if sid in part.unloaded}
            if not entries:
                return
            try:
                async with asyncio.timeout(OPERATION_TIMEOUT_S):
                    await self._load_locked(reader, part, entries)
            except (KafkaError, TimeoutError) as exc:
                raise LogUnavailableError(
                    f"reading sessions of partition {part.partition} failed: {exc!r}"
                ) from exc
            finally:
                if tp in reader.assignment():
                    reader.pause(tp)

    async def _load_locked(
        self, reader: AIOKafkaConsumer, part: PartitionIndex, entries: dict[str, SessionEntry]
    ) -> None:
        """Read and fold ``entries``' sessions (the caller holds the reader)."""
        if not entries:
            return
        tp = TopicPartition(self.topics.events, part.partition)
        for sid, msgs in (await read_runs(reader, tp, entries)).items():
            decoded = (decode_record(part.partition, m) for m in msgs)
            part.load(sid, [r for r in decoded if isinstance(r, LogRecord)])

    async def _release(self, part: PartitionIndex) -> None:
        self._inbox_queues[part.partition].clear()  # fetched while ours: the next owner reads them
        async with part.acquiring, part.lock:
            producer, part.producer, part.owned = part.producer, None, False
            part.pending_commits.clear()
        if producer is not None:
            with contextlib.suppress(Exception):
                await producer.stop()
            log.info("kafka.partition_released", partition=part.partition)

    def _lost(self, part: PartitionIndex, reason: str) -> PartitionNotOwnedError:
        """The partition's producer was fenced: drop it (a newer owner writes now)."""
        producer, part.producer, part.owned = part.producer, None, False
        part.lost = reason
        if producer is not None:
            self._spawn(_quiet_stop(producer))
        log.warning("kafka.partition_fenced", partition=part.partition, reason=reason)
        # fenced while the group still assigns it to us: our view or the fencer's is stale; if the
        # assignment stands after the group settles, this process is the owner and takes it back
        self._spawn(self._reacquire(part, delay=REACQUIRE_DELAY_S))
        return PartitionNotOwnedError(part.partition, reason)

    # -- appends --------------------------------------------------------------------------------

    async def append(
        self, events: Sequence[Event], *, expected_version: int, redoable: bool = False
    ) -> list[LogRecord]:
        """Queue the batch for the partition's next transaction (group commit, kafka_appends):
        appends of many sessions made while one transaction is in flight share the next.
        ``redoable`` changes nothing here: every append waits for its transaction."""
        session_id = check_batch(events, expected_version)
        part = self._parts[self.partition_of(session_id)]
        if not part.owned:
            raise PartitionNotOwnedError(part.partition, part.lost)
        append = PendingAppend(session_id, list(events), expected_version)
        part.appends.append(append)
        if part.committer is None:
            part.committer = asyncio.get_running_loop().create_task(
                self._commit_appends(part), name=f"turnlog-commit-{part.partition}"
            )
        records = await append.done
        self._notify()
        return records

    async def _commit_appends(self, part: PartitionIndex) -> None:
        """Commit the partition's queued appends, a group per transaction, until none wait."""
        try:
            while part.appends:
                async with part.lock:
                    if not part.owned:
                        fail_group(part.appends, PartitionNotOwnedError(part.partition, part.lost))
                        part.appends = []
                        break
                    try:  # every session in the group read (kafka_sessions) before it is checked
                        while todo := [a.session_id for a in part.appends if a.session_id in part.unloaded]:
                            await self._load(part, todo)
                    except LogError as exc:
                        fail_group(part.appends, exc)
                        part.appends = []
                        continue
                    group = take_group(part)
                    if not group:
                        continue
                    try:
                        records = await self._transaction(part, [e for a in group for e in a.events])
                    except LogError as exc:
                        fail_group(group, exc)
                        continue
                    except BaseException as exc:  # cancelled (closing), or a bug: no caller hangs
                        fail_group(group, LogUnavailableError(f"the append did not complete: {exc!r}"))
                        raise
                    settle_group(part, group, records)
        finally:
            part.committer = None
            if part.appends:  # queued after the loop's last look, or left by a cancellation
                fail_group(part.appends, LogUnavailableError("the log is closing; retry"))
                part.appends = []

    async def _transaction(
        self,
        part: PartitionIndex,
        events: list[Event],
        *,
        inbox_offset: int | None = None,
        dead: Sequence[Poison] = (),
        force_index: bool = False,
    ) -> list[LogRecord]:
        """One Kafka transaction: events, dead letters, the inbox offset, pending group offsets
        and the session index when due, all or nothing. Called with ``part.lock`` held by the
        partition's owner."""
        indexing, entries = self._take_index(part, force_index)
        try:
            return await self._transact(part, events, inbox_offset, dead, entries)
        except BaseException:
            part.dirty |= indexing  # written with the next transaction
            raise

    def _index_due(self, part: PartitionIndex, force: bool = False) -> bool:
        if not (self.session_index and part.dirty) or part.unsettled_poison():
            return False
        return force or asyncio.get_running_loop().time() - part.indexed_at >= self.index_every_s

    def _take_index(self, part: PartitionIndex, force: bool) -> tuple[set[str], list[tuple[bytes, bytes]]]:
        """The session index records of the sessions changed since it was last written, and the
        watermark (``kafka_sessions``), if due; the sessions are no longer dirty."""
        if not self._index_due(part, force):
            return set(), []
        sessions, part.dirty = part.dirty, set()
        part.indexed_at = asyncio.get_running_loop().time()
        entries = [(sid.encode(), encode_entry(part.entry(sid))) for sid in sorted(sessions)]
        return sessions, [*entries, (WATERMARK, encode_watermark(part.next_offset))]

    async def _transact(
        self,
        part: PartitionIndex,
        events: list[Event],
        inbox_offset: int | None,
        dead: Sequence[Poison],
        entries: list[tuple[bytes, bytes]],
    ) -> list[LogRecord]:
        producer = part.producer
        assert producer is not None
        p = part.partition
        try:
            async with asyncio.timeout(OPERATION_TIMEOUT_S), producer.transaction():
                futures = [
                    await producer.send(
                        self.topics.events,
                        codec.encode(e),
                        key=e.session_id.encode(),
                        partition=p,
                        headers=_headers(e),
                    )
                    for e in events
                ]
                for poison in dead:
                    await producer.send(
                        self.topics.dead_letter,
                        poison.value,
                        key=poison.key,
                        partition=p,
                        headers=poison.headers(),
                    )
                for key, value in entries:
                    await producer.send(self.topics.sessions, value, key=key, partition=p)
                # aiokafka commits one consumer group's offsets per transaction (a second group
                # fails the transaction): the inbox offset if any, else one pending group's
                group = None if inbox_offset is not None else next(iter(part.pending_commits), None)
                if inbox_offset is not None:
                    await producer.send_offsets_to_transaction(
                        {TopicPartition(self.topics.inbox, p): inbox_offset}, self.topics.owners_group
                    )
                elif group is not None:
                    committing = part.pending_commits[group]
                    await producer.send_offsets_to_transaction(
                        {TopicPartition(self.topics.events, p): committing}, group
                    )
            metas = [await f for f in futures]
        except ProducerFenced as exc:
            raise self._lost(part, "fenced by a newer owner") from exc
        except (KafkaError, TimeoutError) as exc:
            # the outcome is unknown: re-acquire (aborting it if still open) and re-read the partition
            raise await self._reset(part, exc) from exc
        if group is not None and part.pending_commits.get(group) == committing:
            del part.pending_commits[group]  # unless a newer offset came in meanwhile
        part.dead_sources.update(poison.source for poison in dead)
        records = [LogRecord(p, m.offset, e) for m, e in zip(metas, events, strict=True)]
        if records and not part.continues_at(records):
            try:  # someone else wrote to the partition: index it in order first
                await self._catch_up(part)
            except LogError as exc:  # committed but not indexed: re-acquire and re-read
                raise await self._reset(part, exc) from exc
        for record, reason in part.add(records):  # a bug: our writer folded it; readers skip it too
            log.error("kafka.own_record_rejected", partition=p, offset=record.offset, reason=reason)
            part.add_poison(own_poison(self.topics.events, record, reason), record.offset)
        part.own_marker = bool(records) or part.own_marker
        return records

    async def _reset(self, part: PartitionIndex, exc: Exception) -> LogError:
        producer, part.producer, part.owned = part.producer, None, False
        if producer is not None:
            await _quiet_stop(producer)
        log.warning("kafka.transaction_failed", partition=part.partition, error=repr(exc))
        self._spawn(self._reacquire(part))
        return LogUnavailableError(
            f"partition {part.partition}: a Kafka transaction failed ({exc!r}); the owner re-reads "
            "the partition before appending again, retry the operation"
        )

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``work`` in the background, holding a reference until it ends."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _reacquire(self, part: PartitionIndex, delay: float = 0.0) -> None:
        await asyncio.sleep(delay)
        inbox = self._inbox
        while inbox is not None and TopicPartition(self.topics.inbox, part.partition) in inbox.assignment():
            if part.owned:
                return
            try:
                await self._acquire(part)
                return
            except (KafkaError, LogError) as exc:  # a catch-up read fails with LogUnavailableError
                log.warning("kafka.reacquire_failed", partition=part.partition, error=repr(exc))
                await asyncio.sleep(1.0)

    async def submit(self, event: Event) -> Event:
        if not isinstance(event, SUBMITTABLE):
            raise LogError(f"only {', '.join(c.type for c in SUBMITTABLE)} are submitted, not {event.type}")
        assert self._producer is not None, "call start() first"
        part = self._parts[self.partition_of(event.session_id)]
        if part.owned:
            await self._load(part, [event.session_id])
        if part.owned and (held := part.held_submission(event)) is not None:
            return await self._held_submission(DuplicateSubmissionError(event.session_id, *held))
        waiter: asyncio.Future[Event] | None = None
        if part.owned:  # we sequence it ourselves: return it as appended (read your writes)
            waiter = self._submitted[event.event_id] = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(OPERATION_TIMEOUT_S):
                await self._producer.send_and_wait(
                    self.topics.inbox,
                    codec.encode(event),
                    key=event.session_id.encode(),
                    partition=part.partition,
                    headers=_headers(event),
                )
        except (KafkaError, TimeoutError) as exc:
            self._submitted.pop(event.event_id, None)
            raise LogUnavailableError(f"the inbox did not take the event: {exc!r}; retry") from exc
        if waiter is None:
            return dataclasses.replace(event, version=0)
        try:
            async with asyncio.timeout(SUBMIT_WAIT_S):
                return await waiter
        except TimeoutError:  # durable in the inbox; the partition's next owner sequences it
            return dataclasses.replace(event, version=0)
        finally:
            self._submitted.pop(event.event_id, None)

    # -- the owner's sequencer ------------------------------------------------------------------

    async def _sequence_loop(self) -> None:
        """Fetch inbox records and hand each partition's batches to a task of its own that
        sequences them in order (``InboxQueue``), so one partition's transaction (or its wait
        for the lock an append group holds) never delays another's records, and the fetch goes
        on meanwhile (a paused partition would wait for the next fetch request)."""
        inbox = self._inbox
        assert inbox is not None
        loop = asyncio.get_running_loop()
        tailed = loop.time()
        housekeeping: asyncio.Task[None] | None = None
        while True:
            try:
                batches = await inbox.getmany(timeout_ms=100, max_records=500)
                for tp, messages in batches.items():
                    self._queue_inbox(tp, messages)
                tail = loop.time() - tailed >= TAIL_EVERY_S
                if (tail or not batches) and (housekeeping is None or housekeeping.done()):
                    housekeeping = self._spawn(self._housekeeping(tail))
                    if tail:
                        tailed = loop.time()
            except (KafkaError, LogError) as exc:  # the broker is away: nothing was sequenced, retry
                log.warning("kafka.sequencer_retry", error=repr(exc))
                await asyncio.sleep(1.0)

    def _queue_inbox(self, tp: TopicPartition, messages: list[Any]) -> None:
        queue = self._inbox_queues[tp.partition]
        queue.batches.append(messages)
        if queue.task is None:
            queue.task = self._spawn(self._sequence_queued(tp, queue))

    async def _sequence_queued(self, tp: TopicPartition, queue: InboxQueue) -> None:
        try:
            while (messages := queue.next()) is not None:
                await self._sequence(self._parts[tp.partition], tp, messages)
        finally:
            queue.task = None

    async def _housekeeping(self, tail: bool) -> None:
        """When the inbox is quiet, commit pending group offsets; every ``TAIL_EVERY_S``, index
        what others wrote to our partitions."""
        try:
            await self._flush_commits()
            if tail:
                await self._tail_owned()
        except (KafkaError, LogError) as exc:
            log.warning("kafka.housekeeping_retry", error=repr(exc))

    async def _sequence(self, part: PartitionIndex, tp: TopicPartition, messages: list[Any]) -> None:
        """Sequence inbox records fetched for ``tp``; whatever stops that reads them again (the
        consumer's position already moved past them), so no record is ever skipped."""
        try:
            waiting: int | None = None
            async with part.lock:
                if part.owned:
                    waiting = await self._sequence_owned(part, tp, messages)
                    if waiting is None:
                        return
                elif self._inbox is None or tp not in self._inbox.assignment():
                    return  # revoked: the next owner reads these from the committed offset
            if waiting is not None:  # a record waits for an admission policy: read it again once given
                self._rewind(tp, [m for m in messages if m.offset >= waiting])
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._admission_ready.wait(), WAIT_FOR_POLICY_S)
                return
            self._rewind(tp, messages)  # still assigned, being re-acquired: read them again
            await asyncio.sleep(0.2)
        except (KafkaError, LogError) as exc:  # the broker is away: nothing was sequenced, retry
            self._rewind(tp, messages)
            log.warning("kafka.sequencer_retry", partition=tp.partition, error=repr(exc))
            await asyncio.sleep(1.0)
        except Exception:  # a bug: say so loudly, lose nothing, and keep the other partitions moving
            self._rewind(tp, messages)
            log.exception("kafka.sequencer_failed", partition=tp.partition, offset=messages[0].offset)
            await asyncio.sleep(1.0)

    def _rewind(self, tp: TopicPartition, messages: list[Any]) -> None:
        if self._inbox is not None and tp in self._inbox.assignment():
            self._inbox.seek(tp, messages[0].offset)
            self._inbox_queues[tp.partition].rewound(messages[0].offset)

    async def _sequence_owned(
        self, part: PartitionIndex, tp: TopicPartition, messages: list[Any]
    ) -> int | None:
        """Sequence a batch of inbox records; called with ``part.lock`` held by the owner.
        Returns the offset of a record that waits for an admission policy (kafka_inbox), up to
        which the batch was sequenced, or None."""
        await self._load(part, _inbox_sessions(messages))
        batch = InboxBatch(part, self.admission)
        dead: list[Poison] = []
        refused: dict[str, Exception] = {}
        repeats: dict[str, Event] = {}
        waiting: int | None = None
        for msg in messages:
            admission = batch.admit(msg)
            if admission.waits:
                waiting = msg.offset
                self._wait_for_policy(part.partition, msg.offset, admission.waits)
                break
            if admission.repeat is not None and admission.event_id is not None:
                repeats[admission.event_id] = admission.repeat
            if admission.refused is None:
                continue
            poison = poison_of(msg, str(admission.refused))
            dead.append(poison)
            if admission.event_id is not None:
                refused[admission.event_id] = admission.refused
            elif (marked := poisoned(part, poison, batch.versions, self._owner_name)) is not None:
                batch.add([marked])
        if waiting is None:
            self._waiting.pop(part.partition, None)
        elif waiting == messages[0].offset:
            return waiting
        inbox_offset = messages[-1].offset + 1 if waiting is None else waiting
        records = await self._transaction(part, batch.accepted, inbox_offset=inbox_offset, dead=dead)
        for record in records:
            self._resolve(record.event.event_id, record.event, None)
        for eid, held in repeats.items():
            self._resolve(eid, held, None)
        for eid, error in refused.items():
            self._resolve(eid, None, error)
        if dead:
            log.warning(
                "kafka.dead_letters", partition=part.partition, count=len(dead), reason=dead[0].reason
            )
        self._notify()
        return waiting

    def _wait_for_policy(self, partition: int, offset: int, why: str) -> None:
        """Note (and log, once) that the partition's inbox waits at ``offset`` for a policy."""
        reason = f"{why} (inbox offset {offset})"
        if self._waiting.get(partition) != reason:
            log.warning("kafka.inbox_waits_for_admission", partition=partition, offset=offset, why=why)
        self._waiting[partition] = reason

    def _resolve(self, event_id: str, event: Event | None, error: Exception | None) -> None:
        fut = self._submitted.get(event_id)
        if fut is None or fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            assert event is not None
            fut.set_result(event)

    async def _flush_commits(self, force_index: bool = False) -> None:
        """Commit pending group offsets, and the session index when due (``force_index``: now),
        every owned partition in its own transaction, all at once."""
        await asyncio.gather(*(self._flush_partition(part, force_index) for part in self._parts))

    async def _flush_partition(self, part: PartitionIndex, force_index: bool) -> None:
        if self._flush_due(part, force_index):
            async with part.lock:
                if self._flush_due(part, force_index):  # again: an append may have carried it
                    with contextlib.suppress(LogError):
                        await self._transaction(part, [], force_index=force_index)

    def _flush_due(self, part: PartitionIndex, force_index: bool) -> bool:
        return part.owned and bool(part.pending_commits or self._index_due(part, force_index))

    async def _tail_owned(self) -> None:
        """Index what others wrote to our partitions since we read them, and settle poison."""
        for part in self._parts:
            if not part.owned:
                continue
            async with part.lock:
                if part.owned:
                    with contextlib.suppress(LogError):
                        await self._catch_up(part)
                        await self._settle_poison(part)

    async def _settle_poison(self, part: PartitionIndex) -> None:
        """Dead-letter the partition's poison and move its sessions to ERROR (kafka_poison);
        called with ``part.lock`` held by the owner."""
        await self._load(part, [p.session_id for p in part.poison if p.source not in part.dead_sources])
        markers, dead = settle(part, self._owner_name)
        if dead:
            await self._transaction(part, markers, dead=dead)
            log.warning(
                "kafka.poison_dead_lettered", partition=part.partition, count=len(dead), reason=dead[0].reason
            )
            self._notify()

    async def _dead_sources(self, partition: int) -> set[str]:
        reader = self._reader
        assert reader is not None, "call start() first"
        async with self._reader_lock:
            try:
                return await dead_letter_sources(
                    reader, TopicPartition(self.topics.dead_letter, partition), OPERATION_TIMEOUT_S
                )
            except (KafkaError, TimeoutError) as exc:
                raise LogUnavailableError(
                    f"reading dead letters of partition {partition} failed: {exc!r}"
                ) from exc

    @property
    def _owner_name(self) -> str:
        return f"{self.client_id}:owner"

    # -- reads ----------------------------------------------------------------------------------

    async def _catch_up(self, part: PartitionIndex, until: int | None = None) -> None:
        """Read the partition from where the index stopped to its last committed record (or
        nothing, if the index reached ``until`` while this waited for the reader)."""
        reader = self._reader
        assert reader is not None, "call start() first"
        tp = TopicPartition(self.topics.events, part.partition)
        async with self._reader_lock:
            if until is not None and part.next_offset >= until:
                return
            try:
                async with asyncio.timeout(OPERATION_TIMEOUT_S):
                    await self._read_to_end(reader, part, tp)
            except (KafkaError, TimeoutError) as exc:
                raise LogUnavailableError(f"reading partition {part.partition} failed: {exc!r}") from exc

    async def _read_to_end(self, reader: AIOKafkaConsumer, part: PartitionIndex, tp: TopicPartition) -> None:
        end = (await reader.end_offsets([tp]))[tp]
        if part.own_marker and end == part.next_offset + 1:
            part.add([], end)  # nothing after our own last transaction but its commit marker
            part.own_marker = False
            return
        await self._read_until(reader, part, tp, end)
        part.own_marker = False

    async def _read_until(
        self, reader: AIOKafkaConsumer, part: PartitionIndex, tp: TopicPartition, end: int
    ) -> None:
        """Index the partition from ``part.next_offset`` to ``end`` (the caller holds the reader);
        a session the session index names is read first (``_load_locked``)."""
        if part.next_offset >= end:
            return
        if reader.assignment() != {tp}:
            reader.assign([tp])  # one partition at a time: no prefetching of the others
        reader.resume(tp)
        reader.seek(tp, part.next_offset)
        while part.next_offset < end:
            # short polls: a stretch of commit or abort markers returns no records, and the
            # position moves past it with the fetch, not with the poll's timeout
            batch = (await reader.getmany(tp, timeout_ms=50, max_records=1000)).get(tp, [])
            position = await reader.position(tp)
            decoded = [decode_record(part.partition, msg) for msg in batch]
            if part.unloaded:
                sids = {r.event.session_id for r in decoded if isinstance(r, LogRecord)}
                if entries := {sid: part.unloaded[sid] for sid in sids if sid in part.unloaded}:
                    await self._load_locked(reader, part, entries)
                    reader.seek(tp, position)
            for msg, entry in zip(batch, decoded, strict=True):
                index_consumed(part, msg, entry)
            part.add([], position)
        reader.pause(tp)  # no background long polls between catch-ups

    async def _fresh(self, partition: int) -> PartitionIndex:
        """The partition's index, caught up with everything committed before this call.

        Concurrent readers of one partition share the catch-up: each asks the broker for the
        partition's end (outside the reader's lock), and only one that finds the index short
        of it reads; the ones queued behind it find the index already there."""
        part = self._parts[partition]
        if part.owned:
            return part
        reader = self._reader
        assert reader is not None, "call start() first"
        tp = TopicPartition(self.topics.events, partition)
        try:
            async with asyncio.timeout(OPERATION_TIMEOUT_S):
                end = (await reader.end_offsets([tp]))[tp]
        except (KafkaError, TimeoutError) as exc:
            raise LogUnavailableError(f"reading partition {partition} failed: {exc!r}") from exc
        if part.next_offset < end:
            await self._catch_up(part, until=end)
        return part

    async def _before_base(self, part: PartitionIndex, offset: int, limit: int) -> list[LogRecord]:
        """Up to ``limit`` records from ``offset`` below ``part.base`` (a takeover from the session
        index skipped them): read from Kafka, each kept if its session's fold took it (the
        sessions they belong to are loaded first), so a consumer behind the watermark reads what
        a full read would give it, at the cost of its range and of the sessions in it."""
        reader = self._reader
        assert reader is not None, "call start() first"
        tp = TopicPartition(self.topics.events, part.partition)
        found: list[LogRecord] = []
        async with self._reader_lock:
            try:
                async with asyncio.timeout(OPERATION_TIMEOUT_S):
                    if reader.assignment() != {tp}:
                        reader.assign([tp])
                    reader.resume(tp)
                    reader.seek(tp, offset)
                    position = offset
                    while position < part.base and len(found) < limit:
                        batch = (await reader.getmany(tp, timeout_ms=50, max_records=limit)).get(tp, [])
                        position = await reader.position(tp)
                        decoded = [decode_record(part.partition, m) for m in batch if m.offset < part.base]
                        records = [r for r in decoded if isinstance(r, LogRecord)]
                        sids = {r.event.session_id for r in records}
                        if entries := {sid: part.unloaded[sid] for sid in sids if sid in part.unloaded}:
                            await self._load_locked(reader, part, entries)
                            reader.seek(tp, position)
                        found += [taken for r in records if (taken := part.taken(r)) is not None]
                    reader.pause(tp)
            except (KafkaError, TimeoutError) as exc:
                raise LogUnavailableError(f"reading partition {part.partition} failed: {exc!r}") from exc
        return found[:limit]

    async def read_session(self, session_id: str, after_version: int = 0) -> list[Event]:
        part = await self._fresh(self.partition_of(session_id))
        await self._load(part, [session_id])
        return part.session_after(session_id, after_version)

    async def read_session_records(self, session_id: str, after_version: int = 0) -> list[LogRecord]:
        part = await self._fresh(self.partition_of(session_id))
        await self._load(part, [session_id])
        return part.session_records_after(session_id, after_version)

    async def session_version(self, session_id: str) -> int:
        part = await self._fresh(self.partition_of(session_id))
        return part.version(session_id)

    async def list_sessions(
        self, partition: int, *, after: str = "", limit: int = SESSIONS_PAGE
    ) -> list[SessionSummary]:
        """From the partition's index if this process owns it, else from the session index and
        the events after its watermark (``kafka_listing``): no session is folded."""
        self._check_partition(partition)
        return page_of(partition, await session_versions(self, partition, OPERATION_TIMEOUT_S), after, limit)

    async def sessions(
        self, *, partitions: Iterable[int] | None = None, page: int = SESSIONS_PAGE
    ) -> AsyncGenerator[SessionSummary, None]:
        """As ``EventLog.sessions``, reading each partition's listing once (one partition's ids
        and versions in memory at a time; ``page`` is not needed)."""
        for partition in range(self.partitions) if partitions is None else partitions:
            self._check_partition(partition)
            versions = await session_versions(self, partition, OPERATION_TIMEOUT_S)
            for summary in page_of(partition, versions, "", len(versions)):
                yield summary

    async def read_partition(self, partition: int, offset: int, limit: int = 500) -> list[LogRecord]:
        self._check_partition(partition)
        part = await self._fresh(partition)
        if offset >= part.base:
            return part.read(offset, limit)
        older = await self._before_base(part, offset, limit)
        return older + part.read(part.base, limit - len(older))

    async def end_offset(self, partition: int) -> int:
        self._check_partition(partition)
        return (await self._fresh(partition)).next_offset

    async def committed(self, group: str, partition: int) -> int:
        key = (group, partition)
        if key not in self._committed:
            self._committed[key] = await committed_offset(
                self.bootstrap, group, TopicPartition(self.topics.events, partition)
            )
        return self._committed[key]

    async def commit(self, group: str, partition: int, offset: int) -> None:
        """Recorded at once for this process; on Kafka with the partition's next transaction
        (or when the owner is idle), so a fenced zombie cannot move a group's offsets; for a
        partition this process does not own, only if ``persist_offsets`` named the group."""
        self._check_partition(partition)
        self._committed[(group, partition)] = offset
        part = self._parts[partition]
        if part.owned:
            part.pending_commits[group] = offset
        elif group in self._direct.groups:
            self._direct.note(group, partition, offset)

    async def wait_for_append(self, timeout: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        # appends by other processes are not announced: poll at least every 200 ms
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(fut, min(timeout, 0.2))

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _check_partition(self, partition: int) -> None:
        if not 0 <= partition < self.partitions:
            raise LogError(f"partition {partition} out of range 0..{self.partitions - 1}")


def _inbox_sessions(messages: list[Any]) -> set[str]:
    """The sessions inbox records name (by key, and by event where it decodes)."""
    found = {msg.key.decode("utf-8", "replace") for msg in messages if msg.key}
    for msg in messages:
        with contextlib.suppress(EventError):
            found.add(codec.decode(msg.value or b"").session_id)
    return found


class _Owners(ConsumerRebalanceListener):
    """The owners' group hands partitions to this process and takes them away."""

    def __init__(self, log: KafkaEventLog) -> None:
        self.log = log

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        for tp in revoked:
            await self.log._release(self.log._parts[tp.partition])

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.log._group_joined = True
        await asyncio.gather(*(self._acquire(tp.partition) for tp in assigned))

    async def _acquire(self, partition: int) -> None:
        for attempt in range(1, 31):
            try:
                await self.log._acquire(self.log._parts[partition])
                return
            except (KafkaError, LogError) as exc:
                log.warning("kafka.acquire_retry", partition=partition, attempt=attempt, error=repr(exc))
                await asyncio.sleep(1.0)
        log.error("kafka.acquire_failed", partition=partition, then="retrying while assigned")
        self.log._spawn(self.log._reacquire(self.log._parts[partition], delay=1.0))


async def _quiet_stop(producer: AIOKafkaProducer) -> None:
    with contextlib.suppress(Exception):
        await producer.stop()
