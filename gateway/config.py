"""What a gateway process is told to do: its limits, whether turns and projections run in it,
and the pacing of its streams and read-side consumers."""

from __future__ import annotations

from dataclasses import dataclass, field

from turnlog.consumers.health import MAX_PROJECTION_LAG_S
from turnlog.consumers.turn_worker import MAX_CONCURRENT_TURNS
from turnlog.engine.session_cache import DEFAULT_CACHE_BYTES

from .limits import Limits


@dataclass(frozen=True)
class GatewayConfig:
    """How a gateway runs: its limits, and which consumers run in its process."""

    limits: Limits = field(default_factory=Limits)
    run_worker: bool = True
    """Run turns in this process (the TurnWorker); False when workers run elsewhere."""
    max_turns: int = MAX_CONCURRENT_TURNS
    """Turns of different sessions the worker in this process runs at once."""
    cache_bytes: int = DEFAULT_CACHE_BYTES
    """What this process's turn runners keep of idle sessions between turns (its API's and its
    worker's each: engine.session_cache)."""
    poll_s: float = 1.0
    """How often an event stream re-reads the log for writers in other processes."""
    ping_s: float = 15.0
    """Keep-alive comment interval on event streams."""
    log_sample_rate: float = 0.0
    """Share of turns whose full context is logged, redacted (0..1; opt-in)."""
    linger_s: float = 0.05
    """How long the read-side consumers let appends gather before a pass."""
    idle_wait_s: float = 1.0
    """Longest wait between read-side passes (writers in other processes do not wake them)."""
    run_projector: bool = True
    """Fold the projections and the analytics tables in this process. False when `turnlog
    projector` and `turnlog analytics` do (two projectors of one store would collide): reads then
    wait up to ``projection_wait_s`` for the projections to reach what the log shows."""
    projection_wait_s: float = 10.0
    max_projection_lag_s: float = MAX_PROJECTION_LAG_S
    """``/readyz`` answers 503 while the projections are further behind the log than this."""
    lifecycle_every_s: float | None = None
    """How often the lifecycle sweeper runs here, when the agents set a ``Lifecycle`` (it runs
    where the process may append: on the embedded log, or with a worker on Kafka); None: from
    the limits (consumers.lifecycle.SWEEP_EVERY_S)."""
