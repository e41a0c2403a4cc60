"""The processes tests start and kill, in one helper:

python tests/procs.py crash LOG_PATH SESSION_ID {lookup|send|model}
    (tests/test_recovery.py) creates the session, posts a message and runs the turn; the
    model first asks for one tool, which (or, with ``model``, the model call itself) never
    returns here, so the test can SIGKILL the process at a known point. The test imports
    ``recovery_agent`` to run the same agent with a tool that does return.
python tests/procs.py sqlite-worker LOG_PATH
    (tests/test_worker.py) a turn worker whose `fetch_status` tool never returns.
python tests/procs.py kafka-worker BOOTSTRAP TOPIC PARTITIONS DSN SCHEMA WORKER_ID [LATENCY_S]
    (tests/test_fault.py, tests/test_worker_concurrency.py) a member of the Kafka owners' group
    running multi-step tool turns until killed; its non-idempotent tool counts side effects in
    PostgreSQL; its model takes LATENCY_S per call.
python tests/procs.py sqlite-fleet-worker LOG_PATH PARTITIONS EFFECTS_PATH WORKER_ID LATENCY_S
    (tests/test_worker_concurrency.py) the same agent and worker on the embedded log; side
    effects in the SQLite file EFFECTS_PATH.
python tests/procs.py tool-crash BACKEND LOG TOPIC PARTITIONS TARGET SCHEMA TOOL POINT MAX_STARTS
    (tests/test_tool_crashes.py) a turn worker that kills itself at one point of a tool call
    (tests/keyed_crash.py).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

from tests.fleet import kafka_worker_main
from tests.fleet import sqlite_worker_main as sqlite_fleet_worker_main
from tests.keyed_crash import tool_crash_main
from turnlog.consumers import TurnWorker
from turnlog.engine import (
    Agent,
    AgentDirectory,
    AgentSessions,
    FunctionModel,
    Model,
    ModelRequest,
    ModelResponse,
    SqliteEventLog,
    call,
    reply,
    tool,
)
from turnlog.engine.models.base import ModelChunk

# --- crash: tests/test_recovery.py -----------------------------------------------------------

AGENT = "recovery"
RECOVERY_PARTITIONS = 4
TOOL_NAMES = {"lookup": "slow_lookup", "send": "slow_send", "model": "slow_lookup"}
QUESTION = "Please handle order A-17."


def tool_name(kind: str) -> str:
    return TOOL_NAMES[kind]


def answer(request: ModelRequest) -> ModelResponse | str:
    """Asks for the tool once, then answers from its result."""
    last = request.messages[-1]
    if last.role == "tool":
        return f"Done: {last.content}"
    return reply("On it.", call(tool_name_from(request), {"order_id": "A-17"}, "call-1"))


def tool_name_from(request: ModelRequest) -> str:
    (spec,) = request.tools
    return str(spec["name"])


def recovery_agent(
    kind: str, model: Model, handler: Callable[[str, str], Any], *, timeout_s: float = 10.0
) -> Agent:
    """The agent both processes run; only the model and the tool's body differ. The lookup
    takes its call's idempotency key (engine.tools.ledger) and hands it to ``handler``; the send
    does not (its carrier cannot deduplicate), so it is at most once and ``handler`` gets ""."""

    async def keyed(order_id: str, idempotency_key: str) -> str:
        """Look an order up (read-only)."""
        return await handler(order_id, idempotency_key)

    async def keyless(order_id: str) -> str:
        """Send the order to the carrier."""
        return await handler(order_id, "")

    body = keyless if kind == "send" else keyed
    t = tool(body, name=tool_name(kind), idempotent=kind != "send", timeout_s=timeout_s)
    return Agent(AGENT, model, [t], first_token_timeout_s=600, model_timeout_s=600)


class HangingModel(Model):
    """Never sends its first chunk."""

    name = "hanging"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        await asyncio.Event().wait()
        yield ModelResponse("unreachable")


async def hang(order_id: str, idempotency_key: str) -> str:
    await asyncio.Event().wait()
    return "unreachable"


async def crash_main(log_path: str, session_id: str, kind: str) -> None:
    model: Model = HangingModel() if kind == "model" else FunctionModel(answer)
    agent = recovery_agent(kind, model, hang, timeout_s=3600)
    log = SqliteEventLog(log_path, partitions=RECOVERY_PARTITIONS)
    api = AgentSessions(log, AgentDirectory([agent]), producer="crash-worker")
    await api.create_session(AGENT, "user-1", session_id=session_id)
    async for _ in api.send_user_message(session_id, QUESTION):
        pass
    raise SystemExit("the turn was supposed to hang until the test kills this process")


# --- sqlite-worker: tests/test_worker.py -----------------------------------------------------

WORKER_PARTITIONS = 2


def worker_answer(request: ModelRequest):
    if not any(m.role == "tool" for m in request.messages):
        return reply("", call("fetch_status", {"order_id": "O-1"}, "call_fetch"))
    return reply("status fetched: " + request.messages[-1].content)


def worker_agent(block: bool, calls: list[str]) -> Agent:
    # it takes its call's key, so its start is committed before it runs (an idempotent tool
    # without a key would ride the next commit: docs/architecture.md) and the test can see it
    @tool(idempotent=True, timeout_s=3600)
    async def fetch_status(order_id: str, idempotency_key: str) -> dict:
        """Fetch an order's status."""
        calls.append(order_id)
        if block:
            await asyncio.Event().wait()
        return {"order_id": order_id, "status": "delayed"}

    return Agent.build("agent", FunctionModel(worker_answer), [fetch_status])


async def sqlite_worker_main(path: str) -> None:
    log = SqliteEventLog(path, partitions=WORKER_PARTITIONS)
    worker = TurnWorker(log, AgentDirectory([worker_agent(True, [])]), worker_id="doomed-worker")
    await worker.poll_once()


def main(argv: list[str]) -> None:
    command, args = argv[0], argv[1:]
    if command == "crash":
        asyncio.run(crash_main(*args[:3]))
    elif command == "sqlite-worker":
        asyncio.run(sqlite_worker_main(args[0]))
    elif command == "kafka-worker":
        asyncio.run(kafka_worker_main(*args))
    elif command == "sqlite-fleet-worker":
        asyncio.run(sqlite_fleet_worker_main(*args))
    elif command == "tool-crash":
        asyncio.run(tool_crash_main(*args))
    else:
        raise SystemExit(f"unknown command {command!r}; see the docstring of tests/procs.py")


if __name__ == "__main__":
    main(sys.argv[1:])
