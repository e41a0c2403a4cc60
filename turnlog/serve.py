"""`turnlog serve` and `turnlog keys add`: the HTTP gateway on the embedded backend.

The gateway's packages are the ``gateway`` extra (``pip install 'turnlog[gateway]'``); they are
imported only here, so the rest of the CLI works without them.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from engine.errors import ConfigurationError
from engine.models.base import Model

from .config import ModelSettings

DEFAULT_KEYS_FILE = "keys.toml"


def _require_gateway() -> None:
    try:
        import prometheus_client  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ConfigurationError(
            f"the gateway needs its extra packages ({exc.name} is missing); install them with "
            "pip install -e '.[gateway]'"
        ) from None


def add_key(keys_file: Path, user: str, role: str) -> str:
    """Make a new key for ``user``, append its hash to ``keys_file``, return the clear key once."""
    from gateway.auth import ROLES, hash_key, new_key

    if role not in ROLES:
        raise ConfigurationError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    if not user or any(c in user for c in '"\\\n'):
        raise ConfigurationError("the user name must be non-empty, without quotes, backslashes or newlines")
    key = new_key()
    keys_file.parent.mkdir(parents=True, exist_ok=True)
    with keys_file.open("a") as out:
        out.write(f'\n[[keys]]\nuser = "{user}"\nrole = "{role}"\nsha256 = "{hash_key(key)}"\n')
    return key


def _demo_app(home: Path, settings: ModelSettings) -> Any:
    from examples.logistics import SCRIPTED_TOOLS, TASK_TOOLS, LogisticsBackend, build_agent, demo_model

    from .app import EmbeddedApp

    model: Model = settings.build() if settings.configured else demo_model()
    tools = TASK_TOOLS if settings.configured else SCRIPTED_TOOLS  # the scripted model can refund
    backend = LogisticsBackend(today=dt.date.today(), reports_dir=home / "reports")
    return EmbeddedApp(home, [build_agent(model, backend, tools)])


async def run_worker(home: Path, settings: ModelSettings, worker_id: str, max_turns: int) -> int:
    """Run turns of messages on the embedded log (posted by a gateway with --no-worker) until
    SIGTERM or SIGINT; then the turns in flight end at a step boundary."""
    from consumers import TurnWorker

    from .distributed import stop_on_signals

    app_ = _demo_app(home, settings)
    worker = TurnWorker(app_.log, app_.agents, worker_id=worker_id, max_concurrent_turns=max_turns)
    stop_on_signals(worker.stop)
    try:
        await worker.run()
    finally:
        await app_.close()
    return 0


def serve(
    home: Path,
    settings: ModelSettings,
    *,
    host: str,
    port: int,
    keys_file: Path,
    run_worker: bool,
    sample_rate: float,
) -> None:
    """Run the gateway (and, unless ``run_worker`` is False, the turn worker) until interrupted."""
    _require_gateway()
    import uvicorn

    from gateway import Gateway, GatewayConfig, KeyStore, server_config
    from gateway.observe import configure_json_logs
    from gateway.observe.otlp import otlp_tracer_provider

    keys = KeyStore.from_file(keys_file)
    app_ = _demo_app(home, settings)
    if not 0 <= sample_rate <= 1:
        raise ConfigurationError(f"--sample-rate must be between 0 and 1, not {sample_rate}")
    configure_json_logs()
    tracing = otlp_tracer_provider()
    gateway = Gateway(
        app_.log,
        app_.store,
        app_.agents,
        keys,
        GatewayConfig(run_worker=run_worker, log_sample_rate=sample_rate),
        tracer_provider=tracing,
    )
    try:
        # header and body read timeouts, size limits and JSON refusals below the app: gateway/server.py
        uvicorn.Server(
            server_config(gateway.app(), gateway.limits, host=host, port=port, log_level="warning")
        ).run()
    finally:
        if tracing is not None:
            tracing.shutdown()  # flushes the spans still batched
