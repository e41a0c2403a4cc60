"""`turnlog sessions --from-log` / `--kafka`: the sessions the log holds (``EventLog.sessions``),
projected or not, read from the embedded log or from Kafka by a reader that owns no partition."""

from __future__ import annotations

import contextlib
from typing import Sequence

from rich.console import Console
from rich.table import Table

from turnlog.engine.log.base import SessionSummary

from .app import ReadSide


async def print_sessions(console: Console, side: ReadSide, limit: int) -> int:
    """Streams the log's listing (``EventLog.sessions``), stopping after ``limit``; a Kafka log
    is opened as a reader that owns no partition."""
    log = await side.open_log(client_id="turnlog-sessions")
    found: list[SessionSummary] = []
    try:
        async with contextlib.aclosing(log.sessions()) as listing:
            async for summary in listing:
                found.append(summary)
                if len(found) == limit:
                    break
    finally:
        await log.close()
    if not found:
        console.print("no sessions in the log", highlight=False)
        return 0
    console.print(sessions_table(found))
    if len(found) == limit:
        console.print(f"(the first {limit}; more with --limit)", highlight=False)
    return 0


def sessions_table(found: Sequence[SessionSummary]) -> Table:
    """Sessions as the log lists them: by partition, then id (``EventLog.sessions``)."""
    table = Table(
        title="sessions in the log", title_justify="left", pad_edge=False, box=None, header_style="bold"
    )
    table.add_column("session", no_wrap=True, min_width=32)
    table.add_column("partition", justify="right", no_wrap=True)
    table.add_column("version", justify="right", no_wrap=True)
    for s in found:
        table.add_row(s.session_id, str(s.partition), str(s.version))
    return table
