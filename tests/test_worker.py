"""The turn worker: consumes user messages from its partitions, runs each turn once, and a
successor continues a turn whose worker was killed mid-way."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from tests.procs import WORKER_PARTITIONS as PARTITIONS
from tests.procs import worker_agent as build_agent
from tests.procs import worker_answer
from turnlog.consumers import TurnWorker
from turnlog.consumers.turn_worker import GROUP
from turnlog.engine import Agent, AgentDirectory, AgentSessions, EventLog, FunctionModel, SqliteEventLog
from turnlog.engine import events as ev
from turnlog.engine.models.tokens import TokenCounter

REPO = Path(__file__).resolve().parent.parent


def types(events: list[ev.Event]) -> list[str]:
    return [e.type for e in events]


async def test_worker_runs_posted_messages_once(log: EventLog) -> None:
    """Both backends (on Kafka this process owns every partition)."""
    calls: list[str] = []
    agents = AgentDirectory([build_agent(False, calls)])
    producer = AgentSessions(log, agents, producer="gateway")
    sids = [(await producer.create_session("agent", f"u{i}")).session_id for i in range(5)]
    for sid in sids:
        await producer.post_user_message(sid, "where is O-1?")
    worker = TurnWorker(log, agents, worker_id="w1")
    await worker.poll_once()
    assert len(calls) == 5
    for sid in sids:
        events = await log.read_session(sid)
        assert types(events[-2:]) == ["TurnFinished", "SnapshotTaken"] and events[-1].producer == "w1"
    for p in range(log.partitions):
        assert await log.committed(GROUP, p) == await log.end_offset(p)

    # redelivery: rewind the group to 0; every message is seen again, no turn runs twice
    versions = [await log.session_version(sid) for sid in sids]
    for p in range(log.partitions):
        await log.commit(GROUP, p, 0)
    await TurnWorker(log, agents, worker_id="w2").poll_once()
    assert [await log.session_version(sid) for sid in sids] == versions
    assert len(calls) == 5


async def test_a_worker_loads_its_agents_tokenizers_before_the_first_turn(tmp_path: Path) -> None:
    """tiktoken's encoding takes about 0.1 s of the event loop to load: at start, not in a turn."""
    asked: list[str] = []

    class Counted(FunctionModel):
        @property
        def token_counter(self) -> TokenCounter:
            asked.append("counter")
            return super().token_counter

    agents = AgentDirectory([Agent.build("agent", Counted(worker_answer))])
    log = SqliteEventLog(tmp_path / "log.db", partitions=PARTITIONS)
    try:
        TurnWorker(log, agents, worker_id="w")
        assert asked == ["counter"]
    finally:
        await log.close()


async def test_workers_split_partitions(log: EventLog) -> None:
    agents = AgentDirectory([build_agent(False, [])])
    producer = AgentSessions(log, agents)
    sids = [(await producer.create_session("agent", f"u{i}")).session_id for i in range(8)]
    for sid in sids:
        await producer.post_user_message(sid, "hi")
    w0 = TurnWorker(log, agents, worker_id="w0", partitions=[0])
    await w0.poll_once()
    for sid in sids:
        events = await log.read_session(sid)
        last = events[-1]
        if log.partition_of(sid) == 0:
            assert types(events[-2:]) == ["TurnFinished", "SnapshotTaken"] and last.producer == "w0"
        else:
            assert last.type == "UserMessageReceived"


async def test_killed_worker_mid_turn_is_continued_by_its_successor(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    log = SqliteEventLog(path, partitions=PARTITIONS)
    agents = AgentDirectory([build_agent(False, [])])
    producer = AgentSessions(log, agents)
    sid = (await producer.create_session("agent", "u1")).session_id
    await producer.post_user_message(sid, "where is O-1?")

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, str(REPO / "tests" / "procs.py"), "sqlite-worker", str(path)]
    proc = subprocess.Popen(command, env=env)
    try:
        for _ in range(600):
            if "ToolCallStarted" in types(await log.read_session(sid)):
                break
            assert proc.poll() is None, "the worker process died before reaching the tool"
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the worker never started the tool")
    finally:
        proc.kill()
        proc.wait()
    before = await log.read_session(sid)
    assert types(before)[-1] == "ToolCallStarted"
    partition = log.partition_of(sid)
    records = await log.read_partition(partition, 0)
    message_offset = next(r.offset for r in records if r.event.type == "UserMessageReceived")
    assert await log.committed(GROUP, partition) == message_offset  # the message was not committed

    calls: list[str] = []
    successor_agents = AgentDirectory([build_agent(False, calls)])
    successor = TurnWorker(log, successor_agents, worker_id="successor")
    await successor.poll_once()

    after = await log.read_session(sid)
    assert [e.version for e in after] == list(range(1, len(after) + 1))
    new = after[len(before) :]
    assert types(new) == [
        "ToolCallStarted",
        "ToolCallFinished",
        "StateChanged",
        "SnapshotTaken",
        "ModelCallStarted",
        "ModelCallFinished",
        "AssistantMessage",
        "StateChanged",
        "TurnFinished",
        "SnapshotTaken",
    ]
    assert calls == ["O-1"]  # the idempotent tool ran again, once
    started, finished = new[0], new[1]
    assert isinstance(started, ev.ToolCallStarted) and started.attempt == 2
    assert (
        isinstance(finished, ev.ToolCallFinished) and finished.status == "success" and finished.attempts == 2
    )
    model = successor_agents.get("agent").model
    assert len(model.requests) == 1  # the recorded first model answer was reused, not asked again
    assert all(e.producer == "successor" for e in new)
    assert await log.committed(GROUP, partition) == await log.end_offset(partition)
    await log.close()
