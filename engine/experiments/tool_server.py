"""The recorded-tool server: a candidate agent's tools, answered from the recording.

A replayed turn's tool call whose tool and arguments match a call the recorded turn made gets
the recorded result (its text, or its failure) and runs nothing. A call with no match:

* of an idempotent (read-only) tool named in ``live``: runs the real tool;
* otherwise (every tool that is not idempotent, always): is not run, and is answered with a
  failure whose error starts with ``UNMATCHED_ERROR``, so the model sees a clear marker and the
  comparison counts it as a divergence from the log alone.

Arguments are compared as the tool reads them (validated, defaults filled in, as JSON with sorted
keys), so key order, spacing and spelled-out defaults do not count as a difference.

Which recorded turn a call belongs to is the runner's ``ReplayCursor``, set in a context
variable around each replayed turn: tool handlers run in the turn's task (or tasks and threads
copied from its context), so one wrapped agent serves any number of concurrent replays.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import json
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from ..agent import Agent
from ..errors import ToolFailure
from ..tools.registry import Tool, ToolRegistry, default_formatter
from ..tools.validation import ArgumentProblem, parse_arguments
from .recording import RecordedCall, Recording

UNMATCHED_ERROR = "NOT IN THE RECORDING"
"""How the error of a call the recording could not answer starts (ToolCallFinished.error)."""


@dataclass
class ReplayCursor:
    """Where a replay is: the recording and the index of the recorded turn being replayed."""

    recording: Recording
    turn_index: int = 0
    used: set[tuple[int, str]] = field(default_factory=set)
    """(turn index, recorded call id) already served: each recorded result is served once while
    an unserved match is left."""
    live_runs: int = 0
    unmatched: int = 0


_CURSOR: contextvars.ContextVar[ReplayCursor | None] = contextvars.ContextVar("turnlog_replay", default=None)


def set_cursor(cursor: ReplayCursor | None) -> contextvars.Token[ReplayCursor | None]:
    return _CURSOR.set(cursor)


def reset_cursor(token: contextvars.Token[ReplayCursor | None]) -> None:
    _CURSOR.reset(token)


class RecordedTools:
    """Builds the replay agent: ``agent`` with every tool answered from the recording."""

    def __init__(self, live: Collection[str] | bool = ()) -> None:
        self.live = live
        """Idempotent tools that may run live when the recording has no match: names, or True
        for every idempotent tool. A tool that is not idempotent never runs live."""

    def may_run_live(self, t: Tool) -> bool:
        return t.idempotent and (
            self.live is True or (not isinstance(self.live, bool) and t.name in self.live)
        )

    def wrap(self, agent: Agent) -> Agent:
        return dataclasses.replace(agent, tools=ToolRegistry(self.wrap_tool(t) for t in agent.tools))

    def wrap_tool(self, original: Tool) -> Tool:
        async def serve(**kwargs: Any) -> Any:
            return await self._serve(original, kwargs)

        return Tool(
            name=original.name,
            description=original.description,
            parameters=original.parameters,
            handler=serve,
            timeout_s=original.timeout_s,
            idempotent=original.idempotent,
            formatter=default_formatter,
            arguments_model=original.arguments_model,
            roles=original.roles,
            sensitivity=original.sensitivity,
            requires_approval=original.requires_approval,
            retries=original.retries,
            max_result_chars=original.max_result_chars,
            max_starts=original.max_starts,
            crash_window_s=original.crash_window_s,
        )

    async def _serve(self, original: Tool, kwargs: dict[str, Any]) -> Any:
        cursor = _CURSOR.get()
        key = argument_key(original, kwargs)
        recorded = _match(cursor, original, key) if cursor is not None else None
        if recorded is not None:
            return _recorded_result(recorded)
        if self.may_run_live(original):
            if cursor is not None:
                cursor.live_runs += 1
            return await _run_live(original, kwargs)
        if cursor is not None:
            cursor.unmatched += 1
        why = (
            "it is not idempotent, so an experiment never runs it live"
            if not original.idempotent
            else "it was not allowed to run live in this experiment"
        )
        raise ToolFailure(
            f"{UNMATCHED_ERROR}: no call of {original.name} with these arguments was recorded in this turn, "
            f"and {why}; nothing was run"
        )


def argument_key(t: Tool, arguments: dict[str, Any]) -> str:
    """The arguments as the tool reads them, as canonical JSON."""
    if t.arguments_model is not None:
        try:
            dumped = t.arguments_model(**arguments).model_dump(mode="json")
        except Exception:  # not constructible from what it was given: compare the raw values
            dumped = arguments
    else:
        dumped = arguments
    return json.dumps(dumped, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def recorded_key(t: Tool, call: RecordedCall) -> str | None:
    parsed = parse_arguments(t, call.arguments_json)
    return None if isinstance(parsed, ArgumentProblem) else argument_key(t, parsed)


def _match(cursor: ReplayCursor, t: Tool, key: str) -> RecordedCall | None:
    turns = cursor.recording.turns
    if not 0 <= cursor.turn_index < len(turns):
        return None
    candidates = [
        c
        for c in turns[cursor.turn_index].calls
        if c.tool_name == t.name and c.status and recorded_key(t, c) == key
    ]
    if not candidates:
        return None
    fresh = [c for c in candidates if (cursor.turn_index, c.call_id) not in cursor.used]
    chosen = (fresh or candidates)[0]
    cursor.used.add((cursor.turn_index, chosen.call_id))
    return chosen


def _recorded_result(call: RecordedCall) -> str:
    if call.status == "success":
        return call.content
    raise ToolFailure(call.error or call.content)


async def _run_live(t: Tool, kwargs: dict[str, Any]) -> Any:
    if getattr(t, "is_async", False):
        result = await t.handler(**kwargs)
    else:
        result = await asyncio.to_thread(t.handler, **kwargs)
    return result if t.formatter is default_formatter else t.formatter(result)
