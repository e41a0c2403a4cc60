"""Projections: folded from the log exactly once, in order, and identical after a rebuild."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from turnlog.consumers import Projector
from turnlog.engine import (
    Agent,
    AgentDirectory,
    AgentSessions,
    FunctionModel,
    ModelRequest,
    OutOfOrderError,
    ToolFailure,
    call,
    reply,
    tool,
)
from turnlog.engine import events as ev
from turnlog.engine.log.base import EventLog
from turnlog.projections import ProjectionStore, rebuild
from turnlog.projections.rebuild import catch_up
from turnlog.projections.schema import READ_MODELS


@tool(idempotent=True)
async def lookup(order_id: str) -> dict:
    """Look up an order."""
    if order_id == "missing":
        raise ToolFailure("order not found")
    return {"order_id": order_id, "status": "delayed"}


def _script(request: ModelRequest):
    """Per turn: look up the order named in the user message, then answer."""
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    results = [m for m in request.messages[last_user + 1 :] if m.role == "tool"]
    if not results:
        order = request.messages[last_user].content.split()[-1]
        return reply("", call("lookup", {"order_id": order}, f"c{len(request.messages)}"))
    return reply(f"answer: {results[-1].content}")


async def _workload(api: AgentSessions, sessions: int = 4, turns: int = 3) -> list[str]:
    ids = []
    for s in range(sessions):
        info = await api.create_session("agent", f"user-{s}")
        ids.append(info.session_id)
        for t in range(turns):
            order = "missing" if (s, t) == (1, 1) else f"O-{s}{t}"
            async for _ in api.send_user_message(info.session_id, f"where is {order}"):
                pass
    return ids


@pytest.fixture
async def setup(log: EventLog, store: ProjectionStore):
    """Both backends: the SQLite log and store, or Kafka and PostgreSQL."""
    api = AgentSessions(log, AgentDirectory([Agent.build("agent", FunctionModel(_script), [lookup])]))
    yield log, store, api


def snapshot(store: ProjectionStore) -> dict[str, list[dict]]:
    return {name: store.table(name) for name in READ_MODELS}


async def test_rebuild_gives_identical_tables_row_for_row(setup) -> None:
    log, store, api = setup
    projector = Projector(log, store, idle_wait_s=0.05)
    running = asyncio.create_task(projector.run())  # live, while turns are being written
    ids = await _workload(api)
    await asyncio.sleep(0)
    projector.stop()
    await running
    await projector.catch_up()
    live = snapshot(store)
    assert len(live["sessions"]) == 4 and all(r["current_state"] == "FINISHED" for r in live["sessions"])

    applied = await rebuild(log, store)
    assert applied == sum([await log.session_version(sid) for sid in ids])
    assert snapshot(store) == live


async def test_rows_follow_the_log(setup) -> None:
    log, store, api = setup
    ids = await _workload(api, sessions=2, turns=2)
    await catch_up(log, store)
    for sid in ids:
        row = store.session(sid)
        assert row is not None
        assert row["state_version"] == await log.session_version(sid)
        assert row["turns"] == 2 and row["closed"] == 0
        messages = store.rows_of("messages", sid)
        assert [m["seq"] for m in messages] == list(range(1, len(messages) + 1))
        assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"] * 2
        path = [(s["from_state"], s["to_state"]) for s in store.rows_of("state_changes", sid)]
        assert path[:3] == [("IDLE", "PROCESSING"), ("PROCESSING", "TOOL_WAIT"), ("TOOL_WAIT", "PROCESSING")]
    # two calls can be made in the same millisecond: pick the failed one by its input, not its place
    calls = store.rows_of("tool_calls", ids[1])
    (failed,) = [c for c in calls if c["input_json"] == '{"order_id": "missing"}']
    assert failed["status"] == "failed" and failed["content"].startswith("[FAILED]")
    assert failed["elapsed_time_ms"] is not None
    model_calls = store.rows_of("model_calls", ids[0])
    assert all(m["status"] == "ok" and m["finished_at_ms"] >= m["started_at_ms"] for m in model_calls)


async def test_applying_twice_is_a_no_op(setup) -> None:
    log, store, api = setup
    (sid,) = await _workload(api, sessions=1, turns=1)
    events = await log.read_session(sid)
    assert store.apply_events(events) == len(events)
    before = snapshot(store)
    assert store.apply_events(events) == 0
    assert store.apply_events(events[3:7]) == 0
    assert snapshot(store) == before


async def test_out_of_order_is_refused_and_changes_nothing(setup) -> None:
    log, store, api = setup
    (sid,) = await _workload(api, sessions=1, turns=1)
    events = await log.read_session(sid)
    store.apply_events(events[:2])
    before = snapshot(store)
    with pytest.raises(OutOfOrderError, match=r"refusing .* v4 \(missing v3\)"):
        store.apply_events([events[3]])
    with pytest.raises(OutOfOrderError):  # a batch is all or nothing
        store.apply_events([events[2], events[4]])
    assert snapshot(store) == before


async def test_offsets_move_with_the_rows(setup) -> None:
    log, store, api = setup
    await _workload(api, sessions=3, turns=1)
    await catch_up(log, store)
    for p in range(log.partitions):  # on Kafka the end offset also counts transaction markers
        assert 0 < store.next_offset(p) <= await log.end_offset(p) or await log.end_offset(p) == 0
        assert await log.read_partition(p, store.next_offset(p)) == []
    assert await catch_up(log, store) == 0


async def test_force_finished_session_is_closed_in_the_projection(setup) -> None:
    log, store, api = setup
    (sid,) = await _workload(api, sessions=1, turns=1)
    await api.force_finish(sid, "customer asked to stop")
    await catch_up(log, store)
    row = store.session(sid)
    assert row is not None and row["closed"] == 1 and row["close_reason"] == "customer asked to stop"
    assert isinstance((await log.read_session(sid))[-1], ev.SessionClosed)


async def test_turnlog_rebuild_refolds_postgres_from_the_kafka_topic(setup, backend: str) -> None:
    """The CLI on the distributed backend: drop the PostgreSQL tables, refold from offset 0."""
    if backend != "kafka":
        pytest.skip("the embedded rebuild CLI is tested in tests/test_cli_demo.py")
    log, store, api = setup
    await _workload(api, sessions=3, turns=2)
    await catch_up(log, store)
    live = snapshot(store)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "turnlog", "rebuild",
        "--kafka", log.bootstrap, "--topic", log.topics.events, "--partitions", str(log.partitions),
        "--postgres", os.environ["TURNLOG_POSTGRES_DSN"], "--schema", store.schema,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, out.decode()
    events = [len(await log.read_session(row["session_id"])) for row in live["sessions"]]
    assert f"rebuilt 3 sessions from {sum(events)} events" in out.decode()
    assert snapshot(store) == live
