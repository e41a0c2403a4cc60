"""A Kafka partition owner's transactions, and the group commit that fills them.

Every write of an owner is one Kafka transaction on its partition (``transact``): the events,
dead letters, the inbox offset of the records it sequenced, one consumer group's pending offsets
and the session index entries when due (``kafka_sessions``), all or nothing. Appends that arrive
while a transaction is in flight wait in the partition's queue and go together into the next
(``commit_appends``; each still checked on its own: ``kafka_appends``). A producer the broker
fenced drops the partition (``PartitionOwner.fenced``); a transaction that fails otherwise has an
unknown outcome, so the owner takes the partition again and re-reads it (``PartitionOwner.reset``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Sequence

import structlog
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, ProducerFenced

from ..errors import LogError, LogUnavailableError, PartitionNotOwnedError
from ..events import Event
from .base import LogRecord
from .kafka_appends import PendingAppend, fail_group, settle_group, take_group
from .kafka_owner import PartitionOwner
from .kafka_reader import OPERATION_TIMEOUT_S
from .kafka_records import Poison, event_headers, own_poison
from .kafka_sessions import WATERMARK, encode_entry, encode_watermark

log = structlog.get_logger("turnlog.kafka")
OFFSETS_EVERY_S = 1.0
"""How often a consumer group's offsets on a partition ride its transactions (each costs the
broker two more requests): the group's members are at-least-once, so after a crash they handle
up to this much more again. Closing commits them all."""


@dataclass(frozen=True, slots=True)
class Writes:
    """What one transaction writes besides events."""

    inbox_offset: int | None = None
    """The owners' group's next inbox offset (a sequencing transaction)."""
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
    return sessions, [*entries, (WATERMARK, encode_watermark(index.next_offset))]


async def _run_transaction(owner: PartitionOwner, events: list[Event], writes: Writes) -> list[LogRecord]:
    """The producer's transaction, then its records indexed; a failure drops the partition."""
    producer = owner.producer
    assert producer is not None
    # aiokafka commits one consumer group's offsets per transaction (a second group fails the
    # transaction): the inbox offset if any, else one pending group's
    group = None if writes.inbox_offset is not None else due_group(owner, writes.force_offsets)
    committing = owner.pending_commits[group] if group is not None else 0
    try:
        async with asyncio.timeout(OPERATION_TIMEOUT_S), producer.transaction():
            futures = await _send_all(owner, producer, events, writes, group, committing)
        metas = [await f for f in futures]
    except ProducerFenced as exc:
        raise owner.fenced("fenced by a newer owner") from exc
    except (KafkaError, TimeoutError) as exc:
        # the outcome is unknown: re-acquire (aborting it if still open) and re-read the partition
        raise await owner.reset(exc) from exc
    if group is not None:
        owner.offsets_at[group] = asyncio.get_running_loop().time()
        if owner.pending_commits.get(group) == committing:
            del owner.pending_commits[group]  # unless a newer offset came in meanwhile
    owner.index.dead_sources.update(poison.source for poison in writes.dead)
    records = [LogRecord(owner.partition, m.offset, e) for m, e in zip(metas, events, strict=True)]
    await _index_committed(owner, records)
    return records


async def _send_all(
    owner: PartitionOwner,
    producer: AIOKafkaProducer,
    events: list[Event],
    writes: Writes,
    group: str | None,
    committing: int,
) -> list[asyncio.Future[Any]]:
    """Everything one transaction writes, inside it; the events' delivery futures."""
    topics, p = owner.owners.reader.topics, owner.partition
    encode = owner.owners.reader.codec.encode
    futures = [
        await producer.send(
            topics.events, encode(e), key=e.session_id.encode(), partition=p, headers=event_headers(e)
        )
        for e in events
    ]
    for poison in writes.dead:
        await producer.send(
            topics.dead_letter, poison.value, key=poison.key, partition=p, headers=poison.headers()
        )
    for key, value in writes.index:
        await producer.send(topics.sessions, value, key=key, partition=p)
    if writes.inbox_offset is not None:
        inbox = TopicPartition(topics.inbox, p)
        await producer.send_offsets_to_transaction({inbox: writes.inbox_offset}, topics.owners_group)
    elif group is not None:
        await producer.send_offsets_to_transaction({TopicPartition(topics.events, p): committing}, group)
    return futures


async def _index_committed(owner: PartitionOwner, records: list[LogRecord]) -> None:
    """Add the owner's committed records to its index, after what others wrote in between."""
    index = owner.index
    if records and not index.continues_at(records):
        try:  # someone else wrote to the partition: index it in order first
            await owner.owners.reader.catch_up(index)
        except LogError as exc:  # committed but not indexed: re-acquire and re-read
            raise await owner.reset(exc) from exc
    for record, reason in index.add(records):  # a bug: our writer folded it; readers skip it too
        log.error("kafka.own_record_rejected", partition=owner.partition, offset=record.offset, reason=reason)
        reader = owner.owners.reader
        index.add_poison(own_poison(reader.topics.events, record, reason, reader.codec), record.offset)
    index.own_marker = bool(records) or index.own_marker


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
    settle_group(owner.index, group, records)


def due_group(owner: PartitionOwner, force: bool = False) -> str | None:
    """A consumer group whose pending offsets are to ride the next transaction: aiokafka
    commits one group's per transaction (a second fails it)."""
    now = asyncio.get_running_loop().time()
    for group in owner.pending_commits:
        if force or now - owner.offsets_at.get(group, -OFFSETS_EVERY_S) >= OFFSETS_EVERY_S:
            return group
    return None


async def flush(owner: PartitionOwner, force: bool = False) -> None:
    """Commit the partition's pending group offsets when due, and the session index when due,
    in transactions of their own; ``force`` (closing): every group's, and the index, now."""
    for _ in range(len(owner.pending_commits) + 1):  # one group a transaction
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
    return owner.owned and (due_group(owner, force) is not None or index_due(owner, force))
