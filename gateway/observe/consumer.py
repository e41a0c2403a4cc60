"""The observability consumer: its own group on the log, feeding logs, metrics and spans.

At-least-once like every group member (a ``consumers.runner.GroupConsumer``): after a crash the
records since the last commit are seen again (a counter may count them twice; the analytics
consumer is the exactly-once one).
"""

from __future__ import annotations

from typing import Sequence

from turnlog.consumers.runner import GroupConsumer
from turnlog.engine import events as ev
from turnlog.engine.fold import fold
from turnlog.engine.log.base import EventLog, LogRecord
from turnlog.engine.log.sealing import PLAIN

from .logs import EventLogger
from .metrics import GatewayMetrics
from .traces import SpanBuilder

GROUP = "observability"


class ObservabilityConsumer:
    def __init__(
        self,
        event_log: EventLog,
        *,
        logger: EventLogger,
        metrics: GatewayMetrics | None = None,
        spans: SpanBuilder | None = None,
        partitions: Sequence[int] | None = None,
        batch: int = 500,
    ) -> None:
        self.log = event_log
        self.logger = logger
        self.metrics = metrics
        self.spans = spans
        every = list(partitions) if partitions is not None else list(range(event_log.partitions))
        self._member = GroupConsumer(event_log, GROUP, self.handle, partitions=every, batch=batch)

    async def handle(self, record: LogRecord) -> None:
        event = record.event
        self.logger.log(event)
        if self.metrics is not None:
            self.metrics.on_event(event)
        if self.spans is not None:
            self.spans.on_event(event)
        if isinstance(event, ev.TurnFinished) and self.logger.wants_context(event):
            events = await self.log.read_session(event.session_id)
            self.logger.log_context(
                event,
                fold(event.session_id, [e for e in events if e.version <= event.version]),
                getattr(self.log, "records", PLAIN),
            )

    async def poll_once(self) -> int:
        """Handle everything currently on the partitions; return records handled."""
        return await self._member.poll_once()
