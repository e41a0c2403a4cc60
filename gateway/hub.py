"""The live hub: what a turn worker streams (committed events and ephemeral token deltas), fanned
out to the event streams and observers that listen. The worker runs in this process, or in
another one that publishes its items on Kafka's live topic (``turnlog.engine.log.kafka_live``; a notice
``Committed`` then stands in for an event too heavy to send) or on the channel of the processes
sharing an embedded log file (``turnlog.engine.log.local_live``: every event as a ``Committed`` notice).

Events are also on the log, so a listener that misses one loses nothing: the event stream
re-reads the log whenever the hub wakes it, and a poll catches up with writers in other
processes. Token deltas exist only here (they are never logged), so a slow listener whose
queue is full loses deltas, never events.
"""

from __future__ import annotations

import asyncio
from typing import Callable

import structlog

from turnlog.engine.stream import Committed, LiveItem, StreamItem

log = structlog.get_logger("turnlog.hub")
Observer = Callable[[StreamItem], None]


class LiveHub:
    """Fans what turn workers stream out to the event streams and observers listening (module
    docstring)."""

    def __init__(self, queue_size: int = 1024) -> None:
        self.queue_size = queue_size
        self._subscribers: dict[str, set[asyncio.Queue[LiveItem]]] = {}
        self._observers: list[Observer] = []

    def observe(self, observer: Observer) -> None:
        """Call ``observer`` with every item of every session (metrics such as time to first token)."""
        self._observers.append(observer)

    def subscribe(self, session_id: str) -> asyncio.Queue[LiveItem]:
        queue: asyncio.Queue[LiveItem] = asyncio.Queue(self.queue_size)
        self._subscribers.setdefault(session_id, set()).add(queue)
        return queue

    def unsubscribe(self, session_id: str, queue: asyncio.Queue[LiveItem]) -> None:
        queues = self._subscribers.get(session_id)
        if queues is not None:
            queues.discard(queue)
            if not queues:
                del self._subscribers[session_id]

    def publish(self, item: LiveItem) -> None:
        if not isinstance(item, Committed):
            for observer in self._observers:
                try:
                    observer(item)
                except Exception:  # an observer's bug must never break the turn that publishes
                    log.exception("hub.observer_failed", observer=getattr(observer, "__qualname__", "?"))
        for queue in self._subscribers.get(item.session_id, ()):
            try:
                queue.put_nowait(item)
            except asyncio.QueueFull:
                pass  # a slow listener loses deltas; events come back from the log

    def subscriptions(self) -> int:
        """Subscriptions open over all sessions (each an event stream or a run being answered)."""
        return sum(len(queues) for queues in list(self._subscribers.values()))

    def listeners(self, session_id: str) -> int:
        return len(self._subscribers.get(session_id, ()))
