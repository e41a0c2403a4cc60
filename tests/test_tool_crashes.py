"""Tool calls whose worker dies, on both backends, with real worker processes SIGKILLed at an
exact point of the call (tests/keyed_crash.py) and a successor worker finishing the turn:

* a tool that takes its call's idempotency key is run again with the same key after a kill at
  any point of the call (before it reached its service, after the service applied it, after it
  returned but before its result was on the log), and its effect lands once;
* a tool without a key is never run again: "interrupted, outcome unknown";
* a call that kills every worker that starts it ends "abandoned" after its ``max_starts``,
  and the turn goes on: no crash loop;
* an idempotent tool's batch is not committed before it runs (docs/architecture.md "Commits"):
  a worker killed in it leaves the model call that asked for it unanswered, and the successor
  asks again and runs the tool once more; one that kills every worker is still abandoned.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fleet import deliveries, recorder, side_effects
from tests.keyed_crash import AGENT, POINTS, crash_agent
from tests.services import delete_topics, fresh_topic, kafka_log, need_service, postgres_store
from turnlog.consumers import TurnWorker
from turnlog.engine import AgentDirectory, EventLog, SqliteEventLog
from turnlog.engine import events as ev
from turnlog.engine.tools import MARKERS, ToolStatus

REPO = Path(__file__).resolve().parent.parent
PARTITIONS = 2
WAIT_S = 120.0


@dataclass
class Crashes:
    """Where the worker processes log and keep their effects, and how to start one."""

    backend: str
    producer: EventLog
    target: str
    schema: str
    args: list[str]
    successor: Callable[[], contextlib.AbstractAsyncContextManager[EventLog]]

    async def run_dying_worker(self, tool_name: str, point: str, max_starts: int = 5) -> None:
        """Start a worker process that kills itself at ``point`` of the call; wait for its death."""
        command = [sys.executable, str(REPO / "tests" / "procs.py"), "tool-crash", *self.args]
        with tempfile.TemporaryFile() as output:
            proc = subprocess.Popen(
                [*command, tool_name, point, str(max_starts)],
                env={**os.environ, "PYTHONPATH": str(REPO)},
                cwd=REPO,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
            try:
                code = await asyncio.to_thread(proc.wait, WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                code = None
            output.seek(0)
            said = output.read().decode(errors="replace")[-3000:]
        assert code == -signal.SIGKILL, f"the worker ended with {code}, not killed at {point}: {said}"


@pytest.fixture
async def crashes(backend: str, tmp_path: Path) -> AsyncIterator[Crashes]:
    if backend == "sqlite":
        path, effects = tmp_path / "log.db", str(tmp_path / "effects.db")
        producer = SqliteEventLog(path, partitions=PARTITIONS)

        @contextlib.asynccontextmanager
        async def same_file() -> AsyncIterator[EventLog]:
            yield producer

        args = ["sqlite", str(path), "-", str(PARTITIONS), effects, "-"]
        yield Crashes(backend, producer, effects, "", args, same_file)
        await producer.close()
        return
    bootstrap, dsn = need_service("TURNLOG_KAFKA_BOOTSTRAP"), need_service("TURNLOG_POSTGRES_DSN")
    topic = fresh_topic()
    with postgres_store(dsn) as pg:
        async with kafka_log(bootstrap, partitions=PARTITIONS, topic=topic, owner=False) as reader:

            def owner() -> contextlib.AbstractAsyncContextManager[EventLog]:
                return kafka_log(bootstrap, partitions=PARTITIONS, topic=topic)

            args = ["kafka", bootstrap, topic, str(PARTITIONS), dsn, pg.schema]
            yield Crashes(backend, reader, dsn, pg.schema, args, owner)
    await delete_topics(bootstrap, topic)


async def open_session(crashes: Crashes, sid: str) -> None:
    await crashes.producer.submit(ev.SessionCreated(session_id=sid, version=1, agent_id=AGENT, user_id="u"))
    await crashes.producer.submit(
        ev.UserMessageReceived(session_id=sid, version=0, message_id=f"{sid}-m1", text="book it", user_id="u")
    )


async def finish(crashes: Crashes, sid: str, tool_name: str) -> list[ev.Event]:
    """A successor worker whose tool does not die runs what is left of the turn; the events then."""
    async with crashes.successor() as log, recorder(crashes.target, crashes.schema, "successor") as backend:
        worker = TurnWorker(log, AgentDirectory([crash_agent(backend, tool_name, "")]), worker_id="successor")
        async with asyncio.timeout(WAIT_S):
            while not any(isinstance(e, ev.TurnFinished) for e in await log.read_session(sid)):
                await worker.poll_once()
                await asyncio.sleep(0.05)
        return await log.read_session(sid)


def of(events: list[ev.Event], cls: type[ev.E]) -> list[ev.E]:
    return [e for e in events if isinstance(e, cls)]


@pytest.mark.parametrize("point", POINTS)
async def test_a_keyed_tool_killed_mid_call_runs_again_with_its_key_and_lands_once(
    crashes: Crashes, point: str
) -> None:
    sid = f"{crashes.backend}-keyed-{point}"
    await open_session(crashes, sid)
    await crashes.run_dying_worker("book", point)
    before = await crashes.producer.read_session(sid)
    assert [e.attempt for e in of(before, ev.ToolCallStarted)] == [1] and not of(before, ev.ToolCallFinished)

    events = await finish(crashes, sid, "book")

    first, again = of(events, ev.ToolCallStarted)
    assert (first.attempt, again.attempt) == (1, 2) and first.idempotency_key == again.idempotency_key
    (done,) = of(events, ev.ToolCallFinished)
    assert (done.status, done.content, done.attempts) == ("success", "booked", 2)
    landed = [row for row in deliveries(crashes.target, crashes.schema) if row[0] == sid]
    assert landed == [(sid, "call-1", first.idempotency_key)], "the booking took effect exactly once"
    runs = [row for row in side_effects(crashes.target, crashes.schema) if row[0] == sid]
    assert len(runs) == (1 if point == "entry" else 2)  # a run killed at entry never reached the service
    assert {row[3] for row in runs} == {first.idempotency_key}
    (finished,) = of(events, ev.TurnFinished)
    assert finished.reason == "answered"
    assert of(events, ev.AssistantMessage)[-1].text == "done: booked"


async def test_a_tool_without_a_key_killed_after_its_effect_is_never_run_again(crashes: Crashes) -> None:
    sid = f"{crashes.backend}-keyless"
    await open_session(crashes, sid)
    await crashes.run_dying_worker("page", "applied")

    events = await finish(crashes, sid, "page")

    assert [e.attempt for e in of(events, ev.ToolCallStarted)] == [1]
    (done,) = of(events, ev.ToolCallFinished)
    assert done.status == "interrupted" and done.content.startswith(MARKERS[ToolStatus.INTERRUPTED])
    runs = [row for row in side_effects(crashes.target, crashes.schema) if row[0] == sid]
    assert len(runs) == 1, "paged once, by the killed worker; never again"
    (finished,) = of(events, ev.TurnFinished)
    assert finished.reason == "answered"


async def test_a_call_that_kills_every_worker_is_abandoned_after_its_bound(crashes: Crashes) -> None:
    sid = f"{crashes.backend}-crash-loop"
    await open_session(crashes, sid)
    for _ in range(2):  # max_starts=2: two workers die in the call
        await crashes.run_dying_worker("book", "entry", max_starts=2)
    started = of(await crashes.producer.read_session(sid), ev.ToolCallStarted)
    assert [e.attempt for e in started] == [1, 2]

    async with crashes.successor() as log, recorder(crashes.target, crashes.schema, "third") as backend:
        agent = crash_agent(backend, "book", "", max_starts=2)  # a run would show in side_effects
        worker = TurnWorker(log, AgentDirectory([agent]), worker_id="third")
        async with asyncio.timeout(WAIT_S):
            while not of(await log.read_session(sid), ev.TurnFinished):
                await worker.poll_once()
                await asyncio.sleep(0.05)
        events = await log.read_session(sid)

    assert len(of(events, ev.ToolCallStarted)) == 2, "not started a third time"
    (done,) = of(events, ev.ToolCallFinished)
    assert (done.status, done.attempts) == ("abandoned", 2)
    assert done.content.startswith(MARKERS[ToolStatus.ABANDONED]) and "started 2 times" in done.content
    (finished,) = of(events, ev.TurnFinished)
    assert finished.reason == "answered"
    assert of(events, ev.AssistantMessage)[-1].text.startswith("done: [FAILED: ABANDONED")
    assert [row for row in side_effects(crashes.target, crashes.schema) if row[0] == sid] == []


@pytest.mark.parametrize("point", ["entry", "applied"])
async def test_an_idempotent_tool_killed_mid_call_is_run_once_more_after_recovery(
    crashes: Crashes, point: str
) -> None:
    sid = f"{crashes.backend}-idempotent-{point}"
    await open_session(crashes, sid)
    await crashes.run_dying_worker("lookup", point)
    before = await crashes.producer.read_session(sid)
    # its batch rides the next commit: the log ends with the model call that asked for it
    assert before[-1].type == "ModelCallStarted" and not of(before, ev.ToolCallStarted)
    assert not of(before, ev.AssistantMessage)

    events = await finish(crashes, sid, "lookup")

    runs = [row for row in side_effects(crashes.target, crashes.schema) if row[0] == sid]
    assert len(runs) == (1 if point == "entry" else 2), "run once more by the successor, no more"
    (started,) = of(events, ev.ToolCallStarted)
    assert started.attempt == 1 and started.producer != before[-1].producer
    (done,) = of(events, ev.ToolCallFinished)
    assert (done.status, done.content, done.attempts) == ("success", "free", 1)
    # the model call the killed worker made is recorded interrupted and made again
    statuses = [e.status for e in of(events, ev.ModelCallFinished)]
    assert statuses == ["interrupted", "ok", "ok"]
    (finished,) = of(events, ev.TurnFinished)
    assert finished.reason == "answered"
    assert of(events, ev.AssistantMessage)[-1].text == "done: free"


async def test_an_idempotent_tool_that_kills_every_worker_is_abandoned_after_its_bound(
    crashes: Crashes,
) -> None:
    """The first death leaves no start on the log; the successor that found the model call
    unanswered commits its batch before running it, so the ledger counts from there."""
    sid = f"{crashes.backend}-idempotent-loop"
    await open_session(crashes, sid)
    for _ in range(3):  # max_starts=2: one unrecorded death, then two recorded starts
        await crashes.run_dying_worker("lookup", "entry", max_starts=2)
    started = of(await crashes.producer.read_session(sid), ev.ToolCallStarted)
    assert [e.attempt for e in started] == [1, 2]

    async with crashes.successor() as log, recorder(crashes.target, crashes.schema, "fourth") as backend:
        worker = TurnWorker(
            log, AgentDirectory([crash_agent(backend, "lookup", "", max_starts=2)]), worker_id="4"
        )
        async with asyncio.timeout(WAIT_S):
            while not of(await log.read_session(sid), ev.TurnFinished):
                await worker.poll_once()
                await asyncio.sleep(0.05)
        events = await log.read_session(sid)

    assert len(of(events, ev.ToolCallStarted)) == 2, "not started a third time"
    (done,) = of(events, ev.ToolCallFinished)
    assert (done.status, done.attempts) == ("abandoned", 2)
    (finished,) = of(events, ev.TurnFinished)
    assert finished.reason == "answered"
    assert [row for row in side_effects(crashes.target, crashes.schema) if row[0] == sid] == []
