"""Client-side limits per model endpoint: calls in flight, requests and tokens per minute, a fair
queue across sessions, and a 429's reset honoured so the next calls wait instead of failing. Real
HTTP on loopback (bench/fault_server.py) through the real OpenAI SDK; the limiter's time is a
ManualClock where time matters."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, AsyncIterator

import pytest
from rich.console import Console

from bench.fault_server import FaultServer
from tests.test_model_outages import until
from turnlog.engine import AgentSessions, SqliteEventLog
from turnlog.engine import events as ev
from turnlog.engine.agent import Agent, AgentDirectory
from turnlog.engine.errors import ConfigurationError, ModelTimeoutError
from turnlog.engine.messages import ChatMessage
from turnlog.engine.models.base import (
    EndpointWait,
    Model,
    ModelChunk,
    ModelRequest,
    ModelResponse,
    ModelSwitch,
)
from turnlog.engine.models.clock import ManualClock
from turnlog.engine.models.endpoints import Endpoints
from turnlog.engine.models.fallback import FallbackModel
from turnlog.engine.models.limits import stream_within
from turnlog.engine.models.openai_compat import OpenAICompatibleModel
from turnlog.engine.models.ratelimit import WINDOW_MARGIN, EndpointLimits, Limiter, reset_after
from turnlog.engine.stream import ModelWaiting
from turnlog.render import LiveRenderer


def _echo(body: dict[str, Any]) -> tuple[str, list[Any]]:
    return f"answer to {body['messages'][-1]['content']}", []


def _request(text: str, session: str, endpoints: Endpoints) -> ModelRequest:
    return ModelRequest([ChatMessage.user(text)], session_id=session, endpoints=endpoints)


async def _collect(chunks: AsyncIterator[ModelChunk]) -> list[ModelChunk]:
    return [c async for c in chunks]


def _sent_order(server: FaultServer) -> list[str]:
    return [str(b["messages"][-1]["content"]) for b in server.bodies]


async def test_calls_over_the_in_flight_limit_wait_in_a_fair_queue_sessions_in_turn() -> None:
    async with FaultServer(_echo, keep_bodies=True) as server:
        endpoints = Endpoints()
        model = OpenAICompatibleModel(
            "primary", base_url=server.base_url, api_key="k", limits=EndpointLimits(max_in_flight=1)
        )
        limiter = endpoints.limiter(model.endpoint)
        server.set("primary", hang=True)
        calls = {"A1": asyncio.create_task(_collect(model.stream(_request("A1", "A", endpoints))))}
        await until(lambda: server.count("primary", "hung") == 1)
        for queued, label in enumerate(
            ("A2", "A3", "B1", "C1", "B2"), 1
        ):  # in this order, A1 holding the slot
            calls[label] = asyncio.create_task(_collect(model.stream(_request(label, label[0], endpoints))))
            await until(lambda n=queued: limiter.queued == n)
        assert server.count("primary") == 1
        server.clear("primary")
        results = dict(zip(calls, await asyncio.wait_for(asyncio.gather(*calls.values()), 30), strict=True))
        # each session's calls in order, sessions in turn: B1 and C1 before A's third call
        assert _sent_order(server) == ["A1", "A2", "B1", "C1", "A3", "B2"]
        for position, label in enumerate(("A2", "A3", "B1", "C1", "B2")):
            waiting, over = [c for c in results[label] if isinstance(c, EndpointWait)]
            assert (waiting.ahead, waiting.over, over.over) == (position, False, True)
            assert "client-side maximum" in waiting.reason or "wait for the endpoint" in waiting.reason
            assert isinstance(results[label][-1], ModelResponse)
        assert not [c for c in results["A1"] if isinstance(c, EndpointWait)]
        assert (limiter.in_flight, limiter.queued) == (0, 0)
        await model.aclose()


async def test_a_429s_reset_holds_the_endpoint_so_the_next_calls_wait_instead_of_failing() -> None:
    clock = ManualClock()
    async with FaultServer(_echo) as server:
        endpoints = Endpoints(clock)
        primary = OpenAICompatibleModel("primary", base_url=server.base_url, api_key="k")
        backup = OpenAICompatibleModel("backup", base_url=server.base_url, api_key="k")
        chain = FallbackModel(primary, backup)
        limiter = endpoints.limiter(primary.endpoint)
        server.set("primary", status=429, retry_after_s=5)
        first = asyncio.create_task(_collect(chain.stream(_request("one", "s1", endpoints))))
        await until(lambda: limiter.queued == 1)  # it got the 429 and waits for the reset, queued again
        server.clear("primary")
        second = asyncio.create_task(_collect(chain.stream(_request("two", "s2", endpoints))))
        await until(lambda: limiter.queued == 2)
        assert server.count("primary") == 1  # the second call was not sent into the limit
        clock.advance(5 * WINDOW_MARGIN)
        answers = await asyncio.wait_for(asyncio.gather(first, second), 30)
        for chunks in answers:
            assert not [c for c in chunks if isinstance(c, ModelSwitch)]  # no call fell back
            response = chunks[-1]
            assert isinstance(response, ModelResponse) and response.model == "primary"
        held = [c for c in answers[0] if isinstance(c, EndpointWait) and not c.over]
        assert "the endpoint answered 429" in held[0].reason and "waiting 5.0 s as it asked" in held[0].reason
        assert (server.count("primary"), server.count("primary", "errors")) == (3, 1)
        assert server.count("backup") == 0
        await chain.aclose()


async def test_a_429_that_asks_for_longer_than_max_retry_wait_fails_over_at_once() -> None:
    async with FaultServer(_echo) as server:
        endpoints = Endpoints(ManualClock())
        limits = EndpointLimits(max_retry_wait_s=10)
        primary = OpenAICompatibleModel("primary", base_url=server.base_url, api_key="k", limits=limits)
        chain = FallbackModel(primary, OpenAICompatibleModel("backup", base_url=server.base_url, api_key="k"))
        server.set("primary", status=429, retry_after_s=60)
        first = await _collect(chain.stream(_request("one", "s1", endpoints)))
        second = await _collect(chain.stream(_request("two", "s2", endpoints)))
        [switch] = [c for c in first if isinstance(c, ModelSwitch)]
        assert "answered 429" in switch.reason and "requests_per_minute" in switch.reason
        [switch] = [c for c in second if isinstance(c, ModelSwitch)]
        assert "asked to wait 60.0 s" in switch.reason and "max_retry_wait_s of 10 s" in switch.reason
        assert server.count("primary") == 1 and server.count("backup") == 2
        await chain.aclose()


async def test_requests_per_minute_go_out_evenly_spaced_never_in_a_burst() -> None:
    clock = ManualClock()
    async with FaultServer(_echo) as server:
        endpoints = Endpoints(clock)
        limits = EndpointLimits(requests_per_minute=120)  # 2 a second: one every half second
        model = OpenAICompatibleModel("primary", base_url=server.base_url, api_key="k", limits=limits)
        calls = [
            asyncio.create_task(_collect(model.stream(_request(f"c{i}", f"s{i}", endpoints))))
            for i in range(4)
        ]
        await until(lambda: endpoints.limiter(model.endpoint).queued == 3)
        await until(lambda: server.count("primary", "answered") == 1)
        for sent in (2, 3, 4):
            clock.advance(WINDOW_MARGIN / 2)
            await until(lambda n=sent: server.count("primary", "answered") == n)
        results = await asyncio.wait_for(asyncio.gather(*calls), 30)
        assert sum(1 for r in results if any(isinstance(c, EndpointWait) for c in r)) == 3
        await model.aclose()


async def test_tokens_per_minute_count_the_usage_each_answer_reports() -> None:
    clock = ManualClock()
    async with FaultServer(_echo) as server:
        endpoints = Endpoints(clock)
        limits = EndpointLimits(tokens_per_minute=120)
        model = OpenAICompatibleModel("primary", base_url=server.base_url, api_key="k", limits=limits)
        estimate = await model.estimate_input_tokens(_request("c0", "s", endpoints))
        assert estimate < 20  # the estimates alone would let ten calls through in a minute
        for i in range(2):  # the server reports 60 prompt tokens and a few more for each answer
            assert isinstance(
                (await _collect(model.stream(_request(f"c{i}", "s", endpoints))))[-1], ModelResponse
            )
        third = asyncio.create_task(_collect(model.stream(_request("c2", "s", endpoints))))
        await until(lambda: endpoints.limiter(model.endpoint).queued == 1)
        assert server.count("primary") == 2
        clock.advance(60 * WINDOW_MARGIN)
        assert isinstance((await asyncio.wait_for(third, 30))[-1], ModelResponse)
        await model.aclose()


async def test_a_wait_in_the_queue_counts_against_the_first_token_limit() -> None:
    async with FaultServer(_echo) as server:
        endpoints = Endpoints()
        model = OpenAICompatibleModel(
            "primary", base_url=server.base_url, api_key="k", limits=EndpointLimits(max_in_flight=1)
        )
        server.set("primary", hang=True)
        holder = asyncio.create_task(_collect(model.stream(_request("first", "a", endpoints))))
        await until(lambda: server.count("primary", "hung") == 1)
        with pytest.raises(ModelTimeoutError, match="first-token limit of 0.3 s"):
            await _collect(stream_within(model, _request("second", "b", endpoints), 0.3, 30))
        limiter = endpoints.limiter(model.endpoint)
        assert (limiter.queued, server.count("primary")) == (0, 1)  # it left the queue, never sent
        server.clear("primary")
        await asyncio.wait_for(holder, 30)
        assert limiter.in_flight == 0
        await model.aclose()


async def test_a_waiting_call_shows_as_waiting_in_the_turns_stream(tmp_path: Path) -> None:
    async with FaultServer(_echo) as server:
        model = OpenAICompatibleModel(
            "primary", base_url=server.base_url, api_key="k", limits=EndpointLimits(max_in_flight=1)
        )
        log = SqliteEventLog(tmp_path / "log.db", partitions=2)
        api = AgentSessions(log, AgentDirectory([Agent.build("a", model)]))
        server.set("primary", hang=True)
        first, second = [(await api.create_session("a", "u")).session_id for _ in range(2)]
        holder = asyncio.create_task(_items(api, first, "first"))
        await until(lambda: server.count("primary", "hung") == 1)
        items: list[Any] = []
        waiting = asyncio.create_task(_gather(api, second, "second", items))
        await until(lambda: any(isinstance(i, ModelWaiting) for i in items))
        [wait] = [i for i in items if isinstance(i, ModelWaiting)]
        assert (wait.waiting, wait.model, wait.ahead) == (True, "primary", 0)
        assert "1 calls are in flight to the endpoint, its client-side maximum" in wait.reason
        server.clear("primary")
        await asyncio.wait_for(asyncio.gather(holder, waiting), 30)
        kinds = [type(i).__name__ for i in items]
        assert (
            kinds.index("ModelCallStarted") < kinds.index("ModelWaiting") < kinds.index("ModelCallFinished")
        )
        assert [i.waiting for i in items if isinstance(i, ModelWaiting)] == [True, False]
        assert [i for i in items if isinstance(i, ev.AssistantMessage)][0].text == "answer to second"
        console = Console(record=True, width=200)  # the CLI: not a terminal, so one line per wait
        render = LiveRenderer(console)
        for item in items:
            render(item)
        assert "model   waiting: 1 calls are in flight to the endpoint" in console.export_text()
        await model.aclose()
        await log.close()


async def test_the_gateway_streams_a_waiting_call_as_a_waiting_event(tmp_path: Path) -> None:
    import httpx
    import openai

    from tests.gateway_support import auth, read_until, serve_gateway, sse_messages

    async with FaultServer(_echo) as server:
        # the gateway runs on a loop of its own (a thread) that ends with it: no connection is kept
        # open for later, so none is left open when that loop is gone
        unpooled = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0))
        client = openai.AsyncOpenAI(
            base_url=server.base_url, api_key="k", max_retries=0, http_client=unpooled
        )
        limits = EndpointLimits(max_in_flight=1)
        model = OpenAICompatibleModel("primary", client=client, limits=limits)
        with serve_gateway(tmp_path, extra_agents=[Agent.build("limited", model)]) as running:
            server.set("primary", hang=True)
            async with httpx.AsyncClient(base_url=running.url, timeout=30, headers=auth("alice")) as client:

                async def post(text: str) -> str:
                    sid = (await client.post("/v1/sessions", json={"agent": "limited"})).json()["session_id"]
                    await client.post(f"/v1/sessions/{sid}/messages", json={"text": text})
                    return str(sid)

                await post("one")
                await until(lambda: server.count("primary", "hung") == 1)
                second = (await client.post("/v1/sessions", json={"agent": "limited"})).json()["session_id"]
                into: list[Any] = []
                async with client.stream("GET", f"/v1/sessions/{second}/events") as response:
                    stream = sse_messages(response)
                    await client.post(f"/v1/sessions/{second}/messages", json={"text": "two"})
                    waiting = await read_until(stream, lambda m: m.event == "waiting", into)
                    assert waiting.id is None  # ephemeral: never replayed, a reconnect does not skip past it
                    shown = {k: waiting.json[k] for k in ("model", "waiting", "ahead", "step")}
                    assert shown == {"model": "primary", "waiting": True, "ahead": 0, "step": 0}
                    assert "its client-side maximum" in waiting.json["reason"]
                    server.clear("primary")
                    await read_until(stream, lambda m: m.event == "TurnFinished", into)
                assert [m.json["waiting"] for m in into if m.event == "waiting"] == [True, False]
                assert [m.json["text"] for m in into if m.event == "AssistantMessage"] == ["answer to two"]
                await until(lambda: server.count("primary", "answered") == 2)


async def _items(api: AgentSessions, sid: str, text: str) -> list[Any]:
    return [i async for i in api.send_user_message(sid, text)]


async def _gather(api: AgentSessions, sid: str, text: str, into: list[Any]) -> None:
    async for item in api.send_user_message(sid, text):
        into.append(item)


async def test_a_call_that_gives_up_while_queued_is_skipped_not_admitted() -> None:
    limiter = Limiter(EndpointLimits(max_in_flight=1), ManualClock())
    holder = limiter.admit_now("a", 0)
    assert holder is not None
    gives_up = asyncio.create_task(limiter.admit("b", 0))
    await until(lambda: limiter.queued == 1)
    next_one = asyncio.create_task(limiter.admit("c", 0))
    await until(lambda: limiter.queued == 2)
    gives_up.cancel()  # its wait is cancelled; its task has not run its handler yet
    limiter.release(holder)  # the slot goes to the next call still waiting, not to the cancelled one
    admitted = await asyncio.wait_for(next_one, 30)
    with pytest.raises(asyncio.CancelledError):
        await gives_up
    assert (limiter.in_flight, limiter.queued) == (1, 0)
    limiter.release(admitted)
    assert limiter.in_flight == 0


def test_a_wait_crosses_to_gateways_in_other_processes_on_kafkas_live_topic() -> None:
    from turnlog.engine.log.kafka_live import decode, encode

    for wait in (
        ModelWaiting("s", "t", 2, "primary", "held", 4),
        ModelWaiting("s", "t", 2, "primary", "", 0, False),
    ):
        kind, value = encode(wait)
        assert (kind, decode("s", kind, value)) == (b"waiting", wait)


@pytest.mark.parametrize(
    "headers, seconds",
    [
        ({"retry-after-ms": "350", "retry-after": "1"}, 0.35),
        ({"Retry-After": "2"}, 2.0),
        ({"x-ratelimit-reset-requests": "1m30.5s", "x-ratelimit-remaining-requests": "0"}, 90.5),
        ({"x-ratelimit-reset-tokens": "20ms", "x-ratelimit-remaining-tokens": "0",
          "x-ratelimit-reset-requests": "6m0s", "x-ratelimit-remaining-requests": "12"}, 0.02),
        ({"x-ratelimit-reset-requests": "soon"}, None),
        ({}, None),
    ],
)  # fmt: skip
def test_a_429s_reset_is_read_from_the_headers_openai_sends(headers: dict[str, str], seconds: Any) -> None:
    assert reset_after(headers) == (pytest.approx(seconds) if seconds is not None else None)


def test_limits_that_cannot_work_are_refused_with_what_to_set() -> None:
    with pytest.raises(ConfigurationError, match="requests_per_minute must be above 0"):
        EndpointLimits(requests_per_minute=0)
    with pytest.raises(ConfigurationError, match="max_retry_wait_s must be >= 0"):
        EndpointLimits(max_retry_wait_s=-1)


def test_models_without_an_endpoint_have_no_breaker_or_limits() -> None:
    class Plain(Model):
        async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
            yield ModelResponse("ok")

    assert Plain().endpoint is None
