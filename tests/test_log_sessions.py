"""``EventLog.sessions`` / ``list_sessions``: the sessions a log holds, with partition and last
version, in a stable order (partition, then id), a page at a time; from the SQLite log's index,
the memory log's, a Kafka owner's partition index, and, in a process that owns no partition,
Kafka's session index plus the events after its watermark (or the whole partition without
one). The base class's default (a partition scan) must agree. Then `turnlog sessions` lists
from the log, embedded and on Kafka, through the real CLI."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from turnlog.engine import EventLog, MemoryEventLog, SessionSummary, SqliteEventLog
from turnlog.engine import events as ev
from turnlog.engine.errors import LogError
from turnlog.engine.fold import SessionState
from turnlog.engine.log.kafka import KafkaEventLog
from turnlog.engine.log.kafka_sessions import read_index
from turnlog.engine.log.kafka_topics import TopicNames
from turnlog.engine.states import Cause, SessionStatus
from turnlog.engine.writer import SessionWriter

REPO = Path(__file__).resolve().parent.parent
PARTITIONS = 4


async def write_session(log: EventLog, sid: str, turns: int) -> int:
    """A session with ``turns`` answered messages (5 events each); its last version."""
    w = SessionWriter(log, SessionState(sid), "test")
    w.add(ev.SessionCreated, agent_id="a", user_id="u")
    for n in range(turns):
        w.add(ev.UserMessageReceived, message_id=f"m{n}", text="hi", user_id="u")
        w.add(ev.TurnStarted, turn_id=f"t{n}", message_id=f"m{n}")
        w.transition(SessionStatus.PROCESSING, Cause.USER_MESSAGE)
        w.add(ev.AssistantMessage, turn_id=f"t{n}", message_id=f"a{n}", text="hello")
        w.transition(SessionStatus.FINISHED, Cause.MODEL_ANSWER)
        await w.commit()
    await w.commit()
    return w.state.version


async def write_sessions(log: EventLog, count: int, prefix: str = "s") -> dict[str, int]:
    return {sid: await write_session(log, sid, n % 3) for n in range(count) if (sid := f"{prefix}{n:02d}")}


def expected(log: EventLog, versions: dict[str, int]) -> list[SessionSummary]:
    listed = [SessionSummary(sid, log.partition_of(sid), v) for sid, v in versions.items()]
    return sorted(listed, key=lambda s: (s.partition, s.session_id))


async def listed(log: EventLog, page: int = 3) -> list[SessionSummary]:
    return [summary async for summary in log.sessions(page=page)]


async def test_sessions_are_listed_by_partition_and_id_a_page_at_a_time(log: EventLog) -> None:
    versions = await write_sessions(log, 14)
    want = expected(log, versions)
    assert len({s.partition for s in want}) > 1 and {s.version for s in want} == {1, 6, 11}
    assert await listed(log) == want == await listed(log, page=1000)
    assert [s async for s in EventLog.sessions(log, page=2)] == want, "the default scan agrees"
    first = want[0].partition
    of_first = [s for s in want if s.partition == first]
    page = await log.list_sessions(first, limit=2)
    assert page == of_first[:2]
    assert await log.list_sessions(first, after=page[-1].session_id, limit=100) == of_first[2:]
    assert await EventLog.list_sessions(log, first, after=page[-1].session_id) == of_first[2:]
    assert [s async for s in log.sessions(partitions=[first])] == of_first
    with pytest.raises(LogError, match="out of range"):
        await log.list_sessions(PARTITIONS)


async def test_the_memory_log_lists_its_sessions_the_same_way() -> None:
    log = MemoryEventLog(partitions=PARTITIONS)
    versions = await write_sessions(log, 9)
    assert await listed(log, page=2) == expected(log, versions)
    assert [s async for s in EventLog.sessions(log)] == expected(log, versions)


@contextlib.asynccontextmanager
async def kafka(bootstrap: str, topic: str, **options: object) -> AsyncIterator[KafkaEventLog]:
    log = KafkaEventLog(bootstrap, topic=topic, partitions=PARTITIONS, session_timeout_ms=6000, **options)  # type: ignore[arg-type]
    await log.start()
    try:
        if log.owner:
            await log.wait_owned()
        yield log
    finally:
        await log.close()


async def test_a_kafka_process_that_owns_no_partition_lists_from_the_index_and_what_follows_it(
    bootstrap: str, topic: str
) -> None:
    async with kafka(bootstrap, topic) as first:  # its close writes every partition's session index
        versions = await write_sessions(first, 10)
    # the next owner writes no index for an hour: what it appends is only after the watermark
    async with kafka(bootstrap, topic, index_every_s=3600) as second:
        versions |= await write_sessions(second, 4, prefix="late")
        versions["s01"] = await write_session_more(second, "s01", versions["s01"])
        async with kafka(bootstrap, topic, owner=False) as reader:
            assert reader.owned_partitions() == []
            assert await tails_after_watermarks(bootstrap, topic) > 0, "the index lags: a tail to read"
            assert await listed(reader) == expected(reader, versions)
        assert await listed(second) == expected(second, versions), "an owner lists from its own index"


async def test_without_a_session_index_a_reader_lists_from_the_whole_partition(
    bootstrap: str, topic: str
) -> None:
    async with kafka(bootstrap, topic, session_index=False) as owner:
        versions = await write_sessions(owner, 7)
        async with kafka(bootstrap, topic, owner=False) as reader:
            assert await listed(reader) == expected(reader, versions)


async def tails_after_watermarks(bootstrap: str, topic: str) -> int:
    """Records of the events topic after each partition's session index watermark, summed (every
    partition must have a watermark)."""
    names = TopicNames(topic)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    await consumer.start()
    try:
        tail = 0
        for p in range(PARTITIONS):
            index = await read_index(consumer, TopicPartition(names.sessions, p), 30)
            events = TopicPartition(names.events, p)
            assert index.watermark is not None, f"partition {p} has no session index"
            tail += (await consumer.end_offsets([events]))[events] - index.watermark
        return tail
    finally:
        await consumer.stop()


async def write_session_more(log: EventLog, sid: str, version: int) -> int:
    event = ev.UserMessageReceived(session_id=sid, version=0, message_id="more", text="again", user_id="u")
    return (await log.submit(event))[0].event.version or version + 1


def turnlog_sessions(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "turnlog", "sessions", "--home", str(home), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=home.parent,
    )


def rows(stdout: str) -> list[tuple[str, int, int]]:
    found = []
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            found.append((parts[0], int(parts[1]), int(parts[2])))
    return found


async def test_the_cli_lists_the_sessions_of_the_embedded_log(tmp_path: Path) -> None:
    home = tmp_path / "home"
    log = SqliteEventLog(home / "log.db", partitions=8)
    try:
        versions = await write_sessions(log, 5)
        want = [(s.session_id, s.partition, s.version) for s in expected(log, versions)]
    finally:
        await log.close()
    run = turnlog_sessions(home, "--from-log")
    assert run.returncode == 0, run.stderr
    assert rows(run.stdout) == want
    limited = turnlog_sessions(home, "--from-log", "--limit", "2")
    assert rows(limited.stdout) == want[:2] and "(the first 2; more with --limit)" in limited.stdout
    wrong = turnlog_sessions(home, "--from-log", "--partitions", "3")
    assert wrong.returncode == 2 and "was created with 8 partitions, not 3" in wrong.stdout


async def test_the_cli_lists_the_sessions_of_a_kafka_log(bootstrap: str, topic: str, tmp_path: Path) -> None:
    async with kafka(bootstrap, topic) as owner:
        versions = await write_sessions(owner, 6)
        want = [(s.session_id, s.partition, s.version) for s in expected(owner, versions)]
        run = turnlog_sessions(
            tmp_path / "home", "--kafka", bootstrap, "--topic", topic, "--partitions", str(PARTITIONS)
        )
    assert run.returncode == 0, run.stderr
    assert rows(run.stdout) == want
