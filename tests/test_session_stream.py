"""A session's event stream (gateway/stream.py) on the embedded log, driven through its hub as
the turn worker drives it: what it yields, in what order, and how often it reads the log."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncGenerator, cast

from turnlog.engine import events as ev
from turnlog.engine.log.base import LogRecord
from turnlog.engine.log.sqlite import SqliteEventLog
from turnlog.engine.stream import ModelDelta
from turnlog.gateway.hub import LiveHub
from turnlog.gateway.stream import Ephemeral, SessionStream

SID = "s-stream"


class CountedReads:
    """The log, counting the reads a stream makes of it."""

    def __init__(self, log: SqliteEventLog) -> None:
        self.log = log
        self.reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.log, name)

    async def read_session_records(self, session_id: str, after_version: int = 0) -> list[LogRecord]:
        self.reads += 1
        return await self.log.read_session_records(session_id, after_version)

    async def read_session_records_through(
        self, session_id: str, after_version: int, version: int
    ) -> list[LogRecord]:
        self.reads += 1
        return await self.log.read_session_records_through(session_id, after_version, version)


def opening() -> list[ev.Event]:
    return [
        ev.SessionCreated(session_id=SID, version=1, agent_id="a", user_id="u"),
        ev.UserMessageReceived(session_id=SID, version=2, message_id="m1", text="hi"),
    ]


def model_call(first: int) -> list[ev.Event]:
    """A turn's start and one model call, from version ``first`` on."""
    call: dict[str, Any] = {"session_id": SID, "turn_id": "t", "step": 0, "model": "m"}
    return [
        ev.TurnStarted(session_id=SID, version=first, turn_id="t", message_id="m1"),
        ev.ModelCallStarted(version=first + 1, message_count=1, tools_offered=0, **call),
        ev.ModelCallFinished(version=first + 2, status="ok", **call),
    ]


Batches = AsyncGenerator[list[LogRecord | Ephemeral], None]


def batches_of(stream: SessionStream) -> Batches:
    return cast(Batches, stream.batches())  # an async generator: closed at the test's end


async def next_batch(batches: Batches) -> list[str]:
    """The next list the stream yields, each item as ``Type@version position`` or ``delta text``."""
    batch = await asyncio.wait_for(anext(batches), 10)
    return [
        f"{i.event.type}@{i.event.version} {i.offset}" if isinstance(i, LogRecord) else f"delta {i}"
        for i in batch
    ]


@dataclass
class Opened:
    """A session's stream that has shown the session's opening, and the log's reads so far."""

    log: SqliteEventLog
    reads: CountedReads
    hub: LiveHub
    batches: Batches
    opening: list[str]


@asynccontextmanager
async def opened_stream(tmp_path: Path) -> AsyncIterator[Opened]:
    log = SqliteEventLog(tmp_path / "log.db", partitions=2)
    counted, hub = CountedReads(log), LiveHub()
    try:
        await log.append(opening(), expected_version=0)
        batches = batches_of(SessionStream(counted, hub, SID))  # type: ignore[arg-type]
        yield Opened(log, counted, hub, batches, await next_batch(batches))
        await batches.aclose()
    finally:
        await log.close()


async def test_a_commit_of_several_events_is_read_once(tmp_path: Path) -> None:
    async with opened_stream(tmp_path) as opened:
        assert [i.split()[0] for i in opened.opening] == ["SessionCreated@1", "UserMessageReceived@2"]
        reads = opened.reads.reads

        turn = model_call(3)
        await opened.log.append(turn, expected_version=2)
        for event in turn:  # the worker publishes a commit's events one by one, at once
            opened.hub.publish(event)
        batch = await next_batch(opened.batches)

        assert [i.split()[0] for i in batch] == ["TurnStarted@3", "ModelCallStarted@4", "ModelCallFinished@5"]
        offsets = [int(i.split()[1]) for i in batch]
        assert offsets == list(range(offsets[0], offsets[0] + 3))
        assert opened.reads.reads == reads + 1


async def test_deltas_stay_between_the_events_they_came_between(tmp_path: Path) -> None:
    async with opened_stream(tmp_path) as opened:
        reads = opened.reads.reads

        started, called, finished = model_call(3)
        await opened.log.append([started, called, finished], expected_version=2)
        opened.hub.publish(started)
        opened.hub.publish(called)
        hello = [ModelDelta(session_id=SID, turn_id="t", step=0, text=text) for text in ("Hel", "lo")]
        for delta in hello:
            opened.hub.publish(delta)
        opened.hub.publish(finished)
        batch = await next_batch(opened.batches)

        types = [i.split()[0] for i in batch]
        assert types[:2] == ["TurnStarted@3", "ModelCallStarted@4"] and types[4:] == ["ModelCallFinished@5"]
        assert batch[2:4] == [f"delta {d}" for d in hello]
        assert opened.reads.reads == reads + 2  # through ModelCallStarted, then through the last
