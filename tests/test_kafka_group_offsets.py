"""Where a consumer group's offsets on a Kafka partition are committed: with one of the partition
owner's transactions (``kafka_commits``), so a fenced zombie cannot move them; a due offset of a
partition with no append to carry it goes in a transaction of its own, and closing commits what
is pending. Read back from the broker. On a real broker (TURNLOG_KAFKA_BOOTSTRAP)."""

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


async def broker_offset(log: KafkaEventLog) -> int:
    return await committed_offset(log.bootstrap, GROUP, TopicPartition(log.topics.events, 0))


async def until_offset(log: KafkaEventLog, offset: int) -> None:
    for _ in range(200):
        if await broker_offset(log) == offset:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the group's offset never reached {offset}: {await broker_offset(log)}")


async def test_a_due_offset_with_no_append_to_carry_it_is_committed_on_its_own(bootstrap: str) -> None:
    async with kafka_log(bootstrap, partitions=1) as log:
        await log.append([created()], expected_version=0)
        await log.commit(GROUP, 0, 1)
        await until_offset(log, 1)  # no append follows: the quiet inbox's housekeeping commits it
        assert log._owners[0].pending_commits == {}


async def test_closing_commits_an_offset_not_due_yet(bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_commits, "OFFSETS_EVERY_S", 3600.0)  # a group's second offset: due in an hour
    async with kafka_log(bootstrap, partitions=1) as log:
        await log.append([created()], expected_version=0)
        await log.commit(GROUP, 0, 1)
        await until_offset(log, 1)  # a group's first offset is due at once
        await log.commit(GROUP, 0, 2)
        await asyncio.sleep(0.3)  # the housekeeping runs every 100 ms when the inbox is quiet
        assert await broker_offset(log) == 1 and log._owners[0].pending_commits == {GROUP: 2}
        await log.close()
        assert await broker_offset(log) == 2
