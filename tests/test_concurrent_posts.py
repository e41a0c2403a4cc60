"""Every message a client posts is taken, however many are posted at once: 50 posts to one
session from several HTTP connections against the real gateway all answer 202, and the log
shows each message once, then taken by a turn in the order it was received (or dropped with a
reason), exactly once. The log assigns a submission's version where it orders appends
(EventLog.submit), so no post loses a version race to another post or to the worker's steps.
Both backends, under both mid-turn policies; on Kafka also through the inbox (a gateway that
owns no partition, its turns run by a worker in the test's process)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.backend_gateway import Stack, serve, stack, worker_on
from tests.gateway_support import auth
from turnlog.engine import Agent, AgentDirectory, FunctionModel
from turnlog.engine import events as ev
from turnlog.engine.log.base import EventLog
from turnlog.engine.models.base import ModelRequest

POSTS = 50
CONNECTIONS = 5
"""Clients posting at once, each on connections of its own."""
TIMEOUT = httpx.Timeout(60.0)
SETTLE_S = 180.0
"""How long the 50 turns may take on a busy machine (a deadline, not a wait)."""


def answer(request: ModelRequest) -> str:
    asked = next(m.content for m in reversed(request.messages) if m.role == "user")
    return f"answer to {asked}"


def agents() -> AgentDirectory:
    """``echo`` queues a message that arrives mid-turn; ``impatient`` lets it interrupt."""
    return AgentDirectory(
        [
            Agent.build("echo", FunctionModel(answer, name="echo")),
            Agent.build("impatient", FunctionModel(answer, name="impatient"), on_message="interrupt"),
        ]
    )


@pytest.fixture
def where(backend: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    with stack(backend, tmp_path) as made:
        yield made


@pytest.mark.parametrize("agent", ["echo", "impatient"])
async def test_fifty_concurrent_posts_are_all_taken_once_in_log_order(where: Stack, agent: str) -> None:
    directory = agents()
    with serve(where, directory) as url:
        async with where.opened(owner=False) as log:
            sid = await create(url, agent)
            answers = await post_all(url, sid)
            await check_taken_once(log, sid, answers, agent, embedded=where.backend == "sqlite")


async def test_fifty_concurrent_posts_through_the_kafka_inbox_are_all_taken(where: Stack) -> None:
    if where.backend != "kafka":
        pytest.skip("the inbox is Kafka's: a process that does not own the partition")
    directory = agents()
    async with where.opened(owner=True) as log, worker_on(log, directory):
        with serve(where, directory, run_worker=False) as url:
            sid = await create(url, "echo")
            answers = await post_all(url, sid)
            assert all(a["position"] is None for a in answers.values())  # in the inbox; the owner orders it
            await check_taken_once(log, sid, answers, "echo", embedded=False)


async def create(url: str, agent: str) -> str:
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
        created = await client.post("/v1/sessions", json={"agent": agent}, headers=auth("alice"))
        assert created.status_code == 201, created.text
        sid: str = created.json()["session_id"]
        return sid


async def post_all(url: str, sid: str) -> dict[str, dict[str, Any]]:
    """Post ``POSTS`` messages at once from ``CONNECTIONS`` clients; every answer, by message id."""
    clients = [httpx.AsyncClient(base_url=url, timeout=TIMEOUT) for _ in range(CONNECTIONS)]
    try:
        posts = [
            clients[i % CONNECTIONS].post(
                f"/v1/sessions/{sid}/messages",
                json={"text": f"question {i:02d}", "message_id": f"m-{i:02d}"},
                headers=auth("alice"),
            )
            for i in range(POSTS)
        ]
        responses = await asyncio.gather(*posts)
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))
    assert [r.status_code for r in responses] == [202] * POSTS, [
        r.text for r in responses if r.status_code != 202
    ]
    return {r.json()["message_id"]: r.json() for r in responses}


async def settled(log: EventLog, sid: str) -> list[ev.Event]:
    """The session's events once every received message has ended (taken by a turn that
    finished, or dropped) and no turn runs."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE_S
    while True:
        events = await log.read_session(sid)
        received = {e.message_id for e in events if isinstance(e, ev.UserMessageReceived)}
        ended = {e.message_id for e in events if isinstance(e, (ev.TurnFinished, ev.UserMessageDropped))}
        if len(received) == POSTS and ended == received:
            return events
        assert loop.time() < deadline, f"{len(received)} received, {len(ended)} ended after {SETTLE_S:g} s"
        await log.wait_for_append(0.5)


async def check_taken_once(
    log: EventLog, sid: str, answers: dict[str, dict[str, Any]], agent: str, *, embedded: bool
) -> None:
    events = await settled(log, sid)
    assert [e.version for e in events] == list(range(1, len(events) + 1))
    received = [e for e in events if isinstance(e, ev.UserMessageReceived)]
    order = [e.message_id for e in received]
    assert sorted(order) == sorted(answers) == [f"m-{i:02d}" for i in range(POSTS)]  # each once
    if embedded:  # the answer named the version and position the message has on the log
        assert {m.message_id: m.version for m in received} == {k: a["version"] for k, a in answers.items()}
    taken = [e.message_id for e in events if isinstance(e, ev.TurnStarted)]
    dropped = [e for e in events if isinstance(e, ev.UserMessageDropped)]
    assert dropped == [] and taken == order  # every message its own turn, in the order received
    finished = [e for e in events if isinstance(e, ev.TurnFinished)]
    assert [e.message_id for e in finished] == order
    texts = {e.turn_id: e.text for e in events if isinstance(e, ev.AssistantMessage)}
    by_id = {m.message_id: m.text for m in received}
    for turn in finished:
        if turn.reason == "answered":  # what the model was sent for it: that message last
            assert texts[turn.turn_id] == f"answer to {by_id[turn.message_id]}"
        else:  # under `interrupt`, a turn that a later message stopped
            assert (agent, turn.reason) == ("impatient", "cancelled")
    assert finished[-1].reason == "answered"
