"""Shared by the crash tests (tests/test_tool_crashes.py, tests/test_tool_crash_storm.py): real
worker processes (tests/keyed_crash.py) on a real log, started, killed and waited for, and an
in-process successor that finishes what they left."""

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
from typing import IO

from tests.fleet import Backend, recorder
from tests.keyed_crash import AGENT, offset_clock
from tests.services import delete_topics, fresh_topic, kafka_log, need_service, postgres_store
from turnlog.consumers import TurnWorker
from turnlog.engine import AgentDirectory, EventLog, SqliteEventLog
from turnlog.engine import events as ev
from turnlog.engine.agent import Agent

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

    def start_worker(
        self, tool_name: str, point: str, max_starts: int = 5, offset_s: float = 0.0, lookup: str = ""
    ) -> Worker:
        """A worker process (tests/keyed_crash.py) whose clock runs ``offset_s`` ahead."""
        command = [sys.executable, str(REPO / "tests" / "procs.py"), "tool-crash", *self.args]
        output = tempfile.TemporaryFile()
        proc = subprocess.Popen(
            [*command, tool_name, point, str(max_starts), str(offset_s), lookup],
            env={**os.environ, "PYTHONPATH": str(REPO)},
            cwd=REPO,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        return Worker(proc, output)

    async def run_dying_worker(
        self, tool_name: str, point: str, max_starts: int = 5, offset_s: float = 0.0, lookup: str = ""
    ) -> None:
        """Start a worker process that kills itself at ``point`` of the call; wait for its death."""
        worker = self.start_worker(tool_name, point, max_starts, offset_s, lookup)
        try:
            code = await worker.ended()
            assert code == -signal.SIGKILL, f"ended with {code}, not killed at {point}: {worker.said()}"
        finally:
            worker.close()


@dataclass
class Worker:
    """A worker process and what it printed."""

    proc: subprocess.Popen[bytes]
    output: IO[bytes]

    @property
    def runs_as(self) -> str:
        """The worker id its tools record their runs under (tests/fleet.py ``runs_by``)."""
        return f"w{self.proc.pid}"

    async def ended(self, timeout: float = WAIT_S) -> int | None:
        """Its exit code once it ends (None: it did not within ``timeout``, and is killed)."""
        try:
            return await asyncio.to_thread(self.proc.wait, timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def said(self) -> str:
        self.output.seek(0)
        return self.output.read().decode(errors="replace")[-3000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.output.close()


@contextlib.asynccontextmanager
async def crash_backend(backend: str, tmp_path: Path) -> AsyncIterator[Crashes]:
    """The log and the effects store of one backend (the ``crashes`` fixture's)."""
    if backend == "sqlite":
        path, effects = tmp_path / "log.db", str(tmp_path / "effects.db")
        producer = SqliteEventLog(path, partitions=PARTITIONS)

        @contextlib.asynccontextmanager
        async def same_file() -> AsyncIterator[EventLog]:
            yield producer

        args = ["sqlite", str(path), "-", str(PARTITIONS), effects, "-"]
        try:
            yield Crashes(backend, producer, effects, "", args, same_file)
        finally:
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


async def open_session(crashes: Crashes, sid: str, text: str = "book it") -> None:
    await crashes.producer.submit(ev.SessionCreated(session_id=sid, version=1, agent_id=AGENT, user_id="u"))
    await crashes.producer.submit(
        ev.UserMessageReceived(session_id=sid, version=0, message_id=f"{sid}-m1", text=text, user_id="u")
    )


async def finish(
    crashes: Crashes, sid: str, agent: Callable[[Backend], Agent], *, offset_s: float = 0.0
) -> list[ev.Event]:
    """A successor worker in this process (its clock ``offset_s`` ahead), whose tools do not die,
    runs what is left of the turn; the session's events then."""
    async with crashes.successor() as log, recorder(crashes.target, crashes.schema, "successor") as backend:
        directory = AgentDirectory([agent(backend)])
        worker = TurnWorker(log, directory, worker_id="successor", clock=offset_clock(offset_s))
        async with asyncio.timeout(WAIT_S):
            while not of(await log.read_session(sid), ev.TurnFinished):
                await worker.poll_once()
                await asyncio.sleep(0.05)
        return await log.read_session(sid)


def of(events: list[ev.Event], cls: type[ev.E]) -> list[ev.E]:
    return [e for e in events if isinstance(e, cls)]
