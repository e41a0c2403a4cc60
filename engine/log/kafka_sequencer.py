"""The inbox: what producers submit without a version (``send_to_inbox``), and the Kafka owner's
sequencer, which reads it and turns each record into its session's next events, on the
partitions this process owns.

One loop fetches inbox records and hands each partition's batches to a task of that partition
(``InboxQueue``), which admits them (``kafka_inbox``) and writes the events, the dead letters and
the inbox offset in one transaction (``kafka_commits.transact``), so a record is sequenced
exactly once (the offset rides the events; records below it read again are skipped). One
partition waiting for its lock (an append group's transaction in flight) delays no other
partition's records, and fetching goes on meanwhile. Whatever stops a batch (a failed
transaction, a bug, a record that waits for an admission policy) seeks the inbox back to the
batch's first record not sequenced: no record is ever skipped. When the inbox is quiet the
loop commits idle groups' offsets, and once a second it reads what others wrote to its
partitions (``kafka_upkeep``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from ..errors import LogError, LogUnavailableError
from ..events import Event
from .base import AdmissionPolicy, LogRecord
from .kafka_commits import transact
from .kafka_inbox import InboxAdmission, InboxBatch
from .kafka_owner import PartitionOwner, Spawn
from .kafka_poison import poisoned
from .kafka_reader import OPERATION_TIMEOUT_S
from .kafka_records import Poison, event_headers, poison_of, sessions_named
from .kafka_topics import TopicNames
from .kafka_upkeep import flush_all, tail_owned
from .sealing import RecordCodec

log = structlog.get_logger("turnlog.kafka")
TAIL_EVERY_S = 1.0
"""How often an idle owner reads what others wrote to its partitions (poison, see kafka_poison)."""
WAIT_FOR_POLICY_S = 1.0
"""How long a partition whose inbox record waits for an admission policy waits before it reads
the record again (at once when the policy is handed over)."""


@dataclass(eq=False)
class InboxQueue:
    """One inbox partition's fetched batches waiting to be sequenced, in fetch order, and the
    task that sequences them in order: what waits when it is free goes into its next
    transaction together.

    A batch that must be read again seeks the inbox consumer back to its first record
    (``rewound``); the batches fetched before that seek are stale and are dropped, up to the
    batch the seek brings back, which starts at that same offset. A revoke drops them all."""

    batches: deque[list[Any]] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None
    rewound_to: int | None = None

    def next(self) -> list[Any] | None:
        """Every batch waiting, as one (they follow each other: one transaction sequences them
        all, as many as arrived while the last one was committed), stale ones skipped; None
        when none is waiting."""
        while self.batches and self.rewound_to is not None:
            if self.batches[0][0].offset == self.rewound_to:
                self.rewound_to = None
            else:
                self.batches.popleft()
        if not self.batches:
            return None
        taken = [message for batch in self.batches for message in batch]
        self.batches.clear()
        return taken

    def rewound(self, offset: int) -> None:
        self.rewound_to = offset

    def clear(self) -> None:
        self.batches.clear()
        self.rewound_to = None


@dataclass
class Sequenced:
    """What one batch's admission decided, to be written and answered."""

    batch: InboxBatch
    dead: list[Poison] = field(default_factory=list)
    refused: dict[str, Exception] = field(default_factory=dict)
    admitted: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Each admitted submission's events in the batch's ``accepted``: (start, count)."""
    repeats: dict[str, LogRecord | int] = field(default_factory=dict)
    """Each repeated submission's record on the log, or its place in ``accepted``."""
    waiting: int | None = None
    """The offset of a record that waits for an admission policy (the batch stops there)."""
    waits: str = ""
    """Why it waits (said once what the batch admitted before it is on the log)."""


class InboxSequencer:
    """Sequences the inbox partitions this process owns (see the module doc)."""

    def __init__(
        self, owners: list[PartitionOwner], policy: Callable[[], AdmissionPolicy | None], spawn: Spawn
    ) -> None:
        self.owners = owners
        self._spawn = spawn
        self.policy = policy
        """The log's admission policy as it is now (``EventLog.admit_with``)."""
        self.consumer: AIOKafkaConsumer | None = None
        """The owners' group member reading the inbox (set by ``KafkaEventLog.start``)."""
        self.queues = [InboxQueue() for _ in owners]
        self.submitted: dict[str, asyncio.Future[list[LogRecord]]] = {}
        """Submissions of this process to its own partitions, answered once sequenced."""
        self.waiting: dict[int, str] = {}
        """Partitions whose next inbox record waits for an admission policy, and why."""
        self.policy_given = asyncio.Event()
        self.sequenced: Callable[[Event], None] = lambda event: None
        """Told of each event a batch committed (``KafkaEventLog.on_sequenced``)."""

    def forget(self, partition: int) -> None:
        """The partition was revoked: what was fetched while it was ours, the next owner reads."""
        self.queues[partition].clear()
        self.waiting.pop(partition, None)

    async def run(self) -> None:
        """Fetch inbox records and queue each partition's batches; housekeeping when quiet."""
        inbox = self.consumer
        assert inbox is not None
        loop = asyncio.get_running_loop()
        tailed = loop.time()
        housekeeping: asyncio.Task[None] | None = None
        while True:
            try:
                batches = await inbox.getmany(timeout_ms=100, max_records=500)
                for tp, messages in batches.items():
                    self._queue(tp, messages)
                tail = loop.time() - tailed >= TAIL_EVERY_S
                if (tail or not batches) and (housekeeping is None or housekeeping.done()):
                    housekeeping = self._spawn(self._housekeeping(tail))
                    if tail:
                        tailed = loop.time()
            except (KafkaError, LogError) as exc:  # the broker is away: nothing was sequenced, retry
                log.warning("kafka.sequencer_retry", error=repr(exc))
                await asyncio.sleep(1.0)

    def _queue(self, tp: TopicPartition, messages: list[Any]) -> None:
        queue = self.queues[tp.partition]
        queue.batches.append(messages)
        if queue.task is None:
            queue.task = self._spawn(self._drain(tp, queue))

    async def _drain(self, tp: TopicPartition, queue: InboxQueue) -> None:
        try:
            while (messages := queue.next()) is not None:
                await self._sequence_fetched(self.owners[tp.partition], tp, messages)
        finally:
            queue.task = None

    async def _housekeeping(self, tail: bool) -> None:
        """When the inbox is quiet, commit pending group offsets; every ``TAIL_EVERY_S``, index
        what others wrote to our partitions."""
        try:
            await flush_all(self.owners)
            if tail:
                await tail_owned(self.owners)
        except (KafkaError, LogError) as exc:
            log.warning("kafka.housekeeping_retry", error=repr(exc))

    def _assigned(self, tp: TopicPartition) -> bool:
        return self.consumer is not None and tp in self.consumer.assignment()

    async def _sequence_fetched(self, owner: PartitionOwner, tp: TopicPartition, messages: list[Any]) -> None:
        """Sequence inbox records fetched for ``tp``; whatever stops that reads them again (the
        consumer's position already moved past them), so no record is ever skipped."""
        try:
            waiting: int | None = None
            async with owner.lock:
                if owner.owned:
                    waiting = await self._commit_batch(owner, messages)
                    if waiting is None:
                        return
                elif not self._assigned(tp):
                    return  # revoked: the next owner reads these from the committed offset
            if waiting is not None:  # a record waits for an admission policy: read it again once given
                self._rewind(tp, waiting)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.policy_given.wait(), WAIT_FOR_POLICY_S)
                return
            self._rewind(tp, messages[0].offset)  # still assigned, being re-acquired: read them again
            await asyncio.sleep(0.2)
        except (KafkaError, LogError) as exc:  # the broker is away: nothing was sequenced, retry
            self._rewind(tp, messages[0].offset)
            log.warning("kafka.sequencer_retry", partition=tp.partition, error=repr(exc))
            await asyncio.sleep(1.0)
        except Exception:  # a bug: say so loudly, lose nothing, and keep the other partitions moving
            self._rewind(tp, messages[0].offset)
            log.exception("kafka.sequencer_failed", partition=tp.partition, offset=messages[0].offset)
            await asyncio.sleep(1.0)

    def _rewind(self, tp: TopicPartition, offset: int) -> None:
        """Read the inbox partition again from ``offset`` (while it is still ours)."""
        if self.consumer is not None and self._assigned(tp):
            self.consumer.seek(tp, offset)
            self.queues[tp.partition].rewound(offset)

    async def _commit_batch(self, owner: PartitionOwner, messages: list[Any]) -> int | None:
        """Sequence a batch of inbox records; called with ``owner.lock`` held by the owner.
        Returns the offset of a record that waits for an admission policy, up to which the
        batch was sequenced, or None. Records below the partition's ``inbox_next`` are on it
        already: the owners' group's committed offset, where a new owner starts, may lag it."""
        messages = [m for m in messages if m.offset >= owner.index.inbox_next]
        if not messages:
            return None
        await owner.owners.reader.load(owner.index, sessions_named(messages))
        done = self._admit(owner, messages)
        if done.waiting == messages[0].offset:
            self._wait_for_policy(owner.partition, messages[0].offset, done.waits)
            return done.waiting
        inbox_offset = messages[-1].offset + 1 if done.waiting is None else done.waiting
        records = await transact(owner, done.batch.accepted, inbox_offset=inbox_offset, dead=done.dead)
        self._answer_all(done, records)
        for record in records:
            self.sequenced(record.event)
        if done.dead:
            log.warning(
                "kafka.dead_letters",
                partition=owner.partition,
                count=len(done.dead),
                reason=done.dead[0].reason,
            )
        owner.owners.notify()
        if done.waiting is not None:  # now that what came before it is on the log
            self._wait_for_policy(owner.partition, done.waiting, done.waits)
        return done.waiting

    def _admit(self, owner: PartitionOwner, messages: list[Any]) -> Sequenced:
        """Admit the records in order (``kafka_inbox``), up to one that waits for a policy."""
        done = Sequenced(InboxBatch(owner.index, self.policy()))
        for msg in messages:
            admission = done.batch.admit(msg)
            if admission.waits:
                done.waiting, done.waits = msg.offset, admission.waits
                return done
            if admission.event_id is not None:
                self._note(done, admission)
            if admission.refused is None:
                continue
            poison = poison_of(msg, str(admission.refused))
            done.dead.append(poison)
            if admission.event_id is not None:
                done.refused[admission.event_id] = admission.refused
            elif (
                marked := poisoned(owner.index, poison, done.batch.versions, owner.owners.name)
            ) is not None:
                done.batch.add([marked])
        self.waiting.pop(owner.partition, None)
        return done

    def _wait_for_policy(self, partition: int, offset: int, why: str) -> None:
        """Note (and log, once) that the partition's inbox waits at ``offset`` for a policy."""
        reason = f"{why} (inbox offset {offset})"
        if self.waiting.get(partition) != reason:
            log.warning("kafka.inbox_waits_for_admission", partition=partition, offset=offset, why=why)
        self.waiting[partition] = reason

    @staticmethod
    def _note(done: Sequenced, admission: InboxAdmission) -> None:
        """Note what to answer the submitter of an admitted or repeated record."""
        assert admission.event_id is not None
        if admission.events:
            done.admitted[admission.event_id] = (admission.at, len(admission.events))
        elif admission.repeat is not None:
            done.repeats[admission.event_id] = admission.repeat
        elif admission.repeat_at is not None:
            done.repeats[admission.event_id] = admission.repeat_at

    def _answer_all(self, done: Sequenced, records: list[LogRecord]) -> None:
        """Answer this process's submissions the batch sequenced, refused or found repeated."""
        for eid, (start, count) in done.admitted.items():
            self._answer(eid, records[start : start + count])
        for eid, repeat in done.repeats.items():
            self._answer(eid, [repeat if isinstance(repeat, LogRecord) else records[repeat]])
        for eid, error in done.refused.items():
            self._answer(eid, error)

    def _answer(self, event_id: str, outcome: list[LogRecord] | Exception) -> None:
        """Answer this process's submission of ``event_id``, if it waits."""
        fut = self.submitted.get(event_id)
        if fut is None or fut.done():
            return
        if isinstance(outcome, Exception):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)


def inbox_consumer(
    bootstrap: str, client_id: str, topics: TopicNames, session_timeout_ms: int
) -> AIOKafkaConsumer:
    """An owner's member of the owners' group: it is assigned the inbox partitions whose events
    partitions it then owns, and reads what producers submitted there."""
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        group_id=topics.owners_group,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=session_timeout_ms,
        heartbeat_interval_ms=max(100, session_timeout_ms // 10),
    )


async def send_to_inbox(
    producer: AIOKafkaProducer | None, topics: TopicNames, event: Event, partition: int, records: RecordCodec
) -> None:
    """Hand a submission to the partition's owner: durable in the inbox when this returns (its
    content encrypted by the log's sealer, as on the events topic)."""
    assert producer is not None, "call start() first"
    try:
        async with asyncio.timeout(OPERATION_TIMEOUT_S):
            await producer.send_and_wait(
                topics.inbox,
                records.encode(event),
                key=event.session_id.encode(),
                partition=partition,
                headers=event_headers(event),
            )
    except (KafkaError, TimeoutError) as exc:
        raise LogUnavailableError(f"the inbox did not take the event: {exc!r}; retry") from exc
