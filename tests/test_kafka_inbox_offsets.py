"""Where a Kafka owner records how far it sequenced its inbox: on the sequenced events (a header
of each sequencing transaction's last record, and the session index's watermark), not in an
offset commit of the owners' group per message, whose committed offset follows now and then. An
owner that starts from a group offset behind that reads the records in between again and skips
them by offset. On a real broker (TURNLOG_KAFKA_BOOTSTRAP)."""

from __future__ import annotations

import pytest
import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from tests.services import delete_topics, fresh_topic, kafka_log, read_topic
from turnlog.engine import events as ev
from turnlog.engine.admission import AdmissionRules
from turnlog.engine.log.kafka import KafkaEventLog
from turnlog.engine.log.kafka_topics import TopicNames

SID = "s-inbox"


def created() -> ev.SessionCreated:
    return ev.SessionCreated(session_id=SID, version=1, agent_id="a", user_id="u")


def message(text: str) -> ev.UserMessageReceived:
    return ev.UserMessageReceived(session_id=SID, version=0, message_id=ev.new_id(), text=text, user_id="u")


async def owners_offset(bootstrap: str, topics: TopicNames) -> int | None:
    """The owners' group's committed offset on inbox partition 0 (None: never committed)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(topics.owners_group)
    finally:
        await admin.close()
    committed = offsets.get(TopicPartition(topics.inbox, 0))
    return None if committed is None or committed.offset < 0 else committed.offset


async def rewind_owners(bootstrap: str, topics: TopicNames) -> None:
    """Commit 0 as the owners' group's inbox offset (the group has no member now): what a new
    owner finds when the group's last commit lags the partition."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=topics.owners_group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        tp = TopicPartition(topics.inbox, 0)
        consumer.assign([tp])
        await consumer.commit({tp: 0})
    finally:
        await consumer.stop()


async def test_the_inbox_offset_rides_the_last_event_of_each_sequencing(bootstrap: str) -> None:
    async with kafka_log(bootstrap, partitions=1, admission=AdmissionRules()) as log:
        await log.submit(created())
        for text in ("one", "two"):
            await log.submit(message(text))
        committed = await owners_offset(bootstrap, log.topics)
        records = await read_topic(bootstrap, log.topics.events, 0)
    said = [dict(r.headers).get("turnlog.inbox") for r in records]
    assert said == [b"1", b"2", b"3"]  # each record was one inbox record's sequencing
    # the group's offset was not committed with each message: at most the first one's, lazily
    assert committed is None or committed < 3


@pytest.mark.parametrize("session_index", [True, False], ids=["from-the-session-index", "full-read"])
async def test_a_new_owner_skips_what_its_partition_says_was_sequenced(
    bootstrap: str, session_index: bool
) -> None:
    """The group's committed inbox offset is set back to 0 between two owners: the second reads
    the inbox from its start and skips every record the partition holds (by offset: none is even
    admitted again as a repeat), then sequences a new message after them."""
    topic = fresh_topic()

    def owner() -> KafkaEventLog:
        log = KafkaEventLog(
            bootstrap, topic=topic, partitions=1, session_timeout_ms=6000, session_index=session_index
        )
        log.admit_with(AdmissionRules())
        return log

    try:
        first = owner()
        await first.start()
        await first.wait_owned()
        await first.submit(created())
        for text in ("one", "two"):
            await first.submit(message(text))
        await first.close()
        await rewind_owners(bootstrap, first.topics)
        second = owner()
        with structlog.testing.capture_logs() as logs:
            await second.start()
            try:
                await second.wait_owned()
                (three,) = await second.submit(message("three"))
                events = await second.read_session(SID)
            finally:
                await second.close()
    finally:
        await delete_topics(bootstrap, topic)
    texts = [e.text for e in events if isinstance(e, ev.UserMessageReceived)]
    assert texts == ["one", "two", "three"]
    assert [e.version for e in events] == [1, 2, 3, 4] and three.event.version == 4
    assert not [entry for entry in logs if entry["event"] == "kafka.inbox_repeat_skipped"]
