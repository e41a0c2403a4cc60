"""Helpers for the gateway tests: a real gateway on a loopback port (uvicorn in a thread with
its own event loop, as in production), an SSE reader over a real httpx response, test agents."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, AsyncIterator, Iterator, Sequence

import httpx
import uvicorn

from turnlog.engine import Agent, AgentDirectory, SqliteEventLog, tool
from turnlog.engine.budget import Budget
from turnlog.engine.errors import ModelError
from turnlog.engine.models.base import Model, ModelChunk, ModelRequest, ModelResponse, TextDelta, Usage
from turnlog.engine.models.fallback import FallbackModel
from turnlog.engine.models.pricing import Price, PriceTable
from turnlog.engine.models.prompt_tools import PromptToolsModel
from turnlog.engine.models.scripted import FunctionModel, call, reply
from turnlog.examples.logistics import SCRIPTED_TOOLS, LogisticsBackend, build_agent, demo_model
from turnlog.gateway import Gateway, GatewayConfig, KeyStore, Limits, Principal, server_config
from turnlog.projections import SqliteProjectionStore

KEYS = {
    "alice": "tlk_alice_key_0123456789abcdefghij",
    "bob": "tlk_bob_key_0123456789abcdefghijkl",
    "root": "tlk_root_key_0123456789abcdefghijk",
}
PRINCIPALS = {"alice": "user", "bob": "user", "root": "admin"}
PARTITIONS = 4
AGENTS = ["logistics-assistant", "metered", "refunds", "small", "support", "troubled"]
"""support: looks an order up (GatedModel); refunds: a refund that waits for the user's approval;
troubled: its model fails and its backup repeats one tool call until the loop guard stops it;
metered: a lookup, then its per-turn budget pauses the turn before the answer; small: a model
without native tools (PromptToolsModel) that repeats its lookup once and is corrected;
logistics-assistant: the example agent as `turnlog serve` runs it (scripted model, no prices,
a refund tool that waits for approval)."""
PRICES = PriceTable(
    {
        "gated": Price(Decimal("3"), Decimal("0.3"), Decimal("15")),
        "metered": Price(Decimal("2.5"), Decimal("1.25"), Decimal("10"), max_output_tokens=1000),
    }
)
"""Dollars per million tokens for the support agent's model, so its calls have a cost."""


POLLING_LIMITS = Limits(requests_per_second=1000, burst=1000)
"""The tests' default: they poll sessions to their next state, which is not a test of the request
rate (tests/test_gateway_http.py tests the rate limit with its own Limits)."""


def auth(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[user]}"}


@tool(idempotent=True)
async def lookup(order_id: str) -> dict[str, str]:
    """Look up an order's shipping status."""
    return {"order_id": order_id, "status": "delayed"}


class GatedModel(Model):
    """Asks for ``lookup`` once, then streams its answer in two halves with a gate between, so a
    test can act while the turn is in the middle of streaming. The gate is a thread event: the
    model runs on the gateway's loop, the test on its own."""

    name = "gated"
    first_half = "Order A-17 "
    second_half = "is delayed by two days."

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        self.requests.append(request)
        if request.tools and request.messages[-1].role == "user":
            call_id = f"call_{len(self.requests)}"  # unique per session, as real models make them
            yield ModelResponse(
                "", (call("lookup", {"order_id": "A-17"}, call_id),), Usage(20, 5), "tool_calls"
            )
            return
        yield TextDelta(self.first_half)
        while not self.gate.is_set():
            await asyncio.sleep(0.01)
        yield TextDelta(self.second_half)
        yield ModelResponse(self.first_half + self.second_half, (), Usage(30, 8), "stop")


def refund_answer(request: ModelRequest) -> ModelResponse:
    """Asks for a refund of 40 on the first step of a turn; then reports the tool's result."""
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    results = [m for m in request.messages[last_user + 1 :] if m.role == "tool"]
    if not results:
        turn = sum(1 for m in request.messages if m.role == "user")
        return reply(
            "Refunding now.", call("refund", {"order_id": "A-17", "amount": 40}, f"call_refund_{turn}")
        )
    return reply("refund result: " + results[-1].content)


def refunds_agent(refunds: list[dict[str, Any]]) -> Agent:
    @tool(requires_approval=True, sensitivity="high")
    def refund(order_id: str, amount: int) -> dict[str, Any]:
        """Refund an order."""
        refunds.append({"order_id": order_id, "amount": amount})
        return {"refunded": amount, "order_id": order_id}

    return Agent.build("refunds", FunctionModel(refund_answer, name="refunder"), [refund])


def troubled_agent() -> Agent:
    def down(request: ModelRequest) -> ModelResponse:
        raise ModelError("primary model is down")

    def stuck(request: ModelRequest) -> ModelResponse:
        return reply("Checking again.", call("lookup", {"order_id": "A-17"}, f"call_{len(request.messages)}"))

    model = FallbackModel(FunctionModel(down, name="primary"), FunctionModel(stuck, name="backup"))
    return Agent.build("troubled", model, [lookup])


def small_agent() -> Agent:
    """A text-only model given tools through its prompt: it looks A-17 up, writes the same call
    again (dropped, and it is told so: a ModelCorrected event), then answers."""

    def write(request: ModelRequest) -> str:
        told = next(m.content for m in reversed(request.messages) if m.role == "user")
        if told.startswith("These calls were already made"):
            return "A-17 is delayed."
        return '```json\n{"name": "lookup", "arguments": {"order_id": "A-17"}}\n```'

    return Agent.build("small", PromptToolsModel(FunctionModel(write, name="small")), [lookup])


def metered_agent() -> Agent:
    """Each call costs 1,250 micro-dollars; the second call's worst case (1,250 spent + 10,000 of
    output allowance) passes the 11,000 per-turn budget, so the turn pauses for the user."""

    def answer(request: ModelRequest) -> ModelResponse:
        if request.messages[-1].role == "tool":
            return ModelResponse("A-17 is delayed.", usage=Usage(100, 100), model="metered")
        return ModelResponse(
            "", (call("lookup", {"order_id": "A-17"}),), Usage(100, 100), "tool_calls", "metered"
        )

    budget = Budget(per_turn_micros=11_000, on_exceed="pause")
    return Agent.build(
        "metered", FunctionModel(answer, name="metered"), [lookup], prices=PRICES, budget=budget
    )


@dataclass
class RunningGateway:
    url: str
    gateway: Gateway
    model: GatedModel
    log_path: Path
    thread: threading.Thread
    server: uvicorn.Server
    refunds: list[dict[str, Any]]
    """What the refunds agent's tool ran with, in order."""
    shop: LogisticsBackend
    """The logistics example's business system (its refunds, its outbox)."""
    extra: dict[str, Any] = field(default_factory=dict)


def build_gateway(
    home: Path, limits: Limits | None = None, extra_agents: Sequence[Agent] = (), **config: Any
) -> tuple[Gateway, GatedModel, list[dict[str, Any]], LogisticsBackend]:
    model = GatedModel()
    refunds: list[dict[str, Any]] = []
    shop = LogisticsBackend(today=dt.date.today(), reports_dir=home / "reports")
    agents = AgentDirectory(
        [
            Agent.build("support", model, [lookup], system_prompt="You help with orders.", prices=PRICES),
            refunds_agent(refunds),
            troubled_agent(),
            metered_agent(),
            build_agent(demo_model(), shop, SCRIPTED_TOOLS),
            small_agent(),
            *extra_agents,
        ]
    )
    keys = KeyStore.from_plain({KEYS[u]: Principal(u, role) for u, role in PRINCIPALS.items()})
    gw = Gateway(
        SqliteEventLog(home / "log.db", partitions=PARTITIONS),
        SqliteProjectionStore(home / "projections.db"),
        agents,
        keys,
        GatewayConfig(limits=limits or POLLING_LIMITS, poll_s=0.2, ping_s=5, **config),
    )
    return gw, model, refunds, shop


def _wait_until_accepting(port: int, thread: threading.Thread, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not thread.is_alive():
            raise RuntimeError("the gateway thread exited during startup")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.02)
    raise RuntimeError(f"the gateway did not accept connections on port {port} in {timeout_s} s")


@contextlib.contextmanager
def serve_gateway(
    home: Path, limits: Limits | None = None, extra_agents: Sequence[Agent] = (), **config: Any
) -> Iterator[RunningGateway]:
    gw, model, refunds, shop = build_gateway(home, limits, extra_agents, **config)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    server = uvicorn.Server(
        server_config(gw.app(), gw.limits, log_level="warning", access_log=False, timeout_graceful_shutdown=3)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="gateway", daemon=True)
    thread.start()
    try:
        _wait_until_accepting(port, thread)
        url = f"http://127.0.0.1:{port}"
        yield RunningGateway(url, gw, model, home / "log.db", thread, server, refunds, shop)
    finally:
        model.gate.set()
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


@dataclass
class SseMessage:
    event: str
    data: str
    id: int | None

    @property
    def json(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.data)
        return value


async def sse_messages(response: httpx.Response) -> AsyncIterator[SseMessage]:
    """Parse a text/event-stream body as it arrives (comments and pings skipped)."""
    event, data, ident = "message", [], None
    async for line in response.aiter_lines():
        if line == "":
            if data:
                yield SseMessage(event, "\n".join(data), ident)
            event, data, ident = "message", [], None
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
            elif name == "id":
                ident = int(value)


def open_log(path: Path) -> SqliteEventLog:
    """A second handle on the gateway's log file, to compare what was streamed with the log."""
    return SqliteEventLog(path, partitions=PARTITIONS)


async def read_until(stream: Any, stop: Any, into: list[SseMessage]) -> SseMessage:
    async def go() -> SseMessage:
        async for message in stream:
            into.append(message)
            if stop(message):
                return message
        raise AssertionError(f"the stream ended before the expected message; got {[m.event for m in into]}")

    return await asyncio.wait_for(go(), 30)


def turn_committed(into: list[SseMessage]) -> Any:
    """Stop at the last event of the turn's final commit: the snapshot written after TurnFinished."""
    return lambda m: m.event == "SnapshotTaken" and any(x.event == "TurnFinished" for x in into)


async def create(client: httpx.AsyncClient, user: str = "alice", **body: Any) -> dict[str, Any]:
    response = await client.post("/v1/sessions", json={"agent": "support", **body}, headers=auth(user))
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created
