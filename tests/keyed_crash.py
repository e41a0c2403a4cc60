"""The worker process of tests/test_tool_crashes.py: a turn worker whose tool call is SIGKILLed
(the process kills itself, so the point is exact) at one point of the call:

* ``entry``: the call's ToolCallStarted is on the log, the tool has not reached its backend;
* ``applied``: the backend applied the effect, the tool has not returned;
* ``returned``: the tool returned, its ToolCallFinished is about to be appended (the log kills
  the process instead of appending it).

``book`` takes its call's idempotency key and books through a service that applies a key once
(``deliveries`` in tests/fleet.py); ``page`` takes no key; ``lookup`` is idempotent (a read, no
key), so its batch is not committed before it runs. Every run of any of them is a row in
``side_effects``.

    python tests/procs.py tool-crash BACKEND LOG TOPIC PARTITIONS TARGET SCHEMA TOOL POINT MAX_STARTS

BACKEND is sqlite (LOG the file; TOPIC unused; TARGET the effects file) or kafka (LOG the
bootstrap address; TARGET a PostgreSQL DSN and SCHEMA its schema).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence

from tests.fleet import Backend, recorder, run_until_signalled
from turnlog.consumers import TurnWorker
from turnlog.engine import (
    Agent,
    AgentDirectory,
    FunctionModel,
    KafkaEventLog,
    SqliteEventLog,
    call,
    reply,
    tool,
)
from turnlog.engine import events as ev
from turnlog.engine.log.base import EventLog, LogRecord
from turnlog.engine.models.base import ModelRequest, ModelResponse

AGENT = "booker"
POINTS = ("entry", "applied", "returned")


def decide(request: ModelRequest) -> ModelResponse | str:
    """Asks for the session's tool once, then answers with its result."""
    last = request.messages[-1]
    if last.role == "tool":
        return f"done: {last.content}"
    (spec,) = [t for t in request.tools if t["name"] in ("book", "page", "lookup")]
    return reply("", call(str(spec["name"]), {"ref": request.session_id}, "call-1"))


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def crash_agent(backend: Backend, tool_name: str, point: str, *, max_starts: int = 5) -> Agent:
    """The agent with one tool, ``book`` (keyed), ``page`` (no key) or ``lookup`` (idempotent),
    killed at ``point`` ("entry", "applied"; "" or "returned": the tool itself does not kill)."""

    @tool(idempotent=False, max_starts=max_starts)
    async def book(ref: str, idempotency_key: str) -> str:
        """Book a slot through a service that applies each idempotency key once."""
        if point == "entry":
            die()
        await backend.record(ref, "call-1", "book", idempotency_key)
        await backend.deliver(ref, "call-1", idempotency_key)
        if point == "applied":
            die()
        return "booked"

    @tool(idempotent=False, max_starts=max_starts)
    async def page(ref: str) -> str:
        """Page the on-call (no key: the pager cannot tell a repeat)."""
        if point == "entry":
            die()
        await backend.record(ref, "call-1", "page", "")
        if point == "applied":
            die()
        return "paged"

    @tool(idempotent=True, max_starts=max_starts)
    async def lookup(ref: str) -> str:
        """Look a slot up (read-only: safe to repeat)."""
        if point == "entry":
            die()
        await backend.record(ref, "call-1", "lookup", "")
        if point == "applied":
            die()
        return "free"

    tools = {"book": book, "page": page, "lookup": lookup}
    return Agent(AGENT, FunctionModel(decide), [tools[tool_name]])


def dying_before_results(base: type[EventLog]) -> type[EventLog]:
    """``base`` whose append kills the process instead of appending a tool result."""

    class Dying(base):  # type: ignore[valid-type,misc]
        async def append(
            self, events: Sequence[ev.Event], *, expected_version: int, redoable: bool = False
        ) -> list[LogRecord]:
            if any(isinstance(e, ev.ToolCallFinished) for e in events):
                die()
            result: list[LogRecord] = await super().append(
                events, expected_version=expected_version, redoable=redoable
            )
            return result

    return Dying


async def tool_crash_main(
    backend: str,
    log_at: str,
    topic: str,
    partitions: str,
    target: str,
    schema: str,
    tool_name: str,
    point: str,
    max_starts: str,
) -> None:
    log: EventLog
    if backend == "sqlite":
        cls = dying_before_results(SqliteEventLog) if point == "returned" else SqliteEventLog
        log = cls(log_at, partitions=int(partitions))  # type: ignore[call-arg]
    else:
        cls = dying_before_results(KafkaEventLog) if point == "returned" else KafkaEventLog
        log = cls(log_at, topic=topic, partitions=int(partitions), client_id="crashing",  # type: ignore[call-arg]
                  session_timeout_ms=6000)  # fmt: skip
        await log.start()  # type: ignore[attr-defined]
    async with recorder(target, schema, f"crashing-{point}") as effects:
        agent = crash_agent(effects, tool_name, point, max_starts=int(max_starts))
        await run_until_signalled(TurnWorker(log, AgentDirectory([agent]), worker_id="crashing"))
    await log.close()
