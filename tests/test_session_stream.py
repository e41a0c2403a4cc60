"""A session's event stream (gateway/stream.py) on the embedded log, driven through its hub as
the turn worker drives it: what it yields, in what order, and how often it reads the log."""

from __future__ import annotations

import asyncio
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


async def test_a_commit_of_several_events_is_read_once(tmp_path: Path) -> None:
    log = SqliteEventLog(tmp_path / "log.db", partitions=2)
    counted, hub = CountedReads(log), LiveHub()
    try:
        await log.append(opening(), expected_version=0)
        stream = SessionStream(counted, hub, SID)  # type: ignore[arg-type]
        batches = batches_of(stream)
        assert [i.split()[0] for i in await next_batch(batches)] == [
            "SessionCreated@1",
            "UserMessageReceived@2",
        ]
        reads = counted.reads

        turn = model_call(3)
        await log.append(turn, expected_version=2)
        for event in turn:  # the worker publishes a commit's events one by one, at once
            hub.publish(event)
        batch = await next_batch(batches)

        assert [i.split()[0] for i in batch] == ["TurnStarted@3", "ModelCallStarted@4", "ModelCallFinished@5"]
        offsets = [int(i.split()[1]) for i in batch]
        assert offsets == list(range(offsets[0], offsets[0] + 3))
        assert counted.reads == reads + 1
        await batches.aclose()
    finally:
        await log.close()


async def test_deltas_stay_between_the_events_they_came_between(tmp_path: Path) -> None:
    log = SqliteEventLog(tmp_path / "log.db", partitions=2)
    counted, hub = CountedReads(log), LiveHub()
    try:
        await log.append(opening(), expected_version=0)
        stream = SessionStream(counted, hub, SID)  # type: ignore[arg-type]
        batches = batches_of(stream)
        await next_batch(batches)
        reads = counted.reads

        started, called, finished = model_call(3)
        await log.append([started, called, finished], expected_version=2)
        hub.publish(started)
        hub.publish(called)
        hello = [ModelDelta(session_id=SID, turn_id="t", step=0, text=text) for text in ("Hel", "lo")]
        for delta in hello:
            hub.publish(delta)
        hub.publish(finished)
        batch = await next_batch(batches)

        types = [i.split()[0] for i in batch]
        assert types[:2] == ["TurnStarted@3", "ModelCallStarted@4"] and types[4:] == ["ModelCallFinished@5"]
        assert batch[2:4] == [f"delta {d}" for d in hello]
        assert counted.reads == reads + 2  # through ModelCallStarted, then through the last
        await batches.aclose()
    finally:
        await log.close()
