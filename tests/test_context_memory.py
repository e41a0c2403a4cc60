"""Long-term memory on the turn's path (issue 8): the model's ``remember`` call is a MemoryNoted
event, the memory consumer stores it in Qdrant (Qdrant Edge, the embedded default, with the real
multilingual embedder), and
the user's next session starts with it in context; another user never gets it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import AsyncIterator

import pytest

from tests.context_support import last_user_text, open_session
from turnlog.consumers.memory import MemoryConsumer
from turnlog.engine import MemoryPolicy, call, reply
from turnlog.engine import events as ev
from turnlog.engine.context.assemble import MEMORY_HEADER
from turnlog.engine.memory.edge import EdgeMemoryStore
from turnlog.engine.memory.embedders import UniversalSentenceEncoder
from turnlog.engine.memory.qdrant import QdrantMemoryStore
from turnlog.engine.models.base import ModelRequest, ModelResponse

FACT = "The user prefers DHL Express for every replacement shipment."


@pytest.fixture(scope="module")
def embedder() -> UniversalSentenceEncoder:
    return UniversalSentenceEncoder()


@pytest.fixture
async def store(embedder: UniversalSentenceEncoder, tmp_path: Path) -> AsyncIterator[EdgeMemoryStore]:
    opened = EdgeMemoryStore(embedder, path=str(tmp_path / "memory"))
    yield opened
    await opened.close()


def assistant(request: ModelRequest) -> ModelResponse | str:
    if request.messages[-1].role == "tool":
        return "Noted, I will remember that."
    text = last_user_text(request)
    if text.startswith("Remember"):
        return reply("", call("remember", {"fact": FACT, "tag": "preference"}))
    return "Let me arrange the replacement shipments."


async def test_remembered_fact_is_stored_off_path_and_recalled_in_the_next_session(
    tmp_path: Path, store: EdgeMemoryStore
) -> None:
    policy = MemoryPolicy(store, tags=("preference",))
    first = await open_session(tmp_path, assistant, memory=policy)
    await first.send("Remember: for replacements I always want DHL Express.")
    noted = await first.of(ev.MemoryNoted)
    assert [(n.user_id, n.text, n.tag) for n in noted] == [("user-1", FACT, "preference")]
    assert await store.count("user-1") == 0  # nothing written on the turn's path

    consumer = MemoryConsumer(first.log, store)
    await consumer.catch_up()
    assert await store.count("user-1") == 1

    second_sid = (await first.api.create_session(first.agent.agent_id, "user-1")).session_id
    [
        item
        async for item in first.api.send_user_message(
            second_sid, "Which carrier should ship the replacements?"
        )
    ]
    retrieved = [e for e in await first.log.read_session(second_sid) if isinstance(e, ev.MemoriesRetrieved)]
    assert len(retrieved) == 1
    shown = json.loads(retrieved[0].memories_json)
    assert [m["text"] for m in shown] == [FACT] and shown[0]["score"] >= policy.min_score
    request = first.last_request()
    block = [m for m in request.messages if m.content.startswith(MEMORY_HEADER)]
    assert block and FACT in block[0].content
    assert request.messages.index(block[0]) == len(request.messages) - 2  # right before the question

    # another user asking the very same question is told nothing of user-1's memories
    bobs = (await first.api.create_session(first.agent.agent_id, "user-2")).session_id
    [item async for item in first.api.send_user_message(bobs, "Which carrier should ship the replacements?")]
    assert not [e for e in await first.log.read_session(bobs) if isinstance(e, ev.MemoriesRetrieved)]
    assert not any(FACT in m.content for m in first.last_request().messages)


async def test_an_unreachable_memory_store_never_fails_a_turn(
    tmp_path: Path, embedder: UniversalSentenceEncoder
) -> None:
    down = QdrantMemoryStore(embedder, url="http://127.0.0.1:9")
    session = await open_session(tmp_path, assistant, memory=MemoryPolicy(down))
    await session.send("Which carrier should ship the replacements?")
    assert not await session.of(ev.MemoriesRetrieved)
    assert [f.reason for f in await session.of(ev.TurnFinished)] == ["answered"]
    await down.close()
