"""The sessions of a Kafka log, listed without folding them (``EventLog.sessions``).

A partition this process owns answers from its index (``kafka_index.PartitionIndex``: exact,
its sessions loaded or named by the session index). Any other partition, so also in a process
that owns none (a gateway, ``turnlog sessions --kafka``), is read from what exists on Kafka:
the compacted session index (``kafka_sessions``: one record per session once compacted, each
with its version) and the events after its watermark (the owner writes the index about every
second, so that tail is short). Without a usable index the partition is read in full: correct,
only slower. A record that does not continue its session's versions is left out, as every
reader leaves poison out.
"""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, TopicPartition

from .base import LogRecord
from .kafka_index import PartitionIndex
from .kafka_records import decode_record
from .kafka_sessions import read_index
from .kafka_topics import TopicNames


def owned_versions(part: PartitionIndex) -> dict[str, int]:
    """Each session of a partition this process owns, with its last version, from its index."""
    versions = {sid: entry.version for sid, entry in part.unloaded.items()}
    versions.update((sid, events[-1].version) for sid, events in part.sessions.items() if events)
    return versions


async def read_versions(
    reader: AIOKafkaConsumer, topics: TopicNames, partition: int, timeout_s: float
) -> dict[str, int]:
    """The session index's versions, brought up to the end of the events partition (the
    caller holds the reader)."""
    index = await read_index(reader, TopicPartition(topics.sessions, partition), timeout_s)
    tp = TopicPartition(topics.events, partition)
    end = (await reader.end_offsets([tp]))[tp]
    if index.watermark is None or index.watermark > end:
        start, versions = 0, {}
    else:
        start, versions = index.watermark, {sid: entry.version for sid, entry in index.entries.items()}
    await _read_tail(reader, tp, start, end, versions)
    return versions


async def _read_tail(
    reader: AIOKafkaConsumer, tp: TopicPartition, start: int, end: int, versions: dict[str, int]
) -> None:
    if start >= end:
        return
    if reader.assignment() != {tp}:
        reader.assign([tp])
    reader.resume(tp)
    reader.seek(tp, start)
    while await reader.position(tp) < end:
        for msg in (await reader.getmany(tp, timeout_ms=50, max_records=1000)).get(tp, []):
            record = decode_record(tp.partition, msg)
            if msg.offset < end and isinstance(record, LogRecord):
                event = record.event
                if event.version == versions.get(event.session_id, 0) + 1:
                    versions[event.session_id] = event.version
    reader.pause(tp)
