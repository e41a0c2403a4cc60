"""What becomes of a tool call that a stopped worker left started without a result (the
ledger's crash rule, engine.tools.ledger), decided from the fold and a clock.

A call that may be started again by contract (``Tool.resumable``: idempotent, or keyed) is
given up only for one reason: it kills the worker that runs it (a poison tool), and would
otherwise crash-loop every worker that takes the session over. A worker killed from outside
while the call ran (a deploy, the OOM killer, a lost node) leaves the same trace on the log:
a ``ToolCallStarted`` and no result. Starts alone cannot tell the two apart, so the rule bounds
by time as well as by count, and paces the starts:

* the second start is made at once (most crashes are one-off);
* every later one waits ``restart_delay_ms`` after the previous start: 1 s, 2 s, 4 s, then
  8 s at most (``RESTART_DELAY_S``, ``RESTART_DELAY_CAP_S``);
* a call is given up once it has been started at least ``Tool.max_starts`` times (5) AND
  ``Tool.crash_window_s`` (60 s) have passed since its first start.

So unrelated kills never give a call up unless they kill every start of it for a whole
window, and a tool that kills every worker costs at most ``poison_bound`` deaths (11 with the
defaults, fewer when a takeover takes longer than the pacing) before it is given up, about one
window after its first start. Times are the ``time_ms`` of the call's ``ToolCallStarted``
events (the producers' clocks) against the deciding worker's clock (``TurnRunner.clock``,
injectable), so the rule holds across processes and restarts, and a resumed turn decides the
same from the same log at the same time.

A keyed tool with ``lookup`` is asked about the call's key before the call is started again
or reported (``settle``): applied -> the call finishes with that result; not applied -> given
up as "not applied, safe to call again", or run again; no answer -> unknown, or run again.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, MutableMapping, Protocol

import structlog

from . import execute as tool_exec
from .ledger import NOT_APPLIED
from .registry import Tool, ToolRegistry

RESTART_DELAY_S = 1.0
"""The wait before a call's third start; it doubles for each start after."""
RESTART_DELAY_CAP_S = 8.0
"""The longest wait between two starts of one call (and the longest a worker sleeps at once)."""
log = structlog.get_logger("turnlog.tools")


@dataclass(frozen=True, slots=True)
class Paced:
    """Not started again before ``until_ms`` (the deciding clock's time)."""

    until_ms: int


@dataclass(frozen=True, slots=True)
class Consult:
    """A keyed call whose tool has a ``lookup``: ask it about the key first. ``run``: the tool
    and arguments to start it with if the lookup does not say it was applied, or None when the
    call is given up (``starts``, ``span_s``: for what the model is told)."""

    tool: Tool
    run: tuple[Tool, dict[str, Any]] | None
    starts: int
    span_s: float


Verdict = Literal["rerun", "give_up"] | Paced
Prepared = tool_exec.ToolOutcome | tuple[Tool, dict[str, Any]]
"""A consulted call's outcome, or the tool and arguments to start it again with."""


class Starts(Protocol):
    """What the rule reads of a call (``fold.ToolCallProgress`` has it)."""

    @property
    def attempts(self) -> int: ...
    @property
    def first_started_ms(self) -> int: ...
    @property
    def last_started_ms(self) -> int: ...


class Started(Starts, Protocol):
    """A started call as a stop finds it (``fold.ToolCallProgress``)."""

    @property
    def call_id(self) -> str: ...
    @property
    def tool_name(self) -> str: ...
    @property
    def status(self) -> str: ...


def restart_delay_ms(starts: int) -> int:
    """The wait after a call's latest start before its next one, once it has ``starts``."""
    if starts < 2:
        return 0
    return int(min(RESTART_DELAY_CAP_S, RESTART_DELAY_S * 2 ** (starts - 2)) * 1000)


def after_crash(t: Tool, call: Starts, now_ms: int) -> Verdict:
    """Whether a resumable call found started is run again now, later, or given up; pure."""
    starts = call.attempts
    window_end = call.first_started_ms + int(t.crash_window_s * 1000)
    if starts >= t.max_starts and now_ms >= window_end:
        return "give_up"
    due = call.last_started_ms + restart_delay_ms(starts)
    if starts >= t.max_starts:
        due = min(due, window_end)  # past the count, the window's end is the next decision
    return "rerun" if now_ms >= due else Paced(due)


def poison_bound(t: Tool) -> tuple[int, float]:
    """The most starts (worker deaths) a call that kills every worker gets before it is given up,
    and when that happens (seconds after its first start), if every takeover were instant."""
    starts, last, now = 1, 0, 0  # the first start at 0
    while True:
        verdict = after_crash(t, _Times(starts, 0, last), now)
        if verdict == "give_up":
            return starts, now / 1000
        if isinstance(verdict, Paced):
            now = verdict.until_ms
            continue
        starts, last = starts + 1, now


@dataclass(frozen=True, slots=True)
class _Times:
    attempts: int
    first_started_ms: int
    last_started_ms: int


async def pause(ms: int, session_id: str) -> None:
    """Wait before a paced start (at most ``RESTART_DELAY_CAP_S`` at once: the step is decided
    again after it, on a clock that may have moved differently, e.g. a skewed producer's)."""
    seconds = min(max(ms, 0) / 1000, RESTART_DELAY_CAP_S)
    log.info("tool.restart_paced", session=session_id, wait_s=seconds)
    await asyncio.sleep(seconds)


def span_s(call: Starts, now_ms: int) -> float:
    return max(now_ms - call.first_started_ms, 0) / 1000


async def settle(prepared: MutableMapping[str, Any], key_of: Callable[[str], str]) -> None:
    """Replace every ``Consult`` in a batch's plan by what its lookup says: an outcome (applied,
    or given up) or the tool and arguments to start the call again with."""
    for call_id, item in list(prepared.items()):
        if isinstance(item, Consult):
            prepared[call_id] = await consult(item, key_of(call_id), call_id)


async def consult(c: Consult, key: str, call_id: str = "") -> Prepared:
    """The outcome a lookup gives a call: its result if applied; else given up (not applied, or
    unknown), or the tool and arguments to start it again with (``Consult.run``)."""
    started = time.perf_counter()
    answer, error = await ask(c.tool, key)
    log.info("tool.lookup", tool=c.tool.name, call=call_id, answer=error or _describe(answer))
    if not error and answer is not NOT_APPLIED:
        return tool_exec.applied(c.tool, answer, started)
    if c.run is not None:
        return c.run
    if error:
        return tool_exec.abandoned(c.tool, c.starts, c.span_s, lookup_error=error)
    return tool_exec.abandoned(c.tool, c.starts, c.span_s, not_applied=True)


async def ask(t: Tool, key: str) -> tuple[Any, str]:
    """What ``t.lookup`` says about ``key`` (a result, or NOT_APPLIED) and "", or None and why it
    could not say (it raised, or took longer than the tool's timeout)."""
    assert t.lookup is not None
    try:
        async with asyncio.timeout(t.timeout_s):
            if asyncio.iscoroutinefunction(t.lookup):
                return await t.lookup(key), ""
            return await asyncio.to_thread(t.lookup, key), ""
    except TimeoutError:
        return None, f"lookup did not answer within {t.timeout_s:g} s"
    except Exception as exc:  # a lookup that fails says nothing about the call
        return None, f"{type(exc).__name__}: {exc}"


async def stopped_outcomes(
    calls: Iterable[Started], registry: ToolRegistry, key_of: Callable[[str], str]
) -> dict[str, tool_exec.ToolOutcome]:
    """What the model is told of the calls a stop ends that a stopped worker had started, by
    call id: a resumable tool's is not "not safe to repeat", and a keyed one with a lookup is
    what the lookup says. The rest (a tool that is not resumable) get the default."""
    found: dict[str, tool_exec.ToolOutcome] = {}
    for call in calls:
        t = registry.get(call.tool_name)
        if call.status != "started" or t is None or not t.resumable:
            continue
        known = await known_outcome(t, key_of(call.call_id))
        found[call.call_id] = known or tool_exec.interrupted(
            t.name, "the turn was stopped before it could run again"
        )
    return found


async def known_outcome(t: Tool, key: str) -> tool_exec.ToolOutcome | None:
    """A call a stop ends after a crash: its result if ``t.lookup`` says it was applied, the
    not-applied outcome if it says so, None if there is no lookup or it cannot say."""
    if t.lookup is None:
        return None
    started = time.perf_counter()
    answer, error = await ask(t, key)
    if error:
        return None
    if answer is NOT_APPLIED:
        return tool_exec.ToolOutcome(
            tool_exec.ToolStatus.INTERRUPTED,
            f"{tool_exec.MARKERS[tool_exec.ToolStatus.INTERRUPTED]} {t.name} was running when its worker "
            "stopped, and the turn was stopped before it could run again. Its system reports the request "
            f"was not applied, so nothing was done and calling {t.name} again is safe. Tell the user it "
            "was not done.",
            attempts=0,
            error="interrupted by worker restart: not applied (lookup)",
        )
    return tool_exec.applied(t, answer, started)


def _describe(answer: Any) -> str:
    return "not applied" if answer is NOT_APPLIED else "applied"
