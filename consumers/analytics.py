"""The analytics consumer: its own group on the log, keeping daily aggregates in the projection
database (projections/analytics.py). It shows how the card's analytics plug in: read the event
stream, touch nothing in the engine."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import structlog

from turnlog.engine.log.base import EventLog
from turnlog.projections.analytics import AnalyticsStore
from turnlog.projections.rebuild import Follower
from turnlog.projections.store import ProjectionStore

GROUP = "analytics"
log = structlog.get_logger("turnlog.analytics")


class AnalyticsConsumer:
    def __init__(
        self, event_log: EventLog, store: ProjectionStore, *, batch: int = 1000, idle_wait_s: float = 0.5
    ) -> None:
        self.log = event_log
        self.tables = AnalyticsStore(store)
        self.batch = batch
        self.idle_wait_s = idle_wait_s
        self._follower = Follower(event_log, self.tables, batch=batch)
        self._stop = asyncio.Event()

    async def catch_up(self) -> int:
        """Fold everything beyond the group's offsets into the aggregates; return records counted."""
        return await self._follower.catch_up()

    async def lag(self) -> dict[int, int]:
        """Records per partition the group has not read yet."""
        return {p: lag.records for p, lag in (await self._follower.lag()).items()}

    async def run(self) -> None:
        log.info("analytics.start", group=GROUP)
        while not self._stop.is_set():
            if await self.catch_up() == 0:
                await self.log.wait_for_append(self.idle_wait_s)
        log.info("analytics.stop", group=GROUP)

    def stop(self) -> None:
        self._stop.set()

    def report(self, days: int) -> dict[str, Any]:
        """The last ``days`` days (UTC): daily totals and per-tool success and latency."""
        since = (dt.datetime.now(dt.UTC).date() - dt.timedelta(days=days - 1)).isoformat()
        tools = []
        for row in self.tables.daily_tools(since):
            calls = int(row["calls"])
            tools.append(
                {
                    **row,
                    "success_rate": int(row["successes"]) / calls if calls else None,
                    "elapsed_ms_avg": float(row["elapsed_ms_total"]) / calls if calls else None,
                }
            )
        return {"since": since, "days": self.tables.daily(since), "tools": tools}
