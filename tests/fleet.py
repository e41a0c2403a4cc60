"""The agent and the worker processes of the fault test (tests/test_fault.py) and the worker
concurrency tests (tests/test_worker_concurrency.py).

Every turn takes three model steps and two tool steps: ``lookup`` (idempotent, read-only), then
``notify`` and ``alert`` in one batch. Neither is idempotent. ``notify`` takes its call's
idempotency key and delivers through a service that deduplicates by it (a row in
``deliveries``, whose primary key is the key): a kill mid-call runs it again with the same key,
and the tests count one delivery per call (exactly once). ``alert`` takes no key: a kill
mid-call leaves it "interrupted, outcome unknown" and it is never run again (at most once).
Every tool run is a row in ``side_effects`` (the tests check the keys and count the alerts).
The tables live in PostgreSQL next to a Kafka log, or in a SQLite file next to an embedded one.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import sqlite3
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable

import psycopg

from turnlog.consumers import TurnWorker
from turnlog.engine import (
    Agent,
    AgentDirectory,
    FunctionModel,
    KafkaEventLog,
    Model,
    ModelRequest,
    ModelResponse,
    SqliteEventLog,
    call,
    reply,
    tool,
)
from turnlog.engine.errors import LogUnavailableError
from turnlog.engine.models.base import ModelChunk

AGENT = "fleet"
SIDE_EFFECTS_DDL = (
    "CREATE TABLE IF NOT EXISTS side_effects "
    "(session_id TEXT, call_id TEXT, worker TEXT, tool TEXT, idempotency_key TEXT)"
)
"""Every tool run: alert's rows are its side effects, the others' show which key each run got."""
DELIVERIES_DDL = (
    "CREATE TABLE IF NOT EXISTS deliveries "
    "(idempotency_key TEXT PRIMARY KEY, session_id TEXT, call_id TEXT, worker TEXT)"
)
"""The notification service: it applies a request once per idempotency key."""


def decide(request: ModelRequest) -> ModelResponse | str:
    """lookup -> notify -> answer, per user message (the message text names the call ids)."""
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    ref = request.messages[last_user].content
    results = [m for m in request.messages[last_user + 1 :] if m.role == "tool"]
    if not results:
        return reply("", call("lookup", {"session": request.session_id, "ref": ref}, f"lookup-{ref}"))
    if len(results) == 1:
        args = {"session": request.session_id, "ref": ref}
        return reply("", call("notify", args, f"notify-{ref}"), call("alert", args, f"alert-{ref}"))
    return f"done: {ref}"


Execute = Callable[[str, tuple[str, ...]], Awaitable[None]]
"""Runs one statement written with ``?`` placeholders."""
Query = Callable[[str, tuple[str, ...]], Awaitable[list[tuple[str, ...]]]]
"""Runs one query written with ``?`` placeholders and returns its rows."""


@dataclass(frozen=True)
class Backend:
    """The systems behind the fleet's tools, as one worker writes to them."""

    execute: Execute
    worker_id: str
    query: Query

    async def delivered(self, key: str) -> bool:
        """Whether the notification service has applied ``key`` (what a tool's lookup asks)."""
        return bool(await self.query("SELECT 1 FROM deliveries WHERE idempotency_key = ?", (key,)))

    async def record(self, session: str, call_id: str, name: str, key: str) -> None:
        """One tool run: (session, call id, tool name, the idempotency key it got)."""
        await self.execute(
            "INSERT INTO side_effects (session_id, call_id, worker, tool, idempotency_key) "
            "VALUES (?, ?, ?, ?, ?)",
            (session, call_id, self.worker_id, name, key),
        )

    async def deliver(self, session: str, call_id: str, key: str) -> None:
        """A notification, applied once per idempotency key (a repeat is recognised and ignored)."""
        await self.execute(
            "INSERT INTO deliveries (idempotency_key, session_id, call_id, worker) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (idempotency_key) DO NOTHING",
            (key, session, call_id, self.worker_id),
        )


@contextlib.asynccontextmanager
async def recorder(target: str, schema: str, worker_id: str) -> AsyncIterator[Backend]:
    """The tools' backend: PostgreSQL (``target`` a DSN, in ``schema``) or a SQLite file
    (``target`` its path; ``schema`` unused). The tables are created if missing."""
    if target.startswith("postgresql://"):
        async with await psycopg.AsyncConnection.connect(
            target, autocommit=True, options=f"-c search_path={schema}"
        ) as conn:
            for ddl in (SIDE_EFFECTS_DDL, DELIVERIES_DDL):
                await conn.execute(ddl)

            async def on_postgres(statement: str, params: tuple[str, ...]) -> None:
                await conn.execute(statement.replace("?", "%s"), params)

            async def ask_postgres(statement: str, params: tuple[str, ...]) -> list[tuple[str, ...]]:
                cursor = await conn.execute(statement.replace("?", "%s"), params)
                return [tuple(row) for row in await cursor.fetchall()]

            yield Backend(on_postgres, worker_id, ask_postgres)
        return
    db = sqlite3.connect(target, isolation_level=None, timeout=30)
    try:
        for ddl in (SIDE_EFFECTS_DDL, DELIVERIES_DDL):
            db.execute(ddl)

        async def on_sqlite(statement: str, params: tuple[str, ...]) -> None:
            db.execute(statement, params)

        async def ask_sqlite(statement: str, params: tuple[str, ...]) -> list[tuple[str, ...]]:
            return [tuple(row) for row in db.execute(statement, params).fetchall()]

        yield Backend(on_sqlite, worker_id, ask_sqlite)
    finally:
        db.close()


def _rows(target: str, schema: str, query: str) -> list[tuple[str, ...]]:
    if target.startswith("postgresql://"):
        with psycopg.connect(target, options=f"-c search_path={schema}") as conn:
            for ddl in (SIDE_EFFECTS_DDL, DELIVERIES_DDL):
                conn.execute(ddl)
            return [tuple(row) for row in conn.execute(query).fetchall()]
    with sqlite3.connect(target) as db:
        for ddl in (SIDE_EFFECTS_DDL, DELIVERIES_DDL):
            db.execute(ddl)
        return [tuple(row) for row in db.execute(query).fetchall()]


def deliver_late(target: str, schema: str, session: str, call_id: str, key: str) -> None:
    """The notification service applies ``key`` on its own (a request it took before the worker
    that sent it died, processed late)."""
    statement = (
        "INSERT INTO deliveries (idempotency_key, session_id, call_id, worker) VALUES (?, ?, ?, 'late')"
    )
    if target.startswith("postgresql://"):
        with psycopg.connect(target, options=f"-c search_path={schema}", autocommit=True) as conn:
            conn.execute(statement.replace("?", "%s"), (key, session, call_id))
        return
    with sqlite3.connect(target) as db:
        db.execute(statement, (key, session, call_id))


def side_effects(target: str, schema: str) -> list[tuple[str, ...]]:
    """Every tool run recorded so far: (session, call id, tool name, idempotency key)."""
    return _rows(target, schema, "SELECT session_id, call_id, tool, idempotency_key FROM side_effects")


def runs_by(target: str, schema: str, worker: str) -> list[tuple[str, ...]]:
    """The tool runs one worker made: (session, call id, tool name, idempotency key)."""
    query = "SELECT session_id, call_id, tool, idempotency_key, worker FROM side_effects"
    return [row[:4] for row in _rows(target, schema, query) if row[4] == worker]


def deliveries(target: str, schema: str) -> list[tuple[str, ...]]:
    """Every notification the service applied: (session, call id, idempotency key)."""
    return _rows(target, schema, "SELECT session_id, call_id, idempotency_key FROM deliveries")


class PacedModel(FunctionModel):
    """``decide``, after a fixed latency per call (a model that takes its time)."""

    def __init__(self, latency_s: float) -> None:
        super().__init__(decide, name="paced")
        self.latency_s = latency_s
        self.rng = random.Random()

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        await asyncio.sleep(self.latency_s * self.rng.uniform(0.5, 1.5))
        async for chunk in super().stream(request):
            yield chunk


def fleet_agent(backend: Backend, *, jitter_s: float = 0.15, model_latency_s: float = 0.0) -> Agent:
    rng = random.Random()

    @tool(idempotent=True)
    async def lookup(session: str, ref: str, idempotency_key: str) -> dict:
        """Look a reference up (read-only)."""
        await backend.record(session, f"lookup-{ref}", "lookup", idempotency_key)
        await asyncio.sleep(rng.uniform(0, jitter_s))  # a kill here: retried, with the same key
        return {"ref": ref, "status": "delayed"}

    @tool(idempotent=False)
    async def notify(session: str, ref: str, idempotency_key: str) -> str:
        """Send the customer a notice through a service that deduplicates by key."""
        await asyncio.sleep(rng.uniform(0, jitter_s))
        await backend.record(session, f"notify-{ref}", "notify", idempotency_key)
        await backend.deliver(session, f"notify-{ref}", idempotency_key)
        await asyncio.sleep(rng.uniform(0, jitter_s))  # a kill here: run again, delivered once
        return "sent"

    @tool(idempotent=False)
    async def alert(session: str, ref: str) -> str:
        """Page the on-call (a side effect with no key: never twice)."""
        await asyncio.sleep(rng.uniform(0, jitter_s))
        await backend.record(session, f"alert-{ref}", "alert", "")
        await asyncio.sleep(rng.uniform(0, jitter_s))  # a kill here: paged, but not on the log
        return "paged"

    model: Model = PacedModel(model_latency_s) if model_latency_s else FunctionModel(decide)
    return Agent(AGENT, model, [lookup, notify, alert])


async def kafka_worker_main(
    bootstrap: str, topic: str, partitions: str, dsn: str, schema: str, worker_id: str, latency: str = "0"
) -> None:
    log = KafkaEventLog(bootstrap, topic=topic, partitions=int(partitions), client_id=worker_id,
                        session_timeout_ms=6000)  # fmt: skip
    for _ in range(120):  # a worker started while the broker restarts waits for it
        try:
            await log.start()
            break
        except LogUnavailableError:
            await log.close()
            await asyncio.sleep(1.0)
    async with recorder(dsn, schema, worker_id) as backend:
        agent = fleet_agent(backend, model_latency_s=float(latency))
        await run_until_signalled(TurnWorker(log, AgentDirectory([agent]), worker_id=worker_id))
    await log.close()


async def run_until_signalled(worker: TurnWorker) -> None:
    """Run the worker until SIGKILL, or until SIGTERM, on which it drains and returns."""
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, worker.stop)
    await worker.run()


async def sqlite_worker_main(
    log_path: str, partitions: str, effects: str, worker_id: str, latency: str
) -> None:
    log = SqliteEventLog(log_path, partitions=int(partitions))
    async with recorder(effects, "", worker_id) as backend:
        agent = fleet_agent(backend, model_latency_s=float(latency))
        await run_until_signalled(TurnWorker(log, AgentDirectory([agent]), worker_id=worker_id))
    await log.close()
