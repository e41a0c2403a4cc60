"""The Kafka log's topics: their names, the settings the engine creates them with, and the
admin calls it needs (create or check, read a group's committed offset)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from ..errors import ConfigurationError, LogUnavailableError

TOPIC_CONFIG = {
    "retention.ms": "-1",  # the log is the source of truth: never delete by age
    "retention.bytes": "-1",  # ... nor by size
    "cleanup.policy": "delete",  # never compact: every event of a session is kept
    "min.insync.replicas": "1",
    "message.timestamp.type": "CreateTime",
}
LIVE_TOPIC_CONFIG = {
    "retention.ms": "60000",  # live items (token deltas, commit notices) matter for seconds
    "segment.ms": "60000",  # roll segments often, so old ones can go
    "cleanup.policy": "delete",
    "min.insync.replicas": "1",
    "message.timestamp.type": "CreateTime",
}
SESSIONS_TOPIC_CONFIG = {
    "cleanup.policy": "compact",  # the session index: only each session's newest entry matters
    "retention.ms": "-1",
    "segment.ms": "600000",  # roll the active segment, so compaction reaches recent entries
    "min.cleanable.dirty.ratio": "0.1",
    "min.insync.replicas": "1",
}


@dataclass(frozen=True, slots=True)
class TopicNames:
    events: str

    @property
    def inbox(self) -> str:
        return f"{self.events}.inbox"

    @property
    def dead_letter(self) -> str:
        return f"{self.events}.dead-letter"

    @property
    def live(self) -> str:
        """Token deltas and commit notices for streams in other processes (engine.log.kafka_live)."""
        return f"{self.events}.live"

    @property
    def sessions(self) -> str:
        """The session index an owner writes for its successor (engine.log.kafka_sessions)."""
        return f"{self.events}.sessions"

    @property
    def owners_group(self) -> str:
        return f"{self.events}.owners"

    def transactional_id(self, partition: int) -> str:
        return f"{self.events}.owner.{partition}"

    def all(self) -> tuple[str, ...]:
        return (self.events, self.inbox, self.dead_letter, self.live, self.sessions)

    def config(self, name: str) -> dict[str, str]:
        """The settings topic ``name`` is created with: the live topic keeps items for a minute,
        the session index is compacted, the others keep everything forever."""
        if name == self.sessions:
            return dict(SESSIONS_TOPIC_CONFIG)
        return dict(LIVE_TOPIC_CONFIG if name == self.live else TOPIC_CONFIG)


async def existing_topics(admin: AIOKafkaAdminClient, names: TopicNames) -> dict[str, int]:
    """The log's topics that exist, with their partition counts."""
    return {
        t["topic"]: len(t["partitions"])
        for t in await admin.describe_topics(list(names.all()))
        if t.get("error_code", 0) == 0 and t["partitions"]
    }


async def describe_topics(bootstrap: str, names: TopicNames) -> dict[str, int]:
    """``existing_topics`` on a connection of its own (LogUnavailableError if Kafka does not answer)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="turnlog-admin")
    try:
        await admin.start()
        return await existing_topics(admin, names)
    except KafkaError as exc:
        raise LogUnavailableError(f"Kafka at {bootstrap} does not answer ({exc!r})") from exc
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


async def ensure_topics(bootstrap: str, names: TopicNames, partitions: int, replication: int) -> None:
    """Create the log's topics if missing; refuse ones with another partition count."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="turnlog-admin")
    try:
        await admin.start()
        existing = await existing_topics(admin, names)
        missing = [
            NewTopic(name, partitions, replication, topic_configs=names.config(name))
            for name in names.all()
            if name not in existing
        ]
        if missing:
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(missing)
        for name, count in existing.items():
            if count != partitions:
                raise ConfigurationError(
                    f"topic {name} has {count} partitions, not {partitions}; a session's partition "
                    f"must never change. Use partitions={count} or a new topic name."
                )
    except KafkaError as exc:
        raise LogUnavailableError(
            f"cannot reach Kafka at {bootstrap} to create the log's topics ({exc!r}); start it "
            "with scripts/kafka.sh start or set TURNLOG_KAFKA_BOOTSTRAP"
        ) from exc
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


async def committed_offset(bootstrap: str, group: str, tp: TopicPartition) -> int:
    """A consumer group's committed offset on one partition (0 if none)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="turnlog-admin")
    try:
        await admin.start()
        offsets = await admin.list_consumer_group_offsets(group, partitions=[tp])
    except KafkaError as exc:
        raise LogUnavailableError(f"cannot read group {group}'s offsets: {exc!r}") from exc
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
    meta = offsets.get(tp)
    return meta.offset if meta is not None and meta.offset >= 0 else 0
