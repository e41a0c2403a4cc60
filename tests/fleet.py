"""The agent and the worker processes of the fault test (tests/test_fault.py) and the worker
concurrency tests (tests/test_worker_concurrency.py).

Every turn takes three model steps and two tool steps: ``lookup`` (idempotent, read-only) and
then ``notify`` (NOT idempotent: it inserts a row into ``side_effects``, in PostgreSQL next to a
Kafka log or in a SQLite file next to an embedded one, which the tests count to prove that no
notification was sent twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import sqlite3
from typing import AsyncIterator, Awaitable, Callable

import psycopg

from consumers import TurnWorker
from engine import (
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
from engine.errors import LogUnavailableError
from engine.models.base import ModelChunk

AGENT = "fleet"
SIDE_EFFECTS_DDL = (
    "CREATE TABLE IF NOT EXISTS side_effects "
    "(session_id TEXT, call_id TEXT, worker TEXT, tool TEXT, idempotency_key TEXT)"
)
"""Every tool run: notify's rows are its side effects, lookup's show which key each attempt got."""


def decide(request: ModelRequest) -> ModelResponse | str:
    """lookup -> notify -> answer, per user message (the message text names the call ids)."""
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    ref = request.messages[last_user].content
    results = [m for m in request.messages[last_user + 1 :] if m.role == "tool"]
    if not results:
        return reply("", call("lookup", {"session": request.session_id, "ref": ref}, f"lookup-{ref}"))
    if len(results) == 1:
        return reply("", call("notify", {"session": request.session_id, "ref": ref}, f"notify-{ref}"))
    return f"done: {ref}"


Record = Callable[[str, str, str, str], Awaitable[None]]
"""Stores one tool run: (session, call id, tool name, idempotency key)."""


@contextlib.asynccontextmanager
async def recorder(target: str, schema: str, worker_id: str) -> AsyncIterator[Record]:
    """Where a worker's tool runs go: PostgreSQL (``target`` a DSN, in ``schema``) or a SQLite
    file (``target`` its path; ``schema`` unused). The table is created if missing."""
    insert = "INSERT INTO side_effects (session_id, call_id, worker, tool, idempotency_key) VALUES "
    if target.startswith("postgresql://"):
        async with await psycopg.AsyncConnection.connect(
            target, autocommit=True, options=f"-c search_path={schema}"
        ) as conn:
            await conn.execute(SIDE_EFFECTS_DDL)

            async def into_postgres(session: str, call_id: str, name: str, key: str) -> None:
                await conn.execute(insert + "(%s, %s, %s, %s, %s)", (session, call_id, worker_id, name, key))

            yield into_postgres
        return
    db = sqlite3.connect(target, isolation_level=None, timeout=30)
    try:
        db.execute(SIDE_EFFECTS_DDL)

        async def into_sqlite(session: str, call_id: str, name: str, key: str) -> None:
            db.execute(insert + "(?, ?, ?, ?, ?)", (session, call_id, worker_id, name, key))

        yield into_sqlite
    finally:
        db.close()


def side_effects(target: str, schema: str) -> list[tuple[str, str, str, str]]:
    """Every tool run recorded so far: (session, call id, tool name, idempotency key)."""
    query = "SELECT session_id, call_id, tool, idempotency_key FROM side_effects"
    if target.startswith("postgresql://"):
        with psycopg.connect(target, options=f"-c search_path={schema}") as conn:
            return [tuple(row) for row in conn.execute(query).fetchall()]  # type: ignore[misc]
    with sqlite3.connect(target) as db:
        db.execute(SIDE_EFFECTS_DDL)
        return db.execute(query).fetchall()


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


def fleet_agent(record: Record, *, jitter_s: float = 0.15, model_latency_s: float = 0.0) -> Agent:
    rng = random.Random()

    @tool(idempotent=True)
    async def lookup(session: str, ref: str, idempotency_key: str) -> dict:
        """Look a reference up (read-only)."""
        await record(session, f"lookup-{ref}", "lookup", idempotency_key)
        await asyncio.sleep(rng.uniform(0, jitter_s))  # a kill here: retried, with the same key
        return {"ref": ref, "status": "delayed"}

    @tool(idempotent=False)
    async def notify(session: str, ref: str, idempotency_key: str) -> str:
        """Send the customer a notice (a side effect: never twice)."""
        await asyncio.sleep(rng.uniform(0, jitter_s))
        await record(session, f"notify-{ref}", "notify", idempotency_key)
        await asyncio.sleep(rng.uniform(0, jitter_s))  # a kill here: sent, but not on the log
        return "sent"

    model: Model = PacedModel(model_latency_s) if model_latency_s else FunctionModel(decide)
    return Agent(AGENT, model, [lookup, notify])


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
    async with recorder(dsn, schema, worker_id) as record:
        agent = fleet_agent(record, model_latency_s=float(latency))
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
    async with recorder(effects, "", worker_id) as record:
        agent = fleet_agent(record, model_latency_s=float(latency))
        await run_until_signalled(TurnWorker(log, AgentDirectory([agent]), worker_id=worker_id))
    await log.close()
