"""What the lifecycle tests share (tests/test_lifecycle*.py, tests/lifecycle_proc.py): the agents,
a clock the test moves, and an eraser that records what it was asked.

The eraser stands in for the content erasure of issue 43's items 2-3 (built in parallel, behind
``consumers.lifecycle.Eraser``): it keeps one row per session it was asked to erase, and a
count of the asks, in a table of its own (in a SQLite file, or PostgreSQL next to a Kafka log),
so the tests see exactly how often each session was erased, by which process.
"""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Callable

import psycopg

from turnlog.engine import (
    Agent,
    AgentDirectory,
    FunctionModel,
    Lifecycle,
    ModelRequest,
    ModelResponse,
    call,
    reply,
    tool,
)
from turnlog.engine.crypto.keystore_postgres import CREATE_RACES

IDLE = timedelta(minutes=30)
RETAIN = timedelta(days=7)
IDLE_MS = int(IDLE.total_seconds() * 1000)
RETAIN_MS = int(RETAIN.total_seconds() * 1000)
ERASED_DDL = (
    "CREATE TABLE IF NOT EXISTS erased "
    "(session_id TEXT PRIMARY KEY, reason TEXT NOT NULL, asks BIGINT NOT NULL, erased_by TEXT NOT NULL)"
)
_RECORD = (
    "INSERT INTO erased (session_id, reason, asks, erased_by) VALUES (?, ?, 1, ?) "
    "ON CONFLICT (session_id) DO UPDATE SET asks = erased.asks + 1"
)


def answer(request: ModelRequest) -> ModelResponse | str:
    """The desk agent: a refund needs the user's approval; anything else is echoed."""
    last = request.messages[-1]
    if last.role == "user" and "refund" in last.content:
        return reply("", call("refund", {"order_id": "A-17"}, "call-refund"))
    if last.role == "tool":
        return f"done: {last.content}"
    return f"answer to {last.content}"


@tool(requires_approval=True)
def refund(order_id: str) -> str:
    """Refund an order (needs the user's approval)."""
    return f"refunded {order_id}"


def agents(
    default: Lifecycle | None = None, *, desk: Lifecycle | None = None, keeper: bool = False,
    returning: Lifecycle | None = None,
) -> AgentDirectory:  # fmt: skip
    """``desk`` (with its own lifecycle, or the default), ``keeper`` (the default always) and
    ``returning`` (with its own, typically one that continues in a new session)."""
    model = FunctionModel(answer, name="desk-model")
    listed = [Agent.build("desk", model, [refund], lifecycle=desk)]
    if keeper:
        listed.append(Agent.build("keeper", FunctionModel(lambda r: "kept", name="keeper-model")))
    if returning is not None:
        listed.append(Agent.build("returning", FunctionModel(answer, name="desk-model"), lifecycle=returning))
    return AgentDirectory(listed, lifecycle=default)


class TestClock:
    """Now, as the test sets it (ms since the epoch); a file the test writes when ``path`` is
    given, so processes started by the test read the same clock."""

    __test__ = False

    def __init__(self, now_ms: int, path: Path | None = None) -> None:
        self.path = path
        self._now = now_ms
        self.set(now_ms)

    def set(self, now_ms: int) -> None:
        self._now = now_ms
        if self.path is not None:
            temporary = self.path.with_suffix(".tmp")
            temporary.write_text(str(now_ms))
            temporary.replace(self.path)

    def advance(self, delta: timedelta) -> int:
        self.set(self._now + int(delta.total_seconds() * 1000))
        return self._now

    def __call__(self) -> int:
        return self._now


def file_clock(path: Path) -> Callable[[], int]:
    """A clock that reads the test's file (a process started by the test)."""
    return lambda: int(path.read_text())


class MemoryEraser:
    """Records every ask in this process (single-process tests)."""

    def __init__(self) -> None:
        self.asks: list[tuple[str, str]] = []

    async def erase_session(self, session_id: str, reason: str, *, actor: str = "admin") -> None:
        assert actor == "lifecycle"
        self.asks.append((session_id, reason))


class TableEraser:
    """Records every ask in the ``erased`` table of a SQLite file or a PostgreSQL schema; with
    ``hang_on``, never returns for that session (a process killed while erasing it)."""

    def __init__(self, target: str, schema: str, name: str, hang_on: str = "") -> None:
        self.target, self.schema, self.name, self.hang_on = target, schema, name, hang_on
        try:
            _execute(target, schema, ERASED_DDL, ())
        except CREATE_RACES:
            pass  # another worker created it at the same moment: CREATE ... IF NOT EXISTS races in PostgreSQL

    async def erase_session(self, session_id: str, reason: str, *, actor: str = "admin") -> None:
        if session_id == self.hang_on:
            await asyncio.Event().wait()
        await asyncio.to_thread(_execute, self.target, self.schema, _RECORD, (session_id, reason, self.name))


def erased_rows(target: str, schema: str) -> dict[str, tuple[str, int, str]]:
    """session -> (reason, asks, the process that erased it first)."""
    _execute(target, schema, ERASED_DDL, ())
    rows = _execute(target, schema, "SELECT session_id, reason, asks, erased_by FROM erased", ())
    return {r[0]: (r[1], int(r[2]), r[3]) for r in rows}


def _execute(target: str, schema: str, sql: str, params: tuple[object, ...]) -> list[tuple[str, ...]]:
    if target.startswith("postgresql://"):
        with psycopg.connect(target, options=f"-c search_path={schema}", autocommit=True) as conn:
            cursor = conn.execute(sql.replace("?", "%s"), params)
            return [tuple(r) for r in cursor.fetchall()] if cursor.description else []
    with sqlite3.connect(target, timeout=30) as db:
        return [tuple(r) for r in db.execute(sql, params).fetchall()]
