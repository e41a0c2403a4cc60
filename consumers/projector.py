"""The projector: folds the log into the SQL read models, exactly once.

It keeps its offsets inside the projection store (same transaction as the rows) instead of in
the log's consumer-group table, so rows and offsets can never disagree. Each batch of records
is one transaction, written on the store's writer thread: a slow database delays the read
models, never the event loop the projector shares (the gateway runs one in-process).
"""

from __future__ import annotations

import asyncio

import structlog

from turnlog.engine.log.base import EventLog
from turnlog.projections.rebuild import BATCH, AppliedBatch, Follower, OnBatch, PartitionLag
from turnlog.projections.store import ProjectionStore

log = structlog.get_logger("turnlog.projector")


class Projector:
    """Folds the log into the read models of a ``ProjectionStore``, batch by batch, each batch in
    one transaction with its offsets."""

    def __init__(
        self,
        event_log: EventLog,
        store: ProjectionStore,
        *,
        idle_wait_s: float = 0.5,
        batch: int = BATCH,
        on_batch: OnBatch | None = None,
    ) -> None:
        self.log = event_log
        self.store = store
        self.idle_wait_s = idle_wait_s
        self._follower = Follower(event_log, store, batch=batch, on_batch=on_batch)
        self._stop = asyncio.Event()

    async def catch_up(self) -> int:
        """Apply everything appended so far; return events applied (one pass at a time)."""
        return await self._follower.catch_up()

    async def lag(self) -> dict[int, PartitionLag]:
        """Per partition: the log's end offset against the next offset to apply, and how long the
        oldest record not applied yet has waited (``PartitionLag.behind_ms``). No database read
        once a pass has run; one end offset and at most one record per partition from the log."""
        return await self._follower.lag()

    @property
    def last_batch(self) -> AppliedBatch | None:
        """The newest committed batch: ``committed_ms - oldest_event_ms`` is how long its oldest
        event waited to be visible in the read models."""
        return self._follower.last_batch

    async def run(self) -> None:
        log.info("projector.start")
        while not self._stop.is_set():
            if await self.catch_up() == 0:
                await self.log.wait_for_append(self.idle_wait_s)
        log.info("projector.stop")

    def stop(self) -> None:
        self._stop.set()
