"""What every long-running program (serve, worker, memory) runs beside its agents: the memory
consumers their memory policies call for, and the clean-up of the agents' models and stores."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from turnlog.engine.agent import AgentDirectory
from turnlog.engine.log.base import EventLog

if TYPE_CHECKING:
    from turnlog.consumers.memory import MemoryConsumer


def memory_consumers(log: EventLog, agents: AgentDirectory, *, owned_only: bool) -> list[MemoryConsumer]:
    """One MemoryConsumer per memory store the agents use, serving those agents' sessions, with
    the extraction model of the first agent that names one. ``owned_only``: only the partitions
    the log owns (a Kafka turn worker; its offsets then ride the owner's transactions)."""
    from turnlog.consumers.memory import GROUP as MEMORY_GROUP  # the memory extra: only with memory agents
    from turnlog.consumers.memory import MemoryConsumer

    stores: dict[int, tuple[Any, Any, list[str]]] = {}
    for agent in agents:
        if agent.memory is None:
            continue
        store, extractor, ids = stores.setdefault(id(agent.memory.store), (agent.memory.store, None, []))
        ids.append(agent.agent_id)
        if extractor is None and agent.memory.extractor is not None:
            stores[id(store)] = (store, agent.memory.extractor, ids)
    return [
        MemoryConsumer(
            log,
            store,
            extractor,
            group=MEMORY_GROUP if len(stores) == 1 else f"{MEMORY_GROUP}.{ids[0]}",
            owned_only=owned_only,
            agent_ids=ids,
        )
        for store, extractor, ids in stores.values()
    ]


async def close_agents(agents: AgentDirectory) -> None:
    """Close every agent's model clients and memory stores (each once)."""
    closed: set[int] = set()
    for agent in agents:
        for resource, close in (
            (agent.model, "aclose"),
            (agent.memory.store if agent.memory else None, "close"),
            (agent.memory.extractor if agent.memory else None, "aclose"),
        ):
            if resource is None or id(resource) in closed or not hasattr(resource, close):
                continue
            closed.add(id(resource))
            with contextlib.suppress(Exception):
                await getattr(resource, close)()
