"""Every accepted user message ends answered (a turn took it) or with a ``UserMessageDropped``
that says why not, on both backends: a force-finish while a turn runs drops the message queued
behind it; a message that reaches a session after its close (a race the sender cannot see: it
was answered 202) is taken and dropped at once; the sender's SSE stream shows the drop."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx
from ag_ui.core import RunAgentInput

from tests.gateway_support import auth, create, read_until, serve_gateway, sse_messages
from turnlog.engine import Agent, AgentDirectory, AgentSessions, EventLog, FunctionModel, call, reply, tool
from turnlog.engine import events as ev
from turnlog.engine.models.base import ModelRequest, ModelResponse
from turnlog.gateway.agui import RunMapper

WAIT_S = 30.0
Reopen = Callable[[], AbstractAsyncContextManager[EventLog]]


async def until_logged(log: EventLog, sid: str, kind: type[ev.Event]) -> list[ev.Event]:
    """The session's events once one of ``kind`` is among them; fails after WAIT_S."""
    async with asyncio.timeout(WAIT_S):
        while True:
            events = await log.read_session(sid)
            if any(isinstance(e, kind) for e in events):
                return events
            await asyncio.sleep(0.02)


def unaccounted(events: list[ev.Event]) -> list[str]:
    """Message ids received but neither taken by a turn nor dropped with a reason."""
    accounted = {e.message_id for e in events if isinstance(e, ev.TurnStarted | ev.UserMessageDropped)}
    received = [e.message_id for e in events if isinstance(e, ev.UserMessageReceived)]
    return [m for m in received if m not in accounted]


def exporting_agent(release: asyncio.Event) -> Agent:
    @tool(timeout_s=60)
    async def export(table: str) -> str:
        """A long export."""
        await release.wait()
        return "exported"

    def decide(request: ModelRequest) -> ModelResponse | str:
        if request.messages[-1].role == "tool":
            return "export done"
        return reply("", call("export", {"table": "orders"}, "x1"))

    return Agent("exporter", FunctionModel(decide), [export])


async def test_a_force_finish_mid_turn_drops_the_message_queued_behind_it_with_the_reason(
    log: EventLog, reopen: Reopen
) -> None:
    release = asyncio.Event()
    api = AgentSessions(log, AgentDirectory([exporting_agent(release)]), producer="worker")
    sid = (await api.create_session("exporter", "u1")).session_id

    async def first_turn() -> None:
        async for _ in api.send_user_message(sid, "export everything"):
            pass

    running = asyncio.create_task(first_turn())
    try:
        await until_logged(log, sid, ev.ToolCallStarted)
        queued = (await api.post_user_message(sid, "and then the invoices")).event  # accepted behind the turn
        async with reopen() as admin_log:  # an admin elsewhere (on Kafka: through the inbox)
            admin = AgentSessions(admin_log, api.agents, producer="admin-cli")
            await until_logged(admin_log, sid, ev.UserMessageReceived)
            await admin.force_finish(sid, "fraud review", actor="ops")
    finally:
        release.set()
        await asyncio.wait_for(running, WAIT_S)  # the turn's next commit conflicts; it stops

    events = await log.read_session(sid)
    assert [e.type for e in events if isinstance(e, ev.SessionClosed | ev.UserMessageDropped)] == [
        "SessionClosed",
        "UserMessageDropped",
    ]
    (dropped,) = [e for e in events if isinstance(e, ev.UserMessageDropped)]
    assert (dropped.message_id, dropped.reason) == (queued.message_id, "closed")
    assert "ops" in dropped.detail and "fraud review" in dropped.detail
    (finished,) = [e for e in events if isinstance(e, ev.TurnFinished)]
    assert finished.reason == "forced"
    assert unaccounted(events) == []
    state = await api.get_state(sid)
    assert not state.inbox and state.closed
    assert [m.content for m in state.messages if m.role == "user"] == ["export everything"]
    assert [item async for item in api.run_pending(sid)] == []


async def test_a_message_that_reaches_a_closed_session_is_dropped_not_left_waiting(
    log: EventLog, reopen: Reopen
) -> None:
    """The sender checked the session open and was answered; the close won the race to the log."""
    model = FunctionModel(lambda request: "never asked")
    api = AgentSessions(log, AgentDirectory([Agent("quiet", model, [])]), producer="worker")
    sid = (await api.create_session("quiet", "u1")).session_id
    await api.force_finish(sid, "account deleted")
    late = ev.UserMessageReceived(session_id=sid, version=0, message_id="late-1", text="hello?", user_id="u1")
    async with reopen() as sender_log:
        await until_logged(sender_log, sid, ev.SessionClosed)
        await sender_log.submit(late)  # what post_user_message does after its check passed
    await until_logged(log, sid, ev.UserMessageReceived)
    await asyncio.wait_for(_run_pending(api, sid), WAIT_S)  # a worker meets the message (SQLite)

    events = await until_logged(log, sid, ev.UserMessageDropped)
    assert [e.type for e in events][-2:] == ["UserMessageReceived", "UserMessageDropped"]
    dropped = events[-1]
    assert isinstance(dropped, ev.UserMessageDropped)
    assert (dropped.message_id, dropped.reason) == ("late-1", "closed")
    assert "account deleted" in dropped.detail
    assert unaccounted(events) == [] and model.requests == []
    assert not (await api.get_state(sid)).inbox


async def _run_pending(api: AgentSessions, sid: str) -> None:
    async for _ in api.run_pending(sid):
        pass


async def test_the_senders_stream_shows_the_drop(tmp_path: Path) -> None:
    with serve_gateway(tmp_path) as running:
        running.model.gate.clear()  # the first answer stops half-way: the turn is running
        async with httpx.AsyncClient(base_url=running.url, timeout=httpx.Timeout(WAIT_S)) as client:
            sid = (await create(client))["session_id"]
            seen: list[Any] = []
            async with client.stream("GET", f"/v1/sessions/{sid}/events", headers=auth("alice")) as response:
                stream = sse_messages(response)
                url = f"/v1/sessions/{sid}/messages"
                await client.post(url, json={"text": "Where is A-17?"}, headers=auth("alice"))
                await read_until(stream, lambda m: m.event == "delta", seen)
                posted = await client.post(url, json={"text": "And A-18?"}, headers=auth("alice"))
                assert posted.status_code == 202, posted.text
                message_id = posted.json()["message_id"]
                finished = await client.post(
                    f"/v1/admin/sessions/{sid}/finish", json={"reason": "closing time"}, headers=auth("root")
                )
                assert finished.status_code == 200, finished.text
                drop = await read_until(stream, lambda m: m.event == "UserMessageDropped", seen)
    body = drop.json
    assert (body["message_id"], body["reason"], body["phase"]) == (message_id, "closed", "message.dropped")
    assert "closing time" in body["detail"]


def test_an_agui_run_whose_message_is_dropped_ends_with_a_run_error() -> None:
    run = RunAgentInput(
        thread_id="t1", run_id="r1", state={}, messages=[], tools=[], context=[], forwarded_props={}
    )
    mapper = RunMapper(run, "s1")
    dropped = ev.UserMessageDropped(
        session_id="s1", version=4, message_id="m1", reason="closed", detail="the session was closed"
    )
    assert mapper.on_event(dataclasses.replace(dropped, message_id="another"), "m1") == []
    started, error = mapper.on_event(dropped, "m1")
    assert (started.type, error.type, error.code, error.message) == (
        "RUN_STARTED",
        "RUN_ERROR",
        "message_closed",
        "the session was closed",
    )
    assert mapper.done
