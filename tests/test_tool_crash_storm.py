"""Kills from outside vs. a tool that kills its own worker (engine/tools/recovery.py), with real
worker processes (tests/keyed_crash.py) on a real log:

* the test SIGKILLs a worker again and again, each time while a keyed write and a read-only
  check are both in flight in it (their runs are recorded, neither has returned): more starts
  than ``max_starts`` per call, yet neither is ever given up, and both finish with their real
  results, the write applied exactly once;
* a tool that kills every worker that starts it, with the default settings, is given up within
  the bound the docs state (``poison_bound``), the workers' clocks running ahead as if each
  takeover took ten seconds (so the test does not wait out the minute).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest

from tests.crash_support import WAIT_S, Crashes, Worker, crash_backend, finish, of, open_session
from tests.fleet import Backend, deliveries, runs_by, side_effects
from tests.keyed_crash import crash_agent, storm_agent
from turnlog.engine import events as ev
from turnlog.engine.tools.recovery import poison_bound
from turnlog.engine.tools.registry import DEFAULT_MAX_STARTS

KILLS = {"sqlite": (4, 5), "kafka": (1, 5)}
"""Per backend: tool steps, and kills in each (a Kafka takeover waits out the dead member's
session, several seconds a kill). Five kills make six starts: past the default ``max_starts``."""
TAKEOVER_S = 10.0
"""How far each poisoned worker's clock runs ahead of the previous one's."""


@pytest.fixture
async def crashes(backend: str, tmp_path: Path) -> AsyncIterator[Crashes]:
    async with crash_backend(backend, tmp_path) as found:
        yield found


async def kill_in_flight(crashes: Crashes, sid: str, step: int) -> None:
    """Start a worker that lets steps before ``step`` finish; SIGKILL it once its write and its
    check of ``step`` are both running (each recorded its run under this worker)."""
    worker = crashes.start_worker("storm", str(step - 1))
    try:
        wanted = {(sid, f"write-{step}", "write"), (sid, f"check-{step}", "check")}
        async with asyncio.timeout(WAIT_S):
            while not wanted <= {r[:3] for r in runs_by(crashes.target, crashes.schema, worker.runs_as)}:
                assert worker.proc.poll() is None, f"the worker ended before step {step}: {worker.said()}"
                await asyncio.sleep(0.05)
        worker.proc.send_signal(signal.SIGKILL)
        assert await worker.ended() == -signal.SIGKILL
    finally:
        worker.close()


async def test_kills_unrelated_to_the_tools_never_give_a_keyed_write_or_a_lookup_up(crashes: Crashes) -> None:
    steps, per_step = KILLS[crashes.backend]
    sid = f"{crashes.backend}-storm"
    await open_session(crashes, sid, f"storm {steps}")
    kills = 0
    for step in range(1, steps + 1):
        for _ in range(per_step):
            await kill_in_flight(crashes, sid, step)
            kills += 1
    assert kills == steps * per_step and (crashes.backend != "sqlite" or kills >= 20)
    assert per_step + 1 > DEFAULT_MAX_STARTS, "each call is started more often than max_starts"

    events = await finish(crashes, sid, lambda b: storm_agent(b, steps))

    assert not [e for e in of(events, ev.ToolCallFinished) if e.status != "success"], "none given up"
    results = {e.call_id: (e.content, e.attempts) for e in of(events, ev.ToolCallFinished)}
    for step in range(1, steps + 1):
        assert results[f"write-{step}"] == (f"written {step}", per_step + 1)
        assert results[f"check-{step}"] == (f"free {step}", per_step + 1)
        keys = {e.idempotency_key for e in of(events, ev.ToolCallStarted) if e.call_id == f"write-{step}"}
        (key,) = keys  # every start of the write got the same key
        landed = [row for row in deliveries(crashes.target, crashes.schema) if row[1] == f"write-{step}"]
        assert landed == [(sid, f"write-{step}", key)], "applied exactly once"
        made = [r for r in side_effects(crashes.target, crashes.schema) if r[1] == f"write-{step}"]
        assert len(made) == per_step + 1 and {r[3] for r in made} == {key}
    (finished,) = of(events, ev.TurnFinished)
    assert finished.reason == "answered"
    answer = of(events, ev.AssistantMessage)[-1].text
    assert answer == "done: " + ", ".join(f"written {s}, free {s}" for s in range(1, steps + 1))


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_a_tool_that_kills_every_worker_is_given_up_within_the_documented_bound(
    crashes: Crashes,
) -> None:
    sid = "poisoned"
    await open_session(crashes, sid)
    book = crash_agent(cast(Backend, None), "book", "entry").tools.get("book")
    assert book is not None and (book.max_starts, book.crash_window_s) == (DEFAULT_MAX_STARTS, 60.0)
    most, _ = poison_bound(book)
    deaths = 0
    async with asyncio.timeout(WAIT_S * 3):
        while True:
            worker = crashes.start_worker("book", "entry", offset_s=deaths * TAKEOVER_S)
            try:
                if not await died_or_finished(crashes, sid, worker):
                    break  # it gave the call up and finished the turn
                deaths += 1
                assert deaths <= most, f"{deaths} workers died, more than the bound of {most}"
            finally:
                worker.close()

    events = await crashes.producer.read_session(sid)
    assert deaths == len(of(events, ev.ToolCallStarted)) >= DEFAULT_MAX_STARTS
    (done,) = of(events, ev.ToolCallFinished)
    assert (done.status, done.attempts) == ("abandoned", deaths)
    assert of(events, ev.TurnFinished)[0].reason == "answered"
    assert [r for r in side_effects(crashes.target, crashes.schema) if r[0] == sid] == []


async def died_or_finished(crashes: Crashes, sid: str, worker: Worker) -> bool:
    """True when the worker was killed (by its tool), False when the session's turn finished
    while it lived."""
    while worker.proc.poll() is None:
        if of(await crashes.producer.read_session(sid), ev.TurnFinished):
            return False
        await asyncio.sleep(0.05)
    assert await worker.ended() == -signal.SIGKILL, worker.said()
    return True
