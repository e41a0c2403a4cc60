"""The consumer-group loop (consumers/runner.py) on the real embedded log: what a member commits,
when, and what it hands out again after a failure."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from turnlog.consumers import runner
from turnlog.consumers.runner import GroupConsumer
from turnlog.engine import events as ev
from turnlog.engine.errors import LogUnavailableError
from turnlog.engine.log.base import LogRecord
from turnlog.engine.log.sqlite import SqliteEventLog

GROUP = "test-group"


class CountingLog(SqliteEventLog):
    """The embedded log of five records on one partition (positions 1..5: the embedded log
    counts from 1), noting every commit a member makes (each one is a write)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, partitions=1)
        self.commits: list[int] = []

    async def commit(self, group: str, partition: int, offset: int) -> None:
        self.commits.append(offset)
        await super().commit(group, partition, offset)


@pytest.fixture
async def event_log(tmp_path: Path) -> AsyncIterator[CountingLog]:
    opened = CountingLog(tmp_path / "events.db")
    try:
        for i in range(5):  # five sessions of one event each
            created = ev.SessionCreated(session_id=f"s{i}", version=1, agent_id="a", user_id="u")
            await opened.append([created], expected_version=0)
        opened.commits.clear()
        yield opened
    finally:
        await opened.close()


async def test_a_batch_is_committed_once_after_its_handlers_return(event_log: CountingLog) -> None:
    seen: list[int] = []

    async def handle(record: LogRecord) -> None:
        seen.append(record.offset)

    consumer = GroupConsumer(event_log, GROUP, handle, batch=3)
    assert await consumer.poll_once() == 5
    assert seen == [1, 2, 3, 4, 5]
    assert event_log.commits == [4, 6]  # one per batch read, not one per record
    assert await event_log.committed(GROUP, 0) == 6
    assert await consumer.poll_once() == 0 and event_log.commits == [4, 6]


async def test_what_was_handled_before_a_failure_stays_handled(event_log: CountingLog) -> None:
    seen: list[int] = []
    failing = {3}

    async def handle(record: LogRecord) -> None:
        if record.offset in failing:
            raise LogUnavailableError("the store is down")
        seen.append(record.offset)

    consumer = GroupConsumer(event_log, GROUP, handle)
    assert await consumer.poll_once() == 0  # the failure is logged, the partition retried later
    assert seen == [1, 2] and await event_log.committed(GROUP, 0) == 3
    failing.clear()
    assert await consumer.poll_once() == 3
    assert seen == [1, 2, 3, 4, 5]  # the failed record again, nothing handled twice
    assert await event_log.committed(GROUP, 0) == 6


async def test_a_slow_batch_commits_as_it_goes(
    event_log: CountingLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "COMMIT_EVERY_S", 0.0)  # every handler took "long"

    async def handle(record: LogRecord) -> None:
        return None

    assert await GroupConsumer(event_log, GROUP, handle).poll_once() == 5
    assert event_log.commits == [2, 3, 4, 5, 6]
