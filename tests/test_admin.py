"""Admin replay and fork (engine.admin and the `turnlog snapshots / fork / replay` commands)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_cli_demo import turnlog
from turnlog.consumers import Projector
from turnlog.engine import (
    Agent,
    AgentDirectory,
    AgentSessions,
    ChatMessage,
    FunctionModel,
    ModelRequest,
    ModelResponse,
    SessionNotFoundError,
    SqliteEventLog,
    call,
    codec,
    fold,
    reply,
    tool,
)
from turnlog.engine import events as ev
from turnlog.engine.admin import SessionAdmin
from turnlog.engine.errors import InputError, SnapshotNotFoundError
from turnlog.engine.log.base import EventLog
from turnlog.projections import SqliteProjectionStore

calls: list[str] = []


@tool
def refund(order_id: str) -> str:
    """Refund an order."""
    calls.append(order_id)
    return f"refunded {order_id}"


def planner(name: str) -> FunctionModel:
    """Refunds the order named in the message in one tool step, then answers; signs with ``name``."""

    def fn(request: ModelRequest) -> ModelResponse | str:
        last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
        done = [m for m in request.messages[last_user + 1 :] if m.role == "tool"]
        order = request.messages[last_user].content.split()[-1]
        if not done:
            return reply("", call("refund", {"order_id": order}, f"c-{order}"))
        return f"{name}: {done[-1].content}"

    return FunctionModel(fn, name=name)


async def raw_rows(log: EventLog, sid: str) -> list[tuple[int, str, bytes]]:
    """The session's records as the log holds them (version, type, encoded bytes), on any backend."""
    return [(e.version, e.type, codec.encode(e)) for e in await log.read_session(sid)]


async def origin_session(log: SqliteEventLog) -> tuple[AgentSessions, str, FunctionModel]:
    old, new = planner("model-a"), planner("model-b")
    agents = AgentDirectory([Agent("a", old, [refund]), Agent("b", new, [refund])])
    api = AgentSessions(log, agents)
    sid = (await api.create_session("a", "u-1")).session_id
    for order in ("O-1", "O-2"):
        async for _ in api.send_user_message(sid, f"refund {order}"):
            pass
    return api, sid, new


async def test_snapshots_list_what_happened_at_each(log: SqliteEventLog) -> None:
    _, sid, _ = await origin_session(log)
    infos = await SessionAdmin(log).snapshots(sid)
    events = {e.version: e for e in await log.read_session(sid)}
    assert [i.version for i in infos] == [v for v, e in events.items() if isinstance(e, ev.SnapshotTaken)]
    assert [(i.status, i.last_tool, i.turns) for i in infos] == [
        ("PROCESSING", "refund", 0),  # after the first tool step
        ("FINISHED", "refund", 1),  # turn end
        ("PROCESSING", "refund", 1),
        ("FINISHED", "refund", 2),
    ]
    assert infos[-1].output_tokens == fold(sid, events.values()).output_tokens > 0
    assert all(i.turn_id for i in infos)


async def test_fork_mid_turn_continues_with_another_model_and_leaves_the_origin_alone(
    log: SqliteEventLog,
) -> None:
    api, sid, model_b = await origin_session(log)
    before = await raw_rows(log, sid)
    after_tool = (await SessionAdmin(log).snapshots(sid))[2]  # second turn, refund ran, no answer yet
    (point,) = [e for e in await log.read_session(sid) if e.version == after_tool.version]
    assert not point.holds_state  # type: ignore[attr-defined]  # a restore point: folded from the turn end
    origin_at = fold(sid, [e for e in await log.read_session(sid) if e.version < after_tool.version])

    with pytest.raises(InputError, match="unfinished='continue'.*unfinished='rest'"):
        await SessionAdmin(log).fork(sid, after_tool.version, agent_id="b")  # the admin must choose
    forked = await SessionAdmin(log).fork(
        sid, after_tool.version, agent_id="b", model="model-b", unfinished="continue"
    )
    assert forked.unfinished == "continue" and forked.refs_renumbered
    assert (forked.version, forked.origin_session_id, forked.origin_version) == (1, sid, after_tool.version)
    fork_state = await api.get_state(forked.session_id)
    assert fork_state.messages == origin_at.messages and fork_state.turn is not None
    assert (fork_state.agent_id, fork_state.status, fork_state.turns_finished) == ("b", "PROCESSING", 1)

    calls.clear()
    async for _ in api.run_pending(forked.session_id):  # finishes the inherited turn
        pass
    assert calls == [], "the refund that already ran is not run again"
    (request,) = model_b.requests
    assert list(request.messages) == origin_at.messages
    fork_events = await log.read_session(forked.session_id)
    assert fork_events[1].type == "ModelCallStarted" and fork_events[1].model == "model-b"  # type: ignore[attr-defined]
    assert (await api.get_history(forked.session_id))[-1] == ChatMessage("assistant", "model-b: refunded O-2")
    assert await raw_rows(log, sid) == before, "forking never alters the origin's events"

    async for _ in api.send_user_message(forked.session_id, "refund O-3"):
        pass
    assert calls == ["O-3"] and await raw_rows(log, sid) == before
    assert (await api.get_state(forked.session_id)).turns_finished == 3


async def test_a_fork_projects_its_inherited_history_and_its_origin(
    log: SqliteEventLog, tmp_path: Path
) -> None:
    api, sid, _ = await origin_session(log)
    end_of_first = (await SessionAdmin(log).snapshots(sid))[1]
    forked = await SessionAdmin(log).fork(sid, end_of_first.version)
    store = SqliteProjectionStore(tmp_path / "p.db")
    try:
        await Projector(log, store).catch_up()
        rows = store.rows_of("messages", forked.session_id)
        origin_rows = store.rows_of("messages", sid)[: len(rows)]
        assert [(r["role"], r["content"]) for r in rows] == [(r["role"], r["content"]) for r in origin_rows]
        assert len(rows) == end_of_first.message_count == 4
        (link,) = store.rows_of("forks", forked.session_id)
        assert (link["origin_session_id"], link["origin_version"]) == (sid, end_of_first.version)
        session = store.session(forked.session_id)
        assert session is not None and (session["current_state"], session["turns"]) == ("FINISHED", 1)
        async for _ in api.send_user_message(forked.session_id, "refund O-9"):
            pass
        await Projector(log, store).catch_up()
        assert [r["seq"] for r in store.rows_of("messages", forked.session_id)] == list(range(1, 9))
    finally:
        store.close()


async def test_fork_refuses_a_version_that_is_not_a_snapshot(log: SqliteEventLog) -> None:
    _, sid, _ = await origin_session(log)
    snaps = [s.version for s in await SessionAdmin(log).snapshots(sid)]
    with pytest.raises(
        SnapshotNotFoundError, match=rf"no snapshot at version 3; its snapshots are at versions {snaps[0]}"
    ):
        await SessionAdmin(log).fork(sid, 3)
    with pytest.raises(SessionNotFoundError):
        await SessionAdmin(log).fork("nope", 3)
    assert [s for s in await SessionAdmin(log).snapshots(sid)] and await log.session_version("nope") == 0


async def test_replay_steps_through_the_events_read_only(log: SqliteEventLog) -> None:
    _, sid, _ = await origin_session(log)
    before = await raw_rows(log, sid)
    events = await log.read_session(sid)
    steps = [(s.event, s.state.status, len(s.state.messages)) async for s in SessionAdmin(log).replay(sid)]
    assert [e for e, _, _ in steps] == events
    assert steps[0][1:] == ("IDLE", 0) and steps[-1][1:] == ("FINISHED", 8)
    window = [s.event.version async for s in SessionAdmin(log).replay(sid, from_version=5, to_version=9)]
    assert window == [6, 7, 8, 9]
    assert await raw_rows(log, sid) == before


def test_cli_snapshots_fork_replay(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert turnlog(home, "demo", "--scripted").returncode == 0
    store = SqliteProjectionStore(home / "projections.db")
    try:
        (session,) = store.sessions()
        sid = session["session_id"]
        snaps = store.rows_of("snapshots", sid)
    finally:
        store.close()
    listed = turnlog(home, "snapshots", sid)
    assert listed.returncode == 0, listed.stderr
    assert "send_notification" in listed.stdout and "FINISHED" in listed.stdout
    assert all(str(r["version"]) in listed.stdout for r in snaps)

    forked = turnlog(home, "fork", sid, str(snaps[1]["version"]), "--unfinished", "rest")
    assert forked.returncode == 0, forked.stderr
    fork_id = forked.stdout.split()[1]
    shown = turnlog(home, "show", fork_id)
    assert shown.returncode == 0 and "query_orders" in shown.stdout

    replayed = turnlog(home, "replay", sid, "--to", "6")
    assert replayed.returncode == 0, replayed.stderr
    lines = replayed.stdout.splitlines()
    assert len(lines) == 6 and lines[0].startswith("v1") and "SessionCreated" in lines[0]
    assert "IDLE -> PROCESSING (user_message)" in replayed.stdout
