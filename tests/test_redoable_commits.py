"""The turn loop's redoable commits on the embedded log.

After a tool batch that needed no commit before it (idempotent tools, first starts), the
commit before the next model call is *redoable*: lost, the model is asked again and the tools
run again (engine.tool_step.needs_commit_before). It returns without waiting for its COMMIT, which
the turn's end (or the hold's timer) shares (engine.log.sqlite_commit): a K-step turn costs two
COMMITs, so two fsyncs in ``power`` durability, instead of K + 2. A tool with a side effect
keeps every commit of its turn waiting for its own COMMIT.
"""

from __future__ import annotations

from pathlib import Path

from tests.test_sqlite_group_commit import group_of, held_log, version_elsewhere
from turnlog.engine import Agent, AgentDirectory, AgentSessions, ScriptedModel, call, reply, tool
from turnlog.engine import events as ev
from turnlog.engine.tools import Tool

STEPS = 3


@tool(idempotent=True)
async def lookup(order_id: str) -> dict[str, str]:
    """Look up an order's shipping status."""
    return {"order_id": order_id, "status": "delayed"}


@tool
async def apologise(order_id: str) -> str:
    """Send the order's customer an apology (a side effect: not to be repeated)."""
    return f"sent to the customer of {order_id}"


async def run_turn(log_path: Path, used: Tool) -> tuple[int, int, list[ev.Event], ScriptedModel]:
    """One user turn of STEPS tool steps with ``used``; the COMMITs and the writes it took,
    the session's events, and the model."""
    log = held_log(log_path)
    script = [reply("", call(used.name, {"order_id": f"A{i}"}, f"c{i}")) for i in range(STEPS)]
    model = ScriptedModel([*script, reply("done")])
    api = AgentSessions(log, AgentDirectory([Agent("support", model, tools=[used])]))
    try:
        await api.create_session("support", "u", session_id="s")
        group = group_of(log)
        commits, writes = group.commits, group.writes
        streamed = [item async for item in api.send_user_message("s", "find the late orders")]
        assert any(isinstance(i, ev.AssistantMessage) and i.text == "done" for i in streamed)
        taken = group.commits - commits, group.writes - writes
        # the turn's end waited for its COMMIT, which carried everything before it
        events = await log.read_session("s")
        assert version_elsewhere(log_path, "s") == events[-1].version
    finally:
        await log.close()
    return *taken, events, model


async def test_an_idempotent_tools_turn_takes_two_commits(log_path: Path) -> None:
    commits, writes, events, model = await run_turn(log_path, lookup)
    assert writes == STEPS + 2, "one append per step, before each model call, and the turn's end"
    assert commits == 2, "the user message's, and the turn end's with the redoable steps"
    finished = [e for e in events if isinstance(e, ev.ToolCallFinished)]
    assert [e.call_id for e in finished] == [f"c{i}" for i in range(STEPS)]
    assert isinstance(events[-1], ev.SnapshotTaken) and any(isinstance(e, ev.TurnFinished) for e in events)
    # every model call after the first was sent the results of the steps before it
    tool_results = [sum(1 for m in r.messages if m.role == "tool") for r in model.requests]
    assert tool_results == list(range(STEPS + 1))


async def test_a_tool_with_a_side_effect_keeps_every_commit_waiting(log_path: Path) -> None:
    commits, writes, events, _ = await run_turn(log_path, apologise)
    assert commits == writes, "each append of the turn has its own COMMIT"
    assert writes == 2 * STEPS + 2, "per step: the starts before the tool, the result before the next call"
    assert [e.call_id for e in events if isinstance(e, ev.ToolCallFinished)] == [
        f"c{i}" for i in range(STEPS)
    ]
