"""A gateway on either backend, for the HTTP tests that must hold on both: uvicorn on a loopback
port in a thread with an event loop of its own (aiokafka's clients are bound to the loop that
starts them, as in `turnlog serve`), over the embedded log and SQLite projections, or Kafka and
PostgreSQL. The test reads the same log through a handle of its own, on its own loop, and may
run the turn worker there too (a gateway with ``run_worker=False``: on Kafka it then owns no
partition and every write goes through the inbox)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from tests.gateway_support import KEYS, POLLING_LIMITS, PRINCIPALS, _wait_until_accepting
from tests.services import delete_topics, fresh_topic, need_service
from turnlog.consumers import TurnWorker
from turnlog.engine import AgentDirectory
from turnlog.engine.admission import AdmissionRules
from turnlog.engine.log.base import EventLog
from turnlog.engine.log.kafka import KafkaEventLog
from turnlog.engine.log.sqlite import SqliteEventLog
from turnlog.gateway import Gateway, GatewayConfig, KeyStore, Principal, server_config
from turnlog.projections.postgres import PostgresProjectionStore
from turnlog.projections.store import ProjectionStore, SqliteProjectionStore

PARTITIONS = 2


@dataclass
class Stack:
    """Where one test's log and projections live: a folder, or a fresh Kafka topic and a fresh
    PostgreSQL schema (dropped by ``stack``)."""

    backend: str
    home: Path
    bootstrap: str = ""
    topic: str = ""
    dsn: str = ""
    schema: str = ""

    def log(self, *, owner: bool = True) -> EventLog:
        """A new handle on the log, not started (``opened`` starts it)."""
        if self.backend == "sqlite":
            return SqliteEventLog(self.home / "log.db", partitions=PARTITIONS)
        return KafkaEventLog(
            self.bootstrap, topic=self.topic, partitions=PARTITIONS, owner=owner, session_timeout_ms=6000
        )

    def store(self) -> ProjectionStore:
        if self.backend == "sqlite":
            return SqliteProjectionStore(self.home / "projections.db")
        return PostgresProjectionStore(self.dsn, schema=self.schema)

    @contextlib.asynccontextmanager
    async def opened(self, *, owner: bool = True) -> AsyncIterator[EventLog]:
        """A handle on the log in this loop (on Kafka with ``owner``: once it owns every
        partition, so the gateway's own handle must own none)."""
        log = self.log(owner=owner)
        if owner:  # the rules it admits requests by, as a worker process hands its log
            log.admit_with(AdmissionRules())
        try:
            if isinstance(log, KafkaEventLog):
                await log.start()
                if owner:
                    await log.wait_owned()
            yield log
        finally:
            await log.close()
            gc.collect()  # the closed clients' garbage here, not in another test (tests/services.py)


@contextlib.contextmanager
def stack(backend: str, home: Path) -> Iterator[Stack]:
    if backend == "sqlite":
        yield Stack("sqlite", home)
        return
    made = Stack(
        "kafka",
        home,
        bootstrap=need_service("TURNLOG_KAFKA_BOOTSTRAP"),
        topic=fresh_topic(),
        dsn=need_service("TURNLOG_POSTGRES_DSN"),
        schema=f"test_{uuid.uuid4().hex[:12]}",
    )
    try:
        yield made
    finally:
        asyncio.run(delete_topics(made.bootstrap, made.topic))
        store = PostgresProjectionStore(made.dsn, schema=made.schema)
        store.drop_schema()
        store.close()


@contextlib.contextmanager
def serve(where: Stack, agents: AgentDirectory, *, run_worker: bool = True) -> Iterator[str]:
    """The gateway over ``where`` on a loopback port, with its own TurnWorker unless
    ``run_worker`` is False; yields its URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    servers: list[uvicorn.Server] = []
    failed: list[BaseException] = []

    async def main() -> None:
        async with where.opened(owner=run_worker) as log:
            store = where.store()
            keys = KeyStore.from_plain({KEYS[u]: Principal(u, role) for u, role in PRINCIPALS.items()})
            config = GatewayConfig(limits=POLLING_LIMITS, poll_s=0.2, ping_s=5, run_worker=run_worker)
            gw = Gateway(log, store, agents, keys, config)
            server = uvicorn.Server(
                server_config(
                    gw.app(), gw.limits, log_level="warning", access_log=False, timeout_graceful_shutdown=3
                )
            )
            servers.append(server)
            try:
                await server.serve(sockets=[sock])
            finally:
                store.close()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # the test's wait for the port says so
            failed.append(exc)

    thread = threading.Thread(target=run, name=f"gateway-{where.backend}", daemon=True)
    thread.start()
    try:
        _wait_until_accepting(port, thread, timeout_s=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        for server in servers:
            server.should_exit = True
        thread.join(timeout=30)
        sock.close()
        if failed:
            raise failed[0]


@contextlib.asynccontextmanager
async def worker_on(log: EventLog, agents: AgentDirectory) -> AsyncIterator[TurnWorker]:
    """A TurnWorker on ``log`` in this loop (the turns of a gateway that runs none)."""
    worker = TurnWorker(log, agents, worker_id="test-worker")
    running = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await running
