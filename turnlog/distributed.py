"""Long-running processes of the distributed deployment: a turn worker (a member of the Kafka
owners' group running the demo agent) and the projector (Kafka -> PostgreSQL). `turnlog worker`
and `turnlog projector` run them; docker-compose.yml starts them."""

from __future__ import annotations

import asyncio
import datetime as dt
import signal
from pathlib import Path
from typing import Callable

import structlog

from consumers import Projector, TurnWorker
from engine import AgentDirectory, KafkaEventLog
from projections.postgres import PostgresProjectionStore

from .config import ModelSettings

log = structlog.get_logger("turnlog.distributed")


def stop_on_signals(stop: Callable[[], None]) -> None:
    """Call ``stop`` on SIGINT or SIGTERM (a container's stop, Ctrl-C)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)


async def run_worker(
    bootstrap: str,
    topic: str,
    partitions: int,
    worker_id: str,
    home: Path,
    settings: ModelSettings,
    max_turns: int,
) -> int:
    from examples.logistics import LogisticsBackend, build_agent, demo_model

    model = settings.build() if settings.configured else demo_model()
    backend = LogisticsBackend(today=dt.date.today(), reports_dir=home / "reports")
    agents = AgentDirectory([build_agent(model, backend)])
    event_log = KafkaEventLog(bootstrap, topic=topic, partitions=partitions, client_id=worker_id)
    await event_log.start()
    worker = TurnWorker(event_log, agents, worker_id=worker_id, max_concurrent_turns=max_turns)
    stop = asyncio.Event()
    stop_on_signals(stop.set)
    task = asyncio.create_task(worker.run())
    log.info("worker.ready", worker=worker_id, topic=topic)
    try:
        await stop.wait()
    finally:
        worker.stop()
        await task
        await event_log.close()
    return 0


async def run_projector(bootstrap: str, topic: str, partitions: int, dsn: str, schema: str) -> int:
    event_log = KafkaEventLog(bootstrap, topic=topic, partitions=partitions, owner=False)
    await event_log.start()
    store = PostgresProjectionStore(dsn, schema=schema)
    projector = Projector(event_log, store)
    stop = asyncio.Event()
    stop_on_signals(stop.set)
    task = asyncio.create_task(projector.run())
    try:
        await stop.wait()
    finally:
        projector.stop()
        await task
        store.close()
        await event_log.close()
    return 0
