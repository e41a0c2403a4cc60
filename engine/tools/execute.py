"""Run one tool call and shape its result for the model (seed §2.3, §4.4, §7.2).

Every outcome has a status. Anything but success starts with an unmistakable marker, so a
model cannot report a failed send as sent.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..errors import ToolFailure
from .ledger import with_key
from .registry import Tool, ToolRegistry, default_formatter
from .shaping import truncate
from .validation import ArgumentProblem, parse_arguments


class ToolStatus(StrEnum):
    """How a tool call ended; a status other than success reaches the model as a marked result."""

    SUCCESS = "success"
    FAILED = "failed"
    TIMEOUT = "timeout"
    REJECTED = "rejected"
    """Never executed: unknown tool or invalid arguments."""
    INTERRUPTED = "interrupted"
    """Started before a crash and not run again (neither idempotent nor given an idempotency
    key, or its turn was stopped first): outcome unknown."""
    DECLINED = "declined"
    """The user rejected the call when asked to approve it; never executed."""
    CANCELLED = "cancelled"
    """Never run: its turn was stopped (a user interrupt or cancel) before it started."""
    ABANDONED = "abandoned"
    """Started at least ``Tool.max_starts`` times over ``Tool.crash_window_s``, and every time its
    worker stopped before it returned (a tool that kills its process would crash-loop every
    worker): not started again (engine.tools.recovery)."""


MARKERS = {
    ToolStatus.FAILED: "[FAILED]",
    ToolStatus.TIMEOUT: "[FAILED: TIMEOUT]",
    ToolStatus.REJECTED: "[REJECTED]",
    ToolStatus.INTERRUPTED: "[FAILED: INTERRUPTED, OUTCOME UNKNOWN]",
    ToolStatus.DECLINED: "[DECLINED BY USER]",
    ToolStatus.CANCELLED: "[CANCELLED]",
    ToolStatus.ABANDONED: "[FAILED: ABANDONED AFTER REPEATED CRASHES]",
}
ENGINE_OUTCOMES = frozenset(
    {
        ToolStatus.REJECTED,
        ToolStatus.INTERRUPTED,
        ToolStatus.DECLINED,
        ToolStatus.CANCELLED,
        ToolStatus.ABANDONED,
        ToolStatus.TIMEOUT,
    }
)
"""Statuses whose text the engine wrote, not the tool: they say nothing about what the tool
would return (the loop guards never count two of them as the same result)."""


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What a tool call came to: its status, the text the model reads, and the output kept on the
    log."""

    status: ToolStatus
    content: str
    """What the model reads."""
    output_json: str | None = None
    elapsed_ms: float = 0.0
    attempts: int = 1
    error: str | None = None


def rejected(content: str, error: str) -> ToolOutcome:
    return ToolOutcome(
        ToolStatus.REJECTED, f"{MARKERS[ToolStatus.REJECTED]} {content}", error=error, attempts=0
    )


def unknown_tool(name: str, registry: ToolRegistry) -> ToolOutcome:
    available = ", ".join(registry.names) or "none"
    return rejected(f"no such tool {name!r}; available tools are: {available}.", f"unknown tool {name}")


UNKNOWN_OUTCOME = "Whether it took effect is unknown. Tell the user it is not known whether it was done."
"""The one instruction of a call whose effect nobody can know: not "it failed" (it may have
happened), not "check and retry" (the model cannot check, and a repeat may do it twice)."""


def interrupted(t_name: str, why: str = "") -> ToolOutcome:
    """A started call that is not run again: its tool neither is idempotent nor takes a key (a
    repeat could do it twice), or ``why`` (a stop after its worker stopped)."""
    why = why or "it is not run again, since a repeat could do it twice"
    return ToolOutcome(
        ToolStatus.INTERRUPTED,
        f"{MARKERS[ToolStatus.INTERRUPTED]} {t_name} was running when its worker stopped, and {why}. "
        f"{UNKNOWN_OUTCOME}",
        attempts=0,
        error="interrupted by worker restart",
    )


def abandoned(
    t: Tool, starts: int, span_s: float, *, not_applied: bool = False, lookup_error: str = ""
) -> ToolOutcome:
    """A call re-run after crashes that is given up (engine.tools.recovery). What the model is
    told follows what is known: its system said the key was not applied (``not_applied``); or
    a repeat is harmless (an idempotent tool without a key); or nothing is known (no lookup,
    or it could not answer: ``lookup_error``)."""
    what = (
        f"{MARKERS[ToolStatus.ABANDONED]} {t.name} was started {starts} times over {span_s:.0f} s and each "
        "time the worker running it stopped before it returned, so it is not started again."
    )
    if not_applied:
        known, error = (
            (
                f"Its system reports the request was not applied, so nothing was done and calling {t.name} "
                "again is safe. Tell the user it was not done."
            ),
            "not applied (lookup)",
        )
    elif t.idempotent and not t.takes_idempotency_key:
        known, error = "It returned no result. Tell the user it could not be completed.", "no result"
    elif lookup_error:
        known, error = f"Its system could not say. {UNKNOWN_OUTCOME}", f"lookup failed: {lookup_error}"
    else:
        known, error = UNKNOWN_OUTCOME, "outcome unknown"
    return ToolOutcome(
        ToolStatus.ABANDONED,
        f"{what} {known}",
        attempts=0,
        error=f"abandoned after {starts} starts without a result: {error}",
    )


def applied(t: Tool, result: Any, started: float) -> ToolOutcome:
    """A keyed call its system reports applied (``Tool.lookup``): finished with that result, as
    if it had returned it."""
    return _success(t, result, started, 0)


def prepare(
    registry: ToolRegistry, name: str, arguments_json: str
) -> tuple[Tool, dict[str, Any]] | ToolOutcome:
    """The tool and its validated arguments, or the rejection the model gets instead."""
    t = registry.get(name)
    if t is None:
        return unknown_tool(name, registry)
    args = parse_arguments(t, arguments_json)
    if isinstance(args, ArgumentProblem):
        return rejected(
            f"invalid arguments for {name}: {args.describe()}. Fix the arguments and call {name} again.",
            args.describe(),
        )
    return t, args


async def run_tool_call(registry: ToolRegistry, name: str, arguments_json: str) -> ToolOutcome:
    """Validate, execute with timeout (one retry if idempotent), and shape the result."""
    prepared = prepare(registry, name, arguments_json)
    if isinstance(prepared, ToolOutcome):
        return prepared
    return await execute(*prepared)


def declined(t_name: str, note: str) -> ToolOutcome:
    reason = f" Their reason: {note}." if note.strip() else ""
    return ToolOutcome(
        ToolStatus.DECLINED,
        f"{MARKERS[ToolStatus.DECLINED]} the user did not approve {t_name}, so it was not run.{reason} "
        "Tell the user it was not done and ask how they want to proceed.",
        attempts=0,
        error=f"declined by user: {note}" if note.strip() else "declined by user",
    )


async def execute(t: Tool, args: dict[str, Any], *, idempotency_key: str = "") -> ToolOutcome:
    """Run with the tool's timeout; retry per its policy (``Tool.max_attempts``) after a timeout
    or a crash, never after a ToolFailure (a business answer, not a glitch). Every attempt
    gets the same idempotency key if the tool takes one (engine.tools.ledger): the one in
    ``args`` (the turn loop's), else ``idempotency_key``, else a fresh one."""
    args = with_key(t, args, idempotency_key)
    max_attempts = t.max_attempts
    started = time.perf_counter()
    attempt = 0
    while True:
        attempt += 1
        limit = asyncio.timeout(t.timeout_s)
        try:
            async with limit:
                result = await _invoke(t, args)
        except TimeoutError:
            if not limit.expired():  # the tool itself raised TimeoutError: a failure, not our limit
                return _failure(ToolStatus.FAILED, t, "TimeoutError raised by the tool", started, attempt)
            if attempt < max_attempts:
                continue
            return _failure(
                ToolStatus.TIMEOUT,
                t,
                f"did not finish within {t.timeout_s:g} s",
                started,
                attempt,
                hint="it may or may not have taken effect",
            )
        except ToolFailure as exc:
            return _failure(ToolStatus.FAILED, t, str(exc), started, attempt)
        except Exception as exc:  # a tool bug is a result the model sees, not a crashed turn
            if attempt < max_attempts:
                continue
            return _failure(ToolStatus.FAILED, t, f"{type(exc).__name__}: {exc}", started, attempt)
        return _success(t, result, started, attempt)


async def _invoke(t: Tool, args: dict[str, Any]) -> Any:
    if getattr(t, "is_async", False):
        return await t.handler(**args)
    return await asyncio.to_thread(t.handler, **args)


def _elapsed_ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


def _success(t: Tool, result: Any, started: float, attempts: int) -> ToolOutcome:
    output = json.dumps(result, ensure_ascii=False, separators=(",", ":"), default=str)
    if t.formatter is default_formatter:  # the compact JSON is the default text: encode it once
        content = result if isinstance(result, str) else output
    else:
        try:
            content = t.formatter(result)
        except Exception as exc:
            content = f"(formatter failed: {type(exc).__name__}: {exc}) {output[:2000]}"
    content = truncate(content, t.max_result_chars)
    return ToolOutcome(ToolStatus.SUCCESS, content, output, _elapsed_ms(started), attempts)


def _failure(
    status: ToolStatus, t: Tool, message: str, started: float, attempts: int, hint: str = ""
) -> ToolOutcome:
    suffix = f"; {hint}" if hint else ""
    content = f"{MARKERS[status]} {t.name} {message}{suffix}. Do not tell the user it succeeded."
    return ToolOutcome(status, content, None, _elapsed_ms(started), attempts, error=message)
