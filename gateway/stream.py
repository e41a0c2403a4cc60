"""A session's event stream for Server-Sent Events.

Every event goes out with ``id`` = its log position (the offset in the session's partition), read
from the log itself, so a client that reconnects with ``Last-Event-ID`` gets exactly the events
after the last one it saw. Token deltas go out between them as ``event: delta`` without an id:
they are ephemeral, never replayed, and a reconnect does not move past an event because of them.

The hub wakes the stream when this process's worker commits or streams something, in commit
order with the deltas in between, and the stream reads the log up to the last of each run of
events it is told of (one read for a commit's events), so deltas land between the
ModelCallStarted and ModelCallFinished they belong to. A delta whose model call is already
finished on the stream (the stream read ahead) is dropped: the complete text is in the
AssistantMessage. A model call that waits for its endpoint's client-side limits goes out the
same way, as ``event: waiting`` (``waiting: false`` when the wait is over). Items of a worker in
another process reach the hub through Kafka's live topic or the embedded log's channel (a
``Committed`` notice stands in for an event: read it from the log); a poll every ``poll_s``
catches up with writers whose items do not reach the hub at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator

from turnlog.engine import events as ev
from turnlog.engine.log.base import EventLog, LogRecord
from turnlog.engine.stream import Committed, LiveItem, ModelDelta, ModelProgress, ModelWaiting

from .access import event_json
from .hub import LiveHub

PHASES: dict[str, str] = {
    "TurnStarted": "turn.start",
    "TurnFinished": "turn.end",
    "ModelCallStarted": "model.start",
    "ModelCallFinished": "model.end",
    "ToolCallStarted": "tool.start",
    "ToolCallFinished": "tool.end",
    "UserMessageDropped": "message.dropped",
}
"""Process hints (seed §5.2): which events mark a turn, a model step or a tool call beginning or ending."""


@dataclass(frozen=True, slots=True)
class StreamMessage:
    """One SSE message: ``id`` is set for log events and None for ephemeral deltas."""

    event: str
    data: str
    id: int | None = None

    def encode(self) -> bytes:
        """The message on the wire, in the lines sse-starlette writes (CRLF): ``data`` is JSON,
        one line (its strings escape line breaks), and ``event`` one of the names above."""
        head = "" if self.id is None else f"id: {self.id}\r\n"
        return f"{head}event: {self.event}\r\ndata: {self.data}\r\n\r\n".encode()


def event_payload(record: LogRecord) -> dict[str, Any]:
    """The event's fields (a snapshot's or fork's state body as its size, ``state_json_chars``:
    clients need the version, not the state), its log position and its phase."""
    event = record.event
    body = event_json(event)
    body["position"] = record.offset
    body["partition"] = record.partition
    phase = PHASES.get(event.type)
    if phase is not None:
        body["phase"] = phase
    return body


def event_message(record: LogRecord) -> StreamMessage:
    return StreamMessage(record.event.type, json.dumps(event_payload(record)), record.offset)


def delta_message(delta: ModelDelta) -> StreamMessage:
    data = {"turn_id": delta.turn_id, "step": delta.step, "text": delta.text}
    return StreamMessage("delta", json.dumps(data))


def waiting_message(wait: ModelWaiting) -> StreamMessage:
    fields = ("turn_id", "step", "model", "reason", "ahead", "waiting")
    return StreamMessage("waiting", json.dumps({name: getattr(wait, name) for name in fields}))


MAX_BATCH = 64
"""How many items a stream gathers from its queue before it hands them over
(``SessionStream.batches``)."""

Ephemeral = ModelDelta | ModelWaiting
"""What a stream carries between the log's events and never replays."""


def ephemeral_message(item: Ephemeral) -> StreamMessage:
    return delta_message(item) if isinstance(item, ModelDelta) else waiting_message(item)


class SessionStream:
    """Iterate to get a session's messages from ``after_position`` on, live, until cancelled."""

    def __init__(
        self, log: EventLog, hub: LiveHub, session_id: str, after_position: int = -1, *, poll_s: float = 1.0
    ) -> None:
        self.log = log
        self.hub = hub
        self.session_id = session_id
        self.after_position = after_position
        self.poll_s = poll_s
        self._version = 0
        self._open_steps: set[tuple[str, int]] = set()
        self._queue: asyncio.Queue[LiveItem] | None = None
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[StreamMessage]:
        async for batch in self.message_batches():
            for message in batch:
                yield message

    async def message_batches(self) -> AsyncIterator[list[StreamMessage]]:
        """``batches`` as SSE messages: an answer writes each list at once."""
        async for batch in self.batches():
            yield [ephemeral_message(i) if isinstance(i, Ephemeral) else event_message(i) for i in batch]

    async def items(self) -> AsyncIterator[LogRecord | Ephemeral]:
        """The session's log records after ``after_position`` and live deltas, in order, forever."""
        async for batch in self.batches():
            for item in batch:
                yield item

    async def batches(self) -> AsyncIterator[list[LogRecord | Ephemeral]]:
        """What ``items`` yields, a list at a time: what was ready together (a commit's events,
        the deltas queued meanwhile), never an empty list. Queued items stop joining a list
        once it holds ``MAX_BATCH`` (one catch-up's records stay in one list)."""
        if self._closed:
            return
        queue = self._queue = self.hub.subscribe(self.session_id)
        try:
            if out := await self._catch_up():
                yield out
            while True:
                item: LiveItem | None = None
                if not queue.empty():
                    item = queue.get_nowait()
                else:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.poll_s):
                            item = await queue.get()
                if out := await self._gather(queue, item):
                    yield out
        finally:
            self.close()

    async def _gather(
        self, queue: asyncio.Queue[LiveItem], item: LiveItem | None
    ) -> list[LogRecord | Ephemeral]:
        """``item`` and what is queued behind it, up to ``MAX_BATCH``. A run of committed events
        with nothing ephemeral between them is read from the log once, through its last: one
        read for a commit of several events, not one for each."""
        out: list[LogRecord | Ephemeral] = []
        through = 0  # the last version of the run of events not read yet
        while True:
            if isinstance(item, (ev.Event, Committed)):
                through = max(through, item.version)
            else:
                out += await self._read_through(through) + await self._on(item)
                through = 0
            if queue.empty() or len(out) >= MAX_BATCH:
                return out + await self._read_through(through)
            item = queue.get_nowait()

    def close(self) -> None:
        """End the stream's subscription to the hub (once; a stream that never started has
        none). The answer that carries the stream calls it when it ends, however it ends."""
        self._closed = True
        if self._queue is not None:
            self.hub.unsubscribe(self.session_id, self._queue)
            self._queue = None

    async def _on(self, item: Ephemeral | ModelProgress | None) -> list[LogRecord | Ephemeral]:
        if isinstance(item, Ephemeral):
            step = (item.turn_id, item.step)
            if step not in self._open_steps:  # its ModelCallStarted is committed: read it first
                out = await self._catch_up()
                return [*out, item] if step in self._open_steps else out
            return [item]
        if item is None:
            return await self._catch_up()
        return []  # ModelProgress, the terminal's progress line: SSE clients see deltas and events

    async def _read_through(self, version: int) -> list[LogRecord | Ephemeral]:
        """The records through ``version``: the hub delivers events in commit order, between the
        deltas, so reading no further keeps the deltas after it in their place."""
        return await self._catch_up(upto=version) if version > self._version else []

    async def _catch_up(self, upto: int | None = None) -> list[LogRecord | Ephemeral]:
        if upto is None:
            records = await self.log.read_session_records(self.session_id, self._version)
        else:  # a live notice of ``upto``: the log need not look for more than that
            records = await self.log.read_session_records_through(self.session_id, self._version, upto)
        out: list[LogRecord | Ephemeral] = []
        for record in records:
            if upto is not None and record.event.version > upto:
                break
            self._version = record.event.version
            self._track(record.event)
            if record.offset > self.after_position:
                out.append(record)
        return out

    def _track(self, event: ev.Event) -> None:
        if isinstance(event, ev.ModelCallStarted):
            self._open_steps.add((event.turn_id, event.step))
        elif isinstance(event, ev.ModelCallFinished):
            self._open_steps.discard((event.turn_id, event.step))
