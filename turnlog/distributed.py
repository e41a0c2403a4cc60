"""Long-running processes of a deployment: a turn worker (on the embedded log, or a member of
the Kafka owners' group) with its memory consumers, the memory consumers alone, the projector
and the analytics consumer (Kafka -> PostgreSQL). `turnlog worker`, `turnlog memory`, `turnlog
projector` and `turnlog analytics` run them; docker-compose.yml starts them."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from dataclasses import dataclass
from typing import Callable, Protocol

import structlog

from turnlog.consumers import Projector, TurnWorker, health
from turnlog.consumers.analytics import AnalyticsConsumer
from turnlog.consumers.health import Readiness, serve_health
from turnlog.consumers.lifecycle import configured
from turnlog.engine import AgentDirectory, AgentSessions, EventLog, KafkaEventLog, SqliteEventLog
from turnlog.engine.errors import ConfigurationError
from turnlog.engine.log.kafka_live import KafkaLivePublisher, KafkaLiveSubscriber
from turnlog.engine.log.local_live import LocalLive
from turnlog.engine.session_cache import DEFAULT_CACHE_BYTES
from turnlog.projections.store import ProjectionStore

from .agents import AgentContext, deployed_agents
from .app import ReadSide, kafka_log, postgres_store
from .config import ModelSettings
from .lifecycle import LifecycleOptions, deployment_sweeper
from .runtime import close_agents, memory_consumers

log = structlog.get_logger("turnlog.distributed")


def stop_on_signals(stop: Callable[[], None]) -> None:
    """Call ``stop`` on SIGINT or SIGTERM (a container's stop, Ctrl-C)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)


@dataclass(frozen=True)
class HealthOptions:
    """Where a process serves ``/healthz`` and ``/readyz`` (``port`` None: it does not)."""

    port: int | None = None
    host: str = "0.0.0.0"


async def until_stopped(readiness: Readiness, health_options: HealthOptions) -> None:
    """Serve health (if asked) and return on SIGTERM or SIGINT, readiness turned off first."""
    stop = asyncio.Event()

    def drain() -> None:
        readiness.drain()
        stop.set()

    stop_on_signals(drain)
    runner = None
    if health_options.port is not None:
        runner = await serve_health(readiness, health_options.host, health_options.port)
    try:
        await stop.wait()
    finally:
        if runner is not None:
            await runner.cleanup()


def process_name(role: str) -> str:
    """A name for this process on the live topic: role, host and pid."""
    return f"{role}@{socket.gethostname()}:{os.getpid()}"


class LiveLinks:
    """A process's links to what other processes' turn workers stream: Kafka's live topic
    (engine.log.kafka_live), or the channel between the processes sharing an embedded log file
    (engine.log.local_live): a publisher for what its turn worker streams, a subscriber for what
    theirs do."""

    def __init__(self) -> None:
        self.publisher: KafkaLivePublisher | LocalLive | None = None
        self.subscriber: KafkaLiveSubscriber | LocalLive | None = None

    async def start(self, log: KafkaEventLog, *, publish: bool, subscribe: bool = True) -> None:
        origin = process_name(log.client_id)
        if subscribe:
            self.subscriber = KafkaLiveSubscriber(
                log.bootstrap,
                log.topics,
                log.partitions,
                skip_origin=origin if publish else "",
                records=log.records,
                heard=log.heard,
            )
            await self.subscriber.start()
        if publish:
            self.publisher = KafkaLivePublisher(
                log.bootstrap,
                log.topics,
                log.partitions,
                origin=origin,
                records=log.records,
                own_record=log.own_record,
                written=log.written_value,
            )
            await self.publisher.start()
            log.on_sequenced(self.publisher.publish)

    async def share(self, log: SqliteEventLog, role: str, *, publish: bool, subscribe: bool = True) -> None:
        """The embedded log's channel (closed with the log): its appends announced to the other
        processes on the file and theirs heard, its worker's deltas sent if ``publish``."""
        channel = await log.share_live(role)
        self.publisher = channel if publish else None
        self.subscriber = channel if subscribe else None

    async def close(self) -> None:
        for link in (self.publisher, self.subscriber):
            if link is not None and not isinstance(link, LocalLive):  # the channel closes with its log
                await link.close()
        self.publisher = self.subscriber = None


async def run_worker(
    side: ReadSide,
    settings: ModelSettings,
    *,
    agents: str | None,
    worker_id: str,
    max_turns: int,
    memory: bool,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
    health_options: HealthOptions = HealthOptions(),
    lifecycle: LifecycleOptions | None = None,
) -> int:
    """Run turns until SIGTERM or SIGINT (then the turns in flight end at a step boundary): for
    messages posted to the embedded log in ``side.home`` (by `turnlog serve --no-worker`), or for
    the Kafka partitions this process is assigned. With ``memory``, the memory consumers the
    agents call for run beside it (on Kafka: on the partitions it owns); with a ``Lifecycle``,
    the lifecycle sweeper (on Kafka: over the partitions it owns, given ``side.postgres``)."""
    directory = deployed_agents(agents, AgentContext(side.home, settings, "worker"))
    (lifecycle or LifecycleOptions()).apply(directory)
    event_log = await side.open_log(owner=True, client_id=worker_id)
    live = LiveLinks()
    sweeping = Sweeping()
    try:
        if isinstance(event_log, KafkaEventLog):
            await live.start(event_log, publish=True, subscribe=False)
        elif isinstance(event_log, SqliteEventLog):  # gateways on the file: prompt wake-ups, deltas
            await live.share(event_log, "worker", publish=True, subscribe=False)
        publish = live.publisher.publish if live.publisher is not None else None
        worker = TurnWorker(
            event_log, directory, worker_id=worker_id, max_concurrent_turns=max_turns, on_item=publish,
            cache_bytes=cache_bytes,
        )  # fmt: skip
        companions: list[Companion] = []
        if memory:
            companions += memory_consumers(
                event_log, directory, owned_only=isinstance(event_log, KafkaEventLog)
            )
        companions += sweeping.start(side, event_log, directory, worker_id)
        tasks = [asyncio.create_task(c.run()) for c in companions]
        running = asyncio.create_task(worker.run())
        log.info("worker.ready", worker=worker_id, kafka=side.kafka, memory_consumers=len(companions))
        readiness = health.log_readiness(event_log)
        try:
            await until_stopped(readiness, health_options)
        finally:
            worker.stop()
            for companion in companions:
                companion.stop()
            await running
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await live.close()
        sweeping.close()
        await event_log.close()
        await close_agents(directory)
    return 0


class Companion(Protocol):
    """A consumer that runs beside the turn worker: ``run`` until ``stop``."""

    async def run(self) -> None: ...

    def stop(self) -> None: ...


class Sweeping:
    """A worker's lifecycle sweeper and the projections it reads (the embedded ones in the home
    folder, or ``--postgres``): the sessions of the partitions the worker owns."""

    def __init__(self) -> None:
        self.store: ProjectionStore | None = None

    def start(
        self, side: ReadSide, event_log: EventLog, directory: AgentDirectory, worker_id: str
    ) -> list[Companion]:
        if not configured(directory):
            return []
        if side.kafka is not None and side.postgres is None:
            log.warning(
                "worker.no_lifecycle",
                detail="the agents set a Lifecycle, but the sweeper reads the projections: pass "
                "--postgres (or run `turnlog lifecycle`) to expire and erase sessions",
            )
            return []
        self.store = side.store()
        api = AgentSessions(event_log, directory, producer=worker_id)
        sweeper = deployment_sweeper(api, self.store, name=worker_id)
        return [sweeper] if sweeper is not None else []

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


async def run_memory(side: ReadSide, settings: ModelSettings, *, agents: str | None) -> int:
    """The memory consumers of the agents with a MemoryPolicy, on every partition, in a process
    of their own (workers then run with --no-memory), until SIGTERM. On Kafka this process owns
    no partition and keeps its groups' offsets on Kafka directly (engine.log.kafka_offsets):
    run one such process per deployment."""
    directory = deployed_agents(agents, AgentContext(side.home, settings, "memory"))
    event_log = await side.open_log(owner=False, client_id="memory")
    try:
        consumers = memory_consumers(event_log, directory, owned_only=False)
        if not consumers:
            raise ConfigurationError(
                "none of the agents has a MemoryPolicy, so there is no memory to write; give one "
                "Agent.build(..., memory=MemoryPolicy(store)) or do not run `turnlog memory`"
            )
        if isinstance(event_log, KafkaEventLog):
            for consumer in consumers:
                event_log.persist_offsets(consumer.consumer.group)
        stop = asyncio.Event()
        stop_on_signals(stop.set)
        tasks = [asyncio.create_task(c.run()) for c in consumers]
        log.info("memory.ready", consumers=len(consumers), kafka=side.kafka)
        try:
            await stop.wait()
        finally:
            for consumer in consumers:
                consumer.stop()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await event_log.close()
        await close_agents(directory)
    return 0


async def run_projector(
    bootstrap: str,
    topic: str,
    partitions: int,
    dsn: str,
    schema: str,
    health_options: HealthOptions = HealthOptions(),
) -> int:
    """Fold the Kafka log into the PostgreSQL read models until SIGTERM; ready while the log
    answers and the projections are within their lag bound."""
    event_log = kafka_log(bootstrap, topic, partitions)
    await event_log.start()
    store = postgres_store(dsn, schema)
    projector = Projector(event_log, store)
    task = asyncio.create_task(projector.run())
    readiness = health.log_readiness(
        event_log, projections=health.projections_check(event_log, lags=projector.lag)
    )
    try:
        await until_stopped(readiness, health_options)
    finally:
        projector.stop()
        await task
        store.close()
        await event_log.close()
    return 0


async def run_analytics(bootstrap: str, topic: str, partitions: int, dsn: str, schema: str) -> int:
    """The analytics consumer (daily aggregates, exactly once: its offsets are in PostgreSQL with
    its counters) until SIGTERM, for a gateway that does not fold them (`serve --no-projector`)."""
    event_log = kafka_log(bootstrap, topic, partitions, content=False)  # counts metadata only: no keys
    await event_log.start()
    store = postgres_store(dsn, schema)
    analytics = AnalyticsConsumer(event_log, store)
    stop = asyncio.Event()
    stop_on_signals(stop.set)
    task = asyncio.create_task(analytics.run())
    try:
        await stop.wait()
    finally:
        analytics.stop()
        await task
        store.close()
        await event_log.close()
    return 0


async def run_lifecycle(
    side: ReadSide,
    settings: ModelSettings,
    options: LifecycleOptions,
    *,
    agents: str | None,
    interval_s: float | None,
    health_options: HealthOptions = HealthOptions(),
) -> int:
    """`turnlog lifecycle`: sweep every ``interval_s`` until SIGTERM, over every session (this
    process owns no partition: on Kafka its expiries go through the inbox to the owners). It
    reads the projections another process folds (`turnlog serve`, `turnlog projector`)."""
    directory = options.apply(deployed_agents(agents, AgentContext(side.home, settings, "lifecycle")))
    event_log, store = await side.open(owner=False)
    try:
        api = AgentSessions(event_log, directory, producer="lifecycle")
        sweeper = deployment_sweeper(api, store, name="lifecycle", owned_only=False, interval_s=interval_s)
        if sweeper is None:
            raise ConfigurationError(
                "no agent sets a Lifecycle and there is no deployment default, so there is nothing to "
                "sweep; pass --idle-expiry / --retain-closed-for (or TURNLOG_IDLE_EXPIRY ...)"
            )
        task = asyncio.create_task(sweeper.run())
        readiness = health.log_readiness(event_log)
        try:
            await until_stopped(readiness, health_options)
        finally:
            sweeper.stop()
            await task
    finally:
        store.close()
        await event_log.close()
        await close_agents(directory)
    return 0
