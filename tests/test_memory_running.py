"""Long-term memory in the running system: `turnlog worker --agents ...` runs the memory consumer
beside the turns when an agent has a MemoryPolicy (on Kafka, on the partitions it owns), so what
one session's turn asked to remember is retrieved in the user's next session."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from engine import SessionClient
from engine import events as ev
from tests.test_client import worker_and_log


@pytest.mark.parametrize("backend", ["sqlite", "kafka"])
async def test_a_note_from_one_session_is_retrieved_in_the_next(backend: str, tmp_path: Path) -> None:
    async with worker_and_log(backend, tmp_path, agents="tests.agentpkg.memo:build") as log:
        client = SessionClient(log)
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
