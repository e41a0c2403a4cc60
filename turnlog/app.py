"""The embedded deployment in one object: a SQLite log, SQLite projections, the API, the
projector, and the demo agent. Everything runs in one process with no services."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from consumers.projector import Projector
from engine import AgentDirectory, AgentSessions, EventLog, SqliteEventLog
from engine.agent import Agent
from engine.log.kafka import KafkaEventLog
from projections import ProjectionStore, SqliteProjectionStore
from projections.postgres import PostgresProjectionStore


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


@dataclass(frozen=True)
class ReadSide:
    """Where the CLI's read-side commands (rebuild, sessions) find the log and the projections:
    the embedded files in ``home``, or a Kafka topic and a PostgreSQL schema."""

    home: Path
    kafka: str | None = None
    topic: str = "turnlog.events"
    partitions: int = 8
    postgres: str | None = None
    schema: str = "public"

    async def open(self) -> tuple[EventLog, ProjectionStore]:
        if self.kafka is None:
            self.home.mkdir(parents=True, exist_ok=True)
            log: EventLog = SqliteEventLog(self.home / "log.db", partitions=self.partitions)
        else:
            kafka = KafkaEventLog(self.kafka, topic=self.topic, partitions=self.partitions, owner=False)
            await kafka.start()
            log = kafka
        try:
            store: ProjectionStore = (
                SqliteProjectionStore(self.home / "projections.db")
                if self.postgres is None
                else PostgresProjectionStore(self.postgres, schema=self.schema)
            )
        except BaseException:
            await log.close()
            raise
        return log, store
