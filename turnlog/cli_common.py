"""What every `turnlog` command module shares: the console, the options, running a command."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any, Coroutine, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from turnlog.engine.errors import TurnlogError

console = Console()
HomeOption = Annotated[
    Path | None, typer.Option("--home", help="Data folder (env TURNLOG_HOME, default ./.turnlog).")
]
BaseUrlOption = Annotated[str | None, typer.Option(help="OpenAI-compatible endpoint (env TURNLOG_BASE_URL).")]
ApiKeyOption = Annotated[str | None, typer.Option(help="API key (env TURNLOG_API_KEY or OPENAI_API_KEY).")]
ModelOption = Annotated[str | None, typer.Option(help="Model name (env TURNLOG_MODEL).")]
ScriptedOption = Annotated[
    bool, typer.Option("--scripted", help="Use the deterministic scripted model, not the local one.")
]
AgentsOption = Annotated[
    str | None,
    typer.Option(
        "--agents",
        help="Your agents: package.module:attribute naming an AgentDirectory or a function returning one "
        "(env TURNLOG_AGENTS, or agents = ... in HOME/turnlog.toml; default: the logistics example).",
    ),
]
MemoryOption = Annotated[
    bool, typer.Option(help="Run the memory consumers of agents with a MemoryPolicy beside the turns.")
]
KafkaOption = Annotated[
    str | None, typer.Option("--kafka", help="Kafka bootstrap address of the log (instead of --home).")
]
TopicOption = Annotated[str, typer.Option(help="The Kafka log's events topic.")]
PartitionsOption = Annotated[int, typer.Option(help="The log's partition count.")]
PostgresOption = Annotated[
    str | None, typer.Option("--postgres", help="PostgreSQL DSN of the projections instead of --home.")
]
SchemaOption = Annotated[str, typer.Option(help="The PostgreSQL schema of the projections.")]
IdleExpiryOption = Annotated[
    str | None,
    typer.Option(
        "--idle-expiry",
        help="Close sessions idle this long (30m, 12h, 7d; 'never') for agents with no Lifecycle of "
        "their own (env TURNLOG_IDLE_EXPIRY; default: never).",
    ),
]
RetainOption = Annotated[
    str | None,
    typer.Option(
        "--retain-closed-for",
        help="Erase a closed session's content this long after its close (30d; 'never') "
        "(env TURNLOG_RETAIN_CLOSED_FOR; default: never).",
    ),
]
AfterExpiryOption = Annotated[
    str | None,
    typer.Option(
        "--after-expiry",
        help="A message to an expired session: 'refuse' (409 session_expired) or 'new_session' "
        "(env TURNLOG_AFTER_EXPIRY; default: refuse).",
    ),
]
MaxTurnsOption = Annotated[
    int | None,
    typer.Option(
        "--max-turns",
        min=1,
        help="Turns of different sessions this process runs at once (env TURNLOG_MAX_TURNS, default 10000).",
    ),
]
CacheOption = Annotated[
    int | None,
    typer.Option(
        "--cache-mb",
        min=1,
        help="Memory (MB) the turn runner keeps of idle sessions between turns, least recently used "
        "evicted first (env TURNLOG_CACHE_MB, default 256).",
    ),
]
ConnectionsOption = Annotated[
    int | None,
    typer.Option(
        "--model-connections",
        min=1,
        help="HTTP connections each model client may hold: one per call in flight "
        "(env TURNLOG_MODEL_CONNECTIONS, default 10000).",
    ),
]
KeepaliveOption = Annotated[
    float | None,
    typer.Option(
        "--model-keepalive",
        min=0,
        help="Seconds an idle model connection is kept (env TURNLOG_MODEL_KEEPALIVE_S, default 5).",
    ),
]
HealthPortOption = Annotated[
    int | None,
    typer.Option(min=1, max=65535, help="Serve /healthz and /readyz on this port (all interfaces)."),
]


def run_service(coro: Coroutine[Any, Any, int]) -> None:
    """``run`` for a program that runs until stopped, its collector tuned for that first
    (turnlog.collector)."""
    from .collector import tune_collector

    try:
        tune_collector()
    except TurnlogError as exc:
        coro.close()
        fail(exc)
    run(coro)


def run(coro: Coroutine[Any, Any, int]) -> None:
    """Run a command's coroutine; a TurnlogError is its one-line message and exit status 2."""
    try:
        code = asyncio.run(coro)
    except TurnlogError as exc:
        fail(exc)
    raise typer.Exit(code)


def fail(exc: TurnlogError) -> NoReturn:
    """End the command with ``exc``'s one-line message and exit status 2."""
    console.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
    raise typer.Exit(2) from None
