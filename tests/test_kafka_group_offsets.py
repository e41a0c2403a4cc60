"""Where a consumer group's offsets on a Kafka partition are committed: with one of the partition
owner's transactions, so a fenced zombie cannot move them. A busy partition's next transaction
carries a due offset; only a partition idle for ``IDLE_AFTER_S`` commits it in a transaction
of its own (which would hold the lock the appends wait for). Read back from the broker. On a
real broker (TURNLOG_KAFKA_BOOTSTRAP)."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import TopicPartition

from tests.services import kafka_log
from turnlog.engine import events as ev
from turnlog.engine.log import kafka_commits
from turnlog.engine.log.kafka import KafkaEventLog
from turnlog.engine.log.kafka_topics import committed_offset

GROUP = "projector-under-test"
SID = "s-offsets"


def created() -> ev.SessionCreated:
    return ev.SessionCreated(session_id=SID, version=1, agent_id="a", user_id="u")


def said(version: int) -> ev.UserMessageReceived:
    return ev.UserMessageReceived(
        session_id=SID, version=version, message_id=ev.new_id(), text=f"m{version}", user_id="u"
    )


async def broker_offset(log: KafkaEventLog) -> int:
    return await committed_offset(log.bootstrap, GROUP, TopicPartition(log.topics.events, 0))


async def until_offset(log: KafkaEventLog, offset: int) -> None:
    for _ in range(200):
        if await broker_offset(log) == offset:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the group's offset never reached {offset}: {await broker_offset(log)}")


async def test_a_busy_partitions_due_offset_rides_its_next_append(
    bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kafka_commits, "IDLE_AFTER_S", 3600.0)  # never idle: no flush of its own
    async with kafka_log(bootstrap, partitions=1) as log:
        await log.append([created()], expected_version=0)
        await log.commit(GROUP, 0, 1)
        owner = log._owners[0]
        await kafka_commits.flush(owner)  # the quiet inbox's housekeeping, called at once
        assert owner.pending_commits == {GROUP: 1} and await broker_offset(log) == 0
        await log.append([said(2)], expected_version=1)
        assert owner.pending_commits == {} and await broker_offset(log) == 1


async def test_an_idle_partition_commits_a_due_offset_on_its_own(
    bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with kafka_log(bootstrap, partitions=1) as log:
        await log.append([created()], expected_version=0)
        monkeypatch.setattr(kafka_commits, "IDLE_AFTER_S", 0.3)
        await log.commit(GROUP, 0, 1)
        await until_offset(log, 1)  # no append follows: the housekeeping's own transaction
        assert log._owners[0].pending_commits == {}


async def test_closing_commits_what_is_pending_at_once(
    bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kafka_commits, "IDLE_AFTER_S", 3600.0)
    async with kafka_log(bootstrap, partitions=1) as log:
        await log.append([created()], expected_version=0)
        await log.commit(GROUP, 0, 1)
        await log.close()
        assert await broker_offset(log) == 1
