"""The read side on the data folder: `sessions`, `show`, `snapshots`, `fork`, `replay`, `rebuild`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from turnlog.projections.rebuild import rebuild

from . import admin_cli, log_listing
from .app import EmbeddedApp, ReadSide
from .cli_common import (
    HomeOption,
    KafkaOption,
    PartitionsOption,
    PostgresOption,
    SchemaOption,
    TopicOption,
    console,
    run,
)
from .config import home_dir
from .demo import invocation
from .render import event_notes, print_timeline, sessions_table

commands = typer.Typer()


@commands.command()
def sessions(
    home: HomeOption = None,
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many sessions.")] = 50,
    from_log: Annotated[
        bool,
        typer.Option("--from-log", help="List from the log (id, partition, version), not the projections."),
    ] = False,
    kafka: Annotated[
        str | None, typer.Option("--kafka", help="List from the Kafka log at this bootstrap address.")
    ] = None,
    topic: Annotated[str, typer.Option(help="The Kafka log's events topic.")] = "turnlog.events",
    partitions: Annotated[int, typer.Option(help="The log's partition count.")] = 8,
) -> None:
    """List sessions: from the projections (state, turns, tokens), or from the log itself with
    --from-log or --kafka (every session the log holds, projected or not)."""
    if from_log or kafka is not None:
        run(log_listing.print_sessions(console, ReadSide(home_dir(home), kafka, topic, partitions), limit))
    else:
        run(_sessions(home, limit))


async def _sessions(home: Path | None, limit: int) -> int:
    app_ = EmbeddedApp(home_dir(home))
    await app_.projector.catch_up()
    rows = app_.store.sessions(limit)
    await app_.close()
    if not rows:
        console.print(
            f"no sessions yet; run [bold]{invocation(home).command('demo')}[/] first", highlight=False
        )
        return 0
    console.print(sessions_table(rows, console.width))
    return 0


@commands.command()
def show(session_id: str, home: HomeOption = None) -> None:
    """Print a session's timeline: messages, state path, tool calls, corrections and guards, and
    why it is in ERROR if it is."""
    run(_show(home, session_id))


async def _show(home: Path | None, session_id: str) -> int:
    app_ = EmbeddedApp(home_dir(home))
    try:
        await app_.projector.catch_up()
        store = app_.store
        row = store.session(session_id)
        if row is None:
            listing = invocation(home).command("sessions")
            console.print(
                f"[red]no session {session_id}[/]; list them with [bold]{listing}[/]", highlight=False
            )
            return 1
        print_timeline(
            console,
            row,
            store.rows_of("messages", session_id),
            store.rows_of("state_changes", session_id),
            store.rows_of("tool_calls", session_id),
            event_notes(await app_.log.read_session(session_id)),
        )
        return 0
    finally:
        await app_.close()


@commands.command(name="rebuild")
def rebuild_cmd(
    home: HomeOption = None,
    kafka: KafkaOption = None,
    topic: TopicOption = "turnlog.events",
    partitions: PartitionsOption = 8,
    postgres: PostgresOption = None,
    schema: SchemaOption = "public",
) -> None:
    """Drop the projections and refold them from offset 0 of the log (embedded, or Kafka + PostgreSQL)."""
    run(_rebuild(ReadSide(home_dir(home), kafka, topic, partitions, postgres, schema)))


async def _rebuild(side: ReadSide) -> int:
    log, store = await side.open()
    try:
        with Progress(
            TextColumn("rebuilding projections"), BarColumn(), MofNCompleteColumn(), console=console
        ) as bar:
            task = bar.add_task("rebuild", total=None)
            applied = await rebuild(log, store, on_batch=lambda b: bar.advance(task, b.records))
            bar.update(task, total=bar.tasks[0].completed)
        sessions_count = len(store.sessions(10**9))
        console.print(f"rebuilt {sessions_count} sessions from {applied} events")
        return 0
    finally:
        store.close()
        await log.close()


@commands.command(name="snapshots")
def snapshots_cmd(session_id: str, home: HomeOption = None) -> None:
    """List a session's snapshots: state, last tool and tokens at each."""
    run(admin_cli.list_snapshots(console, home_dir(home), session_id, invocation(home)))


@commands.command()
def fork(
    session_id: str,
    version: Annotated[int, typer.Argument(help="Version of a snapshot (see `turnlog snapshots`).")],
    home: HomeOption = None,
    agent: Annotated[str | None, typer.Option(help="Agent for the fork (default: the origin's).")] = None,
    unfinished: Annotated[
        str | None,
        typer.Option(
            help="For a snapshot taken mid-turn: 'continue' the turn in the fork now, or 'rest' "
            "(close it and drop waiting messages)."
        ),
    ] = None,
) -> None:
    """Start a new session from a snapshot of another; the origin is never changed."""
    run(admin_cli.fork(console, home_dir(home), session_id, version, agent, invocation(home), unfinished))


@commands.command()
def replay(
    session_id: str,
    home: HomeOption = None,
    start: Annotated[int, typer.Option("--from", help="Show events after this version.")] = 0,
    end: Annotated[int | None, typer.Option("--to", help="Stop after this version.")] = None,
) -> None:
    """Replay a session read-only, event by event, with the state each one leads to."""
    run(admin_cli.replay(console, home_dir(home), session_id, start, end))
