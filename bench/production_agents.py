"""The agents of bench/production.py, as an agents module (``--agents bench.production_agents:...``)
so the real shape runs `turnlog serve` and `turnlog worker` as a deployment does.

* ``directory``: the bench agent (``lookup`` then ``notify``, three model calls a turn) on the
  endpoint the program was given (--base-url, --model), with long-term memory on as the example
  agent has it: Qdrant Edge in ``HOME/memory``, the ``remember`` tool offered, no extraction
  model (the example's default without a configured extractor);
* ``bare``: the same agent without memory (the bench's bare shape);
* ``inflight``: ``bare`` plus the agent ``slow`` on the endpoint in ``BENCH_SLOW_URL``, whose
  model answers after a long time (``bench/production.py --inflight``), with time limits
  longer than that wait.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from turnlog.engine import Agent, AgentDirectory, MemoryPolicy, tool
from turnlog.engine.models.openai_compat import OpenAICompatibleModel

SLOW_URL_ENV = "BENCH_SLOW_URL"
SLOW_LIMIT_S = 3600.0
"""The ``slow`` agent's first-token and response limits: above any ``--latency`` the bench
waits (the default 15 s first-token limit would end every waiting turn after 15 s)."""


@tool(idempotent=True)
async def lookup(order_id: str) -> dict:
    """Look an order up (read-only)."""
    return {"order_id": order_id, "status": "delayed"}


@tool(idempotent=False)
async def notify(order_id: str) -> str:
    """Tell the customer about the order."""
    return "sent"


def model_of(context: Any, url: str | None = None) -> OpenAICompatibleModel:
    """The model at ``url`` (default: the program's endpoint) with the program's pool settings."""
    settings = context.settings
    if url is None:
        return settings.build()
    return OpenAICompatibleModel(
        "bench-model", base_url=url, api_key="bench", connections=settings.connections
    )


def bench_agent(
    model: OpenAICompatibleModel, memory: MemoryPolicy | None = None, agent_id: str = "bench"
) -> Agent:
    return Agent(agent_id, model, [lookup, notify], memory=memory)


def directory(context: Any) -> AgentDirectory:
    from turnlog.engine.memory.stores import open_store

    store = open_store(Path(context.home) / "memory", url=os.environ.get("TURNLOG_QDRANT_URL"))
    return AgentDirectory([bench_agent(model_of(context), MemoryPolicy(store, extractor=None))])


def bare(context: Any) -> AgentDirectory:
    return AgentDirectory([bench_agent(model_of(context))])


def inflight(context: Any) -> AgentDirectory:
    slow = Agent(
        "slow",
        model_of(context, os.environ[SLOW_URL_ENV]),
        [],
        first_token_timeout_s=SLOW_LIMIT_S,
        model_timeout_s=SLOW_LIMIT_S,
    )
    return AgentDirectory([bench_agent(model_of(context)), slow])
