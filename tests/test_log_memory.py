"""The in-memory log (engine/log/memory.py) against the same behaviour tests as the durable
backends: the log's contract (versions, submissions, partitions, offsets, snapshot lookups)
and the turn loop, interrupts, snapshots and submissions on top of it. The tests are the
modules' own, collected here again with ``log`` a ``MemoryEventLog``; those that read the
SQLite file (``sqlite_only``) skip."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from types import ModuleType

import pytest

from tests import (
    test_group_commit,
    test_interrupts,
    test_log_session_records,
    test_log_sqlite,
    test_snapshots,
    test_submissions,
    test_turn_loop,
)
from turnlog.engine import EventLog, MemoryEventLog
from turnlog.engine import events as ev
from turnlog.engine.errors import ConcurrencyError, DuplicateSubmissionError

SUITES: tuple[ModuleType, ...] = (
    test_group_commit,
    test_interrupts,
    test_log_session_records,
    test_log_sqlite,
    test_snapshots,
    test_submissions,
    test_turn_loop,
)
OWN = {"backend", "log", "reopen"}


def _for_any_backend(obj: object) -> bool:
    """Not a test that names its backends itself (a Kafka-only one)."""
    marks = getattr(obj, "pytestmark", [])
    return not any(m.name == "parametrize" and "backend" in str(m.args[0]) for m in marks)


for _suite in SUITES:
    globals().update(
        {
            k: v
            for k, v in vars(_suite).items()
            if not k.startswith("__") and k not in OWN and _for_any_backend(v)
        }
    )


@pytest.fixture(params=["memory"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def log() -> AsyncIterator[EventLog]:
    opened = MemoryEventLog(partitions=4)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def reopen(log: EventLog) -> Callable[[], AbstractAsyncContextManager[EventLog]]:
    """Another reader of the same log: in memory, the log itself."""

    @contextlib.asynccontextmanager
    async def opener() -> AsyncIterator[EventLog]:
        yield log

    return opener


async def test_the_memory_log_keeps_versions_submissions_and_partitions() -> None:
    log = MemoryEventLog(partitions=2)
    created = ev.SessionCreated(session_id="s", version=1, agent_id="a", user_id="u")
    await log.append([created], expected_version=0)
    with pytest.raises(ConcurrencyError):
        other = ev.SessionCreated(session_id="s", version=1, agent_id="a", user_id="u")
        await log.append([other], expected_version=0)
    message = ev.UserMessageReceived(session_id="s", version=0, message_id="m", text="hi")
    (first,) = await log.submit(message)
    assert first.event.version == 2
    (again,) = await log.submit(message)
    assert again == first, "a repeated submission returns the event already on the log"
    with pytest.raises(DuplicateSubmissionError):
        await log.append([ev.UserMessageReceived(session_id="s", version=3, message_id="m", text="hi")],
                         expected_version=2)  # fmt: skip
    partition = log.partition_of("s")
    records = await log.read_partition(partition, 0)
    assert [r.event.version for r in records] == [1, 2]
    assert await log.read_partition(partition, records[-1].offset + 1) == []
    assert await log.end_offset(partition) == records[-1].offset + 1
    assert await log.end_offset(1 - partition) == 0
    await log.commit("g", partition, 5)
    assert (await log.committed("g", partition), await log.committed("g", 1 - partition)) == (5, 0)
