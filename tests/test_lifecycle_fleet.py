"""Expiry and retention in a fleet, on both backends (issue 43's "done when": on a clock the test
controls, with two workers, and a restart in between).

Two worker processes (tests/lifecycle_proc.py: the turn worker and the lifecycle sweeper, as
`turnlog worker` runs them, on the clock the test writes to a file) answer a dozen sessions; the
test folds the projections. The clock moves past the idle limit: every session is closed as
expired exactly once, whichever worker saw it first. One worker is SIGKILLed and restarted. The
clock moves past the retention: a worker whose every erasure hangs (alone, so it claims first)
claims one session and is SIGKILLed mid-erasure; the others erase the rest; once the clock passes
the claim's lease, the session it left is erased too, and a restart later nothing is erased
again. On Kafka each worker
sweeps the partitions it owns; the partitions of a killed one move to the other.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.backend_gateway import PARTITIONS, Stack, stack
from tests.lifecycle_support import IDLE, RETAIN_MS, TestClock, erased_rows
from tests.tool_harness import of
from turnlog.consumers.lifecycle import CLAIM_LEASE_MS, RETENTION
from turnlog.consumers.projector import Projector
from turnlog.engine import events as ev
from turnlog.engine.log.base import EventLog
from turnlog.projections.lifecycle import LifecycleStore
from turnlog.projections.store import ProjectionStore

REPO = Path(__file__).resolve().parent.parent
SESSIONS = 12
WAIT_S = 120.0
"""Deadline for what the workers do (a busy two-core machine; a Kafka rebalance after a kill)."""


async def until(what: str, condition: Callable[[], Awaitable[bool]], timeout: float = WAIT_S) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not await condition():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"waited {timeout:.0f} s for {what}") from None


class Fleet:
    """The worker processes of one test, on one stack, reading the test's clock."""

    def __init__(self, where: Stack, home: Path, clock: TestClock) -> None:
        self.where, self.home, self.clock = where, home, clock
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        kafka = where.backend == "kafka"
        self.log_arg = f"kafka:{where.bootstrap}:{where.topic}" if kafka else str(home / "log.db")
        self.store_args = [where.dsn, where.schema] if kafka else [str(home / "projections.db")]
        self.erased_at = (where.dsn, where.schema) if kafka else (str(home / "projections.db"), "")
        """Where the workers' erasers record (tests/lifecycle_support.TableEraser)."""

    def erased(self) -> dict[str, tuple[str, int, str]]:
        return erased_rows(*self.erased_at)

    def start(self, name: str, *, hang: bool = False) -> None:
        assert clock_path(self.home).exists()
        args = [str(clock_path(self.home)), str(self.sweeps_file(name)), name, "*" if hang else "-",
                self.log_arg, str(PARTITIONS), *self.store_args]  # fmt: skip
        self.sweeps_file(name).unlink(missing_ok=True)
        with (self.home / f"{name}.out").open("ab") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, str(REPO / "tests" / "lifecycle_proc.py"), *args],
                env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.kill()
        proc.wait(timeout=60)

    def sweeps_file(self, name: str) -> Path:
        return self.home / f"{name}.sweeps"

    def sweeps(self, name: str) -> int:
        try:
            return int(self.sweeps_file(name).read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                output = (self.home / f"{name}.out").read_text(errors="replace")[-4000:]
                raise AssertionError(f"worker {name} exited ({proc.returncode}):\n{output}")

    async def swept(self, *names: str) -> None:
        """Wait until each named worker has made two more sweeps (one whole sweep since now)."""
        marks = {name: self.sweeps(name) for name in names}

        async def all_swept() -> bool:
            self.check_alive()
            return all(self.sweeps(name) >= marks[name] + 2 for name in names)

        await until(f"two more sweeps of {', '.join(names)}", all_swept)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=60)


def clock_path(home: Path) -> Path:
    return home / "clock"


@pytest.fixture
def where(backend: str, tmp_path: Path) -> Iterator[Stack]:
    with stack(backend, tmp_path) as made:
        yield made


async def test_expiry_and_retention_with_two_workers_a_restart_and_a_kill_mid_erasure(
    where: Stack, tmp_path: Path
) -> None:
    clock = TestClock(ev.now_ms(), clock_path(tmp_path))
    fleet = Fleet(where, tmp_path, clock)
    store = where.store()
    try:
        async with where.opened(owner=False) as log:
            projector = Projector(log, store)
            folding = asyncio.create_task(projector.run())
            try:
                await _run(fleet, log, store)
            finally:
                projector.stop()
                await folding
    finally:
        fleet.stop_all()
        store.close()


async def _run(fleet: Fleet, log: EventLog, store: ProjectionStore) -> None:
    fleet.start("a")
    fleet.start("b")
    sids = await _answered_sessions(fleet, log)
    await _projected(store, sids, lambda row: row["current_state"] == "FINISHED" and row["turns"] == 1)

    expired_at = fleet.clock.advance(IDLE + timedelta(minutes=1))
    await _closed(fleet, log, sids)
    for sid in sids:
        (closed,) = of(await log.read_session(sid), ev.SessionClosed)
        assert (closed.reason, closed.actor, closed.time_ms) == ("expired", "lifecycle", expired_at)

    fleet.kill("b")  # the restart in between: b's sweeps resume from the log and the projections
    fleet.start("b")
    await _projected(store, sids, lambda row: row["closed_at_ms"] == expired_at)
    await fleet.swept("a", "b")
    assert fleet.erased() == {} and LifecycleStore(store).erasures() == []

    fleet.kill("a")
    fleet.kill("b")
    fleet.start("a", hang=True)  # every erasure it starts hangs: it claims one, then is killed
    fleet.clock.set(expired_at + RETAIN_MS)
    hung = await _held_by(fleet, store, "a")
    fleet.start("b")
    fleet.kill("a")
    fleet.start("a")
    await until("every other session erased", lambda: _erased(fleet, set(sids) - {hung}))
    await fleet.swept("a", "b")
    assert hung not in fleet.erased()  # its claim's lease still holds
    fleet.clock.advance(timedelta(milliseconds=CLAIM_LEASE_MS))
    await until("the session the killed worker held erased", lambda: _erased(fleet, {hung}))

    fleet.kill("b")
    fleet.start("b")
    fleet.clock.advance(timedelta(days=30))
    await fleet.swept("a", "b")
    rows = fleet.erased()
    assert sorted(rows) == sorted(sids)
    assert {(reason, asks) for reason, asks, _ in rows.values()} == {(RETENTION, 1)}  # each once
    for sid in sids:
        assert len(of(await log.read_session(sid), ev.SessionClosed)) == 1
    done = LifecycleStore(store).erasures()
    assert len(done) == SESSIONS and all(r["erased_ms"] for r in done)


async def _answered_sessions(fleet: Fleet, log: EventLog) -> list[str]:
    """A dozen sessions with one answered turn each (the workers run them)."""
    sids = [f"{fleet.where.backend}-life-{i:02d}" for i in range(SESSIONS)]
    for sid in sids:
        await log.submit(ev.SessionCreated(session_id=sid, version=1, agent_id="desk", user_id="u1"))
        await log.submit(
            ev.UserMessageReceived(
                session_id=sid, version=0, message_id=f"{sid}-m1", text="hello", user_id="u1"
            )
        )

    async def answered() -> bool:
        fleet.check_alive()
        return all([of(await log.read_session(s), ev.TurnFinished) for s in sids])

    await until("every session answered", answered)
    return sids


async def _projected(
    store: ProjectionStore, sids: list[str], holds: Callable[[dict[str, Any]], bool]
) -> None:
    async def all_rows() -> bool:
        rows = [store.session(sid) for sid in sids]
        return all(row is not None and holds(row) for row in rows)

    await until("the projections folded", all_rows)


async def _closed(fleet: Fleet, log: EventLog, sids: list[str]) -> None:
    async def all_closed() -> bool:
        fleet.check_alive()
        return all([of(await log.read_session(s), ev.SessionClosed) for s in sids])

    await until("every session expired", all_closed)


async def _erased(fleet: Fleet, sids: set[str]) -> bool:
    fleet.check_alive()
    return sids <= set(fleet.erased())


async def _held_by(fleet: Fleet, store: ProjectionStore, name: str) -> str:
    """Wait until worker ``name`` holds the claim of a session it has not erased (its erasure
    hangs); return the session."""
    lifecycle = LifecycleStore(store)

    def held() -> list[str]:
        return [
            str(r["session_id"])
            for r in lifecycle.erasures()
            if r["claimed_by"] == name and not r["erased_ms"]
        ]

    async def holds_one() -> bool:
        fleet.check_alive()
        return len(held()) == 1

    await until(f"worker {name} holding a claim", holds_one)
    assert fleet.erased() == {}
    return held()[0]
