"""The seed's example task as a runnable agent: orders, notifications, a report."""

from __future__ import annotations

import datetime as dt

from engine import Agent, Model

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


def build_agent(model: Model, backend: LogisticsBackend) -> Agent:
    return Agent.build(AGENT_ID, model, build_tools(backend), system_prompt=system_prompt(backend.today))


__all__ = ["AGENT_ID", "TASK", "LogisticsBackend", "build_agent", "demo_model", "system_prompt"]
