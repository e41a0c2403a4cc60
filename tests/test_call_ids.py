"""A model that reuses tool-call ids (some number their calls afresh each step) must not confuse
results, approvals or the projections: ids are made unique within a turn, and the tool_calls read
model is keyed by turn."""

from __future__ import annotations

from pathlib import Path

from turnlog.consumers.projector import Projector
from turnlog.engine import AgentDirectory, AgentSessions, SqliteEventLog
from turnlog.engine import events as ev
from turnlog.engine.agent import Agent
from turnlog.engine.models.base import ModelRequest, ModelResponse
from turnlog.engine.models.scripted import FunctionModel, call, reply
from turnlog.engine.tools.registry import tool
from turnlog.projections import SqliteProjectionStore
from turnlog.projections.rebuild import rebuild


@tool(idempotent=True)
def lookup(order_id: str) -> str:
    """Look an order up."""
    return f"{order_id}: delayed"


def same_ids_every_step(request: ModelRequest) -> ModelResponse:
    results = [m for m in request.messages if m.role == "tool"]
    asked = sum(1 for m in request.messages if m.role == "user")
    if len(results) < 2 * asked:  # two lookup steps per turn, both with the id "call_0"
        return reply("", call("lookup", {"order_id": f"O-{len(results)}"}, "call_0"))
    return reply("done")


async def test_reused_call_ids_are_made_unique_and_every_call_is_projected(tmp_path: Path) -> None:
    log = SqliteEventLog(tmp_path / "log.db", partitions=2)
    store = SqliteProjectionStore(tmp_path / "projections.db")
    api = AgentSessions(log, AgentDirectory([Agent.build("a", FunctionModel(same_ids_every_step), [lookup])]))
    sid = (await api.create_session("a", "u")).session_id
    for text in ("first", "second"):
        _ = [item async for item in api.send_user_message(sid, text)]
    await Projector(log, store).catch_up()

    events = await log.read_session(sid)
    requested = [e for e in events if isinstance(e, ev.ToolCallRequested)]
    finished = [e for e in events if isinstance(e, ev.ToolCallFinished)]
    by_turn: dict[str, list[str]] = {}
    for e in requested:
        by_turn.setdefault(e.turn_id, []).append(e.call_id)
    assert [len(ids) for ids in by_turn.values()] == [2, 2]
    assert all(len(set(ids)) == 2 and ids[0] == "call_0" for ids in by_turn.values())
    assert [(e.call_id, e.status) for e in finished] == [(e.call_id, "success") for e in requested]
    rows = store.rows_of("tool_calls", sid)
    assert sorted((r["turn_id"], r["call_id"], r["status"]) for r in rows) == sorted(
        (e.turn_id, e.call_id, "success") for e in requested
    )
    live = {name: store.table(name) for name in ("tool_calls", "messages", "sessions")}
    await rebuild(log, store)
    assert {name: store.table(name) for name in live} == live
    store.close()
    await log.close()


async def test_a_store_made_by_another_schema_is_dropped_and_refolded(tmp_path: Path) -> None:
    """Read models are derived data: a schema change migrates by refolding from the log."""
    import sqlite3

    log = SqliteEventLog(tmp_path / "log.db", partitions=2)
    api = AgentSessions(log, AgentDirectory([Agent.build("a", FunctionModel(same_ids_every_step), [lookup])]))
    sid = (await api.create_session("a", "u")).session_id
    _ = [item async for item in api.send_user_message(sid, "first")]
    store = SqliteProjectionStore(tmp_path / "projections.db")
    await Projector(log, store).catch_up()
    before = store.table("tool_calls")
    store.close()
    with sqlite3.connect(tmp_path / "projections.db") as db:  # as an older release left it
        db.execute("UPDATE projection_schema SET schema_id = 'older'")
        db.execute("ALTER TABLE tool_calls DROP COLUMN superseded_by")
    store = SqliteProjectionStore(tmp_path / "projections.db")
    assert store.table("tool_calls") == [] and store.next_offset(log.partition_of(sid)) == 0
    await Projector(log, store).catch_up()
    assert store.table("tool_calls") == before
    store.close()
    await log.close()
