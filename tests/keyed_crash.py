"""The worker process of tests/test_tool_crashes.py: a turn worker whose tool call is SIGKILLed
at one point of the call, by the process itself (so the point is exact) or by the test.

Single-tool agents (``crash_agent``), killed by themselves at:

* ``entry``: the call's ToolCallStarted is on the log, the tool has not reached its backend;
* ``applied``: the backend applied the effect, the tool has not returned;
* ``returned``: the tool returned, its ToolCallFinished is about to be appended (the log kills
  the process instead of appending it).

``book`` takes its call's idempotency key and books through a service that applies a key once
(``deliveries`` in tests/fleet.py); ``page`` takes no key; ``lookup`` is idempotent (a read, no
key), so its batch is not committed before it runs. ``book`` may offer a ``lookup`` of its key
(LOOKUP ``store``: it asks the service; ``down``: the service cannot be asked). Every run of
any of them is a row in ``side_effects``.

The storm agent (``storm_agent``, TOOL ``storm``) is killed by the test: in each of its steps
the model asks for a keyed write and a read-only check in one batch, and both hang in every
worker whose POINT (the last step it lets finish) is below the step, until the test kills it.

    python tests/procs.py tool-crash BACKEND LOG TOPIC PARTITIONS TARGET SCHEMA TOOL POINT \
        MAX_STARTS [CLOCK_OFFSET_S [LOOKUP]]

BACKEND is sqlite (LOG the file; TOPIC unused; TARGET the effects file) or kafka (LOG the
bootstrap address; TARGET a PostgreSQL DSN and SCHEMA its schema). CLOCK_OFFSET_S: how far
ahead of the wall clock the worker's clock runs (the crash rule's time, engine.tools.recovery),
so a test need not wait out a window.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any

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
from turnlog.engine.tools.ledger import NOT_APPLIED

AGENT = "booker"
POINTS = ("entry", "applied", "returned")
STORM_TIMEOUT_S = 3600.0
"""The storm's tools hang until killed: no timeout of theirs may end a run first."""


def decide(request: ModelRequest) -> ModelResponse | str:
    """Asks for the session's tool once, then answers with its result."""
    last = request.messages[-1]
    if last.role == "tool":
        return f"done: {last.content}"
    (spec,) = [t for t in request.tools if t["name"] in ("book", "page", "lookup")]
    return reply("", call(str(spec["name"]), {"ref": request.session_id}, "call-1"))


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def key_lookup(backend: Backend, mode: str) -> Callable[[str], Any] | None:
    """``book``'s lookup: ask the booking service about a key (``store``), a service that cannot
    be asked (``down``), or none ("")."""
    if not mode:
        return None

    async def booked(key: str) -> Any:
        if mode == "down":
            raise ConnectionError("the booking service is down")
        return "booked" if await backend.delivered(key) else NOT_APPLIED

    return booked


def crash_agent(
    backend: Backend, tool_name: str, point: str, *, max_starts: int = 5, lookup: str = ""
) -> Agent:
    """The agent with one tool, ``book`` (keyed), ``page`` (no key) or ``lookup`` (idempotent),
    killed at ``point`` ("entry", "applied"; "" or "returned": the tool itself does not kill)."""

    @tool(idempotent=False, max_starts=max_starts, lookup=key_lookup(backend, lookup))
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


def storm_decide(request: ModelRequest) -> ModelResponse | str:
    """The user message says how many steps ("storm 4"); each step asks for ``write`` and
    ``check`` of that step in one batch; then the answer lists every result."""
    results = [m.content for m in request.messages if m.role == "tool"]
    steps = int(request.messages[0].content.split()[1])
    done = len(results) // 2
    if done < steps:
        args = {"ref": request.session_id, "step": done + 1}
        return reply("", call("write", args, f"write-{done + 1}"), call("check", args, f"check-{done + 1}"))
    return "done: " + ", ".join(results)


def storm_agent(backend: Backend, release: int) -> Agent:
    """A keyed write and a read-only check per step; a step above ``release`` hangs in both."""

    async def hold(step: int) -> None:
        if step > release:
            await asyncio.Event().wait()  # in flight until the test kills this process

    @tool(idempotent=False, timeout_s=STORM_TIMEOUT_S)
    async def write(ref: str, step: int, idempotency_key: str) -> str:
        """Write the step's record through a store that applies each key once."""
        await backend.record(ref, f"write-{step}", "write", idempotency_key)
        await backend.deliver(ref, f"write-{step}", idempotency_key)
        await hold(step)
        return f"written {step}"

    @tool(idempotent=True, timeout_s=STORM_TIMEOUT_S)
    async def check(ref: str, step: int) -> str:
        """Read the step's slot (read-only)."""
        await backend.record(ref, f"check-{step}", "check", "")
        await hold(step)
        return f"free {step}"

    return Agent(AGENT, FunctionModel(storm_decide), [write, check])


def offset_clock(seconds: float) -> Callable[[], int]:
    """A clock ``seconds`` ahead of the wall clock (TurnRunner.clock)."""
    return lambda: ev.now_ms() + int(seconds * 1000)


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
    clock_offset_s: str = "0",
    lookup: str = "",
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
    async with recorder(target, schema, f"w{os.getpid()}") as effects:
        if tool_name == "storm":
            agent = storm_agent(effects, int(point))
        else:
            agent = crash_agent(effects, tool_name, point, max_starts=int(max_starts), lookup=lookup)
        clock = offset_clock(float(clock_offset_s))
        await run_until_signalled(TurnWorker(log, AgentDirectory([agent]), worker_id="crashing", clock=clock))
    await log.close()
