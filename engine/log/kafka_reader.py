"""Reading a Kafka log's partitions into this process's indexes (``kafka_index``).

One read_committed consumer per process serves every read, one partition at a time under its
lock (``PartitionReader``): catching an index up to the partition's end, folding the sessions a
takeover from the session index left unloaded (``kafka_sessions``), reading records from before
an index's base, the dead-letter ledger and a partition's listing. Every read is bounded
(``OPERATION_TIMEOUT_S``); a broker that does not answer becomes ``LogUnavailableError``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Callable, Iterable

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from ..errors import LogError, LogUnavailableError
from .base import LogRecord
from .kafka_ends import SharedEnds
from .kafka_index import PartitionIndex
from .kafka_listing import read_versions
from .kafka_poison import dead_letter_sources
from .kafka_records import Poison, decode_record
from .kafka_sessions import SessionEntry, read_index, read_runs
from .kafka_topics import TopicNames
from .sealing import PLAIN, RecordCodec

log = structlog.get_logger("turnlog.kafka")
OPERATION_TIMEOUT_S = 30.0
"""A bound on one transaction or one catch-up read: past it the outcome counts as unknown."""
NOTICE_WAIT_S = 0.5
"""How long a read for a version a live notice announced reads on for it: the notice may come
before the commit's markers make it visible to a read_committed reader (a few ms)."""
SETTLE_POLL_S = 0.002
"""How often ``PartitionReader.settled`` asks again whether the transactions it waits for are
resolved (their markers take a few ms)."""


def read_consumer(bootstrap: str, client_id: str) -> AIOKafkaConsumer:
    """The process's reader: read_committed, assigned one partition at a time, never committing."""
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        isolation_level="read_committed",
        fetch_max_wait_ms=20,  # a catch-up waits for an in-flight fetch: keep it short
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )


def high_water_consumer(bootstrap: str, client_id: str) -> AIOKafkaConsumer:
    """Asks only for partitions' high waters: read_uncommitted, so an end is what was written,
    in a transaction resolved or not (``PartitionReader.settled``)."""
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id=f"{client_id}-high-water",
        isolation_level="read_uncommitted",
        enable_auto_commit=False,
    )


async def _started_consumer(consumer: AIOKafkaConsumer) -> AIOKafkaConsumer:
    """``consumer``, started within ``OPERATION_TIMEOUT_S``; else stopped, and the error raised."""
    try:
        async with asyncio.timeout(OPERATION_TIMEOUT_S):
            await consumer.start()
    except BaseException as exc:
        with contextlib.suppress(Exception):
            await consumer.stop()
        if isinstance(exc, (KafkaError, TimeoutError)):
            raise LogUnavailableError(f"starting a consumer of the log failed: {exc!r}") from exc
        raise
    return consumer


class PartitionReader:
    """The process's one consumer of the log's topics, shared by every read under its lock."""

    def __init__(
        self,
        topics: TopicNames,
        codec: RecordCodec = PLAIN,
        known: Callable[[int, int, bytes], LogRecord | None] = lambda partition, offset, value: None,
    ) -> None:
        self.topics = topics
        self.codec = codec
        """How the events topic's records decode (the log's sealer)."""
        self.known = known
        """A record already decoded, by partition, offset and value (``HeardRecords.known``)."""
        self.consumer: AIOKafkaConsumer | None = None
        """Set by ``start``; None before and after ``close``."""
        self.high_waters: AIOKafkaConsumer | None = None
        """Made and started on its first use (``settled``: few processes need it)."""
        self._client = ("", "")
        """The bootstrap servers and client id ``start`` was given."""
        self.lock = asyncio.Lock()
        self._ends = SharedEnds(self._ask_ends)
        self._highs = SharedEnds(self._ask_high_waters)

    async def start(self, bootstrap: str, client_id: str) -> None:
        self.consumer = read_consumer(bootstrap, client_id)
        self._client = (bootstrap, client_id)
        await self.consumer.start()

    async def close(self) -> None:
        for consumer in (self.consumer, self.high_waters):
            if consumer is not None:
                with contextlib.suppress(Exception):
                    await consumer.stop()
        self.consumer = self.high_waters = None

    def _started(self) -> AIOKafkaConsumer:
        assert self.consumer is not None, "call start() first"
        return self.consumer

    def _tp(self, partition: int) -> TopicPartition:
        return TopicPartition(self.topics.events, partition)

    async def end(self, partition: int) -> int:
        """The events partition's end (its last committed record + 1, or past a marker), from
        a request sent after this call began, shared with the callers meanwhile (``kafka_ends``)."""
        return await self._ends.end(partition)

    async def _ask_ends(self, partitions: frozenset[int]) -> dict[int, int]:
        return await self._ask(self._started(), partitions, "end")

    async def _ask_high_waters(self, partitions: frozenset[int]) -> dict[int, int]:
        self._started()
        if self.high_waters is None:  # SharedEnds asks one request at a time: made once
            self.high_waters = await _started_consumer(high_water_consumer(*self._client))
        return await self._ask(self.high_waters, partitions, "high water")

    async def _ask(self, consumer: AIOKafkaConsumer, partitions: frozenset[int], what: str) -> dict[int, int]:
        tps = [self._tp(p) for p in sorted(partitions)]
        try:
            async with asyncio.timeout(OPERATION_TIMEOUT_S):
                ends = await consumer.end_offsets(tps)
        except (KafkaError, TimeoutError) as exc:
            named = ", ".join(str(p) for p in sorted(partitions))
            raise LogUnavailableError(f"reading the {what} of partitions {named} failed: {exc!r}") from exc
        return {tp.partition: int(end) for tp, end in ends.items()}

    async def settled(self, part: PartitionIndex) -> PartitionIndex:
        """``part`` caught up with every transaction that had records in the partition when this
        began, once it is resolved. The end a read_committed reader is given stops at the first
        transaction whose commit markers are not written yet, and the broker writes them after
        it has told the owner its commit succeeded: for a few ms, what another process was told
        is committed (a session just created through another gateway) is past that end. Waits
        at most ``NOTICE_WAIT_S``, polling the end without holding the reader's lock."""
        written = await self._highs.end(part.partition)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + NOTICE_WAIT_S
        end = await self.end(part.partition)
        while end < written and loop.time() < deadline:
            await asyncio.sleep(SETTLE_POLL_S)
            end = await self.end(part.partition)
        if part.next_offset < end:
            await self.catch_up(part, until=end)
        return part

    async def catch_up(self, part: PartitionIndex, until: int | None = None) -> None:
        """Read the partition from where the index stopped to its last committed record (or
        nothing, if the index reached ``until`` while this waited for the reader)."""
        consumer = self._started()
        async with self.lock:
            if until is not None and part.next_offset >= until:
                return
            try:
                async with asyncio.timeout(OPERATION_TIMEOUT_S):
                    await self._read_to_end(consumer, part, until)
            except (KafkaError, TimeoutError) as exc:
                raise LogUnavailableError(f"reading partition {part.partition} failed: {exc!r}") from exc

    async def read_through(self, part: PartitionIndex, session_id: str, version: int) -> None:
        """Read the partition on until the index holds ``version`` of the session (a live notice
        said it is committed), at most ``NOTICE_WAIT_S``: no round trip for the partition's end,
        and a notice that came before the commit's markers is still met."""
        consumer = self._started()
        async with self.lock:
            if part.version(session_id) >= version:
                return
            tp = self._tp(part.partition)
            deadline = asyncio.get_running_loop().time() + NOTICE_WAIT_S
            try:
                _assign(consumer, tp, part.next_offset)
                while part.version(session_id) < version and asyncio.get_running_loop().time() < deadline:
                    await self._read_batch(consumer, part, tp)
            except KafkaError as exc:
                raise LogUnavailableError(f"reading partition {part.partition} failed: {exc!r}") from exc
            finally:
                consumer.pause(tp)

    async def caught_up(self, part: PartitionIndex) -> PartitionIndex:
        """``part`` (a partition this process does not own), caught up with everything committed
        before this call. Concurrent readers share the catch-up: each asks the broker for the
        partition's end outside the lock, and only one that finds the index short of it reads."""
        end = await self.end(part.partition)
        if part.next_offset < end:
            await self.catch_up(part, until=end)
        return part

    async def _read_to_end(self, consumer: AIOKafkaConsumer, part: PartitionIndex, end: int | None) -> None:
        """Read to ``end`` (the caller asked the broker for it just before: its records are
        what this read must have), or to the end the broker gives now."""
        tp = self._tp(part.partition)
        if end is None:
            end = (await consumer.end_offsets([tp]))[tp]
        if part.own_marker and end == part.next_offset + 1:
            part.add([], end)  # nothing after our own last transaction but its commit marker
            part.own_marker = False
            return
        await self._read_until(consumer, part, end)
        part.own_marker = False

    async def _read_until(self, consumer: AIOKafkaConsumer, part: PartitionIndex, end: int) -> None:
        """Index the partition from ``part.next_offset`` to ``end`` (the caller holds the lock);
        a session the session index names is read first (``_load_locked``)."""
        if part.next_offset >= end:
            return
        tp = self._tp(part.partition)
        _assign(consumer, tp, part.next_offset)
        while part.next_offset < end:
            await self._read_batch(consumer, part, tp)
        consumer.pause(tp)  # no background long polls between catch-ups

    async def _read_batch(self, consumer: AIOKafkaConsumer, part: PartitionIndex, tp: TopicPartition) -> None:
        """Index the next records of ``tp`` (assigned, at the index's next offset); a session
        the session index names is read first (``_load_locked``). A short poll: a stretch of
        commit or abort markers returns no records, and the position moves past it with the
        fetch, not with the poll's timeout."""
        batch = (await consumer.getmany(tp, timeout_ms=50, max_records=1000)).get(tp, [])
        position = await consumer.position(tp)
        decoded = [self._decoded(part.partition, msg) for msg in batch]
        if part.unloaded:
            sids = {r.event.session_id for r in decoded if isinstance(r, LogRecord)}
            if entries := {sid: part.unloaded[sid] for sid in sids if sid in part.unloaded}:
                await self._load_locked(consumer, part, entries)
                consumer.seek(tp, position)
        for msg, entry in zip(batch, decoded, strict=True):
            part.add_consumed(msg, entry)
        part.add([], position)
        part.trim()

    def _decoded(self, partition: int, msg: Any) -> LogRecord | Poison:
        """A fetched record as the process heard it on the live topic, or decoded."""
        if (record := self.known(partition, msg.offset, msg.value)) is not None:
            return record
        return decode_record(partition, msg, self.codec)

    async def load(self, part: PartitionIndex, session_ids: Iterable[str]) -> None:
        """Fold the sessions the session index names that this process has not read yet."""
        wanted = {sid for sid in session_ids if sid in part.unloaded}
        if not wanted:
            return
        consumer = self._started()
        tp = self._tp(part.partition)
        async with self.lock:
            entries = {sid: part.unloaded[sid] for sid in wanted if sid in part.unloaded}
            if not entries:
                return
            try:
                async with asyncio.timeout(OPERATION_TIMEOUT_S):
                    await self._load_locked(consumer, part, entries)
            except (KafkaError, TimeoutError) as exc:
                raise LogUnavailableError(
                    f"reading sessions of partition {part.partition} failed: {exc!r}"
                ) from exc
            finally:
                if tp in consumer.assignment():
                    consumer.pause(tp)

    async def _load_locked(
        self, consumer: AIOKafkaConsumer, part: PartitionIndex, entries: dict[str, SessionEntry]
    ) -> None:
        """Read and fold ``entries``' sessions (the caller holds the lock)."""
        if not entries:
            return
        for sid, msgs in (await read_runs(consumer, self._tp(part.partition), entries)).items():
            decoded = (decode_record(part.partition, m, self.codec) for m in msgs)
            part.load(sid, [r for r in decoded if isinstance(r, LogRecord)])

    async def from_session_index(self, part: PartitionIndex) -> bool:
        """Start the partition's index at the session index's watermark, with its live sessions
        folded (``kafka_sessions``); False if there is no usable index (read it all instead)."""
        consumer = self._started()
        p = part.partition
        async with self.lock:
            try:
                async with asyncio.timeout(OPERATION_TIMEOUT_S):
                    read = await self._start_from_index(consumer, part)
            except (KafkaError, TimeoutError, LogError) as exc:
                log.warning("kafka.session_index_failed", partition=p, error=repr(exc), then="full read")
                part.reset()
                return False
        if read is None:
            return False
        sessions, live = read
        log.info("kafka.session_index_read", partition=p, watermark=part.base, sessions=sessions, live=live)
        return True

    async def _start_from_index(
        self, consumer: AIOKafkaConsumer, part: PartitionIndex
    ) -> tuple[int, int] | None:
        """``from_session_index``'s reads (the caller holds the lock): the sessions the index
        names and how many were live, or None without a usable index."""
        tp = self._tp(part.partition)
        index = await read_index(
            consumer, TopicPartition(self.topics.sessions, part.partition), OPERATION_TIMEOUT_S
        )
        end = (await consumer.end_offsets([tp]))[tp]
        if index.watermark is None or index.watermark > end:
            log.info("kafka.session_index_unused", partition=part.partition, watermark=index.watermark)
            return None
        part.unloaded = dict(index.entries)
        part.next_offset = part.base = index.watermark
        part.inbox_next = index.inbox_next
        live = {sid: e for sid, e in index.entries.items() if e.live}
        await self._load_locked(consumer, part, live)
        if tp in consumer.assignment():
            consumer.pause(tp)
        return len(index.entries), len(live)

    async def before_base(self, part: PartitionIndex, offset: int, limit: int) -> list[LogRecord]:
        """Up to ``limit`` records from ``offset`` below ``part.base`` (a takeover from the session
        index skipped them): read from Kafka, each kept if its session's fold took it (the
        sessions they belong to are loaded first), so a consumer behind the watermark reads what
        a full read would give it, at the cost of its range and of the sessions in it."""
        consumer = self._started()
        async with self.lock:
            part.trim()  # what earlier reads below the base loaded, when past the budget
            try:
                async with asyncio.timeout(OPERATION_TIMEOUT_S):
                    found = await self._read_before_base(consumer, part, offset, limit)
            except (KafkaError, TimeoutError) as exc:
                raise LogUnavailableError(f"reading partition {part.partition} failed: {exc!r}") from exc
        return found[:limit]

    async def _read_before_base(
        self, consumer: AIOKafkaConsumer, part: PartitionIndex, offset: int, limit: int
    ) -> list[LogRecord]:
        tp = self._tp(part.partition)
        _assign(consumer, tp, offset)
        found: list[LogRecord] = []
        position = offset
        while position < part.base and len(found) < limit:
            batch = (await consumer.getmany(tp, timeout_ms=50, max_records=limit)).get(tp, [])
            position = await consumer.position(tp)
            decoded = [decode_record(part.partition, m, self.codec) for m in batch if m.offset < part.base]
            records = [r for r in decoded if isinstance(r, LogRecord)]
            sids = {r.event.session_id for r in records}
            if entries := {sid: part.unloaded[sid] for sid in sids if sid in part.unloaded}:
                await self._load_locked(consumer, part, entries)
                consumer.seek(tp, position)
            found += [taken for r in records if (taken := part.taken(r)) is not None]
        consumer.pause(tp)
        return found

    async def dead_sources(self, partition: int) -> set[str]:
        """The sources of the partition's dead letters: the poison already handled."""
        consumer = self._started()
        async with self.lock:
            try:
                tp = TopicPartition(self.topics.dead_letter, partition)
                return await dead_letter_sources(consumer, tp, OPERATION_TIMEOUT_S)
            except (KafkaError, TimeoutError) as exc:
                raise LogUnavailableError(
                    f"reading dead letters of partition {partition} failed: {exc!r}"
                ) from exc

    async def listed_versions(self, partition: int) -> dict[str, int]:
        """Each session of a partition this process does not own, with its last version, from
        the session index and the events after its watermark (``kafka_listing``)."""
        consumer = self._started()
        async with self.lock:
            try:
                async with asyncio.timeout(OPERATION_TIMEOUT_S):
                    return await read_versions(consumer, self.topics, partition, OPERATION_TIMEOUT_S)
            except (KafkaError, TimeoutError, LogError) as exc:
                raise LogUnavailableError(
                    f"listing the sessions of partition {partition} failed: {exc!r}"
                ) from exc


def _assign(consumer: AIOKafkaConsumer, tp: TopicPartition, offset: int) -> None:
    """Read ``tp`` alone (no prefetching of other partitions) from ``offset``."""
    if consumer.assignment() != {tp}:
        consumer.assign([tp])
    consumer.resume(tp)
    consumer.seek(tp, offset)
