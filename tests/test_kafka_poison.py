"""Poison on the Kafka events topic (engine/log/kafka_poison.py), on a real broker: records a
foreign producer wrote straight to the events topic that do not decode or break their
session's fold go to the dead-letter topic with the reason, their sessions go to ERROR with
it (on the log and in the projections), and the partition keeps moving for other sessions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaProducer

from tests.services import kafka_log, need_service, postgres_store, read_topic, read_topic_once
from tests.test_kafka_requests import until_logged
from turnlog.consumers import Projector, TurnWorker
from turnlog.engine import (
    Agent,
    AgentDirectory,
    AgentSessions,
    FunctionModel,
    SessionStatus,
    call,
    codec,
    fold,
    reply,
    tool,
)
from turnlog.engine import events as ev
from turnlog.engine.errors import ConcurrencyError
from turnlog.engine.log.kafka import KafkaEventLog
from turnlog.engine.models.base import ModelRequest, ModelResponse

AGENT = "plain"


@pytest.fixture
async def owner(bootstrap: str) -> AsyncIterator[KafkaEventLog]:
    async with kafka_log(bootstrap, partitions=1) as log:  # one partition: every session shares it
        yield log


def worker(log: KafkaEventLog) -> TurnWorker:
    agent = Agent(AGENT, FunctionModel(lambda request: f"answered {request.messages[-1].content}"), [])
    return TurnWorker(log, AgentDirectory([agent]), worker_id="w")


async def create(log: KafkaEventLog, sid: str) -> None:
    await log.submit(ev.SessionCreated(session_id=sid, version=1, agent_id=AGENT, user_id="u"))


async def say(log: KafkaEventLog, sid: str, text: str) -> None:
    await log.submit(ev.UserMessageReceived(session_id=sid, version=0, message_id=ev.new_id(), text=text))


async def turns_until(w: TurnWorker, log: KafkaEventLog, sid: str, turns: int) -> None:
    for _ in range(200):
        await w.poll_once()
        if fold(sid, await log.read_session(sid)).turns_finished >= turns:
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"{sid} did not finish {turns} turns")


async def wait_status(log: KafkaEventLog, sid: str, status: SessionStatus) -> list[ev.Event]:
    for _ in range(200):
        events = await log.read_session(sid)
        if fold(sid, events).status == status:
            return events
        await asyncio.sleep(0.05)
    pytest.fail(f"{sid} never reached {status}: {[e.type for e in await log.read_session(sid)]}")


def unknown_fingerprint(event: ev.Event) -> bytes:
    value = codec.encode(event)
    return value[:2] + bytes(8) + value[10:]  # C3 01 + a fingerprint nobody wrote + the body


async def test_poison_on_the_events_topic_is_dead_lettered_and_errors_only_its_session(
    owner: KafkaEventLog, bootstrap: str
) -> None:
    w = worker(owner)
    for sid in ("wrong-state", "out-of-order", "unknown-schema", "bystander"):
        await create(owner, sid)
    await say(owner, "bystander", "one")
    await turns_until(w, owner, "bystander", 1)

    wrong_state = ev.StateChanged(
        session_id="wrong-state",
        version=2,
        from_state="PROCESSING",
        to_state="FINISHED",
        cause="model_answer",
    )
    out_of_order = ev.UserMessageReceived(session_id="out-of-order", version=7, message_id="m", text="late")
    foreign = ev.UserMessageReceived(session_id="unknown-schema", version=2, message_id="m", text="x")
    raw = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await raw.start()
    try:
        sent = {
            sid: await raw.send_and_wait(owner.topics.events, value, key=sid.encode(), partition=0)
            for sid, value in [
                ("wrong-state", codec.encode(wrong_state)),
                ("out-of-order", codec.encode(out_of_order)),
                ("unknown-schema", unknown_fingerprint(foreign)),
            ]
        }
    finally:
        await raw.stop()

    await say(owner, "bystander", "two")  # the partition keeps moving for the others
    await turns_until(w, owner, "bystander", 2)
    reasons = {
        "wrong-state": "leaves PROCESSING but the session is in IDLE",
        "out-of-order": "has version 7, expected 2",
        "unknown-schema": "schema",
    }
    for sid, reason in reasons.items():
        events = await wait_status(owner, sid, SessionStatus.ERROR)
        assert [e.type for e in events] == ["SessionCreated", "StateChanged"]
        error = events[1]
        assert isinstance(error, ev.StateChanged) and error.cause == "poison_record"
        source = f"{owner.topics.events}/0/{sent[sid].offset}"
        assert source in error.detail and reason in error.detail, error.detail

    dead = await read_topic(bootstrap, owner.topics.dead_letter, 0)
    by_key = {d.key.decode(): d for d in dead}
    assert sorted(by_key) == sorted(reasons) and len(dead) == 3
    for sid, reason in reasons.items():
        headers = dict(by_key[sid].headers)
        assert reason in headers["turnlog.reason"].decode()
        assert headers["turnlog.source"].decode() == f"{owner.topics.events}/0/{sent[sid].offset}"
    assert by_key["unknown-schema"].value == unknown_fingerprint(foreign)

    # a reader that owns nothing skips the same records and sees the same sessions
    async with kafka_log(bootstrap, partitions=1, topic=owner.topics.events, owner=False) as reader:
        for sid in [*reasons, "bystander"]:
            assert await reader.read_session(sid) == await owner.read_session(sid)
        with postgres_store(need_service("TURNLOG_POSTGRES_DSN")) as store:
            await Projector(reader, store).catch_up()
            status = {row["session_id"]: row["current_state"] for row in store.table("sessions")}
            assert status == {**dict.fromkeys(reasons, "ERROR"), "bystander": "FINISHED"}
            details = [r["detail"] for r in store.table("state_changes") if r["cause"] == "poison_record"]
            on_log = [(await owner.read_session(sid))[1] for sid in reasons]
            assert sorted(details) == sorted(e.detail for e in on_log if isinstance(e, ev.StateChanged))


async def test_a_new_owner_does_not_dead_letter_handled_poison_again(
    owner: KafkaEventLog, bootstrap: str
) -> None:
    await create(owner, "victim")
    raw = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await raw.start()
    try:
        await raw.send_and_wait(owner.topics.events, b"\x00junk", key=b"victim", partition=0)
    finally:
        await raw.stop()
    await wait_status(owner, "victim", SessionStatus.ERROR)
    await owner.close()  # hand the partition over
    async with kafka_log(bootstrap, partitions=1, topic=owner.topics.events) as successor:
        await asyncio.sleep(2.5)  # a few of the successor's tail rounds
        assert [e.type for e in await successor.read_session("victim")] == ["SessionCreated", "StateChanged"]
    assert len(await read_topic(bootstrap, owner.topics.dead_letter, 0)) == 1


async def test_a_session_mid_turn_gets_its_error_when_the_turn_ends(
    owner: KafkaEventLog, bootstrap: str
) -> None:
    release = asyncio.Event()

    @tool(timeout_s=30)
    async def export(table: str) -> str:
        """A long export."""
        await release.wait()
        return "exported"

    def decide(request: ModelRequest) -> ModelResponse | str:
        return (
            "done" if request.messages[-1].role == "tool" else reply("", call("export", {"table": "t"}, "x1"))
        )

    api = AgentSessions(owner, AgentDirectory([Agent(AGENT, FunctionModel(decide), [export])]), producer="w")
    sid = (await api.create_session(AGENT, "u")).session_id
    running = asyncio.create_task(_drain(api, sid, "export"))
    await until_logged(owner, sid, ev.ToolCallStarted)
    raw = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await raw.start()
    try:
        await raw.send_and_wait(owner.topics.events, b"\x00junk", key=sid.encode(), partition=0)
    finally:
        await raw.stop()
    await asyncio.sleep(2.5)  # a few of the owner's tail rounds: the poison waits for the turn
    assert await read_topic_once(bootstrap, owner.topics.dead_letter, 0) == []
    release.set()
    await asyncio.wait_for(running, 30)
    events = await wait_status(owner, sid, SessionStatus.ERROR)
    assert [e.type for e in events[-3:]] == ["TurnFinished", "SnapshotTaken", "StateChanged"]
    error = events[-1]
    assert isinstance(error, ev.StateChanged) and (error.from_state, error.cause) == (
        "FINISHED",
        "poison_record",
    )
    (dead,) = await read_topic(bootstrap, owner.topics.dead_letter, 0)
    assert dead.value == b"\x00junk" and "not a turnlog event" in error.detail


async def _drain(api: AgentSessions, sid: str, text: str) -> None:
    async for _ in api.send_user_message(sid, text):
        pass


async def test_an_owner_append_that_lost_its_versions_to_a_foreign_record_is_the_poison(
    owner: KafkaEventLog, bootstrap: str
) -> None:
    """The rule is the same for every record: the first valid event at a version wins, even a
    foreign one; the owner's own append at that version is refused and dead-lettered."""
    await create(owner, "raced")
    foreign = ev.UserMessageReceived(
        session_id="raced", version=2, message_id="m", text="straight to the topic"
    )
    raw = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await raw.start()
    try:
        await raw.send_and_wait(owner.topics.events, codec.encode(foreign), key=b"raced", partition=0)
    finally:
        await raw.stop()
    mine = ev.CancelRequested(session_id="raced", version=2, reason="stop", actor="user")
    with pytest.raises(ConcurrencyError):
        await owner.append([mine], expected_version=1)
    events = await wait_status(owner, "raced", SessionStatus.ERROR)
    assert [e.event_id for e in events[:2]] == [events[0].event_id, foreign.event_id]
    (dead,) = await read_topic(bootstrap, owner.topics.dead_letter, 0)
    assert codec.decode(dead.value) == mine
    assert "has version 2, expected 3" in dict(dead.headers)["turnlog.reason"].decode()
    async with kafka_log(bootstrap, partitions=1, topic=owner.topics.events, owner=False) as reader:
        assert await reader.read_session("raced") == events
