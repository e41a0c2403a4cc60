"""The gateway process: the HTTP app plus what runs beside it.

One ``Gateway`` holds the engine API (producer side), the live hub, the projector, the
analytics and observability consumers and, unless turns run in a separate worker process, a
TurnWorker whose stream feeds the hub. ``app()`` is the Starlette application; its lifespan
starts and stops the background consumers.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable

import structlog
from opentelemetry.trace import TracerProvider
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware

from consumers.analytics import GROUP as ANALYTICS_GROUP
from consumers.analytics import AnalyticsConsumer
from consumers.projector import Projector
from consumers.turn_worker import GROUP as WORKER_GROUP
from consumers.turn_worker import TurnWorker
from engine.agent import AgentDirectory
from engine.log.base import EventLog
from engine.session import AgentSessions
from projections import queries
from projections.store import ProjectionStore

from .auth import KeyStore
from .http import Guard, SecurityHeaders, internal_error, router_error
from .hub import LiveHub
from .limits import Limits, StreamCounter
from .observe import GROUP as OBSERVE_GROUP
from .observe import EventLogger, GatewayMetrics, ObservabilityConsumer, SpanBuilder
from .routes import Routes

log = structlog.get_logger("turnlog.gateway")


@dataclass(frozen=True)
class GatewayConfig:
    limits: Limits = field(default_factory=Limits)
    run_worker: bool = True
    """Run turns in this process (the TurnWorker); False when workers run elsewhere."""
    poll_s: float = 1.0
    """How often an event stream re-reads the log for writers in other processes."""
    ping_s: float = 15.0
    """Keep-alive comment interval on event streams."""
    log_sample_rate: float = 0.01
    """Share of turns whose full context is logged (0..1)."""
    linger_s: float = 0.05
    """How long the read-side consumers let appends gather before a pass."""
    idle_wait_s: float = 1.0
    """Longest wait between read-side passes (writers in other processes do not wake them)."""


class Gateway:
    def __init__(
        self,
        event_log: EventLog,
        store: ProjectionStore,
        agents: AgentDirectory,
        keys: KeyStore,
        config: GatewayConfig | None = None,
        *,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.config = config or GatewayConfig()
        self.limits = self.config.limits
        self.log = event_log
        self.store = store
        self.api = AgentSessions(event_log, agents, producer="gateway")
        self.hub = LiveHub()
        self.guard = Guard(keys, self.limits)
        self.streams = StreamCounter(self.limits.streams_per_user)
        self.projector = Projector(event_log, store)
        self.analytics = AnalyticsConsumer(event_log, store)
        self.metrics = GatewayMetrics()
        self.metrics.state_source = lambda: queries.state_counts(store)
        self.metrics.lag_source = self.consumer_lag
        self.hub.observe(self.metrics.on_live)
        spans = SpanBuilder(tracer_provider.get_tracer("turnlog.gateway")) if tracer_provider else None
        self.observer = ObservabilityConsumer(
            event_log, logger=EventLogger(self.config.log_sample_rate), metrics=self.metrics, spans=spans
        )
        self.worker = (
            TurnWorker(event_log, agents, worker_id="gateway-worker", on_item=self.hub.publish)
            if self.config.run_worker
            else None
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._worker_task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def consumer_lag(self) -> dict[tuple[str, int], int]:
        lag: dict[tuple[str, int], int] = {}
        projector = await self.projector.lag()  # offsets kept in memory: no database read on the loop
        analytics = await self.analytics.lag()
        for p in range(self.log.partitions):
            end = await self.log.end_offset(p)
            lag[("projector", p)] = projector[p].records
            lag[(ANALYTICS_GROUP, p)] = analytics[p]
            for group in (WORKER_GROUP, OBSERVE_GROUP):
                lag[(group, p)] = max(0, end - await self.log.committed(group, p))
        return lag

    async def start(self) -> None:
        self._stop.clear()
        runners = [
            self._follow(c)
            for c in (self.projector.catch_up, self.analytics.catch_up, self.observer.poll_once)
        ]
        self._tasks = [asyncio.create_task(r) for r in runners]
        if self.worker is not None:
            self._worker_task = asyncio.create_task(self.worker.run())
        log.info("gateway.start", worker=self.worker is not None)

    async def _follow(self, catch_up: Callable[[], Awaitable[int]]) -> None:
        """Run a read-side consumer: catch up, then wait for appends and let them gather for
        ``linger_s``, so one pass (and one transaction) covers many appends. Reads that must be
        fresh (the session routes) catch the projector up themselves."""
        while not self._stop.is_set():
            try:
                await catch_up()
            except Exception:
                log.exception("gateway.consumer_failed", consumer=getattr(catch_up, "__qualname__", "?"))
            await self.log.wait_for_append(self.config.idle_wait_s)
            await asyncio.sleep(self.config.linger_s)

    async def stop(self) -> None:
        self._stop.set()
        if self.worker is not None and self._worker_task is not None:
            self.worker.stop()  # the turns in flight end at a step boundary (bounded by its drain timeout)
            await asyncio.gather(self._worker_task, return_exceptions=True)
            self._worker_task = None
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        log.info("gateway.stop")

    def app(self) -> Starlette:
        @contextlib.asynccontextmanager
        async def lifespan(_: Starlette) -> AsyncIterator[None]:
            await self.start()
            try:
                yield
            finally:
                await self.stop()

        app = Starlette(
            routes=Routes(self).table(),
            middleware=[Middleware(SecurityHeaders)],
            exception_handlers={HTTPException: router_error, Exception: internal_error},
            lifespan=lifespan,
        )
        app.router.redirect_slashes = False  # "/v1/sessions/" is a 404, not a redirect before auth
        return app
