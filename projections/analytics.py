"""Daily aggregates of the event stream (the design card's analytics consumer).

Counters per UTC day (of the event's own time, so a replay gives the same rows): sessions, turns,
model calls and errors, tokens, tool calls, guard stops; and per day and tool: calls, successes,
latency. A batch of records is folded in memory and written in one transaction with the
analytics group's offsets, so every event is counted exactly once whatever crashes.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Iterable

from engine import events as ev
from engine.log.base import LogRecord

from .store import ProjectionStore, Row

DAILY_COUNTERS = (
    "sessions",
    "turns",
    "model_calls",
    "model_errors",
    "input_tokens",
    "output_tokens",
    "tool_calls",
    "guard_stops",
)

TABLES: dict[str, str] = {
    "analytics_daily": f"""
        CREATE TABLE IF NOT EXISTS analytics_daily (
            day TEXT PRIMARY KEY,
            {", ".join(f"{c} BIGINT NOT NULL DEFAULT 0" for c in DAILY_COUNTERS)}
        )""",
    "analytics_daily_tools": """
        CREATE TABLE IF NOT EXISTS analytics_daily_tools (
            day              TEXT NOT NULL,
            tool_name        TEXT NOT NULL,
            calls            BIGINT NOT NULL DEFAULT 0,
            successes        BIGINT NOT NULL DEFAULT 0,
            elapsed_ms_total DOUBLE PRECISION NOT NULL DEFAULT 0,
            elapsed_ms_max   DOUBLE PRECISION NOT NULL DEFAULT 0,
            PRIMARY KEY (day, tool_name)
        )""",
    "analytics_offsets": """
        CREATE TABLE IF NOT EXISTS analytics_offsets (
            log_partition BIGINT PRIMARY KEY,
            next_offset   BIGINT NOT NULL
        )""",
}

_UPSERT_DAY = (
    f"INSERT INTO analytics_daily (day, {', '.join(DAILY_COUNTERS)}) "
    f"VALUES (?, {', '.join('?' for _ in DAILY_COUNTERS)}) ON CONFLICT (day) DO UPDATE SET "
    + ", ".join(f"{c} = analytics_daily.{c} + excluded.{c}" for c in DAILY_COUNTERS)
)
_UPSERT_TOOL = (
    "INSERT INTO analytics_daily_tools (day, tool_name, calls, successes, elapsed_ms_total, elapsed_ms_max) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (day, tool_name) DO UPDATE SET "
    "calls = analytics_daily_tools.calls + excluded.calls, "
    "successes = analytics_daily_tools.successes + excluded.successes, "
    "elapsed_ms_total = analytics_daily_tools.elapsed_ms_total + excluded.elapsed_ms_total, "
    "elapsed_ms_max = CASE WHEN excluded.elapsed_ms_max > analytics_daily_tools.elapsed_ms_max "
    "THEN excluded.elapsed_ms_max ELSE analytics_daily_tools.elapsed_ms_max END"
)


@dataclass
class ToolDay:
    calls: int = 0
    successes: int = 0
    elapsed_ms_total: float = 0.0
    elapsed_ms_max: float = 0.0


@dataclass
class Batch:
    days: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    tools: defaultdict[tuple[str, str], ToolDay] = field(default_factory=lambda: defaultdict(ToolDay))

    def add(self, event: ev.Event) -> None:
        day = dt.datetime.fromtimestamp(event.time_ms / 1000, dt.UTC).date().isoformat()
        counts = self.days[day]
        if isinstance(event, ev.SessionCreated):
            counts["sessions"] += 1
        elif isinstance(event, ev.TurnFinished):
            counts["turns"] += 1
        elif isinstance(event, ev.ModelCallFinished):
            counts["model_calls"] += 1
            counts["model_errors"] += event.status != "ok"
            counts["input_tokens"] += event.input_tokens
            counts["output_tokens"] += event.output_tokens
        elif isinstance(event, ev.ToolCallFinished):
            counts["tool_calls"] += 1
            tool = self.tools[(day, event.tool_name)]
            tool.calls += 1
            tool.successes += event.status == "success"
            tool.elapsed_ms_total += event.elapsed_ms
            tool.elapsed_ms_max = max(tool.elapsed_ms_max, event.elapsed_ms)
        elif isinstance(event, ev.StateChanged) and event.cause == "guard":
            counts["guard_stops"] += 1


class AnalyticsStore:
    """The analytics tables inside a projection store (same database, own offsets)."""

    def __init__(self, store: ProjectionStore) -> None:
        self.store = store
        with store._transaction():
            for ddl in TABLES.values():
                store._execute(ddl)

    def next_offset(self, partition: int) -> int:
        rows = self.store._query(
            "SELECT next_offset FROM analytics_offsets WHERE log_partition = ?", (partition,)
        )
        return int(rows[0]["next_offset"]) if rows else 0

    def apply(self, records: Iterable[LogRecord]) -> int:
        batch, ends, count = Batch(), {}, 0
        for record in records:
            batch.add(record.event)
            ends[record.partition] = record.offset + 1
            count += 1
        store = self.store
        with store._transaction():
            for day, counts in batch.days.items():
                store._execute(_UPSERT_DAY, (day, *(counts[c] for c in DAILY_COUNTERS)))
            for (day, tool_name), t in batch.tools.items():
                store._execute(
                    _UPSERT_TOOL, (day, tool_name, t.calls, t.successes, t.elapsed_ms_total, t.elapsed_ms_max)
                )
            for partition, offset in ends.items():
                store._execute(
                    "INSERT INTO analytics_offsets (log_partition, next_offset) VALUES (?, ?) "
                    "ON CONFLICT (log_partition) DO UPDATE SET next_offset = excluded.next_offset",
                    (partition, offset),
                )
        return count

    def daily(self, since_day: str) -> list[Row]:
        return self.store._query("SELECT * FROM analytics_daily WHERE day >= ? ORDER BY day", (since_day,))

    def daily_tools(self, since_day: str) -> list[Row]:
        return self.store._query(
            "SELECT * FROM analytics_daily_tools WHERE day >= ? ORDER BY day, tool_name", (since_day,)
        )

    def reset(self) -> None:
        with self.store._transaction():
            for table in TABLES:
                self.store._execute(f"DROP TABLE IF EXISTS {table}")
            for ddl in TABLES.values():
                self.store._execute(ddl)
