"""What a posted message costs the log: the records ``submit`` returns carry their positions, so
the gateway answers with them and reads nothing back. A POST of a message reads the session
once (the fold the route checks the caller against, caught up), or not at all; counted through
the log's read calls made while the gateway serves it, over real HTTP, on both backends."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import uvicorn

from tests.gateway_support import KEYS, PRINCIPALS, auth
from turnlog.engine import Agent, AgentDirectory, EventLog, FunctionModel
from turnlog.gateway import Gateway, GatewayConfig, KeyStore, Principal, server_config
from turnlog.projections.store import ProjectionStore

READS = (
    "read_session",
    "read_session_records",
    "read_session_records_through",
    "latest_snapshot",
    "snapshots_between",
    "versions_of",
    "session_version",
    "read_partition",
    "list_sessions",
    "end_offset",
)
"""Every way the log interface reads (``sessions`` is a generator over ``list_sessions``)."""
SERVING: contextvars.ContextVar[str] = contextvars.ContextVar("serving", default="")
"""The request being served (method and path), in the task that serves it."""
NESTED: contextvars.ContextVar[bool] = contextvars.ContextVar("nested", default=False)


class ReadCounter:
    """Counts the log's read calls by request: a call made while a request is served (by the
    route or anything it awaits), once, however the log answers it inside."""

    def __init__(self, log: EventLog) -> None:
        self.calls: dict[str, list[str]] = {}
        for name in READS:
            setattr(log, name, self._counted(name, getattr(log, name)))

    def _counted(self, name: str, read: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def counted(*args: Any, **kwargs: Any) -> Any:
            if SERVING.get() and not NESTED.get():
                self.calls.setdefault(SERVING.get(), []).append(name)
            token = NESTED.set(True)
            try:
                return await read(*args, **kwargs)
            finally:
                NESTED.reset(token)

        return counted


def marking(app: Any) -> Any:
    """The gateway's ASGI app, with the request it serves marked (``SERVING``)."""

    async def marked(scope: dict[str, Any], receive: Any, send: Any) -> None:
        token = SERVING.set(f"{scope['method']} {scope['path']}" if scope["type"] == "http" else "")
        try:
            await app(scope, receive, send)
        finally:
            SERVING.reset(token)

    return marked


@contextlib.asynccontextmanager
async def gateway_on(log: EventLog, store: ProjectionStore) -> AsyncIterator[str]:
    """The gateway over ``log`` on a loopback port, in this event loop (the log's), turns left
    to no worker; yields its URL."""
    agents = AgentDirectory([Agent.build("echo", FunctionModel(lambda r: "noted", name="echo"))])
    keys = KeyStore.from_plain({KEYS[u]: Principal(u, role) for u, role in PRINCIPALS.items()})
    gw = Gateway(log, store, agents, keys, GatewayConfig(run_worker=False, poll_s=0.2, ping_s=5))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        server_config(marking(gw.app()), gw.limits, log_level="warning", access_log=False)
    )
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(30):
            while not server.started:
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await serving
        sock.close()


async def test_a_posted_message_reads_the_session_once_and_nothing_back(
    log: EventLog, store: ProjectionStore
) -> None:
    counter = ReadCounter(log)
    async with gateway_on(log, store) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        created = await client.post("/v1/sessions", json={"agent": "echo"}, headers=auth("alice"))
        assert created.status_code == 201, created.text
        sid = created.json()["session_id"]
        path = f"/v1/sessions/{sid}/messages"
        answers = []
        for text in ("where is A-17?", "and A-18?"):
            posted = await client.post(path, json={"text": text}, headers=auth("alice"))
            assert posted.status_code == 202, posted.text
            answers.append(posted.json())
    reads = counter.calls.get(f"POST {path}", [])
    assert reads == ["read_session", "read_session"], "one read per post: the route's fold, caught up"
    records = await log.read_session_records(sid)
    assert [(a["version"], a["position"], a["partition"]) for a in answers] == [
        (r.event.version, r.offset, r.partition) for r in records[1:]
    ], "the answer's positions are the log's, though nothing was read back"
    assert counter.calls.get("POST /v1/sessions", []) == [], "a new session is answered from its record"
