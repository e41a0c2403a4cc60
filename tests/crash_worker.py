"""A worker that gets killed mid-turn, for tests/test_recovery.py.

    python tests/crash_worker.py LOG_PATH SESSION_ID {lookup|send|model}

It creates the session, posts a message and runs the turn. The model first asks for one tool;
in this process that tool (or, with ``model``, the model call itself) never returns, so the test
can SIGKILL the process at a known point. The test process imports ``build_agent`` to run the
same agent with a tool that does return.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

from engine import (
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
from engine.models.base import ModelChunk

AGENT = "recovery"
PARTITIONS = 4
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


def build_agent(kind: str, model: Model, handler: Callable[[str], Any], *, timeout_s: float = 10.0) -> Agent:
    """The agent both processes run; only the model and the tool's body differ."""

    async def body(order_id: str) -> str:
        return await handler(order_id)

    body.__doc__ = "Look an order up (read-only)." if kind != "send" else "Send the order to the carrier."
    t = tool(body, name=tool_name(kind), idempotent=kind != "send", timeout_s=timeout_s)
    return Agent(AGENT, model, [t], first_token_timeout_s=600, model_timeout_s=600)


class HangingModel(Model):
    """Never sends its first chunk."""

    name = "hanging"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        await asyncio.Event().wait()
        yield ModelResponse("unreachable")


async def hang(order_id: str) -> str:
    await asyncio.Event().wait()
    return "unreachable"


async def main(log_path: str, session_id: str, kind: str) -> None:
    model: Model = HangingModel() if kind == "model" else FunctionModel(answer)
    agent = build_agent(kind, model, hang, timeout_s=3600)
    log = SqliteEventLog(log_path, partitions=PARTITIONS)
    api = AgentSessions(log, AgentDirectory([agent]), producer="crash-worker")
    await api.create_session(AGENT, "user-1", session_id=session_id)
    async for _ in api.send_user_message(session_id, QUESTION):
        pass
    raise SystemExit("the turn was supposed to hang until the test kills this process")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
