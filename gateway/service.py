"""The gateway process: the HTTP app plus what runs beside it.

One ``Gateway`` holds the engine API (producer side), the live hub, the projector and the
analytics consumer (unless ``turnlog projector`` and ``turnlog analytics`` run them elsewhere:
``run_projector=False``), the observability consumer, the lifecycle sweeper (when the agents set
a ``Lifecycle``) and, unless turns run in a separate worker
process, a TurnWorker whose stream feeds the hub, with its companions (the memory consumers). The
hub also hears what workers in other processes stream (``live_subscriber``: Kafka's live topic,
or the embedded log's channel between the processes sharing its file), and a worker in this
process publishes there for other gateways (``live_publisher``). ``app()`` is
the Starlette application; its lifespan starts and stops the background tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Awaitable, Callable, Coroutine, Protocol, Sequence

import structlog
from opentelemetry.trace import TracerProvider
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware

from turnlog.consumers import health
from turnlog.consumers.analytics import GROUP as ANALYTICS_GROUP
from turnlog.consumers.analytics import AnalyticsConsumer
from turnlog.consumers.health import Readiness
from turnlog.consumers.lifecycle import LifecycleSweeper, sweeper_for
from turnlog.consumers.log_metrics import log_metrics
from turnlog.consumers.projector import Projector
from turnlog.consumers.turn_worker import GROUP as WORKER_GROUP
from turnlog.consumers.turn_worker import TurnWorker
from turnlog.engine.agent import AgentDirectory
from turnlog.engine.erasure import Eraser
from turnlog.engine.errors import LogUnavailableError
from turnlog.engine.log.base import EventLog
from turnlog.engine.models.endpoints import Endpoints
from turnlog.engine.session import AgentSessions
from turnlog.engine.stream import LiveItem, StreamItem
from turnlog.projections import queries
from turnlog.projections.erasure import open_eraser
from turnlog.projections.store import ProjectionStore

from .auth import KeyStore
from .config import GatewayConfig
from .http import Guard, SecurityHeaders, internal_error, router_error
from .hub import LiveHub
from .limits import StreamCounter
from .observe import GROUP as OBSERVE_GROUP
from .observe import EventLogger, GatewayMetrics, ObservabilityConsumer, SpanBuilder
from .routes import Routes

log = structlog.get_logger("turnlog.gateway")


class LivePublisher(Protocol):
    """Where a worker in this process sends what it streams, for gateways in other processes
    (Kafka's live topic, engine.log.kafka_live; the embedded log's channel, engine.log.local_live)."""

    def publish(self, item: StreamItem) -> None: ...


class LiveSubscriber(Protocol):
    """What workers in other processes stream, as it comes."""

    def items(self) -> AsyncIterator[LiveItem]: ...


class Companion(Protocol):
    """A consumer that runs beside the turn worker (a memory consumer): ``run`` until ``stop``."""

    async def run(self) -> None: ...

    def stop(self) -> None: ...


class Gateway:
    """The HTTP gateway: the routes over a log, the projections and the agents, with the worker,
    projector and observers it runs beside them (``GatewayConfig``)."""

    def __init__(
        self,
        event_log: EventLog,
        store: ProjectionStore,
        agents: AgentDirectory,
        keys: KeyStore,
        config: GatewayConfig | None = None,
        *,
        tracer_provider: TracerProvider | None = None,
        companions: Sequence[Companion] = (),
        live_publisher: LivePublisher | None = None,
        live_subscriber: LiveSubscriber | None = None,
        endpoints: Endpoints | None = None,
    ) -> None:
        self.config = config or GatewayConfig()
        self.endpoints = endpoints or Endpoints()
        """This process's model endpoints (breakers, client-side limits): its API and its worker
        share them."""
        self.limits = self.config.limits
        self.log = event_log
        self.store = store
        self.api = AgentSessions(
            event_log, agents, producer="gateway", endpoints=self.endpoints,
            cache_bytes=self.config.cache_bytes,
        )  # fmt: skip
        self.hub = LiveHub()
        self.guard = Guard(keys, self.limits)
        self.streams = StreamCounter(self.limits.streams_per_user)
        self.projector = Projector(event_log, store)
        self.analytics = AnalyticsConsumer(event_log, store)
        self.metrics = GatewayMetrics()
        self.metrics.state_source = lambda: queries.state_counts(store)
        self.metrics.lag_source = self.consumer_lag
        self.metrics.text_source = lambda: log_metrics(event_log)
        self.hub.observe(self.metrics.on_live)
        spans = SpanBuilder(tracer_provider.get_tracer("turnlog.gateway")) if tracer_provider else None
        self.observer = ObservabilityConsumer(
            event_log, logger=EventLogger(self.config.log_sample_rate), metrics=self.metrics, spans=spans
        )
        self.live_publisher = live_publisher
        self.live_subscriber = live_subscriber
        self.worker = (
            TurnWorker(
                event_log, agents, worker_id="gateway-worker", on_item=self._on_item,
                endpoints=self.endpoints, max_concurrent_turns=self.config.max_turns,
                cache_bytes=self.config.cache_bytes,
            )
            if self.config.run_worker
            else None
        )  # fmt: skip
        self.companions = list(companions) if self.worker is not None else []
        self.eraser = open_eraser(self.api, store)
        """Erases content (the admin DELETE routes, retention); finishes at start what a crash
        left pending. None when the log encrypts nothing."""
        self.sweeper = self._sweeper(store, self.eraser)
        self.readiness = self._readiness()
        self._tasks: list[asyncio.Task[None]] = []
        self._worker_task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    def _sweeper(self, store: ProjectionStore, eraser: Eraser | None) -> LifecycleSweeper | None:
        """The lifecycle sweeper, if the agents set a ``Lifecycle`` and this process may append:
        on Kafka only with a worker (it sweeps the partitions it owns)."""
        if not self.log.owned_partitions() and not self.config.run_worker:
            return None
        every = self.config.lifecycle_every_s
        return sweeper_for(self.api, store, eraser=eraser, name="gateway", interval_s=every)

    def _readiness(self) -> Readiness:
        """Ready: the log answers (an owner holds its partitions), the schemas load, and the
        projections the routes read are within their lag bound."""
        bound = self.config.max_projection_lag_s
        if self.config.run_projector:
            projections = health.projections_check(self.log, lags=self.projector.lag, max_lag_s=bound)
        else:
            projections = health.projections_check(self.log, self.store.offsets_async, max_lag_s=bound)
        return health.log_readiness(self.log, projections=projections)

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

    def _on_item(self, item: StreamItem) -> None:
        """What this process's worker streams: to the hub, and to other gateways on Kafka."""
        self.hub.publish(item)
        if self.live_publisher is not None:
            self.live_publisher.publish(item)

    async def start(self) -> None:
        self._stop.clear()
        followed = [self.observer.poll_once]
        if self.config.run_projector:
            followed += [self.projector.catch_up, self.analytics.catch_up]
        runners = [self._follow(c) for c in followed]
        runners += [companion.run() for companion in self.companions]
        if self.sweeper is not None:
            runners.append(self.sweeper.run())
        if self.live_subscriber is not None:
            runners.append(self._hear(self.live_subscriber))
        if self.eraser is not None:
            runners.append(self._resume_erasures(self.eraser))
        self._tasks = [asyncio.create_task(r) for r in runners]
        if self.worker is not None:
            self._worker_task = asyncio.create_task(self.worker.run())
        log.info("gateway.start", worker=self.worker is not None, projector=self.config.run_projector)

    async def _hear(self, subscriber: LiveSubscriber) -> None:
        """Feed the hub with what workers in other processes stream (deltas, commit notices).
        A failure here loses live items only (streams read events from the log): log, go on."""
        while not self._stop.is_set():
            try:
                async for item in subscriber.items():
                    self.hub.publish(item)
            except Exception:
                log.exception("gateway.live_feed_failed")
                await asyncio.sleep(1.0)

    async def _resume_erasures(self, eraser: Eraser) -> None:
        """Finish the erasures a process that died left pending (engine.erasure)."""
        try:
            for report in await eraser.resume():
                log.info("gateway.erasure_resumed", erasure=report.erasure_id, sessions=report.sessions)
        except Exception:
            log.exception("gateway.erasure_resume_failed")

    async def catch_up_projections(self) -> None:
        """Make the projections as fresh as this process can: fold the log into them, or (when
        ``turnlog projector`` folds them) nothing; see ``projection``."""
        if self.config.run_projector:
            await self.projector.catch_up()

    async def catch_up_analytics(self) -> None:
        if self.config.run_projector:
            await self.analytics.catch_up()

    async def projection(self, session_id: str, version: int) -> dict[str, object] | None:
        """The session's projection row, at ``version`` or later if the projector gets there in
        time (the freshest row otherwise). Raises LogUnavailableError when the projections do not
        have the session at all after waiting: they are behind the log."""
        row = self.store.session(session_id)
        if row is not None and int(row["state_version"]) >= version:
            return row
        if self.config.run_projector:
            await self.projector.catch_up()
            return self.store.session(session_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.projection_wait_s
        while loop.time() < deadline and (row is None or int(row["state_version"]) < version):
            await asyncio.sleep(0.05)  # another process's projector: no wake-up reaches us
            row = self.store.session(session_id)
        if row is None:
            raise LogUnavailableError(
                f"session {session_id} is on the log but not yet in the projections after "
                f"{self.config.projection_wait_s:g} s; check that `turnlog projector` runs"
            )
        return row

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

    def background(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``work`` in this process until it ends or the gateway stops (an experiment)."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.append(task)
        task.add_done_callback(self._forget)
        return task

    def _forget(self, task: asyncio.Task[None]) -> None:
        if task in self._tasks:
            self._tasks.remove(task)

    async def stop(self) -> None:
        self._stop.set()
        if self.worker is not None and self._worker_task is not None:
            self.worker.stop()  # the turns in flight end at a step boundary (bounded by its drain timeout)
            await asyncio.gather(self._worker_task, return_exceptions=True)
            self._worker_task = None
        for companion in self.companions:
            companion.stop()
        if self.sweeper is not None:
            self.sweeper.stop()
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
