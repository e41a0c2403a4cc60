"""The `turnlog` command: run the demo, list sessions, show a timeline, rebuild projections."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Coroutine

import structlog
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from engine import events as ev
from engine.errors import TurnlogError
from projections.rebuild import rebuild

from .app import EmbeddedApp
from .config import ModelSettings, home_dir
from .render import LiveRenderer, print_timeline, sessions_table

app = typer.Typer(
    help="turnlog: an event-sourced session engine for LLM agents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()
HomeOption = Annotated[
    Path | None, typer.Option("--home", help="Data folder (env TURNLOG_HOME, default ./.turnlog).")
]


def _run(coro: Coroutine[Any, Any, int]) -> None:
    try:
        code = asyncio.run(coro)
    except TurnlogError as exc:
        console.print(f"[red]error:[/] {exc}", highlight=False)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


@app.command()
def demo(
    home: HomeOption = None,
    base_url: Annotated[
        str | None, typer.Option(help="OpenAI-compatible endpoint (env TURNLOG_BASE_URL).")
    ] = None,
    api_key: Annotated[
        str | None, typer.Option(help="API key (env TURNLOG_API_KEY or OPENAI_API_KEY).")
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model name (env TURNLOG_MODEL).")] = None,
    user: Annotated[str, typer.Option(help="User id the session belongs to.")] = "demo-user",
) -> None:
    """Run the seed's example task as a live session and stream what happens."""
    _run(_demo(home_dir(home), ModelSettings.from_env(base_url, api_key, model), user))


async def _demo(home: Path, settings: ModelSettings, user: str) -> int:
    from examples.logistics import AGENT_ID, TASK, LogisticsBackend, build_agent, demo_model

    if settings.configured:
        model = settings.build()
        console.print(f"turnlog demo · model [bold]{model.name}[/] at {settings.base_url}", highlight=False)
    else:
        model = demo_model()
        console.print(
            "turnlog demo · model [bold]scripted-demo[/]: a deterministic offline script, not a real "
            "model. Set TURNLOG_BASE_URL and TURNLOG_MODEL (or --base-url/--model) to run it against "
            "an OpenAI-compatible endpoint.",
            highlight=False,
        )
    backend = LogisticsBackend(today=dt.date.today(), reports_dir=home / "reports")
    app_ = EmbeddedApp(home, [build_agent(model, backend)])
    projector = asyncio.create_task(app_.projector.run())
    try:
        session = await app_.api.create_session(AGENT_ID, user)
        console.print(f"[dim]session[/] {session.session_id} · log {app_.log.path}", highlight=False)
        console.print(f"[bold]user[/]    {TASK}", highlight=False)
        render = LiveRenderer(console)
        outcome = ""
        async for item in app_.api.send_user_message(session.session_id, TASK):
            render(item)
            if isinstance(item, ev.TurnFinished):
                outcome = item.reason
    finally:
        app_.projector.stop()
        await projector
        await app_.projector.catch_up()
        await app_.close()
    console.print(
        f"\nNext: [bold]turnlog show {session.session_id}[/] · turnlog sessions · turnlog rebuild",
        highlight=False,
    )
    if outcome == "model_error":
        console.print(
            "[red]The model call failed; see the error above. Check the endpoint, key and model name.[/]"
        )
        return 1
    return 0


@app.command()
def sessions(home: HomeOption = None, limit: int = 50) -> None:
    """List sessions from the projections."""
    _run(_sessions(home_dir(home), limit))


async def _sessions(home: Path, limit: int) -> int:
    app_ = EmbeddedApp(home)
    await app_.projector.catch_up()
    rows = app_.store.sessions(limit)
    await app_.close()
    if not rows:
        console.print("no sessions yet; run [bold]turnlog demo[/] first")
        return 0
    console.print(sessions_table(rows))
    return 0


@app.command()
def show(session_id: str, home: HomeOption = None) -> None:
    """Print a session's timeline: messages, state path, tool calls."""
    _run(_show(home_dir(home), session_id))


async def _show(home: Path, session_id: str) -> int:
    app_ = EmbeddedApp(home)
    try:
        await app_.projector.catch_up()
        store = app_.store
        row = store.session(session_id)
        if row is None:
            console.print(f"[red]no session {session_id}[/]; list them with [bold]turnlog sessions[/]")
            return 1
        print_timeline(
            console,
            row,
            store.rows_of("messages", session_id),
            store.rows_of("state_changes", session_id),
            store.rows_of("tool_calls", session_id),
        )
        return 0
    finally:
        await app_.close()


@app.command(name="rebuild")
def rebuild_cmd(home: HomeOption = None) -> None:
    """Drop the projections and refold them from offset 0 of the log."""
    _run(_rebuild(home_dir(home)))


async def _rebuild(home: Path) -> int:
    app_ = EmbeddedApp(home)
    try:
        with Progress(
            TextColumn("rebuilding projections"), BarColumn(), MofNCompleteColumn(), console=console
        ) as bar:
            task = bar.add_task("rebuild", total=None)
            applied = await rebuild(app_.log, app_.store, progress=lambda n: bar.advance(task, n))
            bar.update(task, total=bar.tasks[0].completed)
        sessions_count = len(app_.store.sessions(10**9))
        console.print(f"rebuilt {sessions_count} sessions from {applied} events")
        return 0
    finally:
        await app_.close()


@app.command(name="serve")
def serve_cmd(
    home: HomeOption = None,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    keys: Annotated[
        Path | None, typer.Option(help="API key file (env TURNLOG_KEYS, default HOME/keys.toml).")
    ] = None,
    worker: Annotated[bool, typer.Option(help="Run turns in the gateway process.")] = True,
    sample_rate: Annotated[float, typer.Option(help="Share of turns that log full context.")] = 0.01,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible endpoint.")] = None,
    api_key: Annotated[str | None, typer.Option(help="API key of the model endpoint.")] = None,
    model: Annotated[str | None, typer.Option(help="Model name.")] = None,
) -> None:
    """Serve the HTTP gateway (sessions, messages, event streams, metrics) on the embedded backend."""
    from .serve import DEFAULT_KEYS_FILE, serve

    root = home_dir(home)
    keys_file = keys or Path(os.environ.get("TURNLOG_KEYS") or root / DEFAULT_KEYS_FILE)
    try:
        serve(
            root, ModelSettings.from_env(base_url, api_key, model), host=host, port=port,
            keys_file=keys_file, run_worker=worker, sample_rate=sample_rate,
        )  # fmt: skip
    except TurnlogError as exc:
        console.print(f"[red]error:[/] {exc}", highlight=False)
        raise typer.Exit(2) from None


@app.command(name="worker")
def worker_cmd(
    home: HomeOption = None,
    worker_id: Annotated[str, typer.Option("--id", help="Producer name on the events it writes.")] = "worker",
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible endpoint.")] = None,
    api_key: Annotated[str | None, typer.Option(help="API key of the model endpoint.")] = None,
    model: Annotated[str | None, typer.Option(help="Model name.")] = None,
) -> None:
    """Run turns for messages posted to the embedded log (by `turnlog serve --no-worker`)."""
    from .serve import run_worker

    _run(run_worker(home_dir(home), ModelSettings.from_env(base_url, api_key, model), worker_id))


@app.command(name="add-key")
def add_key_cmd(
    user: str,
    role: Annotated[str, typer.Option(help="user or admin.")] = "user",
    home: HomeOption = None,
    keys: Annotated[Path | None, typer.Option(help="API key file (default HOME/keys.toml).")] = None,
) -> None:
    """Create an API key for USER; its SHA-256 goes to the key file, the key is printed once."""
    from .serve import DEFAULT_KEYS_FILE, add_key

    keys_file = keys or Path(os.environ.get("TURNLOG_KEYS") or home_dir(home) / DEFAULT_KEYS_FILE)
    try:
        key = add_key(keys_file, user, role)
    except TurnlogError as exc:
        console.print(f"[red]error:[/] {exc}", highlight=False)
        raise typer.Exit(2) from None
    console.print(f"key for {user} ({role}), shown only now; its hash is in {keys_file}:", highlight=False)
    print(key)


@app.callback()
def _configure(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show the engine's own logs.")] = False,
) -> None:
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO if verbose else logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


def main() -> None:
    app()
