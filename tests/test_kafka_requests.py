"""Requests from a process that does not own the session's Kafka partition: a cancel and a
force-finish go through the inbox and the owner applies them (engine/log/kafka_inbox.py). The
force-finish of a running turn from a non-owner is tests/test_turn_loop.py (both backends)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from engine import Agent, AgentDirectory, AgentSessions, FunctionModel, call, reply, tool
from engine import events as ev
from engine.errors import NoTurnRunningError, SessionClosedError, SessionNotFoundError
from engine.log.kafka import KafkaEventLog
from engine.models.base import ModelRequest, ModelResponse
from tests.services import kafka_log, need_service


@pytest.fixture
async def owner() -> AsyncIterator[KafkaEventLog]:
    async with kafka_log(need_service("TURNLOG_KAFKA_BOOTSTRAP"), partitions=2) as log:
        yield log


def agents(release: asyncio.Event) -> AgentDirectory:
    @tool(timeout_s=30)
    async def export(table: str) -> str:
        """A long export."""
        await release.wait()
        return "exported"

    def decide(request: ModelRequest) -> ModelResponse | str:
        if request.messages[-1].role == "tool":
            return "done"
        return reply("", call("export", {"table": "orders"}, "x1"))

    return AgentDirectory([Agent("a", FunctionModel(decide), [export])])


async def test_a_cancel_from_a_non_owner_stops_the_owners_turn(owner: KafkaEventLog) -> None:
    release = asyncio.Event()
    api = AgentSessions(owner, agents(release), producer="worker")
    sid = (await api.create_session("a", "u")).session_id
    running = asyncio.create_task(_drain(api, sid, "export everything"))
    await until_logged(owner, sid, ev.ToolCallStarted)
    async with kafka_log(owner.bootstrap, partitions=2, topic=owner.topics.events, owner=False) as other_log:
        other = AgentSessions(other_log, api.agents, producer="tab-2")
        await until_logged(other_log, sid, ev.ToolCallStarted)  # its view of the log may lag a little
        request = await other.cancel(sid, "changed my mind")
        assert (request.version, request.producer) == (0, "tab-2")  # the owner sequences it
        await until_logged(owner, sid, ev.CancelRequested)
        release.set()
        await asyncio.wait_for(running, 30)
        events = await owner.read_session(sid)
        changes = [(e.from_state, e.to_state, e.cause) for e in events if isinstance(e, ev.StateChanged)]
        assert changes[-1] == ("PROCESSING", "CANCELLED", "interrupt")
        (cancel,) = [e for e in events if isinstance(e, ev.CancelRequested)]
        assert (cancel.reason, cancel.producer) == ("changed my mind", "tab-2")
        with pytest.raises(NoTurnRunningError):
            await other.cancel(sid)  # checked on the non-owner's read of the log


async def test_a_force_finish_from_a_non_owner_is_refused_as_on_the_owner(owner: KafkaEventLog) -> None:
    api = AgentSessions(owner, agents(asyncio.Event()), producer="worker")
    sid = (await api.create_session("a", "u")).session_id
    async with kafka_log(owner.bootstrap, partitions=2, topic=owner.topics.events, owner=False) as other_log:
        other = AgentSessions(other_log, api.agents, producer="ops")
        await until_logged(other_log, sid, ev.SessionCreated)
        with pytest.raises(SessionNotFoundError):
            await other.force_finish("nobody", "x")
        info = await other.force_finish(sid, "fraud", actor="ops")
        assert (info.status, info.version) == ("FINISHED", 3)
        with pytest.raises(SessionClosedError):
            await other.force_finish(sid, "again")
    events = await owner.read_session(sid)
    assert [e.type for e in events] == ["SessionCreated", "StateChanged", "SessionClosed"]
    assert all(e.producer == "ops" for e in events[1:])
    with pytest.raises(SessionClosedError):  # the owner refuses a close that races another
        await owner.submit(ev.SessionClosed(session_id=sid, version=0, reason="late", actor="ops"))


async def _drain(api: AgentSessions, sid: str, text: str) -> None:
    async for _ in api.send_user_message(sid, text):
        pass


async def until_logged(log: KafkaEventLog, sid: str, kind: type[ev.Event], timeout_s: float = 30.0) -> None:
    """Wait until an event of ``kind`` is on the session's log; fail after ``timeout_s``."""
    for _ in range(int(timeout_s / 0.02)):
        if any(isinstance(e, kind) for e in await log.read_session(sid)):
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"no {kind.type} for {sid} within {timeout_s:g} s")
