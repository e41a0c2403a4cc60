"""The seed's example task as a runnable agent: orders, notifications, a report."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection

from engine import Agent, Model

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


def build_agent(model: Model, backend: LogisticsBackend, tools: Collection[str] = DEMO_TOOLS) -> Agent:
    """The demo's agent on ``model``, offered the tools named in ``tools`` (the choice of tools an
    agent gets is made here: the local model gets DEMO_TOOLS). Saving the report is the task's
    last step: once it succeeds the model answers without tools (``Agent.final_tools``)."""
    return Agent.build(
        AGENT_ID,
        model,
        build_tools(backend, tools),
        system_prompt=system_prompt(backend.today),
        final_tools=frozenset(FINAL_TOOLS) & set(tools),
    )


__all__ = [
    "AGENT_ID",
    "DEMO_TOOLS",
    "TASK",
    "LogisticsBackend",
    "build_agent",
    "demo_model",
    "system_prompt",
]
