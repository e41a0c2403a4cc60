"""Long-term memory in the running system: `turnlog worker --agents ...` runs the memory consumer
beside the turns when an agent has a MemoryPolicy (on Kafka, on the partitions it owns), or
`turnlog memory` runs it in a process of its own (workers with --no-memory), so what one
session's turn asked to remember is retrieved in the user's next session."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiokafka import TopicPartition

from tests.deployment import Program
from tests.test_client import worker_and_log
from turnlog.engine import KafkaEventLog, SessionClient
from turnlog.engine import events as ev
from turnlog.engine.log.kafka_topics import committed_offset
from turnlog.engine.memory.stores import open_store

AGENTS = "tests.agentpkg.memo:build"


@pytest.mark.parametrize("backend", ["sqlite", "kafka"])
async def test_a_note_from_one_session_is_retrieved_in_the_next(backend: str, tmp_path: Path) -> None:
    async with worker_and_log(backend, tmp_path, agents=AGENTS) as log:
        await note_then_recall(SessionClient(log))


async def test_a_memory_process_of_its_own_keeps_its_offsets_on_kafka(tmp_path: Path) -> None:
    """`turnlog memory` owns no partition: it stores the note and keeps its offsets on Kafka
    directly. (Its store is its own here: an embedded store is one process per folder; a
    deployment shares a Qdrant server between it and the workers.)"""
    async with worker_and_log("kafka", tmp_path, agents=AGENTS, extra=["--no-memory"]) as log:
        assert isinstance(log, KafkaEventLog)
        args = ["memory", "--kafka", log.bootstrap, "--topic", log.topics.events, "--partitions", "2",
                "--agents", AGENTS, "--home", str(tmp_path)]  # fmt: skip
        memory = Program("memory", args, tmp_path / "memory.log").start()
        try:
            client = SessionClient(log)
            session = await client.create_session("memo", "u-1")
            await client.ask(session.session_id, "remember: ship my orders with DHL", timeout=90)
            (note,) = [
                r
                for r in await log.read_session_records(session.session_id)
                if isinstance(r.event, ev.MemoryNoted)
            ]
            where = TopicPartition(log.topics.events, note.partition)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while await committed_offset(log.bootstrap, "memory", where) <= note.offset:
                memory.check_alive()
                assert loop.time() < deadline, (
                    f"the memory process never committed past the note:\n{memory.output()}"
                )
                await asyncio.sleep(0.2)
        finally:
            memory.stop()
    store = open_store(tmp_path / "memory")
    try:
        assert [m.text for m in await store.search("u-1", "carrier", min_score=0.0)] == [
            "ship my orders with DHL"
        ]
    finally:
        await store.close()


async def note_then_recall(client: SessionClient) -> None:
    """A note in one session; the same user's next session is told it, another user is not."""
    first = await client.create_session("memo", "u-1")
    noted = await client.ask(first.session_id, "remember: ship my orders with DHL", timeout=90)
    assert [e.text for e in noted.events if isinstance(e, ev.MemoryNoted)] == ["ship my orders with DHL"]

    second = await client.create_session("memo", "u-1")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:  # the memory consumer stores the note off the turn's path: ask until it is there
        result = await client.ask(second.session_id, "which carrier do I use?", timeout=90)
        found = [e for e in result.events if isinstance(e, ev.MemoriesRetrieved)]
        if found:
            break
        assert loop.time() < deadline, "the note never reached the memory store"
        await asyncio.sleep(0.2)
    (retrieved,) = found
    assert [m["text"] for m in json.loads(retrieved.memories_json)] == ["ship my orders with DHL"]
    other = await client.create_session("memo", "u-2")
    elsewhere = await client.ask(other.session_id, "which carrier do I use?", timeout=90)
    assert not any(isinstance(e, ev.MemoriesRetrieved) for e in elsewhere.events)  # one user's only
