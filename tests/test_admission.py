"""The admission rules (engine/admission.py): one rule for what a submission becomes, applied
where a process appends itself and by a Kafka owner to what others submit; and what a Kafka
owner that was handed no rules does with a record that needs them (it waits, in order)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from decimal import Decimal
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from tests.services import kafka_log, need_service
from turnlog.engine import Agent, AgentDirectory, AgentSessions, EventLog, Model
from turnlog.engine import events as ev
from turnlog.engine.admission import AdmissionRules
from turnlog.engine.fold import SessionState, fold
from turnlog.engine.log import kafka_sequencer
from turnlog.engine.log.base import Admitted, LogRecord, Refused
from turnlog.engine.log.kafka import KafkaEventLog
from turnlog.engine.log.kafka_inbox import plain
from turnlog.engine.models.base import ModelChunk, ModelRequest, TextDelta
from turnlog.engine.models.pricing import Price, PriceTable
from turnlog.engine.models.tokens import count_chat_tokens

WAIT_S = 30.0
PRICES = PriceTable({"stuck": Price(Decimal("3"), Decimal("0.3"), Decimal("15"))})
Reopen = Callable[[], AbstractAsyncContextManager[EventLog]]


class Stuck(Model):
    """Streams a first part of its answer and then never finishes (a provider that hangs)."""

    name = "stuck"

    def __init__(self) -> None:
        self.streaming = asyncio.Event()

    async def estimate_input_tokens(self, request: ModelRequest) -> int:
        return count_chat_tokens(self.token_counter, request.messages, request.tools)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        yield TextDelta("Let me think")
        self.streaming.set()
        await asyncio.Event().wait()


async def until(what: str, condition: Callable[[], Awaitable[bool]]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not await condition():
        if loop.time() > deadline:
            raise AssertionError(f"{what}: not within {WAIT_S:g} s")
        await asyncio.sleep(0.05)


async def test_a_force_finish_from_another_process_prices_the_model_call_it_cuts_off(
    log: EventLog, reopen: Reopen
) -> None:
    """On Kafka the other process owns no partition: the owner admits its close by the rules its
    AgentSessions handed over, which know the agents' prices; on SQLite the other process
    applies the same rules itself. Either way the open call is recorded priced."""
    model = Stuck()
    agents = AgentDirectory([Agent("a", model, [], prices=PRICES)])
    api = AgentSessions(log, agents)
    sid = (await api.create_session("a", "u")).session_id
    turn = asyncio.create_task(_drain(api, sid, "what is late?"))
    try:
        await asyncio.wait_for(model.streaming.wait(), WAIT_S)
        async with reopen() as other_log:
            info = await AgentSessions(other_log, agents, producer="ops").force_finish(
                sid, "stuck", actor="ops"
            )
    finally:
        turn.cancel()
        with pytest.raises(asyncio.CancelledError):
            await turn
    assert info.status == "FINISHED"
    events = await log.read_session(sid)
    (started,) = [e for e in events if isinstance(e, ev.ModelCallStarted)]
    (finished,) = [e for e in events if isinstance(e, ev.ModelCallFinished)]
    assert (finished.status, finished.estimated, finished.error) == (
        "cancelled",
        True,
        "closed by ops: stuck",
    )
    assert finished.input_tokens == started.estimated_input_tokens > 0
    assert finished.cost_micros == PRICES.cost_micros("stuck", finished.input_tokens, 0) > 0
    assert fold(sid, events).cost_micros == finished.cost_micros


async def _drain(api: AgentSessions, sid: str, text: str) -> None:
    async for _ in api.send_user_message(sid, text):
        pass


def session(*events: ev.Event) -> SessionState:
    return fold("s", events)


CREATED = ev.SessionCreated(session_id="s", version=1, agent_id="a", user_id="u")
CLOSED = ev.SessionClosed(session_id="s", version=2, reason="done", actor="ops")


def message(text: str = "hi") -> ev.UserMessageReceived:
    return ev.UserMessageReceived(session_id="s", version=0, message_id=ev.new_id(), text=text, user_id="u")


def test_without_rules_the_log_takes_only_what_needs_none() -> None:
    """A Kafka owner handed no rules takes a new session, a message or a model call's usage for
    an open session, at its next version; it refuses what no rule could take; the rest waits
    (None) for the rules."""
    usage = ev.AuxiliaryModelCall(
        session_id="s", version=0, turn_id="", purpose="summary", model="m", status="ok"
    )
    taken = plain(session(CREATED), message())
    assert isinstance(taken, Admitted) and [e.version for e in taken.events] == [2]
    assert isinstance(plain(session(CREATED), usage), Admitted)
    assert isinstance(plain(SessionState("s"), CREATED), Admitted)
    assert isinstance(plain(session(CREATED), CREATED), Refused)  # the session exists
    assert isinstance(plain(SessionState("s"), message()), Refused)  # no such session
    forked = ev.SessionForked(
        session_id="s",
        version=1,
        origin_session_id="o",
        origin_version=4,
        agent_id="a",
        model="m",
        state_format=6,
        state_json="{}",
        unfinished="rest",
    )
    decided = ev.ApprovalDecided(
        session_id="s", version=0, turn_id="t", call_id="c", decision="approved", arguments_json="{}"
    )
    waiting = [
        plain(session(CREATED), ev.SessionClosed(session_id="s", version=0, reason="r", actor="ops")),
        plain(session(CREATED), ev.CancelRequested(session_id="s", version=0, reason="r")),
        plain(session(CREATED), decided),
        plain(session(CREATED), ev.BudgetDecided(session_id="s", version=0, turn_id="t", decision="stop")),
        plain(SessionState("s"), forked),
        plain(session(CREATED, CLOSED), message()),  # the rules take it and drop it
        plain(session(CREATED, CLOSED), usage),
    ]
    assert waiting == [None] * len(waiting)


def test_the_rules_take_a_message_to_a_closed_session_and_drop_it() -> None:
    """What a writer finds when a message reaches a session closed after its sender checked."""
    state = session(CREATED, CLOSED)
    admission = AdmissionRules().admit(state, message("late"), lambda after: [])
    assert isinstance(admission, Admitted)
    assert [(e.type, e.version) for e in admission.events] == [
        ("UserMessageReceived", 3),
        ("UserMessageDropped", 4),
    ]
    assert state.version == 2 and not state.inbox, "the rules never change the state they are given"
    refused = AdmissionRules().admit(
        state, ev.CancelRequested(session_id="s", version=0, reason="r"), lambda after: []
    )
    assert isinstance(refused, Refused) and "closed (done)" in str(refused.error)


async def test_a_kafka_owner_without_rules_holds_a_request_and_what_follows_until_given_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cancel reaches an owner that was handed no rules: it waits in the inbox, and so does
    the message posted after it (nothing is reordered); the owner says why it is not ready once
    what came before the cancel is on the log (its transactions slowed down here, as on a busy
    machine). Once the rules are handed over, the cancel (dropping the waiting message) and
    then the new message are sequenced, in order, and nothing went to the dead-letter topic."""
    bootstrap = need_service("TURNLOG_KAFKA_BOOTSTRAP")
    transact = kafka_sequencer.transact

    async def slow_transact(*args: Any, **kwargs: Any) -> list[LogRecord]:
        await asyncio.sleep(0.3)
        return await transact(*args, **kwargs)

    monkeypatch.setattr(kafka_sequencer, "transact", slow_transact)
    async with kafka_log(bootstrap, partitions=1) as owner:
        async with kafka_log(bootstrap, partitions=1, topic=owner.topics.events, owner=False) as producer:
            await producer.submit(CREATED)
            first = message("first")
            for submitted in (
                first,
                ev.CancelRequested(session_id="s", version=0, reason="stop"),
                message("then"),
            ):
                await producer.submit(submitted)

            async def waits() -> bool:
                return "needs the admission rules" in (await owner.readiness_problem() or "")

            await until("the owner reports the waiting cancel", waits)
            assert [e.type for e in await owner.read_session("s")] == [
                "SessionCreated",
                "UserMessageReceived",
            ]
            owner.admit_with(AdmissionRules())

            async def sequenced() -> bool:
                return len(await owner.read_session("s")) == 5

            await until("the cancel and the message after it sequenced", sequenced)
            events = await owner.read_session("s")
            assert [e.type for e in events] == [
                "SessionCreated",
                "UserMessageReceived",
                "CancelRequested",
                "UserMessageDropped",
                "UserMessageReceived",
            ]
            assert events[3].message_id == first.message_id  # type: ignore[attr-defined]
            assert events[4].text == "then"  # type: ignore[attr-defined]
            assert await owner.readiness_problem() is None
        assert await _dead_letters(owner) == 0


async def _dead_letters(owner: KafkaEventLog) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=owner.bootstrap, isolation_level="read_committed")
    await consumer.start()
    try:
        tp = TopicPartition(owner.topics.dead_letter, 0)
        return int((await consumer.end_offsets([tp]))[tp])
    finally:
        await consumer.stop()
