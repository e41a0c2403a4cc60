"""The seed's example task as a runnable agent: orders, notifications, a report."""

from __future__ import annotations

import datetime as dt
from typing import Sequence

from engine import Agent, ConfigurationError, MemoryPolicy, Model

from .backend import LogisticsBackend, last_week
from .scripted import demo_model
from .tools import build_tools

AGENT_ID = "logistics-assistant"
TASK = (
    "Find last week's orders with logistics anomalies, send each affected customer an apology "
    "notice, then write a handling report."
)


def system_prompt(today: dt.date) -> str:
    monday, sunday = last_week(today)
    return (
        f"You are the operations assistant of an online shop. Today is {today.isoformat()}; "
        f"last week ran from {monday.isoformat()} to {sunday.isoformat()}. Use the tools to look up "
        "orders, notify customers and save reports. Dates are YYYY-MM-DD. A tool result starting with "
        "[FAILED] or [REJECTED] did not succeed: never tell the user it did. When the work is done, "
        "answer with a short summary for the user."
    )


TASK_TOOLS = ("query_orders", "send_notification", "save_report")
"""The tools offered by default: what the demo's task needs. The local model gets these (a
refund waits for a person, which a small model's demo run should not)."""
SCRIPTED_TOOLS = (*TASK_TOOLS, "refund")
"""The scripted model's tools under ``turnlog serve``: ask it to "refund 40 on O-1003" and the
refund waits for approval (approve, edit or reject it in the viewer or over HTTP)."""


def build_agent(
    model: Model,
    backend: LogisticsBackend,
    tools: Sequence[str] = TASK_TOOLS,
    memory: MemoryPolicy | None = None,
) -> Agent:
    """The logistics agent with the named tools (of ``build_tools``) offered to ``model``, and
    long-term memory if ``memory`` is given."""
    available = {t.name: t for t in build_tools(backend)}
    unknown = sorted(set(tools) - set(available))
    if unknown:
        raise ConfigurationError(f"no logistics tool {unknown[0]!r}; the tools are {', '.join(available)}")
    offered = [available[name] for name in tools]
    return Agent.build(AGENT_ID, model, offered, system_prompt=system_prompt(backend.today), memory=memory)


__all__ = [
    "AGENT_ID",
    "TASK_TOOLS",
    "SCRIPTED_TOOLS",
    "TASK",
    "LogisticsBackend",
    "build_agent",
    "demo_model",
    "system_prompt",
]
