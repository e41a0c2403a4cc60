"""A stop pressed right after sending is honoured, over real HTTP on both backends: a cancel
pipelined behind its post on one connection (it reaches the gateway within a millisecond of the
post), or sent while the message waits behind a running turn, drops the message
(UserMessageDropped, reason ``cancelled``) and no turn answers it; the cancel's answer names the
dropped message ids and the turn it stopped. A cancel that races the worker starting the turn
ends with the message dropped or its turn cancelled, never answered; an interrupt keeps its own
message. The model is GatedModel (tests/gateway_support.py): a lookup, then an answer that
waits for the test's gate, so a turn can be held running."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import jsonschema
import pytest

from tests.backend_gateway import Stack, serve, stack, worker_on
from tests.gateway_support import KEYS, GatedModel, auth, lookup
from turnlog.engine import Agent, AgentDirectory, FunctionModel
from turnlog.engine import events as ev
from turnlog.engine.log.base import EventLog
from turnlog.gateway import openapi

TIMEOUT = httpx.Timeout(60.0)
WAIT = 60.0
"""Deadline for what the worker does in the background (a busy machine)."""
RACES = 4


def agents(model: GatedModel) -> AgentDirectory:
    return AgentDirectory(
        [
            Agent.build("support", model, [lookup]),
            Agent.build("echo", FunctionModel(lambda r: f"answer to {r.messages[-1].content}", name="echo")),
        ]
    )


@pytest.fixture
def where(backend: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    with stack(backend, tmp_path) as made:
        yield made


def http_request(path: str, body: dict[str, Any]) -> bytes:
    raw = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEYS['alice']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n"
    )
    return head.encode() + raw


async def pipelined(url: str, requests: list[tuple[str, dict[str, Any]]]) -> list[tuple[int, Any]]:
    """POST ``requests`` on one connection in one write, without waiting for an answer between
    them (HTTP/1.1 pipelining: the server takes them in order); their (status, JSON body)."""
    where = urlsplit(url)
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    try:
        writer.write(b"".join(http_request(path, body) for path, body in requests))
        await writer.drain()
        return [await asyncio.wait_for(http_response(reader), WAIT) for _ in requests]
    finally:
        writer.close()
        await writer.wait_closed()


async def http_response(reader: asyncio.StreamReader) -> tuple[int, Any]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split()[1])
    fields = dict(line.split(": ", 1) for line in head[1:] if line)
    length = int(next(v for k, v in fields.items() if k.lower() == "content-length"))
    return status, json.loads(await reader.readexactly(length))


async def create(url: str, agent: str = "support") -> str:
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
        created = await client.post("/v1/sessions", json={"agent": agent}, headers=auth("alice"))
        assert created.status_code == 201, created.text
        sid: str = created.json()["session_id"]
        return sid


async def post(url: str, sid: str, route: str, body: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
        answer = await client.post(f"/v1/sessions/{sid}/{route}", json=body, headers=auth("alice"))
        assert answer.status_code == 202, answer.text
        out: dict[str, Any] = answer.json()
        return out


async def logged(log: EventLog, sid: str, ready: Callable[[list[ev.Event]], bool]) -> list[ev.Event]:
    """The session's events once ``ready`` holds for them (the worker writes in the background)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not ready(events := await log.read_session(sid)):
        assert loop.time() < deadline, [e.type for e in events]
        await log.wait_for_append(0.2)
    return events


async def projected_to(url: str, sid: str, version: int) -> dict[str, Any]:
    """The session's row (GET /v1/sessions/{id}) once the projections hold ``version``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
        while True:
            row: dict[str, Any] = (await client.get(f"/v1/sessions/{sid}", headers=auth("alice"))).json()
            if row.get("state_version") == version:
                return row
            assert loop.time() < deadline, row
            await asyncio.sleep(0.05)  # another thread's projector: nothing to wait on here


def finished(message_id: str) -> Callable[[list[ev.Event]], bool]:
    return lambda es: any(isinstance(e, ev.TurnFinished) and e.message_id == message_id for e in es)


def waiting_for_the_gate(es: list[ev.Event]) -> bool:
    """The turn's second model call (after its lookup) has started: it streams, then waits."""
    return any(isinstance(e, ev.ModelCallStarted) and e.step == 1 for e in es)


def documented(answer: dict[str, Any], schema: str) -> None:
    """``answer`` is what the OpenAPI document says the route answers (``schema``)."""
    document = openapi.document()
    wanted = {"$ref": f"#/components/schemas/{schema}", "components": document["components"]}
    jsonschema.Draft202012Validator(wanted).validate(answer)


def check_dropped_once(events: list[ev.Event], message_id: str, cancel: dict[str, Any]) -> None:
    """One drop of ``message_id``, by the cancel whose answer is ``cancel``, and no turn for it."""
    documented(cancel, "Interrupted" if "interrupted" in cancel else "Cancelled")
    drops = [e for e in events if isinstance(e, ev.UserMessageDropped) and e.message_id == message_id]
    assert [(d.reason, d.causation_id) for d in drops] == [("cancelled", cancel["events"][0]["event_id"])]
    assert drops[0].detail.startswith("cancelled by alice before a turn took this message")
    assert not [e for e in events if isinstance(e, ev.TurnStarted) and e.message_id == message_id]
    assert [e.version for e in events] == list(range(1, len(events) + 1))


async def test_a_cancel_pipelined_behind_its_post_drops_the_message(where: Stack) -> None:
    """The worker starts only after the cancel, so the message is certainly waiting when the cancel
    is applied (on Kafka the gateway owns no partition: both go through the inbox, in order)."""
    directory = agents(GatedModel())
    async with where.opened(owner=True) as log:
        with serve(where, directory, run_worker=False) as url:
            sid = await create(url, "echo")
            (posted, post_body), (cancelled, cancel) = await pipelined(
                url,
                [
                    (f"/v1/sessions/{sid}/messages", {"text": "where is A-17?", "message_id": "m-1"}),
                    (f"/v1/sessions/{sid}/cancel", {"reason": "wrong order"}),
                ],
            )
            assert (posted, post_body["message_id"], cancelled) == (202, "m-1", 202), cancel
            assert (cancel["stopped_turn"], cancel["dropped"]) == (None, ["m-1"])
            types = [(e["type"], e["position"] is not None) for e in cancel["events"]]
            assert types == [("CancelRequested", True), ("UserMessageDropped", True)]
            async with worker_on(log, directory):
                await post(url, sid, "messages", {"text": "where is A-18?", "message_id": "m-2"})
                events = await logged(log, sid, finished("m-2"))
            row = await projected_to(url, sid, len(events))  # the projector took the drop in its stride
            assert (row["current_state"], row["turn_running"]) == ("FINISHED", False)
    check_dropped_once(events, "m-1", cancel)
    assert [e.message_id for e in events if isinstance(e, ev.TurnStarted)] == ["m-2"]


@pytest.mark.parametrize("gateway_worker", [True, False], ids=["gateway-worker", "worker-elsewhere"])
async def test_a_cancel_drops_a_message_waiting_behind_the_running_turn(
    where: Stack, gateway_worker: bool
) -> None:
    model = GatedModel()
    model.gate.clear()  # the turn's answer waits: it stays running
    directory = agents(model)
    async with where.opened(owner=not gateway_worker) as log:
        with serve(where, directory, run_worker=gateway_worker) as url:
            async with worker_on(log, directory) if not gateway_worker else contextlib.nullcontext():
                sid = await create(url)
                await post(url, sid, "messages", {"text": "Where is A-17?", "message_id": "m-1"})
                events = await logged(log, sid, waiting_for_the_gate)
                (turn,) = [e for e in events if isinstance(e, ev.TurnStarted)]
                await post(url, sid, "messages", {"text": "And A-18?", "message_id": "m-2"})
                cancel = await post(url, sid, "cancel", {"reason": "never mind"})
                assert (cancel["stopped_turn"], cancel["dropped"]) == (turn.turn_id, ["m-2"])
                model.gate.set()
                events = await logged(log, sid, finished("m-1"))
    check_dropped_once(events, "m-2", cancel)
    (end,) = [e for e in events if isinstance(e, ev.TurnFinished)]
    assert (end.turn_id, end.reason) == (turn.turn_id, "cancelled")
    assert not [e for e in events if isinstance(e, ev.AssistantMessage) and e.text]  # nothing answered


async def test_a_cancel_racing_the_turn_start_drops_the_message_or_cancels_its_turn(where: Stack) -> None:
    """The gateway's worker may take the message before or after the cancel is applied: either
    way nothing answers it, and the cancel's answer says which happened."""
    model = GatedModel()
    model.gate.clear()
    directory = agents(model)
    with serve(where, directory) as url:
        async with where.opened(owner=False) as log:
            for i in range(RACES):
                sid = await create(url)
                (_, _), (status, cancel) = await pipelined(
                    url,
                    [
                        (f"/v1/sessions/{sid}/messages", {"text": "Where is A-17?", "message_id": f"r-{i}"}),
                        (f"/v1/sessions/{sid}/cancel", {}),
                    ],
                )
                assert status == 202, cancel
                if cancel["dropped"]:
                    assert (cancel["stopped_turn"], cancel["dropped"]) == (None, [f"r-{i}"])
                    dropped = await logged(
                        log, sid, lambda es: any(isinstance(e, ev.UserMessageDropped) for e in es)
                    )
                    check_dropped_once(dropped, f"r-{i}", cancel)
                    continue
                events = await logged(log, sid, lambda es: any(isinstance(e, ev.TurnFinished) for e in es))
                (end,) = [e for e in events if isinstance(e, ev.TurnFinished)]
                assert (end.turn_id, end.message_id, end.reason) == (
                    cancel["stopped_turn"],
                    f"r-{i}",
                    "cancelled",
                )
                assert not [e for e in events if isinstance(e, ev.AssistantMessage) and e.text]


async def test_an_interrupt_drops_the_waiting_messages_and_keeps_its_own(where: Stack) -> None:
    model = GatedModel()
    model.gate.clear()
    directory = agents(model)
    with serve(where, directory) as url:
        async with where.opened(owner=False) as log:
            sid = await create(url)
            await post(url, sid, "messages", {"text": "Where is A-17?", "message_id": "m-1"})
            events = await logged(log, sid, waiting_for_the_gate)
            (turn,) = [e for e in events if isinstance(e, ev.TurnStarted)]
            await post(url, sid, "messages", {"text": "And A-18?", "message_id": "m-2"})
            interrupted = await post(url, sid, "interrupt", {"text": "Just A-19, please."})
            assert (interrupted["interrupted"], interrupted["stopped_turn"]) == (True, turn.turn_id)
            assert interrupted["dropped"] == ["m-2"]
            kinds = [e["type"] for e in interrupted["events"]]
            assert kinds == ["CancelRequested", "UserMessageDropped", "UserMessageReceived"]
            own = interrupted["events"][-1]["message_id"]
            model.gate.set()
            events = await logged(log, sid, finished(own))
    check_dropped_once(events, "m-2", interrupted)
    ends = [(e.message_id, e.reason) for e in events if isinstance(e, ev.TurnFinished)]
    assert ends == [("m-1", "cancelled"), (own, "answered")]
