"""The embedded deployment in one object (a SQLite log, SQLite projections, the API, the
projector and the agents, in one process with no services), and ``ReadSide``: where a program
finds the log and the projections, embedded or on Kafka + PostgreSQL."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from turnlog.consumers.projector import Projector
from turnlog.engine import AgentDirectory, AgentSessions, EventLog, SqliteEventLog
from turnlog.engine.agent import Agent
from turnlog.engine.crypto.setup import configured_cipher
from turnlog.engine.log.kafka import KafkaEventLog
from turnlog.engine.log.kafka_held import DEFAULT_INDEX_BYTES
from turnlog.projections import ProjectionStore, SqliteProjectionStore
from turnlog.projections.postgres import PostgresProjectionStore

from .config import kafka_index_bytes_from_env


class EmbeddedApp:
    """The embedded deployment in one object: a SQLite log and SQLite projections under ``home``,
    the Python API (``api``) and the projector, for the agents given."""

    def __init__(self, home: Path, agents: list[Agent] | None = None, *, partitions: int = 8) -> None:
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.log = SqliteEventLog(home / "log.db", partitions=partitions)
        self.store = SqliteProjectionStore(home / "projections.db")
        self.agents = AgentDirectory(agents or [])
        self.api = AgentSessions(self.log, self.agents, producer="cli")
        self.projector = Projector(self.log, self.store)

    async def close(self) -> None:
        from .runtime import close_agents

        await close_agents(self.agents)
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

    async def open(self, *, owner: bool = False) -> tuple[EventLog, ProjectionStore]:
        """The log and the projections; on Kafka the log is a member of the owners' group if
        ``owner`` (it runs turns), else a producer and reader that owns no partition."""
        log = await self.open_log(owner=owner)
        try:
            store = self.store()
        except BaseException:
            await log.close()
            raise
        return log, store

    def store(self) -> ProjectionStore:
        """The projections: the embedded file in ``home``, or the PostgreSQL schema."""
        if self.postgres is None:
            return SqliteProjectionStore(self.home / "projections.db")
        return postgres_store(self.postgres, self.schema)

    async def open_log(self, *, owner: bool = False, client_id: str = "turnlog") -> EventLog:
        if self.kafka is None:
            self.home.mkdir(parents=True, exist_ok=True)
            return SqliteEventLog(self.home / "log.db", partitions=self.partitions)
        kafka = kafka_log(
            self.kafka, self.topic, self.partitions, owner=owner, client_id=client_id, home=self.home
        )
        try:
            await kafka.start()
        except BaseException:
            await kafka.close()
            raise
        return kafka


def kafka_log(
    bootstrap: str,
    topic: str,
    partitions: int,
    *,
    owner: bool = False,
    client_id: str = "turnlog",
    home: Path | None = None,
    content: bool = True,
) -> KafkaEventLog:
    """A Kafka log (not started) with the deployment's content cipher: ``TURNLOG_KEYSTORE``'s
    keys, the master key from the environment or ``home`` (engine.crypto.setup). ``content``
    False: a reader that needs no content (the analytics consumer) gets no keys at all."""
    cipher = configured_cipher(home) if content else None
    return KafkaEventLog(
        bootstrap,
        topic=topic,
        partitions=partitions,
        owner=owner,
        client_id=client_id,
        sealer=cipher,
        owns_sealer=cipher is not None,
        index_bytes=kafka_index_bytes_from_env(DEFAULT_INDEX_BYTES),
    )


def postgres_store(dsn: str, schema: str, attempts: int = 5) -> PostgresProjectionStore:
    """The projections in PostgreSQL. Processes that start together (a gateway, the projector,
    the analytics consumer) create the schema's tables at once; PostgreSQL's IF NOT EXISTS is
    not safe against that race (one of them gets a duplicate-name error), so it is retried."""
    for attempt in range(1, attempts + 1):
        try:
            return PostgresProjectionStore(dsn, schema=schema)
        except CREATE_RACES:
            if attempt == attempts:
                raise
            time.sleep(0.2 * attempt)
    raise AssertionError("unreachable")


CREATE_RACES = (
    psycopg.errors.UniqueViolation,
    psycopg.errors.DuplicateObject,
    psycopg.errors.DuplicateTable,
    psycopg.errors.DuplicateSchema,
)
