"""`turnlog serve` and `turnlog add-key`: the HTTP gateway, on the embedded backend or on
Kafka + PostgreSQL.

The gateway's packages are the ``gateway`` extra (``pip install 'turnlog[gateway]'``); they are
imported only here, so the rest of the CLI works without them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from turnlog.consumers.turn_worker import MAX_CONCURRENT_TURNS
from turnlog.engine import extras
from turnlog.engine.agent import AgentDirectory
from turnlog.engine.errors import ConfigurationError
from turnlog.engine.log.kafka import KafkaEventLog
from turnlog.engine.log.sqlite import SqliteEventLog
from turnlog.engine.session_cache import DEFAULT_CACHE_BYTES

from .agents import AgentContext, deployed_agents
from .app import ReadSide
from .collector import tune_collector
from .config import ModelSettings
from .distributed import LiveLinks
from .lifecycle import LifecycleOptions
from .runtime import close_agents, memory_consumers

if TYPE_CHECKING:  # the gateway extra is imported only when serving
    from opentelemetry.sdk.trace import TracerProvider

    from turnlog.gateway import GatewayConfig, KeyStore

DEFAULT_KEYS_FILE = "keys.toml"


def _require_gateway() -> None:
    extras.require("gateway", "turnlog serve")


def add_key(keys_file: Path, user: str, role: str) -> str:
    """Make a new key for ``user``, append its hash to ``keys_file``, return the clear key once."""
    extras.require("gateway", "turnlog add-key (keys are for the gateway)")
    from turnlog.gateway.auth import ROLES, hash_key, new_key

    if role not in ROLES:
        raise ConfigurationError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    if not user or any(c in user for c in '"\\\n'):
        raise ConfigurationError("the user name must be non-empty, without quotes, backslashes or newlines")
    key = new_key()
    keys_file.parent.mkdir(parents=True, exist_ok=True)
    with keys_file.open("a") as out:
        out.write(f'\n[[keys]]\nuser = "{user}"\nrole = "{role}"\nsha256 = "{hash_key(key)}"\n')
    return key


def serve(
    side: ReadSide,
    settings: ModelSettings,
    *,
    agents: str | None,
    host: str,
    port: int,
    keys_file: Path,
    run_worker: bool,
    run_projector: bool,
    run_memory: bool,
    sample_rate: float,
    drain_delay_s: float = 0.0,
    lifecycle: LifecycleOptions | None = None,
    max_turns: int = MAX_CONCURRENT_TURNS,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
) -> None:
    """Run the gateway until interrupted: on the embedded log in ``side.home``, or on Kafka +
    PostgreSQL (``side.kafka``, ``side.postgres``). Unless ``run_worker`` is False the turn worker
    runs here too (on Kafka: a member of the owners' group), with the memory consumers its agents
    call for (``run_memory``), at most ``max_turns`` at once; unless ``run_projector`` is False,
    the projector and analytics. SIGTERM makes ``/readyz`` answer 503 at once and stops the
    server ``drain_delay_s`` later."""
    _require_gateway()
    from turnlog.gateway import GatewayConfig, KeyStore
    from turnlog.gateway.observe import configure_json_logs
    from turnlog.gateway.observe.otlp import otlp_tracer_provider

    if not 0 <= sample_rate <= 1:
        raise ConfigurationError(f"--sample-rate must be between 0 and 1, not {sample_rate}")
    if (side.kafka is None) != (side.postgres is None):
        raise ConfigurationError(
            "--kafka and --postgres go together: the log on Kafka, the projections in PostgreSQL"
        )
    if side.kafka is None and not run_projector:
        raise ConfigurationError(
            "--no-projector is for Kafka + PostgreSQL, where `turnlog projector` folds the projections; "
            "the embedded gateway folds its own"
        )
    keys = KeyStore.from_file(keys_file)
    directory = deployed_agents(agents, AgentContext(side.home, settings, "serve"))
    (lifecycle or LifecycleOptions()).apply(directory)
    config = GatewayConfig(
        run_worker=run_worker,
        run_projector=run_projector,
        log_sample_rate=sample_rate,
        max_turns=max_turns,
        cache_bytes=cache_bytes,
    )
    configure_json_logs()
    tune_collector()
    tracing = otlp_tracer_provider()
    try:
        asyncio.run(
            _serve(side, directory, keys, config, tracing,
                   host=host, port=port, memory=run_memory, drain_delay_s=drain_delay_s)
        )  # fmt: skip
    finally:
        if tracing is not None:
            tracing.shutdown()  # flushes the spans still batched


async def _serve(
    side: ReadSide,
    directory: AgentDirectory,
    keys: KeyStore,
    config: GatewayConfig,
    tracing: TracerProvider | None,
    *,
    host: str,
    port: int,
    memory: bool,
    drain_delay_s: float,
) -> None:
    """The gateway on this loop (aiokafka's clients are bound to the loop that starts them)."""
    from turnlog.gateway import Gateway, server_config
    from turnlog.gateway.server import DrainingServer

    log, store = await side.open(owner=config.run_worker)
    live = LiveLinks()
    try:
        if isinstance(log, KafkaEventLog):
            await live.start(log, publish=config.run_worker)
        elif isinstance(log, SqliteEventLog):  # a `turnlog worker` or another gateway on the file
            await live.share(log, "serve", publish=config.run_worker)
        companions = (
            memory_consumers(log, directory, owned_only=isinstance(log, KafkaEventLog))
            if memory and config.run_worker
            else []
        )
        gateway = Gateway(
            log,
            store,
            directory,
            keys,
            config,
            tracer_provider=tracing,
            companions=companions,
            live_publisher=live.publisher,
            live_subscriber=live.subscriber,
        )
        # header and body read timeouts, size limits and JSON refusals below the app: gateway/server.py
        server = DrainingServer(
            server_config(gateway.app(), gateway.limits, host=host, port=port, log_level="warning"),
            gateway.readiness,
            drain_delay_s,
        )
        await server.serve()
    finally:
        await live.close()
        store.close()
        await log.close()
        await close_agents(directory)
