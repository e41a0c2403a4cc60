"""A Kafka log process holds a bounded share of its partitions in memory (engine/log/kafka_held.py):
past its budget it moves the index's base on and unloads the sessions at rest, and every read,
append, repeat and takeover answers as one that holds everything. The index's own accounting is
checked without a broker; the rest on a real broker (TURNLOG_KAFKA_BOOTSTRAP)."""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import pytest

from tests.kafka_owner_support import full_read, message, owner_of, positions, write_finished, write_live
from tests.openai_server import free_port
from turnlog.consumers.health import log_readiness, serve_health
from turnlog.engine import events as ev
from turnlog.engine.errors import ConcurrencyError
from turnlog.engine.log.base import LogRecord
from turnlog.engine.log.kafka import KafkaEventLog
from turnlog.engine.log.kafka_held import HeldCounts, record_bytes
from turnlog.engine.log.kafka_index import PartitionIndex

BUDGET = 64 * 1024
"""A partition's share: a few sessions of ``write_finished`` (about 13 kB each)."""
SESSIONS = 40


def recounted(part: PartitionIndex) -> int:
    """What the index holds, weighed from scratch: the window, and the loaded sessions' records
    before it."""
    window = sum(record_bytes(r.event) for r in part.records)
    loaded = [r for records in part.session_records.values() for r in records]
    return window + sum(record_bytes(r.event) for r in loaded if r.offset < part.base)


def test_a_record_weighs_its_text_with_its_tool_calls_arguments() -> None:
    bare = ev.AssistantMessage(session_id="s", version=2, turn_id="t", message_id="m", text="hi")
    call = ev.ToolCallSpec(call_id="c", name="n", arguments_json="x" * 1000)
    assert record_bytes(dataclasses.replace(bare, tool_calls=(call,))) - record_bytes(bare) == 1002
    assert record_bytes(dataclasses.replace(bare, text="y" * 502)) - record_bytes(bare) == 500


def test_the_index_counts_what_it_holds_and_unloads_only_idle_sessions() -> None:
    part = PartitionIndex(0, budget=40_000)
    offset, kept = 0, {}
    for n in range(120):
        sid = f"s{n}"
        events: list[ev.Event] = [ev.SessionCreated(session_id=sid, version=1, agent_id="a", user_id="u")]
        if n % 30 == 0:  # a message no turn took yet: live
            events.append(ev.UserMessageReceived(session_id=sid, version=2, message_id="m", text="x" * 500))
        records = [LogRecord(0, offset + i, e) for i, e in enumerate(events)]
        kept[sid] = records
        offset += len(records)
        part.add(records)
        part.trim()
        assert part.held_bytes == recounted(part)
    live = {f"s{n}" for n in range(0, 120, 30)}
    assert live <= set(part.states)
    at_rest = [int(sid[1:]) for sid in part.states if sid not in live]
    assert max(int(sid[1:]) for sid in part.unloaded) < min(at_rest)  # least recently written first
    idle_kept = [n for n in at_rest if part.session_records[f"s{n}"][-1].offset < part.base]
    assert idle_kept  # as many as it takes to hold half the budget, not every idle one
    assert len(part.unloaded) > 60 and part.base > 0
    assert part.counts == HeldCounts(unloaded=len(part.unloaded), loaded=0)
    assert part.window_bytes == sum(part.weights) and len(part.weights) == len(part.records)
    for sid in ("s3", "s4"):  # read back (as ``load`` does from the session's runs)
        part.load(sid, kept[sid])
        assert part.held_bytes == recounted(part)
        assert part.version(sid) == 1 and part.entry(sid).runs == ((int(sid[1:]) + 1, int(sid[1:]) + 2),)
    assert part.unloaded.get("s3") is None and part.states["s3"].version == 1
    unloaded = part.counts.unloaded
    assert part.counts.loaded == 2
    part.trim_at = part.budget = 1  # the next trim unloads every idle session but one kept
    part.trim(keep={"s3"})
    assert "s3" in part.states and "s4" in part.unloaded and part.held_bytes == recounted(part)
    assert part.counts.unloaded > unloaded
    counts = part.counts
    part.reset()  # a takeover that failed half-way starts over, its counts going on
    assert part.counts is counts


async def reads_through(reader: KafkaEventLog, session_id: str, version: int) -> None:
    """Until the reader reads the session at ``version``: a transaction's markers, which make
    its records visible to a read_committed reader, may land a few ms after its commit."""
    for _ in range(100):
        if await reader.session_version(session_id) >= version:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the reader never read {session_id} v{version}")


async def scraped(reader: KafkaEventLog) -> dict[str, int]:
    """The reader's log metrics as a process with a health port serves them on /metrics."""
    port = free_port()
    runner = await serve_health(log_readiness(reader), "127.0.0.1", port)
    try:
        async with httpx.AsyncClient() as client:
            answer = await client.get(f"http://127.0.0.1:{port}/metrics")
    finally:
        await runner.cleanup()
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = [line.split() for line in answer.text.splitlines() if not line.startswith("#")]
    return {name: int(value) for name, value in samples}


def idle_sessions() -> list[str]:
    return [f"idle-{i}" for i in range(SESSIONS)]


async def test_an_owner_past_its_budget_reads_appends_and_refuses_repeats_as_before(
    bootstrap: str, topic: str
) -> None:
    sids = idle_sessions()
    async with owner_of(bootstrap, topic, index_bytes=BUDGET) as owner:
        # at once: a group commit larger than the window, whose sessions stay for their answers
        async with asyncio.timeout(60):
            await asyncio.gather(*(write_finished(owner, sid) for sid in sids))
        await write_live(owner, "live")
        part = owner._owners[0].index
        assert part.held_bytes <= BUDGET + 16 * 1024 and part.held_bytes == recounted(part)
        assert sids[0] in part.unloaded and len(part.unloaded) >= SESSIONS - 5 and part.base > 0
        assert "live" in part.states  # a turn running: never unloaded

        history = await full_read(bootstrap, topic, [*sids, "live"])
        repeat = (await owner.submit(message(sids[0], "m0")))[0].event  # answered long ago, unloaded
        assert (repeat.event_id, repeat.version) == (history[sids[0]][1].event_id, 2)
        stale = ev.TurnStarted(session_id=sids[1], version=14, turn_id="t9", message_id="m1")
        with pytest.raises(ConcurrencyError):
            await owner.append([stale], expected_version=13)
        grown = (await owner.submit(message(sids[2], "new")))[0].event
        assert grown.version == len(history[sids[2]]) + 1

        for sid in [*sids[3:], "live"]:
            assert await owner.read_session(sid) == history[sid]
            assert await owner.session_version(sid) == len(history[sid])
        reader = KafkaEventLog(bootstrap, topic=topic, partitions=1, owner=False)
        await reader.start()
        try:  # a consumer from offset 0 reads below the base what a full read gives
            assert await positions(owner) == await positions(reader)
        finally:
            await reader.close()
        # the sessions each read below the base loaded (7 records: at most 7) are let go again
        assert part.held_bytes <= BUDGET + 7 * 16 * 1024 and part.held_bytes == recounted(part)
    async with owner_of(bootstrap, topic) as second:  # the index it wrote names every session
        index = second._owners[0].index
        assert set(index.unloaded) == set(sids) - {sids[2]}  # its new message waits: live
        assert set(index.sessions) == {"live", sids[2]}
        assert await second.read_session(sids[2]) == [*history[sids[2]], grown]
        assert await second.session_version(sids[5]) == len(history[sids[5]])


async def test_a_reader_that_owns_nothing_holds_its_budget_and_reads_what_the_owner_holds(
    bootstrap: str, topic: str
) -> None:
    sids = idle_sessions()
    async with owner_of(bootstrap, topic) as owner:
        for sid in sids:
            await write_finished(owner, sid)
        reader = KafkaEventLog(bootstrap, topic=topic, partitions=1, owner=False, index_bytes=BUDGET)
        await reader.start()
        try:
            await reads_through(reader, sids[-1], await owner.session_version(sids[-1]))
            part = reader._owners[0].index
            assert sids[0] in part.unloaded and part.held_bytes == recounted(part)
            assert part.held_bytes <= BUDGET + 16 * 1024
            unloaded = len(part.unloaded)
            for sid in sids:
                assert await reader.read_session(sid) == await owner.read_session(sid)
            metrics = await scraped(reader)
            assert metrics["turnlog_kafka_index_budget_bytes"] == BUDGET
            assert metrics["turnlog_kafka_index_bytes"] == part.held_bytes
            assert metrics["turnlog_kafka_index_sessions_loaded_total"] >= unloaded > 0  # each read back
            assert metrics["turnlog_kafka_index_sessions_unloaded_total"] >= unloaded + len(part.unloaded)
            await write_finished(owner, "late")  # read on: a session of the window, folded
            await reads_through(reader, "late", await owner.session_version("late"))
            assert await reader.read_session("late") == await owner.read_session("late")
            assert await positions(reader) == await positions(owner)
            # what its reads of every session and below the base loaded is let go again
            assert part.held_bytes <= BUDGET + 7 * 16 * 1024 and part.held_bytes == recounted(part)
        finally:
            await reader.close()
