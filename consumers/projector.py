"""The projector: folds the log into the SQL read models, exactly once.

It keeps its offsets inside the projection store (same transaction as the rows) instead of in
the log's consumer-group table, so rows and offsets can never disagree.
"""

from __future__ import annotations

import asyncio

import structlog

from engine.log.base import EventLog
from projections.rebuild import catch_up
from projections.store import ProjectionStore

log = structlog.get_logger("turnlog.projector")


class Projector:
    def __init__(self, event_log: EventLog, store: ProjectionStore, *, idle_wait_s: float = 0.5) -> None:
        self.log = event_log
        self.store = store
        self.idle_wait_s = idle_wait_s
        self._stop = asyncio.Event()

    async def catch_up(self) -> int:
        return await catch_up(self.log, self.store)

    async def run(self) -> None:
        log.info("projector.start")
        while not self._stop.is_set():
            if await self.catch_up() == 0:
                await self.log.wait_for_append(self.idle_wait_s)
        log.info("projector.stop")

    def stop(self) -> None:
        self._stop.set()
