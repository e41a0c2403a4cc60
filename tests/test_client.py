"""A producer with no agent code (``engine.SessionClient``) in this process, and `turnlog worker
--agents tests.agentpkg.good:directory` in another, on both backends: the client creates a
session, posts two messages at once, and waits for (or streams) each message's own turn."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.deployment import Program
from tests.services import kafka_log, need_service
from turnlog.engine import SessionClient, SqliteEventLog, TurnWaitTimeoutError
from turnlog.engine import events as ev
from turnlog.engine.errors import SessionNotFoundError
from turnlog.engine.log.base import EventLog

PARTITIONS = 2
AGENTS = "tests.agentpkg.good:directory"


@contextlib.asynccontextmanager
async def worker_and_log(
    backend: str, tmp_path: Path, agents: str = AGENTS, extra: tuple[str, ...] | list[str] = ()
) -> AsyncIterator[EventLog]:
    """`turnlog worker --agents AGENTS` in its own process, and this process's handle on the same
    log (on Kafka, one that owns no partition)."""
    common = [
        "worker",
        "--agents",
        agents,
        "--partitions",
        str(PARTITIONS),
        "--id",
        "client-test-worker",
        *extra,
    ]
    if backend == "sqlite":
        home = tmp_path / "home"
        log: EventLog = SqliteEventLog(home / "log.db", partitions=PARTITIONS)
        program = Program("worker", [*common, "--home", str(home)], tmp_path / "worker.log").start()
        try:
            yield log
        finally:
            program.stop()
            await log.close()
        return
    bootstrap = need_service("TURNLOG_KAFKA_BOOTSTRAP")
    async with kafka_log(bootstrap, partitions=PARTITIONS, owner=False) as kafka:
        home = tmp_path / "worker-home"
        args = [*common, "--kafka", bootstrap, "--topic", kafka.topics.events, "--home", str(home)]
        program = Program("worker", args, tmp_path / "worker.log").start()
        try:
            yield kafka
        finally:
            program.stop()


@pytest.mark.parametrize("backend", ["sqlite", "kafka"])
async def test_a_producer_waits_for_each_of_its_messages_turns(backend: str, tmp_path: Path) -> None:
    async with worker_and_log(backend, tmp_path) as log:
        client = SessionClient(log, producer="web-backend")
        session = await client.create_session("shop", "u-7", metadata={"channel": "web"})
        first = await client.post_message(session.session_id, "Is P-1 in stock?")
        second = await client.post_message(session.session_id, "And now?", message_id="web-42")
        assert second.message_id == "web-42"

        later = await client.wait_for_turn(second, timeout=90)  # waits behind the first turn
        assert (later.message_id, later.reason) == ("web-42", "answered")
        assert later.answer == 'In stock: {"sku":"P-1","in_stock":3}'
        started = later.events[0]
        assert isinstance(started, ev.TurnStarted) and started.message_id == "web-42"

        streamed = [record.event async for record in client.stream_turn(first, timeout=90)]
        assert isinstance(streamed[0], ev.TurnStarted) and streamed[0].message_id == first.message_id
        assert isinstance(streamed[-1], ev.TurnFinished) and streamed[-1].reason == "answered"
        assert {e.correlation_id for e in streamed if isinstance(e, ev.ToolCallFinished)} == {
            streamed[0].turn_id
        }
        assert streamed[-1].version < later.events[0].version  # its own turn, not the later one

        again = await client.post_message(session.session_id, "And now?", message_id="web-42")
        assert again.message_id == "web-42"  # a retry of the same post is not a second message
        events = await log.read_session(session.session_id)
        assert [e.message_id for e in events if isinstance(e, ev.UserMessageReceived)] == [
            first.message_id,
            "web-42",
        ]
        assert {e.producer for e in events if isinstance(e, ev.TurnFinished)} == {"client-test-worker"}

        nobody = await client.create_session("no-such-agent", "u-7")  # no worker runs it
        waiting = await client.post_message(nobody.session_id, "hello?")
        with pytest.raises(
            TurnWaitTimeoutError, match="did not start within 1 s; check that turn workers run"
        ):
            await client.wait_for_turn(waiting, timeout=1)
        with pytest.raises(SessionNotFoundError):
            await client.post_message("no-such-session", "hello?")
