"""A process that owns no partition (a gateway) serves a session's newest events from what their
owner named on the live topic (engine/log/kafka_heard.py): the same records, at the same offsets,
as the partition holds, without reading the partition first; a run with a gap, or a session
found erased since, is read from the partition. The owner sends each event as the bytes it
wrote (engine/log/kafka_written.py), so the gateway's reader, fetching those bytes at that
offset, takes the record heard rather than decoding it again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from tests.erasure_support import REQUIRED, random_master
from tests.services import kafka_log, need_service
from turnlog.distributed import LiveLinks
from turnlog.engine import events as ev
from turnlog.engine.admission import AdmissionRules
from turnlog.engine.crypto.cipher import ContentCipher
from turnlog.engine.crypto.keystore_sqlite import SqliteKeyStore
from turnlog.engine.log import kafka_live
from turnlog.engine.log.base import LogRecord
from turnlog.engine.log.kafka import KafkaEventLog
from turnlog.engine.log.kafka_heard import RECORD_OVERHEAD, HeardRecords
from turnlog.engine.log.kafka_live import (
    KIND,
    OFFSET,
    ORIGIN,
    WHOLE_STATE_CHARS,
    KafkaLivePublisher,
    KafkaLiveSubscriber,
)
from turnlog.engine.log.kafka_topics import TopicNames
from turnlog.engine.log.kafka_written import WrittenValues
from turnlog.engine.log.sealing import PLAIN, Sealer
from turnlog.engine.stream import ModelDelta

PARTITIONS = 2
SID = "s-heard"


def snapshot(version: int, state_chars: int) -> ev.SnapshotTaken:
    fields = {**REQUIRED["SnapshotTaken"], "state_json": "x" * state_chars}
    return ev.SnapshotTaken(session_id=SID, version=version, **fields)  # type: ignore[arg-type]


def session(last: int, sid: str = SID) -> list[ev.Event]:
    """A session's events 1..``last``: created, a message, then a turn's model calls."""
    call: dict[str, Any] = {"session_id": sid, "turn_id": "t", "model": "m"}
    events: list[ev.Event] = [
        ev.SessionCreated(session_id=sid, version=1, agent_id="a", user_id="u"),
        ev.UserMessageReceived(session_id=sid, version=2, message_id="m1", text="hi"),
        ev.TurnStarted(session_id=sid, version=3, turn_id="t", message_id="m1"),
    ]
    for version in range(4, last + 1, 2):
        step = (version - 4) // 2
        events.append(
            ev.ModelCallStarted(version=version, step=step, message_count=1, tools_offered=0, **call)
        )
        events.append(ev.ModelCallFinished(version=version + 1, step=step, status="ok", **call))
    return events[:last]


@dataclass
class Pair:
    """An owner of every partition publishing its items, and a process owning none that hears
    them, wired as ``turnlog.distributed.LiveLinks`` wires them."""

    owner: KafkaEventLog
    gateway: KafkaEventLog
    publisher: KafkaLivePublisher
    items: AsyncIterator[Any]

    async def committed(self, events: list[ev.Event], *, told: list[ev.Event]) -> None:
        """Append ``events`` in the owner (one commit each two), publish ``told``, and wait until
        the gateway heard the last of them."""
        for start in range(0, len(events), 2):
            await self.owner.append(events[start : start + 2], expected_version=events[start].version - 1)
        for event in told:
            self.publisher.publish(event)
        await self.hear(told[-1].version)

    async def hear(self, version: int) -> None:
        """Wait until the gateway hears of the session's ``version``."""

        async def heard() -> None:
            async for item in self.items:  # an event, or a notice of one (Committed)
                if getattr(item, "version", None) == version:
                    return

        await asyncio.wait_for(heard(), 30)

    def partition_reads(self) -> list[int]:
        """The versions the gateway reads its partition through from now on."""
        return self._noted("read_through", lambda part, session_id, version: version)

    def partition_ends(self) -> list[int]:
        """The partitions the gateway's reader asks the broker for the end of from now on."""
        return self._noted("end", lambda partition: partition)

    def partition_catch_ups(self) -> list[int]:
        """The partitions the gateway's reader catches up from now on (each asks the broker)."""
        return self._noted("caught_up", lambda part: part.partition)

    def _noted(self, name: str, note: Callable[..., int]) -> list[int]:
        """What ``note`` makes of the arguments of each call of the gateway's reader's ``name``
        from now on (the call itself goes on as before)."""
        calls: list[int] = []
        method = getattr(self.gateway._reader, name)

        async def noted(*args: Any) -> Any:
            calls.append(note(*args))
            return await method(*args)

        setattr(self.gateway._reader, name, noted)
        return calls

    def decodes(self) -> list[bytes]:
        """The values the gateway decodes from now on."""
        values: list[bytes] = []
        decode = self.gateway.records.decode

        def counted(value: bytes) -> ev.Event:
            values.append(value)
            return decode(value)

        self.gateway.records.decode = counted  # type: ignore[method-assign]
        return values


@asynccontextmanager
async def owner_and_gateway(sealer: Sealer | None = None) -> AsyncIterator[Pair]:
    bootstrap = need_service("TURNLOG_KAFKA_BOOTSTRAP")
    async with kafka_log(
        bootstrap, partitions=PARTITIONS, admission=AdmissionRules(), sealer=sealer
    ) as owner:
        topic = owner.topics.events
        async with kafka_log(
            bootstrap, partitions=PARTITIONS, topic=topic, owner=False, sealer=sealer
        ) as gateway:
            worker_side, gateway_side = LiveLinks(), LiveLinks()  # as turnlog worker and serve wire them
            await gateway_side.start(gateway, publish=False)
            await worker_side.start(owner, publish=True, subscribe=False)
            publisher, subscriber = worker_side.publisher, gateway_side.subscriber
            assert isinstance(publisher, KafkaLivePublisher) and isinstance(subscriber, KafkaLiveSubscriber)
            try:
                pair = Pair(owner, gateway, publisher, subscriber.items())
                await pair.committed(session(3), told=session(3))
                assert len(await gateway.read_session_records(SID)) == 3  # its index holds 1-3
                yield pair
            finally:
                await worker_side.close()
                await gateway_side.close()


def as_the_log_has_them(records: list[LogRecord]) -> list[tuple[int, int, ev.Event]]:
    return [(r.partition, r.offset, r.event) for r in records]


async def test_the_events_the_owner_named_are_served_as_the_partition_holds_them() -> None:
    async with owner_and_gateway() as pair:
        events = session(7)
        await pair.committed(events[3:], told=events[3:])
        reads = pair.partition_reads()

        served = await pair.gateway.read_session_records_through(SID, 1, 7)

        assert as_the_log_has_them(served) == as_the_log_has_them(
            await pair.owner.read_session_records(SID, 1)
        )
        assert [r.event.version for r in await pair.gateway.read_session_records_through(SID, 5, 7)] == [6, 7]
        assert reads == []


async def test_a_snapshot_is_heard_whole_unless_its_state_is_large() -> None:
    async with owner_and_gateway() as pair:
        small, large = snapshot(4, 1_000), snapshot(5, WHOLE_STATE_CHARS + 1)
        await pair.committed([small, large], told=[small, large])
        reads = pair.partition_reads()

        assert [r.event for r in await pair.gateway.read_session_records_through(SID, 3, 4)] == [small]
        assert reads == []
        assert [r.event for r in await pair.gateway.read_session_records_through(SID, 4, 5)] == [large]
        assert reads == [5]


async def test_what_the_owner_sequenced_from_the_inbox_is_heard_too() -> None:
    async with owner_and_gateway() as pair:
        reads = pair.partition_reads()
        await pair.gateway.submit(
            ev.UserMessageReceived(session_id=SID, version=0, message_id="m2", text="and?")
        )
        await pair.hear(4)

        served = await pair.gateway.read_session_records_through(SID, 3, 4)

        assert as_the_log_has_them(served) == as_the_log_has_them(
            await pair.owner.read_session_records(SID, 3)
        )
        assert [r.event.type for r in served] == ["UserMessageReceived"]
        assert reads == []


async def test_a_gap_in_what_was_heard_is_read_from_the_partition() -> None:
    async with owner_and_gateway() as pair:
        events = session(5)
        await pair.committed(events[3:], told=events[4:])  # version 4 was never heard
        reads = pair.partition_reads()

        served = await pair.gateway.read_session_records_through(SID, 3, 5)

        assert as_the_log_has_them(served) == as_the_log_has_them(
            await pair.owner.read_session_records(SID, 3)
        )
        assert reads == [5]


async def test_a_session_found_erased_keeps_nothing_heard(tmp_path: Path) -> None:
    cipher = ContentCipher(SqliteKeyStore(tmp_path / "keys.db"), random_master())
    async with owner_and_gateway(sealer=cipher) as pair:
        events = session(5)
        await pair.committed(events[3:], told=events[3:])
        reads = pair.partition_reads()

        cipher.forget(SID)  # what the gateway's codec does when it reads the session's erasure
        await pair.gateway.read_session_records_through(SID, 3, 5)

        assert reads == [5]
    cipher.close()


async def test_a_submission_from_a_gateway_is_answered_by_what_its_owner_named() -> None:
    """A gateway's submission is pending until the partition's owner sequences it; the owner
    names the sequenced event on the live topic, which wakes the wait for it and answers it
    without a read of the partition."""
    async with owner_and_gateway() as pair:
        message = ev.UserMessageReceived(session_id=SID, version=0, message_id="m4", text="and?")
        waiting = asyncio.ensure_future(pair.gateway.wait_for_session(SID, 30))
        await asyncio.sleep(0)  # waiting to hear of the session from now on
        (pending,) = await pair.gateway.submit(message)
        assert pending.pending
        await pair.hear(4)  # the gateway's subscriber reads on (its live feed does, in a gateway)
        await asyncio.wait_for(waiting, 10)  # woken by what was heard, long before its 30 s
        reads = pair.partition_catch_ups()

        found = await pair.gateway.sequenced(pending, 10)

        assert as_the_log_has_them([found]) == as_the_log_has_them(
            await pair.owner.read_session_records(SID, 3)
        )
        assert reads == []


async def test_a_session_its_owner_named_is_read_whole_before_the_broker_end_reaches_it() -> None:
    """What ``sequenced`` answered from the live topic, every later read of the session has,
    though the broker's end for the partition, asked for before the commit's markers land, is
    still short of it (the gateway's fork read the new session back empty that way, and
    answered 500): the read goes on through the version heard."""
    async with owner_and_gateway() as pair:
        sid = "s-new"
        await stale_end(pair.gateway, pair.gateway.partition_of(sid))
        created = ev.SessionCreated(session_id=sid, version=0, agent_id="a", user_id="u")
        (pending,) = await pair.gateway.submit(created)
        await pair.hear(1)  # the only session that gets a version 1 from now on
        found = await pair.gateway.sequenced(pending, 10)
        assert found is not None and found.event.version == 1
        reads = pair.partition_reads()

        assert [r.event for r in await pair.gateway.read_session_records(sid)] == [found.event]
        assert await pair.gateway.read_session(sid) == [found.event]
        assert await pair.gateway.session_version(sid) == 1
        assert reads == []  # answered by what was heard, without waiting for the markers

        # markers slower than the read waits for them: the records heard answer
        pair.gateway._reader.read_through = gives_up  # type: ignore[method-assign]
        message = ev.UserMessageReceived(session_id=sid, version=0, message_id="m1", text="hi")
        (pending,) = await pair.gateway.submit(message)
        await pair.hear(2)
        found = await pair.gateway.sequenced(pending, 10)
        assert found is not None and found.event.version == 2
        assert [r.event.version for r in await pair.gateway.read_session_records(sid)] == [1, 2]
        assert [e.version for e in await pair.gateway.read_session(sid, 1)] == [2]
        assert await pair.gateway.session_version(sid) == 2


async def test_a_read_of_a_session_reads_the_partition_on_through_a_gap_in_what_was_heard() -> None:
    async with owner_and_gateway() as pair:
        await stale_end(pair.gateway, pair.gateway.partition_of(SID))
        events = session(5)
        await pair.committed(events[3:], told=events[4:])  # version 4 was never heard
        reads = pair.partition_reads()

        served = await pair.gateway.read_session_records(SID, 3)

        assert as_the_log_has_them(served) == as_the_log_has_them(
            await pair.owner.read_session_records(SID, 3)
        )
        assert reads == [5]


async def test_a_session_created_elsewhere_a_moment_ago_is_read_once_its_markers_land() -> None:
    """The broker tells an owner its commit succeeded before it writes the commit's markers, and
    until it has, the end a read_committed reader is given stops short of the commit. A process
    that heard nothing of the new session (a gateway a client turns to right after creating it
    through another) reads once what was in flight is resolved: not "no such session"."""
    async with owner_and_gateway() as pair:
        sid = "s-elsewhere"
        markers_land = await late_markers(pair.gateway, pair.gateway.partition_of(sid))
        created = ev.SessionCreated(session_id=sid, version=1, agent_id="a", user_id="u")
        await pair.owner.append([created], expected_version=0)  # not published: never heard
        asyncio.get_running_loop().call_later(0.05, markers_land)

        assert await pair.gateway.read_session(sid) == [created]


async def test_a_session_no_one_created_reads_as_none_without_waiting_for_markers() -> None:
    async with owner_and_gateway() as pair:
        sid = "s-nowhere"
        ends = pair.partition_ends()

        assert await pair.gateway.read_session(sid) == []
        assert await pair.gateway.read_session(SID, 3) == []  # a session it knows: no settling
        assert ends == [pair.gateway.partition_of(sid)] * 2 + [pair.gateway.partition_of(SID)]


async def test_a_partition_the_publisher_cannot_send_to_holds_back_only_its_own_items(
    monkeypatch: Any,
) -> None:
    """The publisher sends each partition's items as batches, and a partition's next batch waits
    until its last was sent: one partition whose leader cannot be reached (moving after a broker
    restart) must not stop the live items of the others."""
    async with owner_and_gateway() as pair:
        stuck, free = (
            next(f"s-{i}" for i in range(99) if pair.owner.partition_of(f"s-{i}") == p) for p in (0, 1)
        )
        reachable, send = asyncio.Event(), kafka_live.send_batches

        async def leaderless(producer: Any, topic: str, partition: int, records: Any) -> Any:
            if partition == 0:
                await reachable.wait()
            return await send(producer, topic, partition, records)

        monkeypatch.setattr(kafka_live, "send_batches", leaderless)
        pair.publisher.publish(ModelDelta(stuck, "t", 1, "held back"))
        pair.publisher.publish(ModelDelta(free, "t", 1, "goes out"))

        first = await asyncio.wait_for(anext(pair.items), 30)
        assert (first.session_id, first.text) == (free, "goes out")
        reachable.set()
        second = await asyncio.wait_for(anext(pair.items), 30)
        assert (second.session_id, second.text) == (stuck, "held back")
        assert pair.publisher.dropped == 0


def session_in(log: KafkaEventLog, partition: int) -> str:
    return next(sid for sid in (f"s-{i}" for i in range(99)) if log.partition_of(sid) == partition)


async def late_markers(gateway: KafkaEventLog, partition: int) -> Callable[[], None]:
    """The gateway's reader is told the partition ends where it ends now until the returned
    function is called: a commit from now on is past that end until its markers land."""
    reader, landed = gateway._reader, asyncio.Event()
    end = reader.end
    now = await end(partition)

    async def until_landed(p: int) -> int:
        return now if p == partition and not landed.is_set() else await end(p)

    reader.end = until_landed  # type: ignore[method-assign]
    return landed.set


async def gives_up(part: Any, session_id: str, version: int) -> None:
    """A read on through a version that ends before the partition's reader has it."""


async def stale_end(gateway: KafkaEventLog, partition: int) -> None:
    """From now on the gateway's reader is told the partition ends where it ends now, as a
    read_committed reader is until a commit's markers land."""
    reader = gateway._reader
    end = reader.end
    now = await end(partition)

    async def as_before(p: int) -> int:
        return now if p == partition else await end(p)

    reader.end = as_before  # type: ignore[method-assign]


async def test_a_record_heard_is_not_decoded_again_when_the_partition_is_read(tmp_path: Path) -> None:
    """Sealed, an event encoded twice differs (a fresh nonce each time): the gateway recognises
    the records its reader fetches only because the owner sent the bytes it wrote."""
    cipher = ContentCipher(SqliteKeyStore(tmp_path / "keys.db"), random_master())
    async with owner_and_gateway(sealer=cipher) as pair:
        events = [  # what a cipher seals: message text
            ev.UserMessageReceived(session_id=SID, version=v, message_id=f"m{v}", text=f"more {v}")
            for v in range(4, 8)
        ]
        await pair.committed(events, told=events)
        decoded = pair.decodes()

        read = await pair.gateway.read_session_records(SID, 3)  # the reader fetches the partition

        assert as_the_log_has_them(read) == as_the_log_has_them(await pair.owner.read_session_records(SID, 3))
        assert decoded == []
    cipher.close()


def test_an_owner_keeps_what_it_wrote_for_its_publisher_once_asked_and_within_its_budget() -> None:
    written = WrittenValues(budget_bytes=250)
    first, second, third = (LogRecord(0, offset, event) for offset, event in enumerate(session(3)))
    written.add([first], [b"1" * 100])
    assert written.take(first) is None  # nobody had asked: nothing was kept
    written.add([first, second, third], [b"1" * 100, b"2" * 100, b"3" * 100])
    assert written.weight <= 250 and written.take(first) is None  # the oldest went first
    assert written.take(second) == b"2" * 100 and written.take(second) is None  # taken once
    assert written.take(third) == b"3" * 100 and written.weight == 0


def test_what_is_heard_is_bounded_by_weight_the_oldest_going_first() -> None:
    heard = HeardRecords(budget_bytes=3 * (2 * 100 + RECORD_OVERHEAD))
    for sid in ("a", "b"):
        for event in session(2, sid):
            heard.add(LogRecord(0, 0, event), b"x" * 100)
    assert heard.weight <= heard.budget_bytes
    assert heard.beyond("a", 0, 0) == []  # its version 1 went first
    assert [r.event.version for r in heard.beyond("a", 1, 1)] == [2]
    assert [r.event.version for r in heard.beyond("b", 0, 0)] == [1, 2]


def test_an_unreadable_offset_leaves_the_event_a_notice() -> None:
    """An event whose offset header cannot be read still reaches the hub (its streams read it
    from the log); only a readable offset makes it a record heard."""
    kept: list[tuple[LogRecord, bytes]] = []
    subscriber = KafkaLiveSubscriber("", TopicNames("t"), PARTITIONS, heard=lambda r, n: kept.append((r, n)))
    event = session(1)[0]
    value = PLAIN.encode(event)

    def received(offset: bytes) -> Any:
        headers = [(KIND, b"event"), (ORIGIN, b"owner"), (OFFSET, offset)]
        return subscriber._decoded(SimpleNamespace(key=SID.encode(), value=value, headers=headers))

    assert received(b"12") == event
    assert [(r.offset, r.event, v) for r, v in kept] == [(12, event, value)]
    assert received(b"x12") == event
    assert len(kept) == 1
