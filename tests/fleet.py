"""The agent and the worker process of the fault test (tests/test_fault.py) and the Kafka bench.

Every turn takes three model steps and two tool steps: ``lookup`` (idempotent, read-only) and
then ``notify`` (NOT idempotent: it inserts a row into ``side_effects`` in PostgreSQL, which the
test counts to prove that no notification was sent twice).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import psycopg

from consumers import TurnWorker
from engine import (
    Agent,
    AgentDirectory,
    FunctionModel,
    KafkaEventLog,
    ModelRequest,
    ModelResponse,
    call,
    reply,
    tool,
)
from engine.errors import LogUnavailableError

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


def fleet_agent(conn: Any, worker_id: str, *, jitter_s: float = 0.15) -> Agent:
    rng = random.Random()

    async def record(session: str, call_id: str, name: str, key: str) -> None:
        await conn.execute(
            "INSERT INTO side_effects (session_id, call_id, worker, tool, idempotency_key) "
            "VALUES (%s, %s, %s, %s, %s)",
            (session, call_id, worker_id, name, key),
        )

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

    return Agent(AGENT, FunctionModel(decide), [lookup, notify])


async def kafka_worker_main(
    bootstrap: str, topic: str, partitions: str, dsn: str, schema: str, worker_id: str
) -> None:
    log = KafkaEventLog(bootstrap, topic=topic, partitions=int(partitions), client_id=worker_id,
                        session_timeout_ms=6000)  # fmt: skip
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, options=f"-c search_path={schema}")
    for _ in range(120):  # a worker started while the broker restarts waits for it
        try:
            await log.start()
            break
        except LogUnavailableError:
            await log.close()
            await asyncio.sleep(1.0)
    worker = TurnWorker(log, AgentDirectory([fleet_agent(conn, worker_id)]), worker_id=worker_id)
    await worker.run()  # until killed
