"""A turn worker runs many sessions' turns at once, each session's strictly in order (issue 14):
a slow model call of one session never delays another's turn; a worker SIGKILLed with 50 turns
in flight is continued by its successor with every turn finished once, no keyless tool run twice
(a keyed one killed mid-call runs again and is delivered once) and the projections equal to a
rebuild; a worker stopped with SIGTERM ends each turn at a step boundary (no tool left
"interrupted") and its successor finishes them. Both backends; timings are never
asserted (bench/production.py measures them)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fleet import AGENT, deliveries, fleet_agent, recorder, side_effects
from tests.services import delete_topics, fresh_topic, kafka_log, need_service, postgres_store
from turnlog.consumers import Projector, TurnWorker
from turnlog.engine import (
    Agent,
    AgentDirectory,
    AgentSessions,
    EventLog,
    Model,
    ModelRequest,
    ModelResponse,
    fold,
)
from turnlog.engine import events as ev
from turnlog.engine.log.sqlite import SqliteEventLog
from turnlog.engine.models.base import ModelChunk
from turnlog.projections import rebuild
from turnlog.projections.schema import READ_MODELS
from turnlog.projections.store import ProjectionStore, SqliteProjectionStore

REPO = Path(__file__).resolve().parent.parent
PARTITIONS = 4
WAIT_S = 120.0


async def until(what: str, condition: Callable[[], Awaitable[bool]], timeout: float = WAIT_S) -> None:
    """Poll ``condition`` until it holds; fail saying what was awaited."""
    try:
        async with asyncio.timeout(timeout):
            while not await condition():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"waited {timeout:.0f} s for {what}") from None


class GatedModel(Model):
    """Answers at once, except for the sessions in ``held``: their calls wait for ``gate``."""

    name = "gated"

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.held: set[str] = set()
        self.waiting = asyncio.Event()

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        if request.session_id in self.held:
            self.waiting.set()
            await self.gate.wait()
        yield ModelResponse(f"answer for {request.session_id}")


def turns_finished(events: list[ev.Event]) -> list[ev.TurnFinished]:
    return [e for e in events if isinstance(e, ev.TurnFinished)]


async def test_a_slow_session_does_not_block_a_fast_one_on_the_same_worker(log: EventLog) -> None:
    model = GatedModel()
    agents = AgentDirectory([Agent("agent", model, [])])
    api = AgentSessions(log, agents, producer="gateway")
    slow = (await api.create_session("agent", "u1")).session_id
    fast = (await api.create_session("agent", "u2")).session_id
    model.held.add(slow)
    worker = TurnWorker(log, agents, worker_id="w1")
    running = asyncio.create_task(worker.run())
    try:
        await api.post_user_message(slow, "take your time")
        await asyncio.wait_for(model.waiting.wait(), WAIT_S)  # the slow call is in flight
        await api.post_user_message(fast, "quick one")

        async def fast_answered() -> bool:
            return bool(turns_finished(await log.read_session(fast)))

        await until("the fast session's turn to finish while the slow call waits", fast_answered)
        slow_events = await log.read_session(slow)
        assert any(isinstance(e, ev.ModelCallStarted) for e in slow_events)
        assert not turns_finished(slow_events)  # still waiting on its model: it blocked nobody
        model.gate.set()

        async def slow_answered() -> bool:
            return bool(turns_finished(await log.read_session(slow)))

        await until("the slow session's turn to finish once its model answers", slow_answered)
    finally:
        worker.stop()
        await running
    for sid in (slow, fast):
        (finished,) = turns_finished(await log.read_session(sid))
        assert finished.reason == "answered"


# --- worker processes killed or stopped mid-run --------------------------------------------------


@dataclass
class Fleet:
    """One backend's log seen from the test (a producer that owns no partition), the live and
    rebuilt read models, where the workers record their tool runs, and how to start them."""

    backend: str
    producer: EventLog
    live: ProjectionStore
    rebuilt: ProjectionStore
    effects: str
    schema: str
    command: list[str]
    successor: Callable[[], contextlib.AbstractAsyncContextManager[EventLog]]

    def start_worker(self, worker_id: str, latency_s: float) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [*self.command, worker_id, str(latency_s)],
            env={**os.environ, "PYTHONPATH": str(REPO)},
            cwd=REPO,
        )


@pytest.fixture
async def fleet(backend: str, tmp_path: Path) -> AsyncIterator[Fleet]:
    procs = [sys.executable, str(REPO / "tests" / "procs.py")]
    if backend == "sqlite":
        path, effects = tmp_path / "log.db", str(tmp_path / "effects.db")
        producer = SqliteEventLog(path, partitions=PARTITIONS)
        live, rebuilt = SqliteProjectionStore(tmp_path / "live.db"), SqliteProjectionStore(tmp_path / "rb.db")

        @contextlib.asynccontextmanager
        async def successor() -> AsyncIterator[EventLog]:
            yield producer

        command = [*procs, "sqlite-fleet-worker", str(path), str(PARTITIONS), effects]
        yield Fleet(backend, producer, live, rebuilt, effects, "", command, successor)
        await producer.close()
        live.close()
        rebuilt.close()
        return
    bootstrap, dsn = need_service("TURNLOG_KAFKA_BOOTSTRAP"), need_service("TURNLOG_POSTGRES_DSN")
    topic = fresh_topic()
    with postgres_store(dsn) as pg_live, postgres_store(dsn) as pg_rebuilt:
        async with kafka_log(bootstrap, partitions=PARTITIONS, topic=topic, owner=False) as reader:
            command = [*procs, "kafka-worker", bootstrap, topic, str(PARTITIONS), dsn, pg_live.schema]

            def successor() -> contextlib.AbstractAsyncContextManager[EventLog]:
                return kafka_log(bootstrap, partitions=PARTITIONS, topic=topic)

            async with recorder(dsn, pg_live.schema, "setup"):
                pass  # creates the side_effects table
            yield Fleet(backend, reader, pg_live, pg_rebuilt, dsn, pg_live.schema, command, successor)
    await delete_topics(bootstrap, topic)


async def post_sessions(fleet: Fleet, count: int) -> list[str]:
    sids = [f"{fleet.backend}-{i:03d}" for i in range(count)]
    for sid in sids:
        await fleet.producer.submit(ev.SessionCreated(session_id=sid, version=1, agent_id=AGENT, user_id="u"))
        message = ev.UserMessageReceived(
            session_id=sid, version=0, message_id=f"{sid}-m1", text="m1", user_id="u"
        )
        await fleet.producer.submit(message)
    return sids


async def tally(log: EventLog, sids: list[str]) -> Counter[str]:
    """Over every session: turns started and finished, tool calls started."""
    counts: Counter[str] = Counter()
    for sid in sids:
        for event in await log.read_session(sid):
            if isinstance(event, ev.TurnStarted | ev.TurnFinished | ev.ToolCallStarted):
                counts[event.type] += 1
    return counts


@contextlib.contextmanager
def worker_process(fleet: Fleet, worker_id: str, latency_s: float) -> Iterator[subprocess.Popen[bytes]]:
    proc = fleet.start_worker(worker_id, latency_s)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)


async def finish_with_a_successor(fleet: Fleet, sids: list[str]) -> None:
    """A successor worker (in this process) runs whatever the log says is left."""
    async with fleet.successor() as log:
        async with recorder(fleet.effects, fleet.schema, "successor") as backend:
            agent = fleet_agent(backend, jitter_s=0.0)
            successor = TurnWorker(log, AgentDirectory([agent]), worker_id="successor")

            async def all_done() -> bool:
                await successor.poll_once()
                return (await tally(log, sids))["TurnFinished"] >= len(sids)

            await until("the successor to finish every turn", all_done)


async def check_every_turn_once(fleet: Fleet, sids: list[str]) -> Counter[str]:
    """Each message had exactly one turn, answered; each tool call finished once; every notify
    (keyed: run again after a kill) was delivered exactly once; no alert (no key) ran twice;
    return the alert outcomes."""
    runs = side_effects(fleet.effects, fleet.schema)
    paged = Counter((sid, call_id) for sid, call_id, name, _ in runs if name == "alert")
    delivered = Counter((sid, call_id) for sid, call_id, _ in deliveries(fleet.effects, fleet.schema))
    outcomes: Counter[str] = Counter()
    for sid in sids:
        events = await fleet.producer.read_session(sid)
        assert [e.version for e in events] == list(range(1, len(events) + 1)), sid
        assert [e.message_id for e in events if isinstance(e, ev.TurnStarted)] == [f"{sid}-m1"], sid
        (finished,) = turns_finished(events)
        assert finished.reason == "answered", sid
        done = {e.call_id: e for e in events if isinstance(e, ev.ToolCallFinished)}
        assert sorted(done) == ["alert-m1", "lookup-m1", "notify-m1"], sid
        assert len([e for e in events if isinstance(e, ev.ToolCallFinished)]) == 3, sid
        assert done["notify-m1"].status == "success" and delivered[(sid, "notify-m1")] == 1, sid
        alert = done["alert-m1"]
        outcomes[alert.status] += 1
        if alert.status == "success":
            assert paged[(sid, "alert-m1")] == 1, sid
        else:  # killed between the page and its record: reported, never paged again
            assert alert.status == "interrupted" and paged[(sid, "alert-m1")] <= 1, sid
        state = fold(sid, events)
        assert not state.inbox and state.turn is None, sid
    assert max(paged.values(), default=0) <= 1 and max(delivered.values(), default=0) <= 1
    return outcomes


async def check_projections(fleet: Fleet) -> None:
    await Projector(fleet.producer, fleet.live).catch_up()
    assert await rebuild(fleet.producer, fleet.rebuilt) > 0
    for name in READ_MODELS:
        assert fleet.live.table(name) == fleet.rebuilt.table(name), name


async def test_a_worker_killed_with_50_turns_in_flight_is_continued_once(fleet: Fleet) -> None:
    sids = await post_sessions(fleet, 50)
    projector = Projector(fleet.producer, fleet.live, idle_wait_s=0.2)
    projecting = asyncio.create_task(projector.run())
    try:
        # 3 s per model call (x 0.5-1.5): a turn takes 4.5 s at least, time enough for the worker
        # to take every partition and start all 50 turns before any ends, on a busy machine
        with worker_process(fleet, "doomed", latency_s=3.0) as proc:
            seen: list[Counter[str]] = []

            async def all_in_flight() -> bool:
                assert proc.poll() is None, "the worker process died on its own"
                seen[:] = [await tally(fleet.producer, sids)]
                open_turns = seen[0]["TurnStarted"] - seen[0]["TurnFinished"]
                return open_turns == 50 and seen[0]["ToolCallStarted"] > 0

            try:
                await until("50 turns in flight, some of them running tools", all_in_flight)
            except AssertionError as exc:
                raise AssertionError(f"{exc}; last seen: {dict(seen[0]) if seen else 'nothing'}") from None
            proc.send_signal(signal.SIGKILL)
        await finish_with_a_successor(fleet, sids)
    finally:
        projector.stop()
        await projecting
    outcomes = await check_every_turn_once(fleet, sids)
    assert sum(outcomes.values()) == 50
    await check_projections(fleet)


async def test_a_worker_stopped_with_sigterm_ends_its_turns_at_a_step_boundary(fleet: Fleet) -> None:
    sids = await post_sessions(fleet, 20)
    with worker_process(fleet, "stopping", latency_s=0.5) as proc:

        async def tools_running() -> bool:
            assert proc.poll() is None, "the worker process died on its own"
            return (await tally(fleet.producer, sids))["ToolCallStarted"] >= 10

        await until("tool calls in flight", tools_running)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, WAIT_S) == 0  # drained and exited cleanly
    left = await tally(fleet.producer, sids)
    assert left["TurnFinished"] < 20  # the stop left turns for the successor
    await finish_with_a_successor(fleet, sids)
    outcomes = await check_every_turn_once(fleet, sids)
    assert outcomes == Counter(success=20)  # every started tool finished before the worker left
