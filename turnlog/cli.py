"""The `turnlog` command: run the demo, list sessions, show a timeline, rebuild projections."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Coroutine

import structlog
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from turnlog.consumers.turn_worker import MAX_CONCURRENT_TURNS
from turnlog.engine.agent import AgentDirectory
from turnlog.engine.errors import ConfigurationError, TurnlogError
from turnlog.projections.rebuild import rebuild

from . import admin_cli, log_listing
from .agents import DEFAULT_AGENTS, AgentContext, AgentsTarget, agents_target, load_agents
from .app import EmbeddedApp, ReadSide
from .config import ModelSettings, home_dir
from .demo import (
    DemoModel,
    demo_model,
    failure_advice,
    invocation,
    run_turn,
    scripted_requested,
)
from .render import event_notes, print_timeline, sessions_table

app = typer.Typer(
    help="turnlog: an event-sourced session engine for LLM agents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()
HomeOption = Annotated[
    Path | None, typer.Option("--home", help="Data folder (env TURNLOG_HOME, default ./.turnlog).")
]


def _show_version(value: bool) -> None:
    if value:
        from .doctor import version_line

        print(version_line())
        raise typer.Exit()


def _run(coro: Coroutine[Any, Any, int]) -> None:
    try:
        code = asyncio.run(coro)
    except TurnlogError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


BaseUrlOption = Annotated[str | None, typer.Option(help="OpenAI-compatible endpoint (env TURNLOG_BASE_URL).")]
ApiKeyOption = Annotated[str | None, typer.Option(help="API key (env TURNLOG_API_KEY or OPENAI_API_KEY).")]
ModelOption = Annotated[str | None, typer.Option(help="Model name (env TURNLOG_MODEL).")]
ScriptedOption = Annotated[
    bool, typer.Option("--scripted", help="Use the deterministic scripted model, not the local one.")
]


@app.command()
def demo(
    home: HomeOption = None,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
    model: ModelOption = None,
    scripted: ScriptedOption = False,
    user: Annotated[str, typer.Option(help="User id the session belongs to.")] = "demo-user",
    agents: AgentsOption = None,
    agent: Annotated[str | None, typer.Option(help="Which of --agents to ask (default: the first).")] = None,
    message: Annotated[str | None, typer.Option(help="What to ask (default: the example task).")] = None,
) -> None:
    """Run the seed's example task as a live session and stream what happens.

    The model is, in order: the OpenAI-compatible endpoint given by --base-url / TURNLOG_BASE_URL;
    else the local model (Qwen2.5-Coder-1.5B on llama.cpp, the `local` extra) unless --scripted;
    else the scripted model. With --agents (or TURNLOG_AGENTS, or HOME/turnlog.toml), your agents
    run instead, with their own models: --agent picks one, --message says what to ask.
    """
    settings = ModelSettings.from_env(base_url, api_key, model)
    _run(_demo(home, settings, user, scripted_requested(scripted), DemoAsk(agents, agent, message)))


@dataclass(frozen=True)
class DemoAsk:
    """Whose agents the demo runs (--agents), which one (--agent) and what it asks (--message)."""

    agents: str | None
    agent: str | None
    message: str | None


async def _demo(home: Path | None, settings: ModelSettings, user: str, scripted: bool, ask: DemoAsk) -> int:
    root, hint = home_dir(home), invocation(home)
    target = agents_target(ask.agents, root)
    with contextlib.ExitStack() as stack:
        chosen, context = _demo_context(root, settings, scripted, target, stack)
        sid, outcome = await _run_demo(context, user, target, ask)
    console.print(
        f"\nNext:\n  [bold]{hint.command('show', sid)}[/]\n  {hint.command('snapshots', sid)}\n  "
        f"{hint.command('sessions')}",
        highlight=False,
        soft_wrap=True,
    )
    advice = failure_advice(outcome, chosen)
    if advice:
        console.print(f"[red]{advice}[/]", highlight=False)
        return 1
    return 0


def _demo_context(
    root: Path, settings: ModelSettings, scripted: bool, target: AgentsTarget, stack: contextlib.ExitStack
) -> tuple[DemoModel | None, AgentContext]:
    """The example agents get the demo's model (endpoint, local or scripted); your agents bring theirs."""
    chosen = demo_model(console, root, settings, scripted, stack) if target.target == DEFAULT_AGENTS else None
    return chosen, AgentContext(root, settings, "demo", chosen.model if chosen else None)


def _demo_agent(directory: AgentDirectory, wanted: str | None) -> str:
    ids = [a.agent_id for a in directory]
    if wanted is None:
        return ids[0]
    if wanted not in ids:
        raise ConfigurationError(f"no agent {wanted!r} among --agents; the agents are {', '.join(ids)}")
    return wanted


async def _run_demo(context: AgentContext, user: str, target: AgentsTarget, ask: DemoAsk) -> tuple[str, str]:
    """Run one turn of the chosen agent; return the session id and how the turn ended."""
    from turnlog.examples.logistics import TASK

    from .runtime import memory_consumers

    directory = load_agents(target, context)
    chosen = _demo_agent(directory, ask.agent)
    text = ask.message or TASK
    app_ = EmbeddedApp(context.home, list(directory))
    projector = asyncio.create_task(app_.projector.run())
    try:
        session = await app_.api.create_session(chosen, user)
        console.print(f"[dim]session[/] {session.session_id} · log {app_.log.path}", highlight=False)
        console.print(f"[bold]user[/]    {text}", highlight=False)
        outcome = await run_turn(console, app_.api.send_user_message(session.session_id, text))
        for memory in memory_consumers(app_.log, app_.agents, owned_only=False):
            await memory.catch_up()  # what the turn asked to remember is stored before we go
    finally:
        await _close(app_, projector)
    return session.session_id, outcome


async def _close(app_: EmbeddedApp, projector: asyncio.Task[None]) -> None:
    app_.projector.stop()
    await projector
    await app_.projector.catch_up()
    await app_.close()


@app.command(name="continue")
def continue_cmd(
    session_id: str,
    message: Annotated[
        str | None, typer.Argument(help="A new user message (none: finish a waiting turn).")
    ] = None,
    home: HomeOption = None,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
    model: ModelOption = None,
    scripted: ScriptedOption = False,
    agents: AgentsOption = None,
) -> None:
    """Continue a session (a fork, say): finish the turn it inherited, or answer a new message.

    The model is chosen as for `turnlog demo`; --agents names the agents as there.
    """
    settings = ModelSettings.from_env(base_url, api_key, model)
    _run(_continue(home, session_id, message, settings, scripted_requested(scripted), agents))


async def _continue(
    home: Path | None,
    session_id: str,
    message: str | None,
    settings: ModelSettings,
    scripted: bool,
    agents: str | None,
) -> int:
    root, hint = home_dir(home), invocation(home)
    target = agents_target(agents, root)
    with contextlib.ExitStack() as stack:
        chosen, context = _demo_context(root, settings, scripted, target, stack)
        directory = load_agents(target, context)
        app_ = EmbeddedApp(root, list(directory))
        projector = asyncio.create_task(app_.projector.run())
        try:
            state = await app_.api.get_state(session_id)
            if state.agent_id not in directory:
                console.print(
                    f"[red]session {session_id} runs agent {state.agent_id!r}[/], which --agents does not "
                    f"name (it has {', '.join(a.agent_id for a in directory)})",
                    highlight=False,
                )
                return 1
            if message is None and state.turn is None and not state.inbox:
                console.print(
                    f"session {session_id} has no turn waiting; give it a message: "
                    f"[bold]{hint.command('continue', session_id, repr('your message'))}[/]",
                    highlight=False,
                )
                return 1
            if message is not None:
                console.print(f"[bold]user[/]    {message}", highlight=False)
            items = (
                app_.api.send_user_message(session_id, message)
                if message is not None
                else app_.api.run_pending(session_id)
            )
            outcome = await run_turn(console, items)
        finally:
            await _close(app_, projector)
    console.print(f"\nNext:\n  [bold]{hint.command('show', session_id)}[/]", highlight=False, soft_wrap=True)
    advice = failure_advice(outcome, chosen)
    if advice:
        console.print(f"[red]{advice}[/]", highlight=False)
        return 1
    return 0


@app.command()
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
        _run(log_listing.print_sessions(console, ReadSide(home_dir(home), kafka, topic, partitions), limit))
    else:
        _run(_sessions(home, limit))


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


@app.command()
def show(session_id: str, home: HomeOption = None) -> None:
    """Print a session's timeline: messages, state path, tool calls, corrections and guards, and
    why it is in ERROR if it is."""
    _run(_show(home, session_id))


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
HealthPortOption = Annotated[
    int | None,
    typer.Option(min=1, max=65535, help="Serve /healthz and /readyz on this port (all interfaces)."),
]


@app.command()
def doctor(
    home: HomeOption = None,
    kafka: KafkaOption = None,
    topic: TopicOption = "turnlog.events",
    partitions: PartitionsOption = 8,
    postgres: PostgresOption = None,
    schema: SchemaOption = "public",
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
    model: ModelOption = None,
) -> None:
    """Check this installation: Python, extras, schemas, the log, the projections and the model
    endpoint, with what to do about each problem (exit 1 if there is one)."""
    from .doctor import examine, version_line

    side = ReadSide(home_dir(home), kafka, topic, partitions, postgres, schema)
    findings = asyncio.run(examine(side, ModelSettings.from_env(base_url, api_key, model)))
    console.print(version_line(), highlight=False)
    for found in findings:
        mark = "[red]problem[/]" if found.problem else "[green]ok[/]     "
        console.print(f"{mark} [bold]{found.part}[/]: {escape(found.text)}", highlight=False, soft_wrap=True)
    raise typer.Exit(1 if any(f.problem for f in findings) else 0)


@app.command(name="rebuild")
def rebuild_cmd(
    home: HomeOption = None,
    kafka: KafkaOption = None,
    topic: TopicOption = "turnlog.events",
    partitions: PartitionsOption = 8,
    postgres: PostgresOption = None,
    schema: SchemaOption = "public",
) -> None:
    """Drop the projections and refold them from offset 0 of the log (embedded, or Kafka + PostgreSQL)."""
    _run(_rebuild(ReadSide(home_dir(home), kafka, topic, partitions, postgres, schema)))


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


@app.command()
def projector(
    kafka: Annotated[str, typer.Option("--kafka", help="Kafka bootstrap address.")],
    postgres: Annotated[str, typer.Option("--postgres", help="PostgreSQL DSN of the projections.")],
    topic: TopicOption = "turnlog.events",
    partitions: PartitionsOption = 8,
    schema: SchemaOption = "public",
    health_port: HealthPortOption = None,
) -> None:
    """Fold the Kafka log into the PostgreSQL read models, continuously (until SIGTERM)."""
    from .distributed import HealthOptions, run_projector

    _run(run_projector(kafka, topic, partitions, postgres, schema, HealthOptions(health_port)))


@app.command(name="snapshots")
def snapshots_cmd(session_id: str, home: HomeOption = None) -> None:
    """List a session's snapshots: state, last tool and tokens at each."""
    _run(admin_cli.list_snapshots(console, home_dir(home), session_id, invocation(home)))


@app.command()
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
    _run(admin_cli.fork(console, home_dir(home), session_id, version, agent, invocation(home), unfinished))


@app.command()
def replay(
    session_id: str,
    home: HomeOption = None,
    start: Annotated[int, typer.Option("--from", help="Show events after this version.")] = 0,
    end: Annotated[int | None, typer.Option("--to", help="Stop after this version.")] = None,
) -> None:
    """Replay a session read-only, event by event, with the state each one leads to."""
    _run(admin_cli.replay(console, home_dir(home), session_id, start, end))


@app.command(name="serve")
def serve_cmd(
    home: HomeOption = None,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    keys: Annotated[
        Path | None, typer.Option(help="API key file (env TURNLOG_KEYS, default HOME/keys.toml).")
    ] = None,
    agents: AgentsOption = None,
    worker: Annotated[bool, typer.Option(help="Run turns in the gateway process.")] = True,
    projector: Annotated[
        bool, typer.Option(help="Fold projections and analytics here (off when `turnlog projector` runs).")
    ] = True,
    memory: MemoryOption = True,
    kafka: KafkaOption = None,
    topic: TopicOption = "turnlog.events",
    partitions: PartitionsOption = 8,
    postgres: PostgresOption = None,
    schema: SchemaOption = "public",
    sample_rate: Annotated[
        float,
        typer.Option(help="Share of turns that log their full context, redacted (opt-in; 0.01: 1 %)."),
    ] = 0.0,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible endpoint.")] = None,
    api_key: Annotated[str | None, typer.Option(help="API key of the model endpoint.")] = None,
    model: Annotated[str | None, typer.Option(help="Model name.")] = None,
    drain_delay: Annotated[
        float,
        typer.Option(min=0, help="Seconds between SIGTERM (when /readyz turns 503) and the server stopping."),
    ] = 0.0,
) -> None:
    """Serve the HTTP gateway (sessions, messages, event streams, metrics, /healthz and /readyz):
    on the embedded backend, or on Kafka + PostgreSQL (--kafka, --postgres; with --no-worker it
    owns no partition)."""
    from .serve import DEFAULT_KEYS_FILE, serve

    root = home_dir(home)
    keys_file = keys or Path(os.environ.get("TURNLOG_KEYS") or root / DEFAULT_KEYS_FILE)
    try:
        serve(
            ReadSide(root, kafka, topic, partitions, postgres, schema),
            ModelSettings.from_env(base_url, api_key, model),
            agents=agents, host=host, port=port, keys_file=keys_file, run_worker=worker,
            run_projector=projector, run_memory=memory, sample_rate=sample_rate, drain_delay_s=drain_delay,
        )  # fmt: skip
    except TurnlogError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None


@app.command(name="worker")
def worker_cmd(
    home: HomeOption = None,
    kafka: Annotated[
        str | None, typer.Option("--kafka", help="Kafka bootstrap address (default: the embedded log).")
    ] = None,
    topic: TopicOption = "turnlog.events",
    partitions: PartitionsOption = 8,
    worker_id: Annotated[str, typer.Option("--id", help="Producer name on the events it writes.")] = "worker",
    max_turns: Annotated[
        int, typer.Option("--max-turns", min=1, help="Turns of different sessions run at once.")
    ] = MAX_CONCURRENT_TURNS,
    agents: AgentsOption = None,
    memory: MemoryOption = True,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible endpoint.")] = None,
    api_key: Annotated[str | None, typer.Option(help="API key of the model endpoint.")] = None,
    model: Annotated[str | None, typer.Option(help="Model name.")] = None,
    health_port: HealthPortOption = None,
) -> None:
    """Run your agents' turns (until SIGTERM, which lets each turn in flight finish its step):
    for the Kafka partitions this process is assigned (--kafka), or for messages posted to the
    embedded log (by `turnlog serve --no-worker`). Sessions run concurrently, each in order."""
    from .distributed import HealthOptions, run_worker

    side = ReadSide(home_dir(home), kafka, topic, partitions)
    settings = ModelSettings.from_env(base_url, api_key, model)
    _run(
        run_worker(
            side,
            settings,
            agents=agents,
            worker_id=worker_id,
            max_turns=max_turns,
            memory=memory,
            health_options=HealthOptions(health_port),
        )  # fmt: skip
    )


@app.command()
def memory(
    home: HomeOption = None,
    kafka: Annotated[
        str | None, typer.Option("--kafka", help="Kafka bootstrap address (default: the embedded log).")
    ] = None,
    topic: TopicOption = "turnlog.events",
    partitions: PartitionsOption = 8,
    agents: AgentsOption = None,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible endpoint.")] = None,
    api_key: Annotated[str | None, typer.Option(help="API key of the model endpoint.")] = None,
    model: Annotated[str | None, typer.Option(help="Model name.")] = None,
) -> None:
    """Write your agents' long-term memories (notes, facts extracted from answered tasks) in a
    process of their own, until SIGTERM; run the workers with --no-memory. One per deployment."""
    from .distributed import run_memory

    side = ReadSide(home_dir(home), kafka, topic, partitions)
    _run(run_memory(side, ModelSettings.from_env(base_url, api_key, model), agents=agents))


@app.command()
def analytics(
    kafka: Annotated[str, typer.Option("--kafka", help="Kafka bootstrap address.")],
    postgres: Annotated[str, typer.Option("--postgres", help="PostgreSQL DSN of the analytics tables.")],
    topic: TopicOption = "turnlog.events",
    partitions: PartitionsOption = 8,
    schema: SchemaOption = "public",
) -> None:
    """Fold the Kafka log into the daily analytics tables in PostgreSQL, continuously (until SIGTERM)."""
    from .distributed import run_analytics

    _run(run_analytics(kafka, topic, partitions, postgres, schema))


@app.command(name="export")
def export_cmd(
    out: Annotated[Path, typer.Argument(help="The output directory (it must exist).")],
    home: HomeOption = None,
    kafka: KafkaOption = None,
    topic: TopicOption = "turnlog.events",
    partitions: PartitionsOption = 8,
    content: Annotated[
        bool, typer.Option("--content", help="Also export message text and tool results (personal data).")
    ] = False,
    follow: Annotated[
        bool, typer.Option("--follow", help="Keep exporting what is appended, until SIGTERM or Ctrl-C.")
    ] = False,
    batch: Annotated[int, typer.Option(min=1, help="Records of a partition per flush (per file).")] = 50_000,
    interval: Annotated[
        float, typer.Option(min=0, help="With --follow: flush a partition's records after this many seconds.")
    ] = 5.0,
) -> None:
    """Export the log (embedded, or Kafka with --kafka) as Parquet datasets for analytics tools:
    sessions, turns, messages, model_calls, tool_calls, state_changes, by day. Incremental and
    exactly once: a later run (or a killed one, run again) goes on from the position it committed
    in OUT. See docs/analytics.md for DuckDB queries over the files."""
    from . import export_cli as x

    side = ReadSide(home_dir(home), kafka, topic, partitions)
    _run(x.run(console, side, x.ExportOptions(out, content, follow, batch, interval)))


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
        console.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    console.print(f"key for {user} ({role}), shown only now; its hash is in {keys_file}:", highlight=False)
    print(key)


experiment_app = typer.Typer(
    help="Replay recorded sessions against a changed agent and report what changes.", no_args_is_help=True
)
app.add_typer(experiment_app, name="experiment")
CandidateOption = Annotated[
    str,
    typer.Option(
        "--candidate",
        help="The candidate agents, as --agents names agents: package.module:attribute "
        "(an AgentDirectory or a function returning one).",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the report as JSON.")]


@experiment_app.command(name="run")
def experiment_run(
    candidate: CandidateOption,
    home: HomeOption = None,
    agent: Annotated[
        str | None, typer.Option(help="The candidate agent (default: the one with each session's agent id).")
    ] = None,
    select_agent: Annotated[
        str | None, typer.Option("--select-agent", help="Only sessions of this agent.")
    ] = None,
    user: Annotated[str | None, typer.Option(help="Only sessions of this user.")] = None,
    since: Annotated[str | None, typer.Option(help="Only sessions created at or after (ISO, UTC).")] = None,
    until: Annotated[str | None, typer.Option(help="Only sessions created before (ISO, UTC).")] = None,
    session: Annotated[list[str] | None, typer.Option("--session", help="Exactly these sessions.")] = None,
    sample: Annotated[int | None, typer.Option(help="A random sample of N of the matching sessions.")] = None,
    seed: Annotated[int, typer.Option(help="The sample's random seed.")] = 0,
    from_turn: Annotated[
        int, typer.Option(help="Replay from the snapshot at the end of turn N (0: from the start).")
    ] = 0,
    from_version: Annotated[
        int | None, typer.Option(help="Replay from this snapshot version (one --session only).")
    ] = None,
    live: Annotated[
        list[str] | None,
        typer.Option("--live", help="An idempotent tool that may run live when the recording has no match."),
    ] = None,
    live_all: Annotated[bool, typer.Option("--live-all", help="Every idempotent tool may run live.")] = False,
    concurrency: Annotated[int, typer.Option(min=1, help="Sessions replayed at once.")] = 8,
    name: Annotated[str, typer.Option(help="A name to list the experiment by.")] = "",
    as_json: JsonOption = False,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
    model: ModelOption = None,
) -> None:
    """Replay the selected sessions' user messages against the candidate agent; tools answer from
    the recording. Prints what differs per turn and overall."""
    from . import experiment_cli as x

    selection = x.selection_of(select_agent, user, since, until, session or [], sample, seed)
    options = x.RunOptions(
        candidate,
        agent,
        from_turn,
        from_version,
        True if live_all else (live or []),
        concurrency,
        name,
        as_json,
    )
    settings = ModelSettings.from_env(base_url, api_key, model)
    _run(x.run(console, home_dir(home), selection, options, settings))


@experiment_app.command(name="resume")
def experiment_resume(
    experiment_id: str,
    home: HomeOption = None,
    candidate: Annotated[
        str | None, typer.Option("--candidate", help="The candidate agents (default: those it was run with).")
    ] = None,
    as_json: JsonOption = False,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
    model: ModelOption = None,
) -> None:
    """Carry on an experiment that was stopped: sessions already replayed are not replayed again."""
    from . import experiment_cli as x

    settings = ModelSettings.from_env(base_url, api_key, model)
    _run(x.resume(console, home_dir(home), experiment_id, candidate, settings, as_json))


@experiment_app.command(name="report")
def experiment_report(
    experiment_id: str,
    home: HomeOption = None,
    as_json: JsonOption = False,
    all_turns: Annotated[
        bool, typer.Option("--all-turns", help="Every turn, not only those that differ.")
    ] = False,
) -> None:
    """The experiment's report, made again from the log."""
    from . import experiment_cli as x

    _run(x.report(console, home_dir(home), experiment_id, as_json, all_turns))


@experiment_app.command(name="list")
def experiment_list(home: HomeOption = None, as_json: JsonOption = False) -> None:
    """The experiments on the log."""
    from . import experiment_cli as x

    _run(x.list_all(console, home_dir(home), as_json))


@app.callback()
def _configure(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show the engine's own logs.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_show_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO if verbose else logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


def main() -> None:
    app()
