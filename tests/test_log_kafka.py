"""What only the Kafka log does: topics it creates, records' headers, the inbox sequenced by the
partition's owner, fencing of a zombie owner, dead letters. On a real broker
(TURNLOG_KAFKA_BOOTSTRAP; scripts/kafka.sh start)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaConnectionError

from tests.services import delete_topics, fresh_topic, kafka_log, read_topic
from turnlog.engine import codec
from turnlog.engine import events as ev
from turnlog.engine.admission import AdmissionRules
from turnlog.engine.errors import (
    ConcurrencyError,
    ConfigurationError,
    LogUnavailableError,
    PartitionNotOwnedError,
    SessionClosedError,
    SessionNotFoundError,
)
from turnlog.engine.log.kafka import KafkaEventLog


@pytest.fixture
async def owner(bootstrap: str) -> AsyncIterator[KafkaEventLog]:
    async with kafka_log(bootstrap, partitions=3, admission=AdmissionRules()) as log:
        yield log


def created(sid: str) -> ev.SessionCreated:
    return ev.SessionCreated(session_id=sid, version=1, agent_id="a", user_id="u")


def message(sid: str, text: str = "hi") -> ev.UserMessageReceived:
    return ev.UserMessageReceived(session_id=sid, version=0, message_id=ev.new_id(), text=text, user_id="u")


async def until(what: str, condition: Callable[[], Awaitable[bool]], attempts: int = 400) -> None:
    """Poll ``condition`` every 50 ms until it holds; fail naming ``what`` if it never does."""
    for _ in range(attempts):
        if await condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what}: not within {attempts * 0.05:g} s")


async def has_events(log: KafkaEventLog, sid: str, count: int) -> bool:
    return len(await log.read_session(sid)) >= count


async def test_topics_are_created_with_infinite_retention_but_the_live_one_and_the_index(
    owner: KafkaEventLog, bootstrap: str
) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        topics = {t["topic"]: t for t in await admin.describe_topics(list(owner.topics.all()))}
        assert {name: len(t["partitions"]) for name, t in topics.items()} == dict.fromkeys(
            owner.topics.all(), 3
        )
        (described,) = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, owner.topics.events)]
        )
        configs = {name: value for name, value, *_ in described.resources[0][4]}
        assert configs["retention.ms"] == "-1" and configs["retention.bytes"] == "-1"
        assert configs["cleanup.policy"] == "delete"
        (live,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, owner.topics.live)])
        live_configs = {name: value for name, value, *_ in live.resources[0][4]}
        assert live_configs["retention.ms"] == "60000"  # token deltas matter for seconds, not forever
        (index,) = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, owner.topics.sessions)]
        )
        index_configs = {name: value for name, value, *_ in index.resources[0][4]}
        assert index_configs["cleanup.policy"] == "compact"  # a session's newest entry is what counts
    finally:
        await admin.close()


async def test_reopening_with_another_partition_count_is_refused(
    owner: KafkaEventLog, bootstrap: str
) -> None:
    other = KafkaEventLog(bootstrap, topic=owner.topics.events, partitions=5, owner=False)
    with pytest.raises(ConfigurationError, match="has 3 partitions, not 5"):
        await other.start()
    await other.close()


async def test_records_are_keyed_by_session_with_the_schema_fingerprint_header(
    owner: KafkaEventLog, bootstrap: str
) -> None:
    await owner.submit(created("s-1"))
    p = owner.partition_of("s-1")
    (record,) = await read_topic(bootstrap, owner.topics.events, p)
    headers = dict(record.headers)
    assert record.key == b"s-1"
    assert headers["turnlog.schema"] == codec.schema_fingerprint("SessionCreated") == record.value[2:10]
    assert headers["turnlog.type"] == b"SessionCreated"
    assert codec.decode(record.value) == (await owner.read_session("s-1"))[0]


async def test_a_transaction_larger_than_a_producer_batch_gives_each_event_its_offset(
    owner: KafkaEventLog, bootstrap: str
) -> None:
    """One transaction's events go out as producer batches of 16 kB (kafka_commits): a larger
    one fills several, and each event is answered with the offset the partition gave it."""
    await owner.submit(created("s-big"))
    big = [
        ev.UserMessageReceived(session_id="s-big", version=v, message_id=f"m{v}", text=f"{v}" * 7000)
        for v in range(2, 10)
    ]
    appended = await owner.append(big, expected_version=1)

    on_topic = await read_topic(bootstrap, owner.topics.events, owner.partition_of("s-big"))
    as_written = [(r.offset, codec.decode(r.value)) for r in on_topic[1:]]
    assert [(r.offset, r.event) for r in appended] == as_written
    assert [r.event for r in await owner.read_session_records("s-big", 1)] == big


async def test_a_producer_that_owns_nothing_submits_through_the_inbox(
    owner: KafkaEventLog, bootstrap: str
) -> None:
    async with kafka_log(bootstrap, partitions=3, topic=owner.topics.events, owner=False) as producer:
        assert producer.owned_partitions() == []
        sent = [
            *await producer.submit(created("s-2")),
            *await producer.submit(message("s-2", "one")),
            *await producer.submit(message("s-2", "two")),
        ]
        assert all(r.pending for r in sent)  # the owner assigns the versions and positions later
        assert [r.event.version for r in sent] == [0, 0, 0]
        with pytest.raises(PartitionNotOwnedError, match="does not own partition"):
            await producer.append(
                [ev.TurnStarted(session_id="s-2", version=4, turn_id="t", message_id="m")], expected_version=3
            )
        await until("the owner sequenced s-2", lambda: has_events(producer, "s-2", 3), attempts=200)
    events = await owner.read_session("s-2")
    assert [(e.type, e.version) for e in events] == [
        ("SessionCreated", 1),
        ("UserMessageReceived", 2),
        ("UserMessageReceived", 3),
    ]
    assert [e.event_id for e in events] == [r.event.event_id for r in sent]


async def test_the_owner_refuses_what_does_not_fit_and_dead_letters_it(
    owner: KafkaEventLog, bootstrap: str
) -> None:
    await owner.submit(created("s-3"))
    with pytest.raises(ConcurrencyError):
        await owner.submit(created("s-3"))  # the session exists
    with pytest.raises(SessionNotFoundError):
        await owner.submit(message("nobody"))
    await owner.append(
        [ev.SessionClosed(session_id="s-3", version=2, reason="done", actor="ops")], expected_version=1
    )
    with pytest.raises(SessionClosedError):
        await owner.submit(ev.CancelRequested(session_id="s-3", version=0, reason="stop"))
    # a message's sender may have been answered already (from a process that does not own the
    # partition): it is taken and dropped with the reason, never left waiting or only dead-lettered
    records = await owner.submit(message("s-3"))
    assert [(r.event.type, r.event.version) for r in records] == [
        ("UserMessageReceived", 3),
        ("UserMessageDropped", 4),
    ]
    assert records == await owner.read_session_records("s-3", 2)  # with their positions
    late = records[0].event
    dead = await read_topic(bootstrap, owner.topics.dead_letter, owner.partition_of("s-3"))
    reasons = [dict(d.headers)["turnlog.reason"].decode() for d in dead if d.key == b"s-3"]
    assert len(reasons) == 2 and "expected version 0 but the log is at 1" in reasons[0]
    assert "closed" in reasons[1]
    events = await owner.read_session("s-3")
    assert [e.type for e in events] == [
        "SessionCreated",
        "SessionClosed",
        "UserMessageReceived",
        "UserMessageDropped",
    ]
    assert events[-1].message_id == late.message_id  # type: ignore[attr-defined]


async def test_undecodable_inbox_bytes_go_to_the_dead_letter_topic_and_the_session_to_error(
    owner: KafkaEventLog, bootstrap: str
) -> None:
    await owner.submit(created("s-4"))
    p = owner.partition_of("s-4")
    raw = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await raw.start()
    try:
        poison = await raw.send_and_wait(owner.topics.inbox, b"\x00not avro", key=b"s-4", partition=p)
    finally:
        await raw.stop()
    (after,) = await owner.submit(message("s-4", "still there?"))  # the partition keeps moving
    assert after.event.version == 3

    events = await owner.read_session("s-4")
    assert [e.type for e in events] == ["SessionCreated", "StateChanged", "UserMessageReceived"]
    error = events[1]
    assert isinstance(error, ev.StateChanged)
    assert (error.from_state, error.to_state, error.cause) == ("IDLE", "ERROR", "poison_record")
    assert (
        f"{owner.topics.inbox}/{p}/{poison.offset}" in error.detail and "not a turnlog event" in error.detail
    )
    (dead,) = await read_topic(bootstrap, owner.topics.dead_letter, p)
    assert dead.value == b"\x00not avro" and dead.key == b"s-4"
    assert "not a turnlog event" in dict(dead.headers)["turnlog.reason"].decode()
    assert dict(dead.headers)["turnlog.source"].decode() == f"{owner.topics.inbox}/{p}/{poison.offset}"


async def test_a_zombie_owner_is_fenced_and_appends_nothing(owner: KafkaEventLog, bootstrap: str) -> None:
    """A new owner of partition p starts a producer with p's transactional id (what the owners'
    group assignment does). The old owner, which never heard of it, is fenced by the broker."""
    await owner.submit(created("s-5"))
    p = owner.partition_of("s-5")
    successor = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=owner.topics.transactional_id(p)
    )
    await successor.start()
    try:
        late = ev.TurnStarted(session_id="s-5", version=2, turn_id="t", message_id="m")
        with pytest.raises(PartitionNotOwnedError, match="fenced"):
            await owner.append([late], expected_version=1)
        assert p not in owner.owned_partitions()
    finally:
        await successor.stop()
    on_topic = [codec.decode(r.value) for r in await read_topic(bootstrap, owner.topics.events, p)]
    assert [e.type for e in on_topic if e.session_id == "s-5"] == ["SessionCreated"]


async def test_a_failed_re_acquire_read_is_retried_until_the_partition_is_owned_again(
    owner: KafkaEventLog,
) -> None:
    """A transaction with an unknown outcome drops the partition and re-acquires it; the
    re-read failing once (the broker away) must not leave it assigned but unowned."""
    await owner.submit(created("s-6"))
    part = owner._owners[owner.partition_of("s-6")]
    read, failures = owner._reader.catch_up, []

    async def read_failing_once(p: Any, until: int | None = None) -> None:
        # only the dropped partition's re-read: the owner also catches its other partitions up
        if not failures and p.partition == part.partition:
            failures.append(p.partition)
            raise LogUnavailableError("injected: the broker went away during the re-read")
        await read(p, until)

    owner._reader.catch_up = read_failing_once  # type: ignore[method-assign]
    await part.reset(RuntimeError("injected: a transaction with an unknown outcome"))
    assert part.partition not in owner.owned_partitions()
    await owner.wait_owned(timeout=20)
    assert failures == [part.partition]
    assert (await owner.submit(message("s-6")))[0].event.version == 2  # and it sequences again


class CommitResponseLost(AIOKafkaProducer):
    """A transactional producer whose next commit reaches the broker and commits, but whose
    answer is lost on the way back (the client sees a dropped connection): the outcome the
    owner cannot know, injected at the one point it happens."""

    lose_next = False

    async def commit_transaction(self) -> None:
        await super().commit_transaction()
        if CommitResponseLost.lose_next:
            CommitResponseLost.lose_next = False
            raise KafkaConnectionError("injected: the commit's response was lost")


class LosingCommitResponses(KafkaEventLog):
    def _owner_producer(self, partition: int) -> AIOKafkaProducer:
        return CommitResponseLost(
            bootstrap_servers=self.bootstrap,
            client_id=self.client_id,
            transactional_id=self.topics.transactional_id(partition),
            enable_idempotence=True,
            acks="all",
        )


async def test_a_sequencing_commit_whose_response_is_lost_sequences_the_message_once(bootstrap: str) -> None:
    """The transaction that sequenced m1 committed, but the owner saw a failure: it re-acquires
    the partition, reads the inbox record again, finds m1 on the log by its id and skips it
    (before idempotent sequencing m1 entered the session twice, issue 13)."""
    topic = fresh_topic()
    log = LosingCommitResponses(bootstrap, topic=topic, partitions=2, session_timeout_ms=6000)
    await log.start()
    try:
        await log.wait_owned()
        await log.submit(created("s-lost"))
        CommitResponseLost.lose_next = True
        first = message("s-lost", "m1")
        (answer,) = await log.submit(first)  # sequenced, then re-read after the re-acquire
        assert not CommitResponseLost.lose_next  # the fault was injected on m1's transaction
        await log.wait_owned()
        (after,) = await log.submit(message("s-lost", "m2"))
        events = await log.read_session("s-lost")
    finally:
        await log.close()
        await delete_topics(bootstrap, topic)
    assert [e.text for e in events if isinstance(e, ev.UserMessageReceived)] == ["m1", "m2"]
    assert answer.event.event_id == first.event_id and answer.event.version in (0, 2)  # 0: pending
    assert after.event.version == 3


@pytest.mark.parametrize("partition_says", [True, False], ids=["offset-on-the-partition", "older-log"])
async def test_an_inbox_read_again_by_a_new_owner_sequences_nothing_twice(
    owner: KafkaEventLog, bootstrap: str, partition_says: bool
) -> None:
    """A new owner whose committed-offset fetch was stale (the owners' group commits lazily)
    reads inbox records that are already on the log: a creation, messages, a cancel and a
    force-finish request. Seeking the owner's inbox back to 0 is that redelivery. The partition
    says how far its inbox was sequenced (tests/test_kafka_inbox_offsets.py); a log written
    before it said so is read again and its records are found by their submission keys."""
    sid = "s-again"
    await owner.submit(created(sid))
    one = (await owner.submit(message(sid, "one")))[0].event
    assert isinstance(one, ev.UserMessageReceived)
    turn = ev.TurnStarted(session_id=sid, version=3, turn_id="t1", message_id=one.message_id)
    await owner.append([turn], expected_version=2)
    await owner.submit(ev.CancelRequested(session_id=sid, version=0, reason="stop", actor="u"))
    before = [(e.type, e.event_id) for e in await owner.read_session(sid)]
    assert owner._inbox is not None
    tp = TopicPartition(owner.topics.inbox, owner.partition_of(sid))
    if not partition_says:
        owner._owners[tp.partition].index.inbox_next = 0
    owner._inbox.seek(tp, 0)
    marker = (await owner.submit(message(sid, "two")))[0].event  # sequenced after every re-read record
    after = [(e.type, e.event_id) for e in await owner.read_session(sid)]
    assert after == [*before, ("UserMessageReceived", marker.event_id)]
    assert marker.version == len(before) + 1


def on_other_partitions(log: KafkaEventLog, prefix: str, count: int) -> list[str]:
    """``count`` session ids, each on a partition of its own."""
    found: dict[int, str] = {}
    for i in range(1000):
        found.setdefault(log.partition_of(f"{prefix}-{i}"), f"{prefix}-{i}")
        if len(found) == count:
            return list(found.values())
    raise AssertionError(f"{count} partitions not reached")


async def test_a_partition_that_cannot_sequence_yet_holds_up_no_other(
    owner: KafkaEventLog, bootstrap: str
) -> None:
    """Each inbox partition is sequenced in a task of its own: while one partition waits for its
    lock (a long append group in flight), another partition's messages are sequenced, and the
    waiting one's follow once it can, in order."""
    slow, fast = on_other_partitions(owner, "s-seq", 2)
    for sid in (slow, fast):
        await owner.submit(created(sid))
    slow_queue = owner._sequencer.queues[owner.partition_of(slow)]

    async def sequencer_started() -> bool:  # fetched, and its sequencer waits for the lock
        return slow_queue.task is not None

    async with kafka_log(bootstrap, partitions=3, topic=owner.topics.events, owner=False) as producer:
        async with owner._owners[owner.partition_of(slow)].lock:
            await producer.submit(message(slow, "waits"))
            await producer.submit(message(slow, "waits too"))
            await until("the owner fetched the slow session's messages", sequencer_started)
            await producer.submit(message(fast, "passes"))
            await until("the fast session's message sequenced", lambda: has_events(owner, fast, 2))
            fast_events = await owner.read_session(fast)
            assert [e.type for e in fast_events] == ["SessionCreated", "UserMessageReceived"]
            assert [e.type for e in await owner.read_session(slow)] == ["SessionCreated"]
        await until("the slow session's messages sequenced", lambda: has_events(owner, slow, 3))
    texts = [e.text for e in await owner.read_session(slow) if isinstance(e, ev.UserMessageReceived)]
    assert texts == ["waits", "waits too"]


async def test_owner_producers_retry_a_busy_transaction_coordinator_within_milliseconds(
    owner: KafkaEventLog,
) -> None:
    """aiokafka waits 20 ms (100 ms for offsets) before asking again while the previous
    transaction's markers are written; the owners wait 2 ms and 10 ms (engine.log.kafka_txn).
    aiokafka reads the constant it keeps in its sender module: an upgrade that renames it shows here."""
    from aiokafka.producer import sender

    from turnlog.engine.log.kafka_txn import CONCURRENT_TXN_RETRY_S, TXN_RETRY_BACKOFF_MS

    producer = owner._owners[0].producer
    assert producer is not None
    assert sender.BACKOFF_OVERRIDE == CONCURRENT_TXN_RETRY_S == 0.002
    assert producer._sender._retry_backoff == TXN_RETRY_BACKOFF_MS / 1000


def test_an_inbox_queue_drops_the_batches_fetched_before_a_rewind() -> None:
    """What waits is taken together; after a batch is read again (the consumer seeked back to
    its first record), the batches fetched before the seek are skipped up to the one the seek
    brings back."""
    from types import SimpleNamespace

    from turnlog.engine.log.kafka_sequencer import InboxQueue

    def batch(first: int, last: int) -> list:
        return [SimpleNamespace(offset=o) for o in range(first, last + 1)]

    queue = InboxQueue()
    queue.batches.append(batch(0, 4))
    assert [m.offset for m in queue.next() or []] == [0, 1, 2, 3, 4]
    queue.batches.extend([batch(5, 9), batch(10, 12)])  # fetched while 0-4 was sequenced
    queue.rewound(0)  # 0-4 failed: the inbox reads from 0 again; 5-9 and 10-12 are stale
    queue.batches.extend([batch(0, 8), batch(9, 12)])  # what the seek brings back
    assert [m.offset for m in queue.next() or []] == list(range(13))  # one transaction's worth
    assert queue.next() is None
    queue.batches.append(batch(13, 13))
    assert [m.offset for m in queue.next() or []] == [13]


async def test_a_followers_pass_skips_the_partitions_with_nothing_past_its_offsets(
    owner: KafkaEventLog, bootstrap: str
) -> None:
    """``partitions_to_read`` on a log that owns nothing (one request for the ends of all): the
    partitions with a record at or after the offsets; a commit marker after the last is none."""
    sids = {p: next(f"s-{i}" for i in itertools.count() if owner.partition_of(f"s-{i}") == p) for p in (0, 2)}
    for sid in sids.values():
        await owner.append([created(sid)], expected_version=0)
    async with kafka_log(bootstrap, partitions=3, topic=owner.topics.events, owner=False) as reader:
        assert await reader.partitions_to_read({0: 0, 1: 0, 2: 0}) == [0, 2]
        past = {p: (await reader.read_partition(p, 0))[-1].offset + 1 for p in sids}
        assert await reader.partitions_to_read({0: past[0], 1: 0, 2: 0}) == [2]
        assert await reader.partitions_to_read({0: past[0], 2: past[2]}) == []
        assert await reader.end_offset(0) > past[0]  # the marker: the end alone would say "read"
