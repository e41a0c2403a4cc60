"""The analytics consumer: daily aggregates from the event stream, exactly once, rebuildable."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from turnlog.consumers import TurnWorker
from turnlog.consumers.analytics import AnalyticsConsumer
from turnlog.engine import (
    Agent,
    AgentDirectory,
    AgentSessions,
    FunctionModel,
    SqliteEventLog,
    ToolFailure,
    call,
    reply,
    tool,
)
from turnlog.engine import events as ev
from turnlog.engine.models.base import ModelRequest, ModelResponse
from turnlog.projections import SqliteProjectionStore


@tool
async def ok_tool(n: int) -> int:
    """Doubles n."""
    return 2 * n


@tool
async def bad_tool() -> str:
    """Fails."""
    raise ToolFailure("nope")


def answer(request: ModelRequest) -> ModelResponse | str:
    if request.messages[-1].role == "user":
        return reply("", call("ok_tool", {"n": 2}, "a"), call("bad_tool", {}, "b"))
    return "done"


async def guard_stopped_session(log: SqliteEventLog) -> None:
    """A session a loop guard stopped (the tool layer writes these; here a producer does)."""
    sid, turn = ev.new_id(), ev.new_id()
    await log.append(
        [
            ev.SessionCreated(session_id=sid, version=1, agent_id="a", user_id="u"),
            ev.UserMessageReceived(session_id=sid, version=2, message_id="m", text="go"),
            ev.TurnStarted(session_id=sid, version=3, turn_id=turn, message_id="m"),
            ev.StateChanged(
                session_id=sid, version=4, from_state="IDLE", to_state="PROCESSING", cause="user_message"
            ),
            ev.StateChanged(
                session_id=sid, version=5, from_state="PROCESSING", to_state="FINISHED", cause="guard"
            ),
            ev.TurnFinished(
                session_id=sid,
                version=6,
                turn_id=turn,
                message_id="m",
                reason="guard",
                iterations=3,
                model_calls=3,
                input_tokens=0,
                output_tokens=0,
            ),
        ],
        expected_version=0,
    )


async def test_daily_aggregates_exactly_once_and_rebuildable(tmp_path: Path) -> None:
    log = SqliteEventLog(tmp_path / "log.db", partitions=3)
    store = SqliteProjectionStore(tmp_path / "projections.db")
    agents = AgentDirectory([Agent.build("a", FunctionModel(answer, name="m"), [ok_tool, bad_tool])])
    api = AgentSessions(log, agents)
    for user in ("u1", "u2", "u3"):
        sid = (await api.create_session("a", user)).session_id
        await api.post_user_message(sid, "go")
    await TurnWorker(log, agents).poll_once()
    await guard_stopped_session(log)

    analytics = AnalyticsConsumer(log, store, batch=7)  # small batches: several transactions
    assert await analytics.catch_up() > 0
    report = analytics.report(days=2)

    every = [r.event for p in range(log.partitions) for r in await log.read_partition(p, 0, 10_000)]
    finished_models = [e for e in every if isinstance(e, ev.ModelCallFinished)]
    today = dt.datetime.fromtimestamp(every[0].time_ms / 1000, dt.UTC).date().isoformat()
    (day,) = report["days"]
    assert day == {
        "day": today,
        "sessions": 4,
        "turns": 4,
        "model_calls": len(finished_models),
        "model_errors": 0,
        "input_tokens": sum(e.input_tokens for e in finished_models),
        "output_tokens": sum(e.output_tokens for e in finished_models),
        "tool_calls": 6,
        "guard_stops": 1,
    }
    tools = {t["tool_name"]: t for t in report["tools"]}
    assert (tools["ok_tool"]["calls"], tools["ok_tool"]["successes"], tools["ok_tool"]["success_rate"]) == (
        3,
        3,
        1.0,
    )
    assert (tools["bad_tool"]["calls"], tools["bad_tool"]["successes"]) == (3, 0)
    elapsed = [e.elapsed_ms for e in every if isinstance(e, ev.ToolCallFinished) and e.tool_name == "ok_tool"]
    assert tools["ok_tool"]["elapsed_ms_max"] == max(elapsed)

    # a restarted consumer (same group, offsets in the same database) counts nothing twice
    assert await AnalyticsConsumer(log, store).catch_up() == 0
    assert AnalyticsConsumer(log, store).report(days=2) == report
    assert all(lag == 0 for lag in (await analytics.lag()).values())
    # a batch handed over again (a stale pass, a redelivery) is dropped inside the transaction
    records = [r for p in range(log.partitions) for r in await log.read_partition(p, 0, 10_000)]
    assert analytics.tables.apply(records) == 0
    assert await analytics.tables.apply_async(records[2:9]) == 0
    assert analytics.report(days=2) == report

    # dropped and refolded from offset 0: identical
    analytics.tables.reset()
    await analytics.catch_up()
    assert analytics.report(days=2) == report
    store.close()
    await log.close()
