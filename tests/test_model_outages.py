"""Model outages across sessions: one circuit breaker per endpoint, shared by every session of a
process, decides which model a new call starts with. Real HTTP on loopback (bench/fault_server.py)
through the real OpenAI SDK; the breaker's time is a ManualClock, moved by the test."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.fault_server import FaultServer
from turnlog.engine import AgentSessions, SqliteEventLog
from turnlog.engine import events as ev
from turnlog.engine.agent import Agent, AgentDirectory
from turnlog.engine.models.breaker import BreakerPolicy
from turnlog.engine.models.clock import ManualClock
from turnlog.engine.models.endpoints import Endpoints
from turnlog.engine.models.fallback import FallbackModel
from turnlog.engine.models.openai_compat import OpenAICompatibleModel
from turnlog.engine.stream import ModelDelta
from turnlog.render import LiveRenderer

POLICY = BreakerPolicy(failures=3, window_s=30, cooldown_s=10, stall_calls=3, stall_min_s=2)


def _answer(body: dict[str, Any]) -> tuple[str, list[Any]]:
    return f"The {body['model']} model answers this one in full.", []


@dataclass
class Fleet:
    """One process: the fault server, an agent whose primary and backup are endpoints on it, and
    the AgentSessions that runs many sessions with one registry of endpoints."""

    server: FaultServer
    api: AgentSessions
    clock: ManualClock
    log: SqliteEventLog

    async def turn(self, text: str = "Where is my parcel?") -> tuple[str, list[Any]]:
        session = await self.api.create_session("support", "u")
        items = [i async for i in self.api.send_user_message(session.session_id, text)]
        return session.session_id, items

    async def events(self, session_id: str) -> list[ev.Event]:
        return list(await self.log.read_session(session_id))


@contextlib.asynccontextmanager
async def fleet(tmp_path: Path, policy: BreakerPolicy = POLICY) -> AsyncIterator[Fleet]:
    async with FaultServer(_answer, keep_bodies=True) as server:
        primary = OpenAICompatibleModel("primary", base_url=server.base_url, api_key="k", breaker=policy)
        backup = OpenAICompatibleModel("backup", base_url=server.base_url, api_key="k")
        agent = Agent.build("support", FallbackModel(primary, backup, first_token_s=15, response_s=30))
        log = SqliteEventLog(tmp_path / "log.db", partitions=2)
        clock = ManualClock()
        api = AgentSessions(log, AgentDirectory([agent]), endpoints=Endpoints(clock))
        try:
            yield Fleet(server, api, clock, log)
        finally:
            await agent.model.aclose()
            await log.close()


def of(items: list[Any], kind: type[ev.Event]) -> list[Any]:
    return [i for i in items if isinstance(i, kind)]


def rendered(items: list[Any]) -> str:
    console = Console(record=True, width=300)
    render = LiveRenderer(console)
    for item in items:
        render(item)
    return console.export_text()


def answered_by(items: list[Any]) -> str:
    [finished] = of(items, ev.ModelCallFinished)
    assert finished.status == "ok"
    return str(finished.model)


async def test_failures_open_the_breaker_then_calls_start_on_the_backup_until_a_probe_closes_it(
    tmp_path: Path,
) -> None:
    async with fleet(tmp_path) as f:
        _, healthy = await f.turn()
        assert answered_by(healthy) == "primary" and not of(healthy, ev.ModelFallback)
        f.server.set("primary", status=500)
        failed = [await f.turn() for _ in range(3)]  # three sessions, each fails over on its own
        for _, items in failed:
            [switch] = of(items, ev.ModelFallback)
            assert (switch.cause, answered_by(items)) == ("failed", "backup")
            assert "answered 500" in switch.reason
        # the third failure (3 of the 4 calls that ended in the window) opened it, in its session
        assert [of(items, ev.ModelBreakerChanged) != [] for _, items in failed] == [False, False, True]
        [opened] = of(failed[-1][1], ev.ModelBreakerChanged)
        assert (opened.model, opened.from_state, opened.to_state) == ("primary", "closed", "open")
        assert opened.endpoint == f.server.base_url and "3 of the 4 calls" in opened.reason
        assert f.server.count("primary") == 4

        sid, skipped = await f.turn()  # new calls start on the backup: the primary is not called
        [switch] = of(skipped, ev.ModelFallback)
        assert (switch.from_model, switch.to_model, switch.cause) == ("primary", "backup", "breaker_open")
        assert "breaker of primary at" in switch.reason and "is open" in switch.reason
        assert answered_by(skipped) == "backup" and f.server.count("primary") == 4
        assert [type(e).__name__ for e in await f.events(sid)].count("ModelFallback") == 1  # on the log
        shown = rendered(failed[-1][1] + skipped)  # what `turnlog chat` prints
        assert f"breaker  primary at {f.server.base_url}: closed → open (3 of the 4 calls" in shown
        assert "fallback primary → backup (breaker open): the breaker of primary at" in shown

        f.server.clear("primary")
        f.clock.advance(POLICY.cooldown_s)
        _, probed = await f.turn()  # the first call after the cool-down probes, answers, closes it
        changes = [(c.from_state, c.to_state) for c in of(probed, ev.ModelBreakerChanged)]
        assert changes == [("open", "half_open"), ("half_open", "closed")]
        assert answered_by(probed) == "primary" and not of(probed, ev.ModelFallback)
        _, after = await f.turn()
        assert answered_by(after) == "primary" and not of(after, ev.ModelBreakerChanged)
        assert f.server.count("primary") == 6


async def test_a_failed_probe_opens_the_breaker_for_another_cool_down(tmp_path: Path) -> None:
    async with fleet(tmp_path) as f:
        f.server.set("primary", status=503)
        for _ in range(3):
            await f.turn()
        f.clock.advance(POLICY.cooldown_s)
        _, probed = await f.turn()
        changes = [(c.from_state, c.to_state) for c in of(probed, ev.ModelBreakerChanged)]
        assert changes == [("open", "half_open"), ("half_open", "open")]
        assert "the probe call failed" in of(probed, ev.ModelBreakerChanged)[-1].reason
        assert of(probed, ev.ModelFallback)[0].cause == "failed" and answered_by(probed) == "backup"
        f.clock.advance(POLICY.cooldown_s - 1)  # still cooling down: straight to the backup
        _, skipped = await f.turn()
        assert of(skipped, ev.ModelFallback)[0].cause == "breaker_open"
        assert f.server.count("primary") == 4  # three failures and one probe, nothing more


async def test_background_errors_and_the_requests_own_errors_never_open_it(tmp_path: Path) -> None:
    async with fleet(tmp_path) as f:
        for _ in range(6):
            await f.turn()
        f.server.set("primary", status=500)
        for _ in range(3):  # 3 failures, but of 9 calls in the window: under half
            await f.turn()
        f.server.set("primary", status=400)  # the request's own fault, however often
        for _ in range(4):
            await f.turn()
        f.server.clear("primary")
        _, items = await f.turn()
        assert answered_by(items) == "primary" and not of(items, ev.ModelFallback)
        assert f.server.count("primary") == 14


async def test_a_hung_endpoint_hands_the_calls_waiting_on_it_to_the_backup_before_their_limit(
    tmp_path: Path,
) -> None:
    async with fleet(tmp_path) as f:
        for _ in range(10):  # the endpoint's usual time to first token is learned from its answers
            assert answered_by((await f.turn())[1]) == "primary"
        f.server.set("primary", hang=True)
        turns = [asyncio.create_task(f.turn()) for _ in range(3)]
        await until(lambda: f.server.count("primary", "hung") == 3)
        assert not any(t.done() for t in turns)
        f.clock.advance(POLICY.stall_min_s)  # three calls waited past the stall limit, no answer came
        done = await asyncio.wait_for(asyncio.gather(*turns), 30)
        opened = [c for _, items in done for c in of(items, ev.ModelBreakerChanged)]
        assert [(c.from_state, c.to_state) for c in opened] == [("closed", "open")]
        assert "3 calls waited" in opened[0].reason and "none came" in opened[0].reason
        for _, items in done:
            [switch] = of(items, ev.ModelFallback)
            assert switch.cause == "breaker_open" and "opened while this call waited" in switch.reason
            assert "first-token limit" not in switch.reason
            assert answered_by(items) == "backup"
        _, later = await f.turn()
        assert of(later, ev.ModelFallback)[0].cause == "breaker_open"
        assert f.server.count("primary") == 13  # the later call never reached the hung endpoint
        f.server.clear("primary")


async def test_a_stream_cut_midway_leaves_no_half_message_and_logs_the_fallback(tmp_path: Path) -> None:
    async with fleet(tmp_path) as f:
        f.server.set("primary", cut_after_chunks=4)  # the role chunk and 3 pieces of text, then cut
        sid, items = await f.turn()
        streamed = "".join(i.text for i in items if isinstance(i, ModelDelta))
        partial = "The primary model answers this one in full."[:24]
        assert streamed.startswith(partial)  # the user saw the cut answer begin, live
        [switch] = of(items, ev.ModelFallback)
        assert (switch.from_model, switch.to_model, switch.cause) == ("primary", "backup", "failed")
        assert "broke before the answer was complete" in switch.reason
        assert "partial answer was discarded" in switch.reason
        logged = await f.events(sid)
        assert [e for e in logged if isinstance(e, ev.ModelFallback)] == [switch]
        [message] = [e for e in logged if isinstance(e, ev.AssistantMessage)]
        assert message.text == "The backup model answers this one in full."
        state = await f.api.runner.reload(sid)
        assert [m.content for m in state.messages if m.role == "assistant"] == [message.text]
        f.server.clear("primary")
        items = [i async for i in f.api.send_user_message(sid, "And the other parcel?")]
        sent = f.server.bodies[-1]["messages"]  # what the model is sent next: the backup's answer only
        assert [m["content"] for m in sent if m["role"] == "assistant"] == [message.text]
        assert not any(str(m.get("content")).startswith(partial) for m in sent)


async def test_breaker_changes_and_the_calls_it_sends_elsewhere_are_metrics(tmp_path: Path) -> None:
    from turnlog.gateway.observe import EventLogger, GatewayMetrics, ObservabilityConsumer

    async with fleet(tmp_path) as f:
        f.server.set("primary", status=500)
        for _ in range(4):  # three failures open it, the fourth call is sent to the backup
            await f.turn()
        metrics = GatewayMetrics()
        consumer = ObservabilityConsumer(f.log, logger=EventLogger(), metrics=metrics)
        await consumer.poll_once()
        text = (await metrics.render())[0].decode()
        url = f.server.base_url
        assert 'turnlog_model_breaker_changes_total{model="primary",to_state="open"} 1.0' in text
        assert f'turnlog_model_breaker_open{{endpoint="{url}",model="primary",worker="api"}} 1.0' in text
        assert 'turnlog_model_switches_total{cause="failed",model="primary"} 3.0' in text
        assert 'turnlog_model_switches_total{cause="breaker_open",model="primary"} 1.0' in text
        f.server.clear("primary")
        f.clock.advance(POLICY.cooldown_s)
        await f.turn()  # the probe closes it
        await consumer.poll_once()
        text = (await metrics.render())[0].decode()
        assert f'turnlog_model_breaker_open{{endpoint="{url}",model="primary",worker="api"}} 0.0' in text
        assert 'turnlog_model_breaker_changes_total{model="primary",to_state="closed"} 1.0' in text


async def until(condition: Any, timeout_s: float = 30.0) -> None:
    """Wait for ``condition()`` with a generous deadline (a busy machine is slow, never wrong)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)
