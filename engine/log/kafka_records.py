"""What a Kafka log writes and reads as one record: an event's headers, records sent as few
producer batches, and a consumed record as a ``LogRecord`` or, if it cannot be taken, as
``Poison`` on its way to the dead-letter topic."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer

from .. import codec
from ..errors import EventError
from ..events import Event
from .base import LogRecord
from .sealing import PLAIN, RecordCodec

REASON_HEADER = "turnlog.reason"
SOURCE_HEADER = "turnlog.source"
INBOX_HEADER = "turnlog.inbox"
"""On the last event of a sequencing transaction: the partition's next inbox offset to sequence
(the inbox records below it are on the events partition, committed with this record)."""


Headers = list[tuple[str, bytes]]
SentBatch = tuple["asyncio.Future[Any]", list[int]]
"""A batch sent (``producer.send_batch``): its delivery, whose offset is the batch's first, and
each record's offset relative to it. One batch for many records, not a future each: the
producer's cost per record is a third of ``send``'s."""


def event_headers(event: Event) -> Headers:
    """An event record's headers: its schema fingerprint and type (readable without decoding)."""
    return [
        ("turnlog.schema", codec.schema_fingerprint(event.type)),
        ("turnlog.type", event.type.encode()),
    ]


def inbox_header(next_offset: int) -> tuple[str, bytes]:
    return (INBOX_HEADER, str(next_offset).encode())


def inbox_offset_of(msg: Any) -> int | None:
    """The next inbox offset a consumed events record says was sequenced, if it says one."""
    for key, value in msg.headers or ():
        if key == INBOX_HEADER:
            try:
                return int(value)
            except ValueError:
                return None  # not ours to trust: the owners' group's offset and submission keys stand
    return None


@dataclass(frozen=True, slots=True)
class Poison:
    """A record the log could not take, as it goes to the dead-letter topic."""

    source: str
    """``topic/partition/offset`` of the record."""
    session_id: str
    """The session it names (its event's, else its key's); "" if neither."""
    reason: str
    key: bytes | None
    value: bytes

    def headers(self) -> list[tuple[str, bytes]]:
        return [(REASON_HEADER, self.reason.encode()), (SOURCE_HEADER, self.source.encode())]


def source_of(msg: Any) -> str:
    return f"{msg.topic}/{msg.partition}/{msg.offset}"


def poison_of(msg: Any, reason: str, session_id: str | None = None) -> Poison:
    """A consumed record as poison; the session is the key's unless named."""
    if session_id is None:
        session_id = msg.key.decode("utf-8", "replace") if msg.key else ""
    return Poison(source_of(msg), session_id, reason, msg.key, msg.value or b"")


def own_poison(topic: str, record: LogRecord, reason: str, records: RecordCodec = PLAIN) -> Poison:
    """A record this process appended that its index refused (as every reader will); its
    dead-letter copy is the record as the events topic holds it (content encrypted)."""
    event = record.event
    source = f"{topic}/{record.partition}/{record.offset}"
    return Poison(source, event.session_id, reason, event.session_id.encode(), records.encode(event))


def decode_record(partition: int, msg: Any, records: RecordCodec = PLAIN) -> LogRecord | Poison:
    """A consumed events-topic record as a LogRecord (its content opened by the log's sealer),
    or as poison if it does not decode."""
    try:
        return LogRecord(partition, msg.offset, records.decode(msg.value))
    except EventError as exc:
        return poison_of(msg, str(exc))


def sessions_named(messages: list[Any]) -> set[str]:
    """The sessions consumed records name (by key, and by event where it decodes)."""
    found = {msg.key.decode("utf-8", "replace") for msg in messages if msg.key}
    for msg in messages:
        try:
            found.add(codec.decode(msg.value or b"").session_id)
        except EventError:
            continue
    return found


async def send_batches(
    producer: AIOKafkaProducer, topic: str, partition: int, records: list[tuple[bytes, bytes, Headers]]
) -> list[SentBatch]:
    """``records`` (key, value, headers) in as few producer batches as hold them, in order."""
    sent: list[SentBatch] = []
    builder, relatives = producer.create_batch(), list[int]()  # each record's place in its batch
    for key, value, headers in records:
        appended = builder.append(key=key, value=value, timestamp=None, headers=headers)
        if appended is None:  # the batch is full (its first record always fits): send it, start one
            sent.append((await producer.send_batch(builder, topic, partition=partition), relatives))
            builder, relatives = producer.create_batch(), list[int]()
            appended = builder.append(key=key, value=value, timestamp=None, headers=headers)
        relatives.append(appended.offset)
    if relatives:
        sent.append((await producer.send_batch(builder, topic, partition=partition), relatives))
    return sent
