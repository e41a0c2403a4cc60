#!/usr/bin/env python
"""What a runner's SessionCache holds per session, measured (tracemalloc) against its estimate.

Runs ``--sessions`` tool-using sessions of ``--turns`` turns each (a lookup, then an answer of
about 200 characters) on the embedded log, then has a fresh runner load every session the way a
worker's next turn does (the fold, the token tally, the snapshot encoder's entry) and reports
the memory that took per session, traced, next to the cache's own estimate (``cache.bytes``).

    PYTHONPATH=. .venv/bin/python bench/session_cache_memory.py [--sessions 300] [--turns 3]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

from turnlog.engine import (
    Agent,
    AgentDirectory,
    AgentSessions,
    FunctionModel,
    ModelRequest,
    SqliteEventLog,
    TurnRunner,
    call,
    reply,
    tool,
)


@tool(idempotent=True)
async def lookup(order_id: str) -> dict:
    """Look an order up."""
    return {"order_id": order_id, "status": "delayed", "carrier": "DHL", "eta": "2026-12-09"}


def answer(request: ModelRequest) -> Any:
    tools_after = 0
    for message in reversed(request.messages):
        if message.role == "user":
            break
        tools_after += message.role == "tool"
    if tools_after == 0:
        return reply("Checking.", call("lookup", {"order_id": "A-17"}))
    return "Order A-17 is delayed; DHL expects to deliver it on 9 December. " * 3


async def measure(sessions: int, turns: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        log = SqliteEventLog(Path(tmp) / "log.db", partitions=4)
        agent = Agent.build("a", FunctionModel(answer), [lookup])
        api = AgentSessions(log, AgentDirectory([agent]))
        sids = [(await api.create_session("a", "u")).session_id for _ in range(sessions)]
        for t in range(turns):
            for sid in sids:
                async for _ in api.send_user_message(sid, f"Where is my order A-17? (turn {t})"):
                    pass
        runner = TurnRunner(log, api.agents.get)
        await cache_one(runner, agent, sids[0])  # the first loads what every later one shares (a tokenizer)
        first_bytes = runner.cache.bytes
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for sid in sids[1:]:
            await cache_one(runner, agent, sid)
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        messages = len((await runner.load(sids[0])).messages)
        await log.close()
    measured = len(sids) - 1
    return {
        "messages_per_session": messages,
        "traced_kb_per_session": round(traced / measured / 1024, 2),
        "estimated_kb_per_session": round((runner.cache.bytes - first_bytes) / measured / 1024, 2),
    }


async def cache_one(runner: TurnRunner, agent: Agent, session_id: str) -> None:
    """Load a session the way a worker's next turn does: the fold, the token tally, the
    snapshot encoder's entry."""
    state = await runner.load(session_id)
    runner.context.measure(state, agent)
    assert runner.snapshots is not None
    runner.snapshots.encode(state, state.version + 1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    print(asyncio.run(measure(args.sessions, args.turns)))


if __name__ == "__main__":
    main()
