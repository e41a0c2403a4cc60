"""`turnlog export OUT [--follow]`: the log (embedded or Kafka) as Parquet datasets for analytics
tools (consumers/export.py), with a progress bar, and following the log until SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

from turnlog.engine import extras
from turnlog.engine.errors import ExportError
from turnlog.engine.log.base import EventLog

from .app import ReadSide


@dataclass(frozen=True)
class ExportOptions:
    out: Path
    content: bool
    follow: bool
    batch: int
    interval_s: float


def source_of(side: ReadSide) -> str:
    """What the export directory records as its source: a resumed export must read the same log."""
    if side.kafka is not None:
        return f"kafka:{side.topic}"
    return f"sqlite:{(side.home / 'log.db').resolve()}"


async def open_log(side: ReadSide) -> EventLog:
    if side.kafka is None and not (side.home / "log.db").exists():
        raise ExportError(
            f"there is no log at {side.home / 'log.db'}; pass --home of a turnlog data folder, "
            "or --kafka for the Kafka log"
        )
    return await side.open_log(owner=False, client_id="turnlog-export")


async def run(console: Console, side: ReadSide, options: ExportOptions) -> int:
    extras.require("export", "turnlog export")
    from turnlog.consumers.export import Exporter

    out = options.out.expanduser()
    log = await open_log(side)
    try:
        with _progress(console, options.follow) as show:
            exporter = Exporter(
                log,
                out,
                source=source_of(side),
                content=options.content,
                batch=options.batch,
                on_progress=show,
            )
            exporter.open()
            try:
                if options.follow:
                    await exporter.follow(_stop_on_signals(), interval_s=options.interval_s)
                else:
                    await exporter.export()
            finally:
                exporter.close()
    finally:
        await log.close()
    console.print(
        f"exported {exporter.events:,} events ({exporter.rows:,} rows, {exporter.files:,} files) to {out}",
        highlight=False,
    )
    return 0


@contextlib.contextmanager
def _progress(console: Console, follow: bool) -> Iterator[Any]:
    """A progress bar over the offsets to export (a running count while following)."""
    label = "following the log" if follow else "exporting"
    columns = (
        SpinnerColumn(),
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("", total=None)

        def show(p: Any) -> None:
            bar.update(
                task, completed=p.done, total=p.total, description=f"{p.rows:,} rows, {p.files:,} files"
            )

        yield show


def _stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT: a following export flushes what it read, then stops."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop
