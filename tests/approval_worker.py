"""A turn worker process for tests/test_tool_approvals.py: ``python tests/approval_worker.py LOG``.

It runs whatever turns are waiting on the log (one poll) and exits: a turn that reaches an
approval leaves its session PAUSED_FOR_USER, and this process is gone before anyone decides.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from turnlog.consumers import TurnWorker
from turnlog.engine import (
    Agent,
    AgentDirectory,
    FunctionModel,
    ModelRequest,
    SqliteEventLog,
    call,
    reply,
    tool,
)

PARTITIONS = 2


def answer(request: ModelRequest) -> Any:
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    results = [m for m in request.messages[last_user + 1 :] if m.role == "tool"]
    if not results:
        return reply("Refunding now.", call("refund", {"order_id": "A-17", "amount": 40}, "call_refund"))
    return reply("refund result: " + results[-1].content)


def build_agent(refunds: list[dict[str, Any]]) -> Agent:
    @tool(requires_approval=True, sensitivity="high")
    def refund(order_id: str, amount: int) -> dict:
        """Refund an order."""
        refunds.append({"order_id": order_id, "amount": amount})
        return {"refunded": amount, "order_id": order_id}

    return Agent.build("agent", FunctionModel(answer), [refund])


async def main(path: str) -> None:
    log = SqliteEventLog(path, partitions=PARTITIONS)
    worker = TurnWorker(log, AgentDirectory([build_agent([])]), worker_id="worker-before-restart")
    await worker.poll_once()
    await log.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
