"""The long-running programs and their tools: `serve`, `worker`, `memory`, `projector`,
`analytics`, `lifecycle`, `export`, `add-key`, `doctor`."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from turnlog.consumers.turn_worker import MAX_CONCURRENT_TURNS
from turnlog.engine.errors import TurnlogError
from turnlog.engine.session_cache import DEFAULT_CACHE_BYTES

from .app import ReadSide
from .cli_common import (
    AfterExpiryOption,
    AgentsOption,
    ApiKeyOption,
    BaseUrlOption,
    CacheOption,
    ConnectionsOption,
    HealthPortOption,
    HomeOption,
    IdleExpiryOption,
    KafkaOption,
    KeepaliveOption,
    MaxTurnsOption,
    MemoryOption,
    ModelOption,
    PartitionsOption,
    PostgresOption,
    RetainOption,
    SchemaOption,
    TopicOption,
    console,
    fail,
    run,
    run_service,
)
from .config import ModelSettings, cache_bytes_from_env, home_dir, max_turns_from_env

commands = typer.Typer()


@commands.command()
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


@commands.command()
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

    run_service(run_projector(kafka, topic, partitions, postgres, schema, HealthOptions(health_port)))


@commands.command(name="serve")
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
    idle_expiry: IdleExpiryOption = None,
    retain_closed_for: RetainOption = None,
    after_expiry: AfterExpiryOption = None,
    max_turns: MaxTurnsOption = None,
    model_connections: ConnectionsOption = None,
    model_keepalive: KeepaliveOption = None,
    cache_mb: CacheOption = None,
) -> None:
    """Serve the HTTP gateway (sessions, messages, event streams, metrics, /healthz and /readyz):
    on the embedded backend, or on Kafka + PostgreSQL (--kafka, --postgres; with --no-worker it
    owns no partition). With a session lifecycle (--idle-expiry ...), its sweeper runs here."""
    from .lifecycle import LifecycleOptions
    from .serve import DEFAULT_KEYS_FILE, serve

    root = home_dir(home)
    keys_file = keys or Path(os.environ.get("TURNLOG_KEYS") or root / DEFAULT_KEYS_FILE)
    try:
        pool, keepalive = model_connections, model_keepalive
        serve(
            ReadSide(root, kafka, topic, partitions, postgres, schema),
            ModelSettings.from_env(base_url, api_key, model, connections=pool, keepalive_s=keepalive),
            agents=agents, host=host, port=port, keys_file=keys_file, run_worker=worker,
            run_projector=projector, run_memory=memory, sample_rate=sample_rate, drain_delay_s=drain_delay,
            lifecycle=LifecycleOptions(idle_expiry, retain_closed_for, after_expiry),
            max_turns=max_turns_from_env(max_turns, MAX_CONCURRENT_TURNS),
            cache_bytes=cache_bytes_from_env(cache_mb, DEFAULT_CACHE_BYTES),
        )  # fmt: skip
    except TurnlogError as exc:
        fail(exc)


@commands.command(name="worker")
def worker_cmd(
    home: HomeOption = None,
    kafka: Annotated[
        str | None, typer.Option("--kafka", help="Kafka bootstrap address (default: the embedded log).")
    ] = None,
    topic: TopicOption = "turnlog.events",
    partitions: PartitionsOption = 8,
    worker_id: Annotated[str, typer.Option("--id", help="Producer name on the events it writes.")] = "worker",
    max_turns: MaxTurnsOption = None,
    agents: AgentsOption = None,
    memory: MemoryOption = True,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible endpoint.")] = None,
    api_key: Annotated[str | None, typer.Option(help="API key of the model endpoint.")] = None,
    model: Annotated[str | None, typer.Option(help="Model name.")] = None,
    health_port: HealthPortOption = None,
    postgres: PostgresOption = None,
    schema: SchemaOption = "public",
    idle_expiry: IdleExpiryOption = None,
    retain_closed_for: RetainOption = None,
    after_expiry: AfterExpiryOption = None,
    model_connections: ConnectionsOption = None,
    model_keepalive: KeepaliveOption = None,
    cache_mb: CacheOption = None,
) -> None:
    """Run your agents' turns (until SIGTERM, which lets each turn in flight finish its step):
    for the Kafka partitions this process is assigned (--kafka), or for messages posted to the
    embedded log (by `turnlog serve --no-worker`). Sessions run concurrently, each in order.
    With a session lifecycle it also expires and erases its sessions (reading the projections:
    HOME's, or --postgres on Kafka)."""
    from .distributed import HealthOptions, run_worker
    from .lifecycle import LifecycleOptions

    side = ReadSide(home_dir(home), kafka, topic, partitions, postgres, schema)
    try:
        settings = ModelSettings.from_env(
            base_url, api_key, model, connections=model_connections, keepalive_s=model_keepalive
        )
        turns = max_turns_from_env(max_turns, MAX_CONCURRENT_TURNS)
        cache_bytes = cache_bytes_from_env(cache_mb, DEFAULT_CACHE_BYTES)
    except TurnlogError as exc:
        fail(exc)
    run_service(
        run_worker(
            side,
            settings,
            agents=agents,
            worker_id=worker_id,
            max_turns=turns,
            memory=memory,
            cache_bytes=cache_bytes,
            health_options=HealthOptions(health_port),
            lifecycle=LifecycleOptions(idle_expiry, retain_closed_for, after_expiry),
        )  # fmt: skip
    )


@commands.command()
def lifecycle(
    home: HomeOption = None,
    kafka: KafkaOption = None,
    topic: TopicOption = "turnlog.events",
    partitions: PartitionsOption = 8,
    postgres: PostgresOption = None,
    schema: SchemaOption = "public",
    agents: AgentsOption = None,
    idle_expiry: IdleExpiryOption = None,
    retain_closed_for: RetainOption = None,
    after_expiry: AfterExpiryOption = None,
    interval: Annotated[
        float | None,
        typer.Option(
            min=0.1, help="Seconds between sweeps (default: a tenth of the shortest limit, 30 at most)."
        ),
    ] = None,
    health_port: HealthPortOption = None,
) -> None:
    """Expire idle sessions and erase closed ones after their retention, by your agents'
    Lifecycle or the default given here, until SIGTERM. Reads the projections (HOME's, or
    --postgres); owns no partition, so on Kafka its expiries go through the inbox. Workers and
    `turnlog serve` run the same sweeper over their own sessions: this is for a deployment that
    keeps it apart (one per deployment is enough; several are safe)."""
    from .distributed import HealthOptions, run_lifecycle
    from .lifecycle import LifecycleOptions

    side = ReadSide(home_dir(home), kafka, topic, partitions, postgres, schema)
    options = LifecycleOptions(idle_expiry, retain_closed_for, after_expiry)
    settings = ModelSettings.from_env()
    run_service(
        run_lifecycle(
            side,
            settings,
            options,
            agents=agents,
            interval_s=interval,
            health_options=HealthOptions(health_port),
        )
    )


@commands.command()
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
    run_service(run_memory(side, ModelSettings.from_env(base_url, api_key, model), agents=agents))


@commands.command()
def analytics(
    kafka: Annotated[str, typer.Option("--kafka", help="Kafka bootstrap address.")],
    postgres: Annotated[str, typer.Option("--postgres", help="PostgreSQL DSN of the analytics tables.")],
    topic: TopicOption = "turnlog.events",
    partitions: PartitionsOption = 8,
    schema: SchemaOption = "public",
) -> None:
    """Fold the Kafka log into the daily analytics tables in PostgreSQL, continuously (until SIGTERM)."""
    from .distributed import run_analytics

    run_service(run_analytics(kafka, topic, partitions, postgres, schema))


@commands.command(name="export")
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
    run(x.run(console, side, x.ExportOptions(out, content, follow, batch, interval)))


@commands.command(name="add-key")
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
        fail(exc)
    console.print(f"key for {user} ({role}), shown only now; its hash is in {keys_file}:", highlight=False)
    print(key)
