"""Connections to the test services (Kafka, PostgreSQL) started by scripts/kafka.sh and
scripts/postgres.sh (``.ci/run`` starts both), with fresh topics / schemas per test."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import gc
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from turnlog.engine.log.base import AdmissionPolicy
from turnlog.engine.log.kafka import KafkaEventLog
from turnlog.engine.log.kafka_held import DEFAULT_INDEX_BYTES
from turnlog.engine.log.kafka_topics import TopicNames
from turnlog.engine.log.sealing import Sealer
from turnlog.projections.postgres import PostgresProjectionStore


def need_service(variable: str) -> str:
    """The service address in ``variable``; skip without it, but fail under CI.

    Optional path for users with Docker: with the variable unset, a ``docker`` binary and the
    ``[docker]`` extra (testcontainers) installed, a container is started once per test run.
    """
    value = os.environ.get(variable, "") or _from_container(variable)
    if value:
        return value
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{variable} is not set; CI must run every backend (.ci/run starts the services)")
    pytest.skip(f"{variable} is not set (start the service with scripts/, see README)")


@functools.cache
def _from_container(variable: str) -> str:
    if os.environ.get("CI", "").lower() == "true" or shutil.which("docker") is None:
        return ""
    try:
        from testcontainers.kafka import KafkaContainer  # type: ignore[import-not-found]
        from testcontainers.postgres import PostgresContainer  # type: ignore[import-not-found]
    except ImportError:
        return ""
    if variable == "TURNLOG_KAFKA_BOOTSTRAP":
        kafka = KafkaContainer("apache/kafka:4.1.1").with_kraft()
        kafka.start()
        atexit.register(kafka.stop)
        return str(kafka.get_bootstrap_server())
    postgres = PostgresContainer("postgres:15", username="turnlog", password="turnlog", dbname="turnlog_test")
    postgres.start()
    atexit.register(postgres.stop)
    return str(postgres.get_connection_url(driver=None))


def fresh_topic() -> str:
    return f"test.{uuid.uuid4().hex[:12]}"


@contextlib.asynccontextmanager
async def kafka_log(
    bootstrap: str,
    *,
    partitions: int = 4,
    topic: str | None = None,
    owner: bool = True,
    admission: AdmissionPolicy | None = None,
    sealer: Sealer | None = None,
    index_bytes: int = DEFAULT_INDEX_BYTES,
) -> AsyncIterator[KafkaEventLog]:
    """A started KafkaEventLog on fresh topics that owns every partition; topics deleted after.
    ``admission``: the rules the owner admits inbox records by, handed over before it starts;
    else the first AgentSessions or TurnWorker made on it hands over theirs."""
    name = topic or fresh_topic()
    log = KafkaEventLog(
        bootstrap,
        topic=name,
        partitions=partitions,
        owner=owner,
        session_timeout_ms=6000,
        sealer=sealer,
        index_bytes=index_bytes,
    )
    if admission is not None:
        log.admit_with(admission)
    await log.start()
    try:
        if owner:
            await log.wait_owned()
        yield log
    finally:
        await log.close()
        if topic is None:
            await delete_topics(bootstrap, name)
        # collect the closed clients' garbage here, not at a random later point: a finalizer run
        # by the GC in the middle of CPython 3.11's ast.parse fails it (tests/test_layout.py)
        gc.collect()


async def delete_topics(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        with contextlib.suppress(Exception):
            await admin.delete_topics(list(TopicNames(topic).all()))
    finally:
        await admin.close()


@contextlib.contextmanager
def postgres_store(dsn: str, schema: str | None = None) -> Iterator[PostgresProjectionStore]:
    """A PostgresProjectionStore in a fresh schema, dropped after."""
    store = PostgresProjectionStore(dsn, schema=schema or f"test_{uuid.uuid4().hex[:12]}")
    try:
        yield store
    finally:
        if schema is None:
            store.drop_schema()
        store.close()


async def read_topic(bootstrap: str, topic: str, partition: int) -> list:
    """Every committed record of a partition; retried while a just-committed write is not yet
    visible to a new consumer (its end offset can lag by a metadata refresh)."""
    for _ in range(50):
        if records := await read_topic_once(bootstrap, topic, partition):
            return records
        await asyncio.sleep(0.1)
    return []


def raw_consumer(bootstrap: str, isolation_level: str = "read_committed") -> AIOKafkaConsumer:
    """A consumer of no group that reads from the start (not started)."""
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level=isolation_level,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )


async def read_topic_once(bootstrap: str, topic: str, partition: int) -> list:
    consumer = raw_consumer(bootstrap)
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        consumer.seek(tp, 0)
        out: list = []
        while await consumer.position(tp) < end:
            out += (await consumer.getmany(tp, timeout_ms=1000)).get(tp, [])
        return out
    finally:
        await consumer.stop()
