"""The agent of the end-to-end test (tests/test_e2e.py), loaded by every process with `--agents
tests.agentpkg.e2e:directory`. What a turn does depends on the user's message:

* ``plain R``: ``lookup`` (idempotent) -> ``notify`` (NOT idempotent: each run inserts a row in
  PostgreSQL) -> an answer streamed in small chunks (token deltas);
* ``refund R``: ``refund`` (waits for approval; NOT idempotent, each run inserts a row) -> an answer;
* ``slow R``: ``hold`` (idempotent), which returns once the test creates the file named after the
  session in TURNLOG_E2E_RELEASE, so the turn is surely running while the test cancels or
  interrupts it -> an answer.

Side effects go to TURNLOG_E2E_DSN, schema TURNLOG_E2E_SCHEMA, table ``side_effects``.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import psycopg

from turnlog.engine import (
    Agent,
    AgentDirectory,
    FunctionModel,
    ModelRequest,
    ModelResponse,
    call,
    reply,
    tool,
)

AGENT = "e2e"
SIDE_EFFECTS = (
    "CREATE TABLE IF NOT EXISTS side_effects (session_id TEXT, call_id TEXT, tool TEXT, amount INT)"
)
HOLD_LIMIT_S = 300.0


def _record(session_id: str, call_id: str, tool_name: str, amount: int = 0) -> None:
    dsn, schema = os.environ["TURNLOG_E2E_DSN"], os.environ["TURNLOG_E2E_SCHEMA"]
    with psycopg.connect(dsn, autocommit=True, options=f"-c search_path={schema}") as conn:
        conn.execute(
            "INSERT INTO side_effects (session_id, call_id, tool, amount) VALUES (%s, %s, %s, %s)",
            (session_id, call_id, tool_name, amount),
        )


@tool(idempotent=True)
def lookup(session: str, ref: str) -> str:
    """Look the order up (read-only)."""
    return f"order {ref}: delayed"


@tool(idempotent=False, timeout_s=30)
def notify(session: str, ref: str, call_id: str) -> str:
    """Tell the customer (one message per run)."""
    _record(session, call_id, "notify")
    return f"notified about {ref}"


@tool(requires_approval=True, sensitivity="high", timeout_s=30)
def refund(session: str, amount: int, call_id: str) -> str:
    """Refund the order (money leaves the shop: a person approves)."""
    _record(session, call_id, "refund", amount)
    return f"refunded {amount}"


@tool(idempotent=True, timeout_s=HOLD_LIMIT_S)
async def hold(session: str) -> str:
    """Wait for the carrier (returns when the test releases the session)."""
    released = Path(os.environ["TURNLOG_E2E_RELEASE"]) / session
    deadline = time.monotonic() + HOLD_LIMIT_S
    while not released.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # async: a long wait holds none of the default executor's few threads
    return "the carrier answered"


def answer(request: ModelRequest) -> ModelResponse | str:
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    kind, _, ref = request.messages[last_user].content.partition(" ")
    results = [m for m in request.messages[last_user + 1 :] if m.role == "tool"]
    sid = request.session_id
    step = {
        "plain": [("lookup", {"session": sid, "ref": ref}), ("notify", {"session": sid, "ref": ref})],
        "refund": [("refund", {"session": sid, "amount": 40})],
        "slow": [("hold", {"session": sid})],
    }.get(kind, [])
    if len(results) < len(step):
        name, arguments = step[len(results)]
        call_id = f"{name}-{ref}"
        if name in ("notify", "refund"):
            arguments = {**arguments, "call_id": call_id}
        return reply("", call(name, arguments, call_id))
    return f"done: {kind} {ref}"


def directory() -> AgentDirectory:
    model = FunctionModel(answer, name="e2e-model", chunk_chars=3)
    return AgentDirectory([Agent.build(AGENT, model, [lookup, notify, refund, hold], max_tool_iterations=4)])
