"""The turn worker: runs the turns of user messages on its partitions.

For each UserMessageReceived (or CancelRequested) it folds the session and lets the TurnRunner
do whatever the log says is left: a new turn, the rest of a turn a previous worker died in, or
stopping a turn someone cancelled. A redelivered message whose turn already finished finds
nothing to do, so no turn ever runs twice.
"""

from __future__ import annotations

from typing import Callable, Sequence

import structlog

from engine import events as ev
from engine.agent import AgentDirectory
from engine.log.base import EventLog, LogRecord
from engine.stream import StreamItem
from engine.turn import TurnRunner

from .runner import GroupConsumer

GROUP = "turn-workers"
log = structlog.get_logger("turnlog.worker")


RESUMES = (ev.UserMessageReceived, ev.ApprovalDecided, ev.BudgetDecided, ev.CancelRequested)
"""The events that give a worker something to do: a new message, a decision on a paused turn,
a cancel."""


class TurnWorker:
    def __init__(
        self,
        event_log: EventLog,
        agents: AgentDirectory,
        *,
        worker_id: str = "worker",
        partitions: Sequence[int] | None = None,
        on_item: Callable[[StreamItem], None] | None = None,
    ) -> None:
        self.runner = TurnRunner(event_log, agents.get, producer=worker_id)
        self.on_item = on_item
        self.consumer = GroupConsumer(event_log, GROUP, self.handle, partitions=partitions)

    async def handle(self, record: LogRecord) -> None:
        event = record.event
        if not isinstance(event, RESUMES):
            return  # a decision resumes a paused turn; a cancel may outlive its turn's dead worker
        async for item in self.runner.run(event.session_id):
            if self.on_item is not None:
                self.on_item(item)
        log.debug("worker.message_done", session=event.session_id, offset=record.offset)

    async def poll_once(self) -> int:
        return await self.consumer.poll_once()

    async def run(self) -> None:
        await self.consumer.run()

    def stop(self) -> None:
        self.consumer.stop()
