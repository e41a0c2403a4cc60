"""Loop guards (seed §4.3): three layers that stop a turn's tool loop, each with its reason.

1. ``iteration_cap``: the turn has used the agent's ``max_tool_iterations`` tool steps (default 8).
2. ``repeated_call``: the same tool with near-equal arguments three times in a row, counted over
   the turn's calls in the order the model asked for them (across steps). The third call is not
   run: it is answered as rejected by the guard.
3. ``unchanged_result``: a tool's result did not change from one tool step to the next, twice in
   a row (three consecutive steps that call the tool and get the same result). Equal results of
   calls in the *same* step do not count: parallel calls are independent, not a loop. Nor do
   outcomes the engine wrote instead of a result (interrupted by a crash, timed out, refused,
   declined, cancelled, abandoned): their text names only the tool, so three different calls
   would read alike; each counts as a result of its own call.

Near-equal arguments: equal after ``canonical_arguments``: JSON parsed, object keys sorted,
strings stripped, inner whitespace runs collapsed to one space and case-folded, numbers compared
by value (1, 1.0 and 1e0 are equal; true is not 1; "1" is not 1), list order kept. Text that is
not JSON is compared the same way as one string.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Sequence

from .execute import ENGINE_OUTCOMES

REPEAT_LIMIT = 3
"""Calls of one tool with near-equal arguments in a row that trip ``repeated_call``."""
UNCHANGED_LIMIT = 2
"""Unchanged results in a row (step to step) that trip ``unchanged_result``."""
_SPACE = re.compile(r"\s+")


class Guard(StrEnum):
    ITERATION_CAP = "iteration_cap"
    REPEATED_CALL = "repeated_call"
    UNCHANGED_RESULT = "unchanged_result"


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One finished call of the current turn, as the guards see it."""

    call_id: str
    tool_name: str
    arguments_json: str
    iteration: int
    """The tool step (1-based) the call belongs to."""
    status: str
    result: str
    """Status and result text (the full output when there is one)."""


@dataclass(frozen=True, slots=True)
class Trip:
    guard: Guard
    reason: str
    tool_name: str = ""


@functools.lru_cache(maxsize=4096)
def canonical_arguments(arguments_json: str) -> str:
    """The normal form under which two argument sets are near-equal (see the module doc)."""
    try:
        value = json.loads(arguments_json) if arguments_json.strip() else {}
    except (ValueError, RecursionError):
        value = arguments_json
    try:
        return json.dumps(_normal(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except RecursionError:
        return _SPACE.sub(" ", arguments_json.strip()).casefold()


def _normal(value: Any) -> Any:
    if isinstance(value, str):
        return _SPACE.sub(" ", value.strip()).casefold()
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            return {"$number": str(value)}
        number = float(value) if abs(value) < 2**53 else value
        return {"$number": repr(number)}  # keeps true apart from 1 and "1" apart from 1
    if isinstance(value, dict):
        return {_SPACE.sub(" ", str(k).strip()).casefold(): _normal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    return str(value)


def near_equal(a_json: str, b_json: str) -> bool:
    return canonical_arguments(a_json) == canonical_arguments(b_json)


def repeated_call(history: Sequence[CallRecord], name: str, arguments_json: str) -> Trip | None:
    """Would calling ``name`` now make REPEAT_LIMIT near-equal calls in a row?"""
    recent = history[-(REPEAT_LIMIT - 1) :]
    if len(recent) < REPEAT_LIMIT - 1:
        return None
    key = canonical_arguments(arguments_json)
    if all(r.tool_name == name and canonical_arguments(r.arguments_json) == key for r in recent):
        return Trip(
            Guard.REPEATED_CALL,
            f"{name} was asked for {REPEAT_LIMIT} times in a row with near-equal arguments {key}",
            name,
        )
    return None


def unchanged_result(history: Sequence[CallRecord]) -> Trip | None:
    """Did a tool of the latest step return, for the UNCHANGED_LIMIT-th step in a row, what it
    returned the step before?"""
    if not history:
        return None
    last_step = history[-1].iteration
    for name in dict.fromkeys(r.tool_name for r in history if r.iteration == last_step):
        per_step: dict[int, list[str]] = {}
        for r in history:
            if r.tool_name == name:
                per_step.setdefault(r.iteration, []).append(_compared(r))
        steps = [last_step - k for k in range(UNCHANGED_LIMIT + 1)]
        if not all(s in per_step for s in steps):
            continue
        results = [sorted(per_step[s]) for s in steps]
        if all(r == results[0] for r in results[1:]):
            return Trip(
                Guard.UNCHANGED_RESULT,
                f"{name} returned the same result in {UNCHANGED_LIMIT + 1} tool steps in a row "
                f"(steps {steps[-1]}-{last_step}); calling it again gives no new information",
                name,
            )
    return None


def _compared(record: CallRecord) -> str:
    """What ``unchanged_result`` compares: the result, or for an outcome the engine wrote (no
    result from the tool) the call itself, so distinct calls never count as one result."""
    if record.status in ENGINE_OUTCOMES:
        return f"{record.status}:{record.call_id}"
    return record.result


def superseded(history: Sequence[CallRecord], latest: CallRecord) -> list[str]:
    """Call ids of earlier successful calls (earlier steps) whose result ``latest`` replaces:
    the same tool with near-equal arguments, called again and answered successfully."""
    if latest.status != "success":
        return []
    key = canonical_arguments(latest.arguments_json)
    return [
        r.call_id
        for r in history
        if r.iteration < latest.iteration
        and r.status == "success"
        and r.tool_name == latest.tool_name
        and canonical_arguments(r.arguments_json) == key
    ]


def iteration_cap(iterations: int, cap: int) -> Trip | None:
    if iterations < cap:
        return None
    return Trip(Guard.ITERATION_CAP, f"the turn used its maximum of {cap} tool steps")


CLOSING_NOTES = {
    Guard.ITERATION_CAP: "You have used the maximum of {cap} tool steps for this request.",
    Guard.REPEATED_CALL: "The same tool was called {limit} times in a row with near-equal arguments.",
    Guard.UNCHANGED_RESULT: "A tool kept returning the same result; calling it again tells nothing new.",
}


def closing_note(guard: str, reason: str, cap: int) -> str:
    """The system message of the last, tool-less model call after a guard stopped the loop."""
    try:
        first = CLOSING_NOTES[Guard(guard)].format(cap=cap, limit=REPEAT_LIMIT)
    except ValueError:
        first = f"The tool loop was stopped ({reason})."
    return (
        f"{first} Do not call any tool. Answer the user now from the results above, and say that "
        f"the run was cut short to avoid a loop ({reason})."
    )


def final_note(tool_name: str) -> str:
    """The system message of the model call after one of the agent's final tools succeeded."""
    return (
        f"{tool_name} has run: that completes the tool work for this request. Do not call any tool. "
        "Answer the user now in plain text, from the results above: say what was done, and name "
        "everything that failed."
    )
