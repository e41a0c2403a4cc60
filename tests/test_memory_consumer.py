"""The memory consumer on a real SQLite log and the real embedded memory store, Qdrant Edge (seed §3.3)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.openai_server import FakeReply, serve_openai
from turnlog.consumers.memory import GROUP, MemoryConsumer, parse_facts
from turnlog.engine import events as ev
from turnlog.engine.errors import ModelError
from turnlog.engine.log.sqlite import SqliteEventLog
from turnlog.engine.memory.edge import EdgeMemoryStore
from turnlog.engine.memory.embedders import UniversalSentenceEncoder
from turnlog.engine.models.openai_compat import OpenAICompatibleModel
from turnlog.engine.models.scripted import ScriptedModel

FACTS = json.dumps(
    [
        {"fact": "The user prefers DHL for shipping", "tag": "preference"},
        {"fact": "订单1042被承运商弄丢了", "tag": "conclusion"},
    ],
    ensure_ascii=False,
)


@pytest.fixture(scope="session")
def embedder() -> UniversalSentenceEncoder:
    return UniversalSentenceEncoder()


@pytest.fixture
async def event_log(tmp_path: Path) -> AsyncIterator[SqliteEventLog]:
    opened = SqliteEventLog(tmp_path / "events.db", partitions=4)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def memories(embedder: UniversalSentenceEncoder, tmp_path: Path) -> AsyncIterator[EdgeMemoryStore]:
    store = EdgeMemoryStore(embedder, path=str(tmp_path / "memory"))
    try:
        yield store
    finally:
        await store.close()


async def write_task(
    log: SqliteEventLog, session_id: str, *, user_id: str = "u1", reason: str = "answered", note: str = ""
) -> None:
    """One session with one turn: the user's message, an optional remember note, the answer."""
    turn = f"turn-{session_id}"
    events: list[ev.Event] = [
        ev.SessionCreated(session_id=session_id, version=1, agent_id="support", user_id=user_id),
        ev.UserMessageReceived(
            session_id=session_id,
            version=2,
            message_id="m1",
            text="Order 1042 never came. Ship with DHL from now on.",
            user_id=user_id,
        ),
        ev.TurnStarted(session_id=session_id, version=3, turn_id=turn, message_id="m1"),
    ]
    if note:
        events.append(
            ev.MemoryNoted(
                session_id=session_id,
                version=4,
                turn_id=turn,
                call_id="c1",
                user_id=user_id,
                text=note,
                tag="agreement",
            )
        )
    events += [
        ev.AssistantMessage(
            session_id=session_id,
            version=len(events) + 1,
            turn_id=turn,
            message_id="a1",
            text="The carrier lost order 1042; future orders go with DHL.",
        ),
        ev.TurnFinished(
            session_id=session_id,
            version=len(events) + 2,
            turn_id=turn,
            message_id="m1",
            reason=reason,
            iterations=0,
            model_calls=1,
            input_tokens=10,
            output_tokens=10,
        ),
    ]
    await log.append(events, expected_version=0)


async def test_notes_are_stored_and_tasks_are_distilled(
    event_log: SqliteEventLog, memories: EdgeMemoryStore
) -> None:
    await write_task(event_log, "s1", note="Refund orders that are more than 5 days late")
    extractor = ScriptedModel([FACTS])
    consumer = MemoryConsumer(event_log, memories, extractor)

    assert await consumer.catch_up() == 7  # the task's 6 events and the extraction call's record

    stored = {m.text: m for m in await memories.search("u1", "shipping and orders", limit=10)}
    assert set(stored) == {
        "Refund orders that are more than 5 days late",
        "The user prefers DHL for shipping",
        "订单1042被承运商弄丢了",
    }
    assert stored["The user prefers DHL for shipping"].tag == "preference"
    assert all(m.source == "s1" for m in stored.values())
    sent = extractor.requests[0].messages
    assert sent[0].role == "system" and "JSON" in sent[0].content
    assert "User: Order 1042 never came" in sent[1].content
    assert "Assistant: The carrier lost order 1042" in sent[1].content
    (recorded,) = [e for e in await event_log.read_session("s1") if isinstance(e, ev.AuxiliaryModelCall)]
    assert (recorded.purpose, recorded.turn_id, recorded.model, recorded.status) == (
        "memory_extraction",
        "turn-s1",
        extractor.name,
        "ok",
    )


async def test_a_restart_resumes_where_it_stopped(
    event_log: SqliteEventLog, memories: EdgeMemoryStore
) -> None:
    await write_task(event_log, "s1")
    assert await MemoryConsumer(event_log, memories, ScriptedModel([FACTS])).catch_up() == 6

    extractor = ScriptedModel([FACTS])
    restarted = MemoryConsumer(event_log, memories, extractor)
    assert await restarted.catch_up() == 0
    await write_task(event_log, "s2", user_id="u2")
    assert await restarted.catch_up() == 6
    assert [r.session_id for r in extractor.requests] == ["s2"]
    assert await memories.count("u1") == 2
    assert await memories.count("u2") == 2


async def test_a_rerun_over_the_same_events_writes_nothing_twice(
    event_log: SqliteEventLog, memories: EdgeMemoryStore
) -> None:
    await write_task(event_log, "s1", note="Refund orders that are more than 5 days late")
    await MemoryConsumer(event_log, memories, ScriptedModel([FACTS])).catch_up()
    before = await memories.count("u1", current_only=False)

    # a new group starts at offset 0: every event is handled again (the extraction is asked
    # again, a call that costs and is recorded: the first record and the new one are read)
    rerun = MemoryConsumer(event_log, memories, ScriptedModel([FACTS]), group=f"{GROUP}-rerun")
    assert await rerun.catch_up() == 8
    assert await memories.count("u1", current_only=False) == before == 3
    assert await memories.count("u1") == 3


@pytest.mark.parametrize(
    "answer",
    [
        "I think the user is nice.",
        '{"fact": "no list"',
        "",
        ModelError("extraction model unreachable"),
    ],
)
async def test_unusable_extraction_is_skipped_not_a_crash(
    event_log: SqliteEventLog, memories: EdgeMemoryStore, answer: str | Exception
) -> None:
    await write_task(event_log, "s1", note="Refund orders that are more than 5 days late")
    await write_task(event_log, "s2")
    consumer = MemoryConsumer(event_log, memories, ScriptedModel([answer, FACTS]))
    assert await consumer.catch_up() == 13  # two tasks and their extraction calls' records
    (first,) = [e for e in await event_log.read_session("s1") if isinstance(e, ev.AuxiliaryModelCall)]
    assert first.status == ("failed" if isinstance(answer, Exception) else "ok")
    assert first.estimated == isinstance(answer, Exception), "a call that failed is what was sent, estimated"
    texts = {m.text for m in await memories.search("u1", "orders", limit=10)}
    assert "Refund orders that are more than 5 days late" in texts
    assert "The user prefers DHL for shipping" in texts


def test_parse_facts_keeps_the_good_items_and_says_why_others_went() -> None:
    answer = """Here you go:
```json
[{'fact': 'Reports in Chinese', 'tag': 'preference'},
 {"fact": "", "tag": "conclusion"},
 {"fact": "Ship with SF Express", "tag": "gossip"},
 {"fact": "Refund after 5 days", "tag": "agreement"},]
```"""
    facts, problems = parse_facts(answer)
    assert [(f.text, f.tag) for f in facts] == [
        ("Reports in Chinese", "preference"),
        ("Refund after 5 days", "agreement"),
    ]
    assert len(problems) == 2 and "gossip" in problems[1]
    assert parse_facts('{"facts": [{"fact": "x", "tag": "agreement"}]}')[0][0].text == "x"
    assert parse_facts("[]") == ([], [])


async def test_only_answered_tasks_are_distilled(
    event_log: SqliteEventLog, memories: EdgeMemoryStore
) -> None:
    await write_task(event_log, "s1", reason="iteration_cap")
    extractor = ScriptedModel([FACTS])
    await MemoryConsumer(event_log, memories, extractor).catch_up()
    assert extractor.requests == []
    assert await memories.count("u1") == 0


async def test_extraction_through_the_openai_sdk(
    event_log: SqliteEventLog, memories: EdgeMemoryStore
) -> None:
    await write_task(event_log, "s1")
    with serve_openai([FakeReply(text=f"```json\n{FACTS}\n```")]) as server:
        model = OpenAICompatibleModel("fake-model", base_url=server.base_url, api_key="k")
        try:
            await MemoryConsumer(event_log, memories, model).catch_up()
        finally:
            await model.aclose()
        assert server.requests[0]["messages"][0]["role"] == "system"
    assert await memories.count("u1") == 2


class ReadsRecorded(SqliteEventLog):
    """The real log, noting from which version each session read started."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.reads: list[tuple[str, int]] = []

    async def read_session(self, session_id: str, after_version: int = 0) -> list[ev.Event]:
        self.reads.append((session_id, after_version))
        return await super().read_session(session_id, after_version)


async def test_a_task_is_read_from_its_user_message_not_from_the_start(
    tmp_path: Path, memories: EdgeMemoryStore
) -> None:
    log = ReadsRecorded(tmp_path / "events.db", partitions=4)
    try:
        await write_task(log, "s1")
        second = [
            ev.UserMessageReceived(
                session_id="s1", version=6, message_id="m2", text="Use SF Express now.", user_id="u1"
            ),
            ev.TurnStarted(session_id="s1", version=7, turn_id="t2", message_id="m2"),
            ev.AssistantMessage(session_id="s1", version=8, turn_id="t2", message_id="a2", text="SF it is."),
            ev.TurnFinished(
                session_id="s1", version=9, turn_id="t2", message_id="m2", reason="answered",
                iterations=0, model_calls=1, input_tokens=1, output_tokens=1,
            ),
        ]  # fmt: skip
        await log.append(second, expected_version=5)
        extractor = ScriptedModel([FACTS, FACTS])
        # the 9 events written, then the 2 extraction calls the consumer recorded on the same log
        assert await MemoryConsumer(log, memories, extractor).catch_up() == 11
        recorded = [e for e in await log.read_session("s1", 9) if isinstance(e, ev.AuxiliaryModelCall)]
        assert [(e.purpose, e.turn_id) for e in recorded] == [
            ("memory_extraction", "turn-s1"),
            ("memory_extraction", "t2"),
        ]
        assert log.reads[:2] == [("s1", 1), ("s1", 5)]  # from each turn's user message (versions 2 and 6)
        assert extractor.requests[1].messages[1].content == "User: Use SF Express now.\nAssistant: SF it is."
    finally:
        await log.close()


async def test_only_the_sessions_of_its_agents(event_log: SqliteEventLog, memories: EdgeMemoryStore) -> None:
    await write_task(event_log, "s1", note="Refund orders that are more than 5 days late")
    other = [ev.SessionCreated(session_id="s2", version=1, agent_id="other", user_id="u1")]
    await event_log.append(other, expected_version=0)
    noted = ev.MemoryNoted(
        session_id="s2", version=2, turn_id="t", call_id="c", user_id="u1", text="Likes tea", tag="preference"
    )
    await event_log.append([noted], expected_version=1)
    consumer = MemoryConsumer(event_log, memories, agent_ids={"support"})
    assert await consumer.catch_up() == 8
    assert {m.text for m in await memories.search("u1", "orders tea", limit=10)} == {
        "Refund orders that are more than 5 days late"
    }
