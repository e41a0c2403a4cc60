"""The seed's example task as a runnable agent: orders, notifications, a report."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection

from turnlog.engine import Agent, MemoryPolicy, Model

from .backend import LogisticsBackend, last_week
from .scripted import demo_model
from .tools import DEMO_TOOLS, FINAL_TOOLS, build_tools

AGENT_ID = "logistics-assistant"
TASK = (
    "Find last week's orders with logistics anomalies, send each affected customer an apology "
    "notice, then write a handling report."
)


def system_prompt(today: dt.date) -> str:
    monday, sunday = last_week(today)
    return (
        f"You are the operations assistant of an online shop. Today is {today.isoformat()}; last week "
        f"ran from {monday.isoformat()} to {sunday.isoformat()} (dates are YYYY-MM-DD). Work one tool "
        "step at a time: first look the orders up; once you have them, notify every affected customer "
        "in one block; once the notices are sent, save the report; then answer. A tool result starting "
        "with [FAILED] or [REJECTED] did not succeed: never say it did. Answer in two or three "
        "sentences that name every notice that failed."
    )


TASK_TOOLS = DEMO_TOOLS
"""The tools offered by default: what the demo's task needs. The local model gets these (a
refund waits for a person, which a small model's demo run should not)."""
SCRIPTED_TOOLS = (*TASK_TOOLS, "refund")
"""The scripted model's tools under ``turnlog serve``: ask it to "refund 40 on O-1003" and the
refund waits for approval (approve, edit or reject it in the viewer or over HTTP)."""


def build_agent(
    model: Model,
    backend: LogisticsBackend,
    tools: Collection[str] = TASK_TOOLS,
    memory: MemoryPolicy | None = None,
) -> Agent:
    """The demo's agent on ``model``, offered the tools named in ``tools`` (the choice of tools an
    agent gets is made here: the local model gets TASK_TOOLS), and long-term memory if ``memory``
    is given. Saving the report is the task's last step: once it succeeds the model answers
    without tools (``Agent.final_tools``)."""
    return Agent.build(
        AGENT_ID,
        model,
        build_tools(backend, tools),
        system_prompt=system_prompt(backend.today),
        final_tools=frozenset(FINAL_TOOLS) & set(tools),
        memory=memory,
    )


__all__ = [
    "AGENT_ID",
    "DEMO_TOOLS",
    "TASK_TOOLS",
    "SCRIPTED_TOOLS",
    "TASK",
    "LogisticsBackend",
    "build_agent",
    "demo_model",
    "system_prompt",
]
