"""What a request opens for as long as its answer lasts (an event stream's slot, a hub
subscription) is released however the request ends: a HEAD, a client gone before the first
byte, an error in the handler or while streaming. Real servers on loopback, real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from pathlib import Path
from typing import AsyncIterator, Callable, Iterator

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.gateway_support import (
    KEYS,
    RunningGateway,
    auth,
    create,
    open_log,
    read_until,
    serve_gateway,
    sse_messages,
)
from turnlog.gateway.agui import thread_session_id
from turnlog.gateway.lifetimes import Holdings

TIMEOUT = httpx.Timeout(30.0)


async def until(condition: Callable[[], bool], what: str, deadline_s: float = 30.0) -> None:
    """Wait for ``condition`` (the server settles the requests asynchronously)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while not condition():
        assert loop.time() < end, f"never happened within {deadline_s:g} s: {what}"
        await asyncio.sleep(0.02)


async def get_and_hang_up(port: int, path: str, key: str) -> None:
    """Send a whole GET and close the connection before reading a byte of the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n".encode())
    await writer.drain()
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def settled(running: RunningGateway) -> None:
    """Wait until the server has taken in every connection opened so far and runs no request
    (every answer has ended, however it ended). A request on a new connection is answered only
    once the connections queued before it were accepted, and their requests read."""
    async with httpx.AsyncClient(base_url=running.url, timeout=TIMEOUT) as probe:
        assert (await probe.get("/viewer")).status_code == 200
    state = running.server.server_state
    await until(lambda: not state.tasks, "every request answered or abandoned")


@pytest.fixture
def running(tmp_path: Path):  # type: ignore[no-untyped-def]
    with serve_gateway(tmp_path) as gw:
        yield gw


async def test_heads_and_hung_up_gets_leave_every_stream_slot_free(running: RunningGateway) -> None:
    gw = running.gateway
    port = int(running.url.rsplit(":", 1)[1])
    async with httpx.AsyncClient(base_url=running.url, timeout=TIMEOUT) as client:
        sid = (await create(client))["session_id"]
        url = f"/v1/sessions/{sid}/events"
        subscribed = gw.hub.subscriptions()

        for _ in range(100):
            head = await client.head(url, headers=auth("alice"))
            assert head.status_code == 200 and head.content == b""
            assert head.headers["content-type"].startswith("text/event-stream")
        assert (await client.head(url, headers=auth("bob"))).status_code == 404  # what GET would say
        await asyncio.gather(*(get_and_hang_up(port, url, KEYS["alice"]) for _ in range(100)))
        await settled(running)
        assert gw.streams.open_count("alice") == 0
        assert gw.hub.subscriptions() == subscribed

        async with contextlib.AsyncExitStack() as streams:
            opened = [
                await streams.enter_async_context(client.stream("GET", url, headers=auth("alice")))
                for _ in range(gw.limits.streams_per_user)
            ]
            assert [r.status_code for r in opened] == [200] * 8
            readers = [sse_messages(r) for r in opened]
            for reader in readers:
                await read_until(reader, lambda m: m.event == "SessionCreated", [])
            ninth = await client.get(url, headers=auth("alice"))
            assert (ninth.status_code, ninth.json()["error"]) == (429, "too_many_streams")
            assert (await client.head(url, headers=auth("alice"))).status_code == 200  # opens nothing
            message = {"text": "Where is A-17?"}
            posted = await client.post(f"/v1/sessions/{sid}/messages", json=message, headers=auth("alice"))
            assert posted.status_code == 202
            for reader in readers:  # every stream carries the turn live
                await read_until(reader, lambda m: m.event == "TurnFinished", [])
        await until(lambda: gw.streams.open_count("alice") == 0, "the 8 closed streams' slots free")
        await until(lambda: gw.hub.subscriptions() == subscribed, "the 8 streams' subscriptions gone")


async def test_agui_runs_hung_up_before_the_first_byte_free_their_slots(running: RunningGateway) -> None:
    gw = running.gateway
    port = int(running.url.rsplit(":", 1)[1])
    body = (
        b'{"threadId": "t1", "runId": "r1", "state": {}, "tools": [], "context": [], '
        b'"forwardedProps": {}, "messages": [{"id": "m1", "role": "user", "content": "A-17?"}]}'
    )
    subscribed = gw.hub.subscriptions()

    async def post_and_hang_up() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = (
            f"POST /v1/agui/support HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEYS['alice']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode() + body)
        await writer.drain()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    await asyncio.gather(*(post_and_hang_up() for _ in range(20)))
    await settled(running)
    assert gw.streams.open_count("alice") == 0
    assert gw.hub.subscriptions() == subscribed


async def test_an_agui_run_refused_for_its_stream_slot_creates_nothing(running: RunningGateway) -> None:
    gw = running.gateway
    body = {
        "threadId": "t-refused", "runId": "r1", "state": {}, "tools": [], "context": [],
        "forwardedProps": {}, "messages": [{"id": "m1", "role": "user", "content": "A-17?"}],
    }  # fmt: skip
    async with httpx.AsyncClient(base_url=running.url, timeout=TIMEOUT) as client:
        sid = (await create(client))["session_id"]
        url = f"/v1/sessions/{sid}/events"
        async with contextlib.AsyncExitStack() as streams:
            for _ in range(gw.limits.streams_per_user):  # every one of alice's slots taken
                await streams.enter_async_context(client.stream("GET", url, headers=auth("alice")))
            await until(lambda: gw.streams.open_count("alice") == gw.limits.streams_per_user, "8 open")
            refused = await client.post("/v1/agui/support", json=body, headers=auth("alice"))
            assert (refused.status_code, refused.json()["error"]) == (429, "too_many_streams")
    log = open_log(running.log_path)  # nothing of the refused run reached the log
    try:
        assert await log.read_session_records(thread_session_id("alice", "t-refused")) == []
        assert [r.event.type for r in await log.read_session_records(sid)] == ["SessionCreated"]
    finally:
        await log.close()


# -- the holdings of one answer, on a bare server ------------------------------------------------


@contextlib.contextmanager
def bare_server(routes: list[Route]) -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=routes), log_level="critical"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            assert thread.is_alive()
            threading.Event().wait(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


async def test_an_error_in_the_handler_or_while_streaming_releases_what_was_held() -> None:
    released: list[str] = []

    async def broken_body() -> AsyncIterator[bytes]:
        yield b"first\n"
        raise RuntimeError("the stream broke")

    async def streaming(request: Request) -> Response:
        with Holdings() as held:
            held.hold(lambda: released.append("streaming"))
            return held.answer(StreamingResponse(broken_body(), media_type="text/plain"))

    async def failing(request: Request) -> Response:
        with Holdings() as held:
            held.hold(lambda: released.append("handler"))
            raise RuntimeError("the handler broke")

    async def fine(request: Request) -> Response:
        with Holdings() as held:
            held.hold(lambda: released.append(f"{request.method} taken first"))
            held.hold(lambda: released.append(f"{request.method} taken second"))
            return held.answer(StreamingResponse(iter([b"ok"]), media_type="text/plain"))

    routes = [Route("/streaming", streaming), Route("/failing", failing), Route("/fine", fine)]
    fresh = httpx.Limits(max_keepalive_connections=0)  # the server closes a connection an error broke
    with bare_server(routes) as url:
        async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT, limits=fresh) as client:
            with pytest.raises(httpx.HTTPError):
                async with client.stream("GET", "/streaming") as broken:
                    async for _ in broken.aiter_bytes():
                        pass
            await until(lambda: "streaming" in released, "the broken stream's holding released")
            assert (await client.get("/failing")).status_code == 500
            assert released[-1] == "handler"
            assert (await client.get("/fine")).text == "ok"
            head = await client.head("/fine")
            assert head.status_code == 200 and head.content == b""
            await until(lambda: len(released) == 6, f"every holding released (so far {released})")
    assert released[2:] == ["GET taken second", "GET taken first", "HEAD taken second", "HEAD taken first"]
