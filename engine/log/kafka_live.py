"""Live items across processes on Kafka: what a turn worker streams, for event streams served by
another process (an API gateway that runs no turns).

A turn's token deltas are never logged (seed §5.2), so a stream in another process can only get
them through a channel that is not the event log: ``<topic>.live``, partitioned like the log
(a session's items stay in order) and kept for a minute. A worker publishes there every item its
turns stream: deltas, and a notice of each event it committed (the event itself, or for the two
heavy kinds, SnapshotTaken and SessionForked, only its version when their state is large), so a
stream reads the log at once instead of at its next poll. Nothing here is a source of truth: a
subscriber that misses items loses deltas, never events (streams read events from the log), and
publishing never blocks or fails a turn (a full queue or a broker error drops live items,
logged).

Records: key = session id; header ``turnlog.live`` = ``event`` (Avro single-object value,
``turnlog.engine.codec``), ``notice`` (JSON ``{"version", "type"}``), ``delta`` (JSON
``{"turn_id", "step", "text"}``) or ``waiting`` (a model call waiting for its endpoint, JSON of
its fields); header ``turnlog.origin`` = the publishing process, so a process that also
publishes can skip its own items; header ``turnlog.offset`` on an event its publisher committed
itself = the event's offset in its partition, so a subscriber serves it as that record before
its reader of the partition has it (``kafka_heard``); its value is then the record's own value
on the events topic (``kafka_written``), which that reader need not decode again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from typing import Any, AsyncIterator, Callable

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from ..errors import EventError
from ..events import Event, SessionForked, SnapshotTaken
from ..stream import Committed, LiveItem, ModelDelta, ModelProgress, ModelWaiting, StreamItem
from .base import LogRecord, partition_for
from .kafka_records import Headers, send_batches
from .kafka_topics import TopicNames
from .sealing import PLAIN, RecordCodec

log = structlog.get_logger("turnlog.live")
KIND, ORIGIN, OFFSET = "turnlog.live", "turnlog.origin", "turnlog.offset"
HEAVY = (SnapshotTaken, SessionForked)
"""Events whose state body can be hundreds of KB: sent whole only when it is at most
``WHOLE_STATE_CHARS``, else as a notice (their version)."""
WHOLE_STATE_CHARS = 64 << 10
QUEUE_SIZE = 10_000
"""Live items waiting to be sent, a partition's; past it new ones are dropped (a stream reads
events from the log)."""
SEND_AT_ONCE = 500
"""At most this many of a partition's queued items go to the producer at a time."""
BATCH_BYTES = 512 << 10
"""A producer batch's bound: what a partition queued while its last batch was being sent goes in
one or a few."""
LIVE_FETCH_WAIT_MS = 500
"""How long the broker holds a subscriber's fetch while the live topic is quiet. It answers as
soon as an item arrives, so this sets only how often an idle process asks again."""


Published = Event | ModelDelta | ModelWaiting


def encode(item: Published, records: RecordCodec = PLAIN) -> tuple[bytes, bytes]:
    """The record kind and value of one live item (``ModelProgress`` is never published); content
    encrypted by the log's sealer, a delta's text too."""
    if isinstance(item, ModelDelta):
        text = records.seal_text(item.session_id, item.text, _delta_label(item.turn_id, item.step))
        return b"delta", json.dumps({"turn_id": item.turn_id, "step": item.step, "text": text}).encode()
    if isinstance(item, ModelWaiting):
        fields = ("turn_id", "step", "model", "reason", "ahead", "waiting")
        return b"waiting", json.dumps({name: getattr(item, name) for name in fields}).encode()
    if _notice_only(item):
        return b"notice", json.dumps({"version": item.version, "type": item.type}).encode()
    return b"event", records.encode(item)


def _notice_only(item: Published) -> bool:
    """A heavy event too large to send whole: only its version goes out."""
    return isinstance(item, HEAVY) and len(item.state_json) > WHOLE_STATE_CHARS


def _delta_label(turn_id: str, step: int) -> str:
    return f"delta/{turn_id}/{step}"


def decode(session_id: str, kind: bytes, value: bytes, records: RecordCodec = PLAIN) -> LiveItem:
    """One live item from its record; raises ValueError or EventError for a malformed one."""
    if kind == b"event":
        event: Event = records.decode(value)
        return event
    body = json.loads(value)
    if kind == b"delta":
        turn_id, step = str(body["turn_id"]), int(body["step"])
        return ModelDelta(
            session_id,
            turn_id,
            step,
            records.open_text(session_id, str(body["text"]), _delta_label(turn_id, step)),
        )
    if kind == b"notice":
        return Committed(session_id, int(body["version"]), str(body["type"]))
    if kind == b"waiting":
        return ModelWaiting(
            session_id,
            str(body["turn_id"]),
            int(body["step"]),
            str(body["model"]),
            str(body["reason"]),
            int(body["ahead"]),
            bool(body["waiting"]),
        )
    raise ValueError(f"unknown live item kind {kind!r}")


class KafkaLivePublisher:
    """Sends a process's live items to ``<topic>.live``; ``publish`` is a sync callback (a
    TurnWorker's ``on_item``) that queues by partition, and a task per partition sends what is
    queued, in order, as producer batches, without waiting for acknowledgements. A partition's
    next batch goes once its last was sent, so a partition the producer cannot reach (its leader
    moving) holds only its own items back."""

    def __init__(
        self,
        bootstrap: str,
        topics: TopicNames,
        partitions: int,
        *,
        origin: str,
        records: RecordCodec = PLAIN,
        own_record: Callable[[str, int], LogRecord | None] = lambda session_id, version: None,
        written: Callable[[LogRecord], bytes | None] = lambda record: None,
    ) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.partitions = partitions
        self.origin = origin.encode()
        self.records = records
        """Encrypts what is published as the log's records are (its sealer)."""
        self.own_record = own_record
        """The record of an event this process committed (``KafkaEventLog.own_record``): its
        offset goes out with the event."""
        self.written = written
        """The value such a record was committed with (``KafkaEventLog.written_value``): sent as
        it is, not encoded again, so a subscriber knows the bytes its reader will fetch."""
        self._queues: list[asyncio.Queue[Published]] = [asyncio.Queue(QUEUE_SIZE) for _ in range(partitions)]
        self._producer: AIOKafkaProducer | None = None
        self._senders: list[asyncio.Task[None]] = []
        self.dropped = 0

    async def start(self) -> None:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            client_id=f"{self.origin.decode()}-live",
            acks=1,
            linger_ms=0,
            max_batch_size=BATCH_BYTES,
        )
        await self._producer.start()
        self._senders = [
            asyncio.create_task(self._send_loop(p), name=f"turnlog-live-sender-{p}")
            for p in range(self.partitions)
        ]

    def publish(self, item: StreamItem) -> None:
        if isinstance(item, ModelProgress):
            return  # the local terminal's progress line; streams get the deltas and the events
        try:
            self._queues[partition_for(item.session_id, self.partitions)].put_nowait(item)
        except asyncio.QueueFull:
            self.dropped += 1

    async def _send_loop(self, partition: int) -> None:
        producer, queue = self._producer, self._queues[partition]
        assert producer is not None
        while True:
            items = [await queue.get()]
            while not queue.empty() and len(items) < SEND_AT_ONCE:
                items.append(queue.get_nowait())
            records = [self._record(item) for item in items]
            try:
                for delivery, placed in await send_batches(producer, self.topics.live, partition, records):
                    delivery.add_done_callback(functools.partial(self._delivered, len(placed)))
            except KafkaError as exc:  # live items are best effort: streams read events from the log
                self._dropped(len(records), exc)

    def _record(self, item: Published) -> tuple[bytes, bytes, Headers]:
        """The item as a record of the live topic: key, value, headers."""
        record = self.own_record(item.session_id, item.version) if isinstance(item, Event) else None
        kind, value = b"", None
        if record is not None and not _notice_only(item):
            kind, value = b"event", self.written(record)
        if value is None:
            kind, value = encode(item, self.records)
        return item.session_id.encode(), value, self._headers(kind, record)

    def _delivered(self, count: int, delivery: asyncio.Future[Any]) -> None:
        if not delivery.cancelled() and (exc := delivery.exception()) is not None:
            self._dropped(count, exc)

    def _dropped(self, count: int, exc: BaseException) -> None:
        self.dropped += count
        log.warning("live.send_failed", error=repr(exc), dropped=self.dropped)

    def _headers(self, kind: bytes, record: LogRecord | None) -> Headers:
        headers = [(KIND, kind), (ORIGIN, self.origin)]
        if kind == b"event" and record is not None:
            headers.append((OFFSET, str(record.offset).encode()))
        return headers

    async def close(self) -> None:
        for sender in self._senders:
            sender.cancel()
        for sender in self._senders:
            with contextlib.suppress(asyncio.CancelledError):
                await sender
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await self._producer.stop()  # flushes what was sent
        self._producer, self._senders = None, []


class KafkaLiveSubscriber:
    """Reads ``<topic>.live`` from its end (what is published from now on), every partition,
    skipping the items ``skip_origin`` published."""

    def __init__(
        self,
        bootstrap: str,
        topics: TopicNames,
        partitions: int,
        *,
        skip_origin: str = "",
        records: RecordCodec = PLAIN,
        heard: Callable[[LogRecord, bytes], None] = lambda record, value: None,
    ) -> None:
        self.records = records
        self.heard = heard
        """Told of each event that came with its offset, and its value (``KafkaEventLog.heard``)."""
        self.bootstrap = bootstrap
        self.topics = topics
        self.partitions = partitions
        self.skip_origin = skip_origin.encode()
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, enable_auto_commit=False, fetch_max_wait_ms=LIVE_FETCH_WAIT_MS
        )
        await self._consumer.start()
        tps = [TopicPartition(self.topics.live, p) for p in range(self.partitions)]
        self._consumer.assign(tps)
        await self._consumer.seek_to_end(*tps)
        for tp in tps:  # fix the start now: items published after start() are delivered
            await self._consumer.position(tp)

    async def items(self) -> AsyncIterator[LiveItem]:
        consumer = self._consumer
        assert consumer is not None, "call start() first"
        while True:
            try:
                batches = await consumer.getmany(timeout_ms=500, max_records=1000)
            except KafkaError as exc:
                log.warning("live.read_failed", error=repr(exc))
                await asyncio.sleep(1.0)
                continue
            for messages in batches.values():
                for msg in messages:
                    item = self._decoded(msg)
                    if item is not None:
                        yield item

    def _decoded(self, msg: object) -> LiveItem | None:
        headers = dict(getattr(msg, "headers", ()) or ())
        if self.skip_origin and headers.get(ORIGIN) == self.skip_origin:
            return None
        key: bytes = getattr(msg, "key", b"") or b""
        value: bytes = getattr(msg, "value", b"")
        try:
            item = decode(key.decode(), headers.get(KIND, b""), value, self.records)
        except (EventError, ValueError, KeyError, UnicodeDecodeError) as exc:
            log.warning("live.item_skipped", error=repr(exc))
            return None
        if isinstance(item, Event) and (offset := headers.get(OFFSET)) is not None:
            if offset.isdigit():
                partition = partition_for(item.session_id, self.partitions)
                self.heard(LogRecord(partition, int(offset), item), value)
            else:  # the event still wakes its streams: they read it from the log
                log.warning("live.offset_unreadable", session=item.session_id, offset=repr(offset[:32]))
        return item

    async def close(self) -> None:
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                await self._consumer.stop()
        self._consumer = None
