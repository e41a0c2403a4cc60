"""A cancel drops the messages waiting for a turn (interrupts.add_cancel): every message received
and not yet taken when the cancel is applied gets a UserMessageDropped (reason ``cancelled``) in
the cancel's commit, and the running turn, if any, stops as before. With neither a turn nor a
waiting message the cancel is refused (NoTurnRunningError) and nothing is appended. A turn that
loses the race to a cancel never answers its message. Both backends; on Kafka the cancel from a
process that does not own the partition goes through the inbox and the owner applies it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from turnlog.consumers import TurnWorker
from turnlog.engine import (
    Agent,
    AgentDirectory,
    AgentSessions,
    EventLog,
    FunctionModel,
    ModelRequest,
    call,
    reply,
    tool,
)
from turnlog.engine import events as ev
from turnlog.engine.errors import ConcurrencyError, NoTurnRunningError
from turnlog.engine.interrupts import Rebaser
from turnlog.engine.log.kafka import KafkaEventLog
from turnlog.engine.states import Cause, SessionStatus
from turnlog.engine.writer import SessionWriter

WAIT = 30.0


def answer(request: ModelRequest) -> Any:
    """Asks for the slow export for 'export ...', answers everything else at once."""
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    asked = request.messages[last_user].content
    if asked.startswith("export") and not any(m.role == "tool" for m in request.messages[last_user:]):
        return reply("", call("export", {"table": "orders"}, f"x{last_user}"))
    return f"answer to {asked}"


def directory(release: asyncio.Event) -> AgentDirectory:
    @tool(timeout_s=WAIT * 2)
    async def export(table: str) -> str:
        """A long export."""
        await asyncio.wait_for(release.wait(), WAIT)
        return f"exported {table}"

    return AgentDirectory([Agent.build("a", FunctionModel(answer), [export])])


def of(events: list[ev.Event], cls: type[ev.E]) -> list[ev.E]:
    return [e for e in events if isinstance(e, cls)]


async def logged(log: EventLog, sid: str, ready: Callable[[list[ev.Event]], bool]) -> list[ev.Event]:
    """The session's events once ``ready`` holds for them (another task or process writes)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not ready(events := await log.read_session(sid)):
        assert loop.time() < deadline, [e.type for e in events]
        await log.wait_for_append(0.2)
    return events


async def test_a_cancel_before_any_turn_drops_the_waiting_messages(
    log: EventLog, reopen: Callable[[], AbstractAsyncContextManager[EventLog]]
) -> None:
    agents = directory(asyncio.Event())
    api = AgentSessions(log, agents, producer="gateway")
    sid = (await api.create_session("a", "u")).session_id
    first = (await api.post_user_message(sid, "where is A-17?", message_id="m-1")).event
    second = (await api.post_user_message(sid, "and A-18?", message_id="m-2")).event
    cancelled = await api.cancel(sid, "wrong session")

    assert (cancelled.stopped_turn, [d.message_id for d in cancelled.dropped]) == (None, ["m-1", "m-2"])
    events = await log.read_session(sid)
    cancel, *drops = events[second.version :]
    assert cancel == cancelled.request and drops == list(cancelled.dropped)
    detail = "cancelled by user before a turn took this message: wrong session"
    assert [(d.message_id, d.reason, d.detail, d.causation_id) for d in drops] == [
        ("m-1", "cancelled", detail, cancel.event_id),
        ("m-2", "cancelled", detail, cancel.event_id),
    ]
    assert not (await api.get_state(sid)).inbox and first.version < cancel.version

    await TurnWorker(log, agents, worker_id="w1").poll_once()  # the records give it nothing to do
    assert of(await log.read_session(sid), ev.TurnStarted) == []
    before = await log.session_version(sid)
    with pytest.raises(NoTurnRunningError):  # nothing runs and nothing waits now
        await api.cancel(sid)
    async with reopen() as other_log:  # on Kafka: through the inbox, the owner finds nothing
        with pytest.raises(NoTurnRunningError):
            await AgentSessions(other_log, agents, producer="tab-2").cancel(sid)
    after = [e.type for e in await log.read_session(sid, before)]
    assert after == (["CancelRequested"] if isinstance(log, KafkaEventLog) else [])  # it stops nothing

    await api.post_user_message(sid, "where is A-19?", message_id="m-3")
    await TurnWorker(log, agents, worker_id="w1").poll_once()
    events = await logged(log, sid, lambda es: bool(of(es, ev.TurnFinished)))
    assert [(t.message_id, t.reason) for t in of(events, ev.TurnFinished)] == [("m-3", "answered")]


async def test_a_cancel_right_after_a_post_from_another_process_drops_it(
    log: EventLog, reopen: Callable[[], AbstractAsyncContextManager[EventLog]]
) -> None:
    """The post and the cancel come from a process that may not have the message on its read of
    the log yet (on Kafka: both go through the inbox); the owner applies them in order."""
    agents = directory(asyncio.Event())
    sid = (await AgentSessions(log, agents).create_session("a", "u")).session_id
    async with reopen() as other_log:
        tab = AgentSessions(other_log, agents, producer="tab-2")
        await logged(other_log, sid, bool)
        await tab.post_user_message(sid, "hello", message_id="m-1")
        cancelled = await tab.cancel(sid, "oops")
    assert (cancelled.stopped_turn, [d.message_id for d in cancelled.dropped]) == (None, ["m-1"])
    events = await log.read_session(sid)
    assert [e.type for e in events] == [
        "SessionCreated",
        "UserMessageReceived",
        "CancelRequested",
        "UserMessageDropped",
    ]
    assert events[2].event_id == cancelled.request.event_id and events[2].producer == "tab-2"
    await TurnWorker(log, agents, worker_id="w1").poll_once()
    assert of(await log.read_session(sid), ev.TurnStarted) == []


async def test_a_cancel_stops_the_turn_and_drops_the_messages_waiting_behind_it(log: EventLog) -> None:
    release = asyncio.Event()
    agents = directory(release)
    api = AgentSessions(log, agents, producer="gateway")
    sid = (await api.create_session("a", "u")).session_id
    await api.post_user_message(sid, "export the orders", message_id="m-1")
    worker = TurnWorker(log, agents, worker_id="w1")
    running = asyncio.create_task(worker.run())
    try:
        events = await logged(log, sid, lambda es: bool(of(es, ev.ToolCallStarted)))
        (turn,) = of(events, ev.TurnStarted)
        await api.post_user_message(sid, "and the invoices", message_id="m-2")
        cancelled = await api.cancel(sid, "enough")
        assert (cancelled.stopped_turn, [d.message_id for d in cancelled.dropped]) == (turn.turn_id, ["m-2"])
        release.set()  # the export finishes; its result is put on top of the cancel and the drop
        events = await logged(log, sid, lambda es: bool(of(es, ev.TurnFinished)))
    finally:
        worker.stop()
        await running
    (finished,) = of(events, ev.TurnFinished)
    assert (finished.message_id, finished.reason) == ("m-1", "cancelled")
    (result,) = of(events, ev.ToolCallFinished)
    (drop,) = of(events, ev.UserMessageDropped)
    assert (result.status, result.content) == ("success", "exported orders")
    assert result.basis_version < drop.version < result.version  # rebased over the drop, not lost
    assert [t.message_id for t in of(events, ev.TurnStarted)] == ["m-1"]  # m-2 is never answered
    assert (drop.message_id, drop.reason) == ("m-2", "cancelled")
    assert [e.version for e in events] == list(range(1, len(events) + 1))


async def test_a_turn_that_loses_the_race_to_a_cancel_never_answers_its_message(log: EventLog) -> None:
    """A worker folded the waiting message and is about to commit its turn's start when a cancel
    is appended: the cancel's drop wins, the start conflicts, and a fold again finds nothing."""
    agents = directory(asyncio.Event())
    api = AgentSessions(log, agents, producer="gateway")
    sid = (await api.create_session("a", "u")).session_id
    await api.post_user_message(sid, "hello", message_id="m-1")
    worker = AgentSessions(log, agents, producer="worker")
    state = await worker.runner.reload(sid)
    rebase = Rebaser(agents.get("a"), lambda: worker.runner.reload(sid), None)
    w = SessionWriter(log, state, "worker", rebase=rebase)
    w.add(ev.TurnStarted, turn_id="t-1", message_id="m-1")
    w.transition(SessionStatus.PROCESSING, Cause.USER_MESSAGE)
    cancelled = await api.cancel(sid)
    assert [d.message_id for d in cancelled.dropped] == ["m-1"]
    with pytest.raises(ConcurrencyError):
        await w.commit()
    assert [item async for item in worker.run_pending(sid)] == []
    events = await log.read_session(sid)
    assert [e.type for e in events] == [
        "SessionCreated",
        "UserMessageReceived",
        "CancelRequested",
        "UserMessageDropped",
    ]
