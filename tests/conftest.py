"""Shared fixtures.

ONE fixture, TWO backends: ``log`` is the embedded SQLite log, and also (``[kafka]``) a
``KafkaEventLog`` on a real broker when ``TURNLOG_KAFKA_BOOTSTRAP`` is set — with fresh topics
per test, owning all their partitions. ``store`` likewise is SQLite, and PostgreSQL (a fresh
schema per test) when ``TURNLOG_POSTGRES_DSN`` is set. With ``CI=true`` a missing service fails
the run instead of skipping (``.ci/run`` starts both).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from tests.services import delete_topics, fresh_topic, kafka_log, need_service, postgres_store
from turnlog.engine.log.base import EventLog
from turnlog.engine.log.kafka import KafkaEventLog
from turnlog.engine.log.sqlite import SqliteEventLog
from turnlog.projections.store import ProjectionStore, SqliteProjectionStore

BACKENDS = ["sqlite", "kafka"]

# --- Kafka alone: the broker and a topic of the test's own (tests/test_kafka_*, ...) ---


@pytest.fixture
def bootstrap() -> str:
    return need_service("TURNLOG_KAFKA_BOOTSTRAP")


@pytest.fixture
async def topic(bootstrap: str) -> AsyncIterator[str]:
    """A fresh topic name, its topics deleted after the test."""
    name = fresh_topic()
    yield name
    await delete_topics(bootstrap, name)


# --- engine: a real log (tests/test_log_*, test_turn_loop, test_recovery, ...) ---


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "events.db"


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def log(backend: str, log_path: Path) -> AsyncIterator[EventLog]:
    if backend == "sqlite":
        opened: EventLog = SqliteEventLog(log_path, partitions=4)
        try:
            yield opened
        finally:
            await opened.close()
        return
    async with kafka_log(need_service("TURNLOG_KAFKA_BOOTSTRAP"), partitions=4) as kafka:
        yield kafka


@pytest.fixture
def store(backend: str, tmp_path: Path) -> Iterator[ProjectionStore]:
    """The read models next to ``log``: SQLite, or PostgreSQL (a fresh schema) with Kafka."""
    if backend == "sqlite":
        opened: ProjectionStore = SqliteProjectionStore(tmp_path / "projections.db")
        try:
            yield opened
        finally:
            opened.close()
        return
    with postgres_store(need_service("TURNLOG_POSTGRES_DSN")) as pg:
        yield pg


@pytest.fixture
def reopen(
    backend: str, log_path: Path, log: EventLog
) -> Callable[[], AbstractAsyncContextManager[EventLog]]:
    """Opens another process's connection to the same log (on Kafka: a reader and producer that
    owns no partition)."""

    @contextlib.asynccontextmanager
    async def opener() -> AsyncIterator[EventLog]:
        if backend == "sqlite":
            second = SqliteEventLog(log_path, partitions=4)
            try:
                yield second
            finally:
                await second.close()
        else:
            assert isinstance(log, KafkaEventLog)
            async with kafka_log(log.bootstrap, topic=log.topics.events, owner=False) as reader:
                yield reader

    return opener


@pytest.fixture
def sqlite_only(backend: str) -> Iterator[None]:
    """For tests of what only the embedded log has (its file, its durability modes)."""
    if backend != "sqlite":
        pytest.skip("embedded-log specific")
    yield


def pytest_report_header() -> list[str]:
    return [
        f"kafka: {os.environ.get('TURNLOG_KAFKA_BOOTSTRAP') or 'not set (kafka tests skip)'}",
        f"postgres: {os.environ.get('TURNLOG_POSTGRES_DSN') or 'not set (postgres tests skip)'}",
    ]
