"""The embedded deployment in one object: a SQLite log, SQLite projections, the API, the
projector, and the demo agent. Everything runs in one process with no services."""

from __future__ import annotations

from pathlib import Path

from consumers.projector import Projector
from engine import AgentDirectory, AgentSessions, SqliteEventLog
from engine.agent import Agent
from projections import SqliteProjectionStore


class EmbeddedApp:
    def __init__(self, home: Path, agents: list[Agent] | None = None, *, partitions: int = 8) -> None:
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.log = SqliteEventLog(home / "log.db", partitions=partitions)
        self.store = SqliteProjectionStore(home / "projections.db")
        self.agents = AgentDirectory(agents or [])
        self.api = AgentSessions(self.log, self.agents, producer="cli")
        self.projector = Projector(self.log, self.store)

    async def close(self) -> None:
        for agent in self.agents:
            await agent.model.aclose()
        self.store.close()
        await self.log.close()
