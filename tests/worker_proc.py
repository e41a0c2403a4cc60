"""A turn worker process for tests/test_worker.py: ``python tests/worker_proc.py LOG_PATH``.

Its agent's model asks for the `fetch_status` tool once, then answers; in this process the
tool never returns, so the test can kill the worker in the middle of the turn.
"""

from __future__ import annotations

import asyncio
import sys

from consumers import TurnWorker
from engine import Agent, AgentDirectory, FunctionModel, ModelRequest, SqliteEventLog, call, reply, tool

PARTITIONS = 2


def answer(request: ModelRequest):
    if not any(m.role == "tool" for m in request.messages):
        return reply("", call("fetch_status", {"order_id": "O-1"}, "call_fetch"))
    return reply("status fetched: " + request.messages[-1].content)


def build_agent(block: bool, calls: list[str]) -> Agent:
    @tool(idempotent=True, timeout_s=3600)
    async def fetch_status(order_id: str) -> dict:
        """Fetch an order's status."""
        calls.append(order_id)
        if block:
            await asyncio.Event().wait()
        return {"order_id": order_id, "status": "delayed"}

    return Agent.build("agent", FunctionModel(answer), [fetch_status])


async def main(path: str) -> None:
    log = SqliteEventLog(path, partitions=PARTITIONS)
    worker = TurnWorker(log, AgentDirectory([build_agent(True, [])]), worker_id="doomed-worker")
    await worker.poll_once()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
