"""Direct tool invocation (``AgentSessions.invoke_tool``, seed §6.2) and how it is logged.

A direct call goes through the same role filter, validation, timeout and retry policy as a
model's call, and is recorded as one ``ToolInvoked`` event after it ran (or was refused): the
log shows who ran what with which outcome, yet the conversation the model sees is unchanged.
"""

from __future__ import annotations

import json
from typing import Any

from .. import events as ev
from ..writer import SessionWriter
from .execute import ToolOutcome, rejected, run_tool_call
from .registry import ToolRegistry


async def run_direct(
    registry: ToolRegistry, tool_name: str, arguments: dict[str, Any], *, confirmed: bool
) -> ToolOutcome:
    t = registry.get(tool_name)
    if t is not None and t.requires_approval and not confirmed:
        return rejected(
            f"{tool_name} requires the user's approval; ask them, then invoke it with confirmed=True.",
            "approval required",
        )
    return await run_tool_call(registry, tool_name, json.dumps(arguments, ensure_ascii=False))


def add_invoked(
    w: SessionWriter, tool_name: str, arguments: dict[str, Any], actor: str, outcome: ToolOutcome
) -> None:
    w.add(
        ev.ToolInvoked,
        call_id=ev.new_id(),
        tool_name=tool_name,
        arguments_json=json.dumps(arguments, ensure_ascii=False),
        actor=actor,
        status=str(outcome.status),
        content=outcome.content,
        output_json=outcome.output_json,
        elapsed_ms=outcome.elapsed_ms,
        attempts=outcome.attempts,
        error=outcome.error,
    )
