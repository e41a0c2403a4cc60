"""A Kafka partition owner's transactions, and the group commit that fills them.

Every write of an owner is one Kafka transaction on its partition (``transact``): the events,
dead letters, the inbox offset of the records it sequenced, one consumer group's pending offsets
and the session index entries when due (``kafka_sessions``), all or nothing. The inbox offset
rides the sequenced events, a header of the last (``INBOX_HEADER``), rather than an offset
commit of the owners' group, whose two requests to the coordinators a user's message would
wait for; the group's offset follows now and then (``INBOX_OFFSETS_EVERY_S``), and an owner
skips the inbox records below the offset its partition says (``PartitionIndex.inbox_next``).
A batch that sequenced no event (only refusals and repeats) commits it as the group's offset.

Appends that arrive while a transaction is in flight wait in the partition's queue and go
together into the next (``commit_appends``; each still checked on its own: ``kafka_appends``).
A producer the broker fenced drops the partition (``PartitionOwner.fenced``); a transaction that
fails otherwise has an unknown outcome, so the owner takes the partition again and re-reads it
(``PartitionOwner.reset``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Sequence

import structlog
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, ProducerFenced

from ..errors import LogError, LogUnavailableError, PartitionNotOwnedError
from ..events import Event
from .base import LogRecord
from .kafka_appends import PendingAppend, fail_group, settle_group, take_group
from .kafka_owner import PartitionOwner
from .kafka_reader import OPERATION_TIMEOUT_S
from .kafka_records import Headers, Poison, SentBatch, event_headers, inbox_header, own_poison, send_batches
from .kafka_sessions import WATERMARK, encode_entry, encode_watermark

log = structlog.get_logger("turnlog.kafka")
OFFSETS_EVERY_S = 1.0
"""How often a consumer group's offsets on a partition ride its transactions (each costs the
broker two more requests): the group's members are at-least-once, so after a crash they handle
up to this much more again. Closing commits them all."""
INBOX_OFFSETS_EVERY_S = 10.0
"""How often the owners' group's inbox offset rides a transaction: the partition's events hold
it (``INBOX_HEADER``), so a new owner only reads up to this much of its inbox again, and skips it."""


@dataclass(frozen=True, slots=True)
class Writes:
    """What one transaction writes besides events."""

    inbox_offset: int | None = None
    """The partition's next inbox offset to sequence (a sequencing transaction)."""
    dead: Sequence[Poison] = ()
    index: Sequence[tuple[bytes, bytes]] = ()
    """Session index records (key, value), the watermark last."""
    force_offsets: bool = False


async def transact(
    owner: PartitionOwner,
    events: list[Event],
    *,
    inbox_offset: int | None = None,
    dead: Sequence[Poison] = (),
    force_index: bool = False,
    force_offsets: bool = False,
) -> list[LogRecord]:
    """One transaction on the owner's partition (see the module doc); returns the events'
    records. Called with ``owner.lock`` held by the partition's owner. A group's pending
    offsets ride it if ``OFFSETS_EVERY_S`` passed since the group's last (or ``force_offsets``)."""
    indexing, entries = take_index(owner, force_index)
    try:
        writes = Writes(inbox_offset, dead, entries, force_offsets)
        return await _run_transaction(owner, events, writes)
    except BaseException:
        owner.index.dirty |= indexing  # written with the next transaction
        raise


def index_due(owner: PartitionOwner, force: bool = False) -> bool:
    """Whether the session index is to be written with the next transaction: sessions changed,
    no poison waits to be dead-lettered, and ``index_every_s`` passed (or ``force``)."""
    index = owner.index
    if not (owner.owners.session_index and index.dirty) or index.unsettled_poison():
        return False
    return force or asyncio.get_running_loop().time() - owner.indexed_at >= owner.owners.index_every_s


def take_index(owner: PartitionOwner, force: bool) -> tuple[set[str], list[tuple[bytes, bytes]]]:
    """The session index records of the sessions changed since it was last written, and the
    watermark, if due; the sessions are no longer dirty."""
    if not index_due(owner, force):
        return set(), []
    index = owner.index
    sessions, index.dirty = index.dirty, set()
    owner.indexed_at = asyncio.get_running_loop().time()
    entries = [(sid.encode(), encode_entry(index.entry(sid))) for sid in sorted(sessions)]
    return sessions, [*entries, (WATERMARK, encode_watermark(index.next_offset, index.inbox_next))]


async def _run_transaction(owner: PartitionOwner, events: list[Event], writes: Writes) -> list[LogRecord]:
    """The producer's transaction, then its records indexed; a failure drops the partition."""
    producer = owner.producer
    assert producer is not None
    committing = offsets_to_commit(owner, events, writes)
    try:
        async with asyncio.timeout(OPERATION_TIMEOUT_S), producer.transaction():
            sent, values = await _send_all(owner, producer, events, writes, committing)
        offsets = await _offsets(sent)
    except ProducerFenced as exc:
        raise owner.fenced("fenced by a newer owner") from exc
    except (KafkaError, TimeoutError) as exc:
        # the outcome is unknown: re-acquire (aborting it if still open) and re-read the partition
        raise await owner.reset(exc) from exc
    if committing is not None:
        offsets_committed(owner, committing)
    if writes.inbox_offset is not None:
        owner.index.inbox_next = max(owner.index.inbox_next, writes.inbox_offset)
        if events:  # the owners' group's offset follows (offsets_to_commit)
            owner.inbox_pending = owner.index.inbox_next
    owner.index.dead_sources.update(poison.source for poison in writes.dead)
    records = [LogRecord(owner.partition, o, e) for o, e in zip(offsets, events, strict=True)]
    owner.owners.written.add(records, values)
    await _index_committed(owner, records)
    return records


async def _send_all(
    owner: PartitionOwner,
    producer: AIOKafkaProducer,
    events: list[Event],
    writes: Writes,
    committing: GroupOffset | None,
) -> tuple[list[SentBatch], list[bytes]]:
    """Everything one transaction writes, inside it; the events' batches and values."""
    topics, p = owner.owners.reader.topics, owner.partition
    values = owner.owners.reader.codec.encode_all(events)
    last = len(events) - 1
    records: list[tuple[bytes, bytes, Headers]] = []
    for i, (e, value) in enumerate(zip(events, values, strict=True)):
        headers = event_headers(e)
        if i == last and writes.inbox_offset is not None:
            headers.append(inbox_header(writes.inbox_offset))
        records.append((e.session_id.encode(), value, headers))
    sent = await send_batches(producer, topics.events, p, records)
    for poison in writes.dead:
        await producer.send(
            topics.dead_letter, poison.value, key=poison.key, partition=p, headers=poison.headers()
        )
    for key, value in writes.index:
        await producer.send(topics.sessions, value, key=key, partition=p)
    if committing is not None:
        await producer.send_offsets_to_transaction({committing.tp: committing.offset}, committing.group)
    return sent, values


async def _offsets(sent: list[SentBatch]) -> list[int]:
    """Each record's offset, once its batch is delivered: the batch's first plus its place."""
    offsets: list[int] = []
    for batch, relatives in sent:
        first = (await batch).offset
        offsets += [first + relative for relative in relatives]
    return offsets


async def _index_committed(owner: PartitionOwner, records: list[LogRecord]) -> None:
    """Add the owner's committed records to its index, after what others wrote in between."""
    index, sessions = owner.index, {r.event.session_id for r in records}
    try:
        if records and not index.continues_at(records):  # someone else wrote to the partition
            await owner.owners.reader.catch_up(index)  # index it in order first
        # a trim while the transaction ran (a consumer's read below the base) may have unloaded
        # an idle session of ours (kafka_held): fold it back (nothing to do if it is loaded)
        await owner.owners.reader.load(index, sessions)
    except LogError as exc:  # committed but not indexed: re-acquire and re-read
        raise await owner.reset(exc) from exc
    for record, reason in index.add(records):  # a bug: our writer folded it; readers skip it too
        log.error("kafka.own_record_rejected", partition=owner.partition, offset=record.offset, reason=reason)
        reader = owner.owners.reader
        index.add_poison(own_poison(reader.topics.events, record, reason, reader.codec), record.offset)
    index.own_marker = bool(records) or index.own_marker
    index.trim(keep=sessions)  # the caller settles them next


async def append_grouped(
    owner: PartitionOwner, events: Sequence[Event], expected_version: int
) -> list[LogRecord]:
    """Queue one session's batch for the partition's next transaction and wait for its records:
    appends of many sessions made while one transaction is in flight share the next."""
    if not owner.owned:
        raise PartitionNotOwnedError(owner.partition, owner.lost)
    append = PendingAppend(events[0].session_id, list(events), expected_version)
    owner.appends.append(append)
    if owner.committer is None:
        owner.committer = asyncio.get_running_loop().create_task(
            commit_appends(owner), name=f"turnlog-commit-{owner.partition}"
        )
    return await append.done


async def commit_appends(owner: PartitionOwner) -> None:
    """Commit the partition's queued appends, a group per transaction, until none wait."""
    try:
        while owner.appends:
            async with owner.lock:
                await _commit_group(owner)
    finally:
        owner.committer = None
        if owner.appends:  # queued after the loop's last look, or left by a cancellation
            owner.fail_appends(LogUnavailableError("the log is closing; retry"))


async def _commit_group(owner: PartitionOwner) -> None:
    """Commit one group of queued appends (with ``owner.lock`` held)."""
    if not owner.owned:
        owner.fail_appends(PartitionNotOwnedError(owner.partition, owner.lost))
        return
    try:  # every session in the group read (kafka_sessions) before it is checked
        while todo := [a.session_id for a in owner.appends if a.session_id in owner.index.unloaded]:
            await owner.owners.reader.load(owner.index, todo)
    except LogError as exc:
        owner.fail_appends(exc)
        return
    queued, owner.appends = owner.appends, []
    group = take_group(owner.index, queued)
    if not group:
        return
    try:
        records = await transact(owner, [e for a in group for e in a.events])
    except LogError as exc:
        fail_group(group, exc)
        return
    except BaseException as exc:  # cancelled (closing), or a bug: no caller hangs
        fail_group(group, LogUnavailableError(f"the append did not complete: {exc!r}"))
        raise
    try:
        settle_group(owner.index, group, records)
    except LogError as exc:  # a bug (committed, but not indexed as written): no caller hangs
        log.error("kafka.settle_failed", partition=owner.partition, error=repr(exc))
        fail_group(group, exc)  # the appends answered already keep their records


@dataclass(frozen=True, slots=True)
class GroupOffset:
    """One consumer group's offset on one partition, committed by a transaction."""

    group: str
    tp: TopicPartition
    offset: int


def offsets_to_commit(owner: PartitionOwner, events: list[Event], writes: Writes) -> GroupOffset | None:
    """The group offset a transaction commits (aiokafka commits one group's per transaction, a
    second fails it): the inbox offset of a sequencing that wrote no event, else a due one."""
    if writes.inbox_offset is not None and not events:
        topics = owner.owners.reader.topics
        inbox = TopicPartition(topics.inbox, owner.partition)
        return GroupOffset(topics.owners_group, inbox, writes.inbox_offset)
    return due_offsets(owner, writes.force_offsets)


def due_offsets(owner: PartitionOwner, force: bool = False) -> GroupOffset | None:
    """A group whose pending offset is to ride the next transaction, ``OFFSETS_EVERY_S`` after
    its last (``force``: now): the owners' group's on the inbox first (``INBOX_OFFSETS_EVERY_S``),
    then the events topic's consumer groups (``KafkaEventLog.commit``)."""
    now = asyncio.get_running_loop().time()
    topics, p = owner.owners.reader.topics, owner.partition

    def due(group: str, every: float = OFFSETS_EVERY_S) -> bool:
        return force or now - owner.offsets_at.get(group, -every) >= every

    if owner.inbox_pending is not None and due(topics.owners_group, INBOX_OFFSETS_EVERY_S):
        return GroupOffset(topics.owners_group, TopicPartition(topics.inbox, p), owner.inbox_pending)
    for group, offset in owner.pending_commits.items():
        if due(group):
            return GroupOffset(group, TopicPartition(topics.events, p), offset)
    return None


def offsets_committed(owner: PartitionOwner, committed: GroupOffset) -> None:
    """A transaction committed ``committed``: it is no longer pending (unless a newer offset
    came in meanwhile)."""
    owner.offsets_at[committed.group] = asyncio.get_running_loop().time()
    if committed.group == owner.owners.reader.topics.owners_group:
        if owner.inbox_pending is not None and owner.inbox_pending <= committed.offset:
            owner.inbox_pending = None
    elif owner.pending_commits.get(committed.group) == committed.offset:
        del owner.pending_commits[committed.group]


async def flush(owner: PartitionOwner, force: bool = False) -> None:
    """Commit the partition's pending group offsets when due, and the session index when due,
    in transactions of their own; ``force`` (closing): every group's, and the index, now."""
    for _ in range(len(owner.pending_commits) + 2):  # one group a transaction, the inbox's too
        if not _flush_due(owner, force):
            return
        async with owner.lock:
            if not _flush_due(owner, force):  # again: an append may have carried it
                return
            try:
                await transact(owner, [], force_index=force, force_offsets=force)
            except LogError:
                return


def _flush_due(owner: PartitionOwner, force: bool) -> bool:
    return owner.owned and (due_offsets(owner, force) is not None or index_due(owner, force))
