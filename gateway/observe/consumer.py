"""The observability consumer: its own group on the log, feeding logs, metrics and spans.

At-least-once like every group member: after a crash the records since the last commit are seen
again (a counter may count them twice; the analytics consumer is the exactly-once one).
"""

from __future__ import annotations

from typing import Sequence

from consumers.runner import GroupConsumer
from engine import events as ev
from engine.fold import fold
from engine.log.base import EventLog, LogRecord

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
    ) -> None:
        self.log = event_log
        self.logger = logger
        self.metrics = metrics
        self.spans = spans
        self.consumer = GroupConsumer(event_log, GROUP, self.handle, partitions=partitions)

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
                event, fold(event.session_id, [e for e in events if e.version <= event.version])
            )

    async def poll_once(self) -> int:
        return await self.consumer.poll_once()

    async def run(self) -> None:
        await self.consumer.run()

    def stop(self) -> None:
        self.consumer.stop()
