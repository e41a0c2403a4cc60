"""Daily aggregates of the event stream (the design card's analytics consumer).

Counters per UTC day (of the event's own time, so a replay gives the same rows): sessions, turns,
model calls and errors, tokens, tool calls, guard stops; and per day and tool: calls, successes,
latency. A batch of records is folded in memory and written in one transaction with the
analytics group's offsets (on the store's writer thread), so every event is counted exactly
once whatever crashes: records below the stored offsets are dropped inside that transaction, so
even a batch handed over twice is counted once.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import partial
from typing import Iterable

from turnlog.engine import events as ev
from turnlog.engine.experiments.namespace import is_experiment_session
from turnlog.engine.log.base import LogRecord

from .batch import Group
from .store import ProjectionStore, Row, Writer

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
_UPSERT_OFFSET = (
    "INSERT INTO analytics_offsets (log_partition, next_offset) VALUES (?, ?) "
    "ON CONFLICT (log_partition) DO UPDATE SET next_offset = excluded.next_offset"
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
        elif isinstance(event, ev.ModelCallFinished | ev.AuxiliaryModelCall):
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
        store.write(_create)

    def next_offset(self, partition: int) -> int:
        rows = self.store._query(
            "SELECT next_offset FROM analytics_offsets WHERE log_partition = ?", (partition,)
        )
        return int(rows[0]["next_offset"]) if rows else 0

    async def offsets_async(self) -> dict[int, int]:
        return await self.store.write_async(_offsets)

    def apply(self, records: Iterable[LogRecord]) -> int:
        """Count records beyond the stored offsets and advance them, atomically; return records counted."""
        return self.store.write(partial(_count, list(records)))

    async def apply_async(self, records: Iterable[LogRecord]) -> int:
        return await self.store.write_async(partial(_count, list(records)))

    def daily(self, since_day: str) -> list[Row]:
        return self.store._query("SELECT * FROM analytics_daily WHERE day >= ? ORDER BY day", (since_day,))

    def daily_tools(self, since_day: str) -> list[Row]:
        return self.store._query(
            "SELECT * FROM analytics_daily_tools WHERE day >= ? ORDER BY day, tool_name", (since_day,)
        )

    def reset(self) -> None:
        self.store.write(_reset)


def _create(writer: Writer) -> None:
    for ddl in TABLES.values():
        writer.execute(ddl)


def _reset(writer: Writer) -> None:
    for table in TABLES:
        writer.execute(f"DROP TABLE IF EXISTS {table}")
    _create(writer)


def _offsets(writer: Writer) -> dict[int, int]:
    rows = writer.query("SELECT log_partition, next_offset FROM analytics_offsets")
    return {int(r["log_partition"]): int(r["next_offset"]) for r in rows}


def _count(records: list[LogRecord], writer: Writer) -> int:
    stored = _offsets(writer)
    batch, ends, count = Batch(), dict(stored), 0
    for record in records:
        if record.offset < ends.get(record.partition, 0):
            continue  # counted already (a stale or replayed batch)
        if not is_experiment_session(record.event.session_id):  # experiments are not production traffic
            batch.add(record.event)
        ends[record.partition] = record.offset + 1
        count += 1
    days = [(day, *(counts[c] for c in DAILY_COUNTERS)) for day, counts in batch.days.items()]
    tools = [
        (day, name, t.calls, t.successes, t.elapsed_ms_total, t.elapsed_ms_max)
        for (day, name), t in batch.tools.items()
    ]
    moved = [(p, offset) for p, offset in ends.items() if offset != stored.get(p)]
    groups = [Group(_UPSERT_DAY, days), Group(_UPSERT_TOOL, tools), Group(_UPSERT_OFFSET, moved)]
    writer.run_groups([g for g in groups if g.rows])
    return count
