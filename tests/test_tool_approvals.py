"""Approvals: a tool that needs confirmation pauses the session (PAUSED_FOR_USER) with the
pending call visible in the log, the fold and the projections; approve, edit (validated again)
and reject each continue the turn from exactly that point, also across a worker restart."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.approval_worker import PARTITIONS, build_agent
from tests.tool_harness import of, path
from turnlog.consumers import TurnWorker
from turnlog.engine import AgentDirectory, AgentSessions, SessionStatus, SqliteEventLog, ToolStatus
from turnlog.engine import events as ev
from turnlog.engine.errors import ApprovalError, InvalidArgumentsError

REPO = Path(__file__).resolve().parent.parent
PAUSE = [
    ("IDLE", "PROCESSING", "user_message"),
    ("PROCESSING", "TOOL_WAIT", "model_tool_call"),
    ("TOOL_WAIT", "PAUSED_FOR_USER", "approval_required"),
]


async def paused_session(log: SqliteEventLog) -> tuple[AgentSessions, str, list[dict[str, Any]]]:
    refunds: list[dict[str, Any]] = []
    api = AgentSessions(log, AgentDirectory([build_agent(refunds)]))
    sid = (await api.create_session("agent", "u1")).session_id
    streamed = [item async for item in api.send_user_message(sid, "refund A-17 please")]
    assert [e.type for e in streamed if isinstance(e, ev.Event)][-2:] == ["ApprovalRequested", "StateChanged"]
    return api, sid, refunds


async def test_a_call_needing_approval_pauses_with_the_call_visible(
    log: SqliteEventLog, tmp_path: Path
) -> None:
    api, sid, refunds = await paused_session(log)
    events = await log.read_session(sid)
    assert path(events) == PAUSE
    (asked,) = of(events, ev.ApprovalRequested)
    assert (asked.call_id, asked.tool_name, asked.sensitivity) == ("call_refund", "refund", "high")
    assert asked.arguments_json == '{"order_id": "A-17", "amount": 40}'
    assert not of(events, ev.ToolCallStarted) and refunds == []

    state = await api.get_state(sid)
    assert state.status == SessionStatus.PAUSED_FOR_USER
    assert [(c.call_id, c.approval) for c in state.pending_approvals] == [("call_refund", "pending")]

    from turnlog.projections import SqliteProjectionStore
    from turnlog.projections.rebuild import catch_up

    store = SqliteProjectionStore(tmp_path / "p.db")
    await catch_up(log, store)
    assert store.session(sid)["current_state"] == "PAUSED_FOR_USER"  # type: ignore[index]
    (row,) = store.rows_of("tool_calls", sid)
    assert (row["status"], row["approval"]) == ("awaiting_approval", "pending")
    # nothing else happens while paused: running the session again does nothing
    assert [item async for item in api.run_pending(sid)] == []


async def test_approve_runs_the_call_and_the_turn_finishes(log: SqliteEventLog) -> None:
    api, sid, refunds = await paused_session(log)
    items = [item async for item in api.decide_tool_call(sid, "call_refund", "approve", actor="alice")]
    assert refunds == [{"order_id": "A-17", "amount": 40}]
    events = await log.read_session(sid)
    (decided,) = of(events, ev.ApprovalDecided)
    assert (decided.decision, decided.actor) == ("approved", "alice")
    assert path(events)[3:] == [
        ("PAUSED_FOR_USER", "TOOL_WAIT", "user_approval"),
        ("TOOL_WAIT", "PROCESSING", "tool_result"),
        ("PROCESSING", "FINISHED", "model_answer"),
    ]
    assert of(events, ev.AssistantMessage)[-1].text.startswith("refund result: {")
    assert items[0] == decided, "the decision is streamed first, then the rest of the turn"


async def test_edit_validates_again_and_runs_with_the_new_arguments(
    log: SqliteEventLog, tmp_path: Path
) -> None:
    api, sid, refunds = await paused_session(log)
    version = await log.session_version(sid)
    with pytest.raises(InvalidArgumentsError, match="amount must be an integer, got 'forty'"):
        _ = [
            i
            async for i in api.decide_tool_call(
                sid, "call_refund", "edit", arguments={"order_id": "A-17", "amount": "forty"}
            )
        ]
    with pytest.raises(InvalidArgumentsError, match="unknown argument note"):
        await api.post_tool_decision(
            sid, "call_refund", "edit", arguments={"order_id": "A-17", "amount": 1, "note": "x"}
        )
    assert await log.session_version(sid) == version, "a refused edit writes nothing"
    assert (await api.get_state(sid)).status == SessionStatus.PAUSED_FOR_USER

    _ = [
        i
        async for i in api.decide_tool_call(
            sid, "call_refund", "edit", arguments={"order_id": "A-17", "amount": 25}
        )
    ]
    assert refunds == [{"order_id": "A-17", "amount": 25}]
    events = await log.read_session(sid)
    (decided,) = of(events, ev.ApprovalDecided)
    assert (decided.decision, decided.arguments_json) == ("edited", '{"order_id": "A-17", "amount": 25}')
    (finished,) = of(events, ev.ToolCallFinished)
    assert finished.output_json == '{"refunded":25,"order_id":"A-17"}'
    from turnlog.projections import SqliteProjectionStore
    from turnlog.projections.rebuild import catch_up

    store = SqliteProjectionStore(tmp_path / "p.db")
    await catch_up(log, store)
    (row,) = store.rows_of("tool_calls", sid)
    assert (row["status"], row["approval"], row["approved_json"]) == (
        "success",
        "edited",
        '{"order_id": "A-17", "amount": 25}',
    )
    assert row["input_json"] == '{"order_id": "A-17", "amount": 40}', "what the model asked stays"


async def test_reject_reaches_the_model_as_a_result_it_can_explain(log: SqliteEventLog) -> None:
    api, sid, refunds = await paused_session(log)
    _ = [
        i async for i in api.decide_tool_call(sid, "call_refund", "reject", note="already refunded by phone")
    ]
    assert refunds == []
    events = await log.read_session(sid)
    (finished,) = of(events, ev.ToolCallFinished)
    assert finished.status == ToolStatus.DECLINED
    assert finished.content.startswith(
        "[DECLINED BY USER] the user did not approve refund, so it was not run."
    )
    assert "already refunded by phone" in finished.content
    assert not of(events, ev.ToolCallStarted)
    history = await api.get_history(sid)
    assert history[-2].role == "tool" and history[-2].content == finished.content, "the model was sent it"
    assert history[-1].content == "refund result: " + finished.content


async def test_deciding_a_call_that_waits_for_nothing_is_a_clear_error(log: SqliteEventLog) -> None:
    api, sid, _ = await paused_session(log)
    with pytest.raises(
        ApprovalError, match=r"'nope' is not waiting for approval; waiting: call_refund \(refund\)"
    ):
        await api.post_tool_decision(sid, "nope", "approve")
    _ = [i async for i in api.decide_tool_call(sid, "call_refund", "approve")]
    with pytest.raises(ApprovalError, match="waiting: none"):
        await api.post_tool_decision(sid, "call_refund", "approve")


async def test_restart_while_paused_continues_from_the_log(tmp_path: Path) -> None:
    """A real worker process runs the turn until it pauses and exits; a new process (this one,
    with a fresh log handle and runner) takes the decision and a fresh worker finishes the turn."""
    db = tmp_path / "log.db"
    log = SqliteEventLog(db, partitions=PARTITIONS)
    refunds: list[dict[str, Any]] = []
    agents = AgentDirectory([build_agent(refunds)])
    producer = AgentSessions(log, agents, producer="gateway")
    sid = (await producer.create_session("agent", "u1")).session_id
    await producer.post_user_message(sid, "refund A-17 please")
    await log.close()

    subprocess.run([sys.executable, "tests/approval_worker.py", str(db)], cwd=REPO, check=True, timeout=120)

    log = SqliteEventLog(db, partitions=PARTITIONS)
    events = await log.read_session(sid)
    assert path(events) == PAUSE
    assert {e.producer for e in events if isinstance(e, ev.ApprovalRequested)} == {"worker-before-restart"}
    api = AgentSessions(log, agents, producer="gateway")
    written = await api.post_tool_decision(sid, "call_refund", "approve")
    assert [r.event.type for r in written] == ["ApprovalDecided", "StateChanged"]
    assert written == await log.read_session_records(sid, written[0].event.version - 1), "with positions"
    worker = TurnWorker(log, agents, worker_id="worker-after-restart")
    await worker.poll_once()
    assert refunds == [{"order_id": "A-17", "amount": 40}], "run once, by the new worker"
    events = await log.read_session(sid)
    finished = [e for e in events if isinstance(e, ev.TurnFinished)]
    assert len(finished) == 1 and finished[0].producer == "worker-after-restart"
    assert path(events)[-1] == ("PROCESSING", "FINISHED", "model_answer")
    await log.close()


async def test_two_calls_in_one_batch_resume_after_the_last_decision(log: SqliteEventLog) -> None:
    from turnlog.engine import Agent, FunctionModel, ModelRequest, call, reply, tool

    ran: list[str] = []

    @tool(requires_approval=True)
    def send_mail(to: str) -> str:
        """Send a mail."""
        ran.append(to)
        return f"sent to {to}"

    @tool(idempotent=True)
    def lookup(order_id: str) -> str:
        """Look up."""
        ran.append(order_id)
        return "ok"

    def fn(request: ModelRequest) -> Any:
        if request.messages[-1].role == "user":
            return reply(
                "",
                call("send_mail", {"to": "a"}, "m1"),
                call("lookup", {"order_id": "X"}, "l1"),
                call("send_mail", {"to": "b"}, "m2"),
            )
        return "done"

    api = AgentSessions(log, AgentDirectory([Agent.build("agent", FunctionModel(fn), [send_mail, lookup])]))
    sid = (await api.create_session("agent", "u")).session_id
    _ = [i async for i in api.send_user_message(sid, "go")]
    assert [c.call_id for c in (await api.get_state(sid)).pending_approvals] == ["m1", "m2"]
    assert ran == [], "nothing of the batch runs before the decisions"
    first = [i async for i in api.decide_tool_call(sid, "m2", "reject")]
    assert [e.type for e in first] == ["ApprovalDecided"], "still paused: m1 waits"
    with pytest.raises(  # a second decision on m2 names the first (two racing decisions end here)
        ApprovalError, match=r"'m2' \(send_mail\) was already decided: rejected; .* waiting: m1 \(send_mail\)"
    ):
        await api.post_tool_decision(sid, "m2", "approve")
    _ = [i async for i in api.decide_tool_call(sid, "m1", "approve")]
    assert sorted(ran) == ["X", "a"]
    finished = of(await log.read_session(sid), ev.ToolCallFinished)
    assert [(f.call_id, f.status) for f in finished] == [
        ("m1", "success"),
        ("l1", "success"),
        ("m2", "declined"),
    ]


async def test_force_finish_while_paused_closes_the_turn_without_running_the_call(
    log: SqliteEventLog,
) -> None:
    api, sid, refunds = await paused_session(log)
    await api.force_finish(sid, "customer hung up")
    events = await log.read_session(sid)
    assert path(events)[-1] == ("PAUSED_FOR_USER", "FINISHED", "admin")
    assert of(events, ev.TurnFinished)[-1].reason == "forced"
    assert (await api.get_state(sid)).pending_approvals == []
    with pytest.raises(ApprovalError, match="waiting: none"):
        await api.post_tool_decision(sid, "call_refund", "approve")
    assert refunds == []


async def test_direct_invocation_of_an_approval_tool_needs_confirmation(log: SqliteEventLog) -> None:
    refunds: list[dict[str, Any]] = []
    api = AgentSessions(log, AgentDirectory([build_agent(refunds)]))
    sid = (await api.create_session("agent", "u1")).session_id
    refused = await api.invoke_tool(sid, "refund", {"order_id": "A-1", "amount": 5})
    assert refused.status == ToolStatus.REJECTED and "requires the user's approval" in refused.content
    assert refunds == []
    done = await api.invoke_tool(
        sid, "refund", {"order_id": "A-1", "amount": 5}, confirmed=True, actor="agent-7"
    )
    assert done.status == ToolStatus.SUCCESS and refunds == [{"order_id": "A-1", "amount": 5}]
    invoked = of(await log.read_session(sid), ev.ToolInvoked)
    assert [(e.status, e.actor, e.error) for e in invoked] == [
        ("rejected", "api", "approval required"),
        ("success", "agent-7", None),
    ]


async def test_tool_layer_projections_rebuild_to_identical_rows(log: SqliteEventLog, tmp_path: Path) -> None:
    from turnlog.projections import SqliteProjectionStore, rebuild
    from turnlog.projections.rebuild import catch_up
    from turnlog.projections.schema import READ_MODELS

    api, sid, _ = await paused_session(log)
    _ = [
        i
        async for i in api.decide_tool_call(
            sid, "call_refund", "edit", arguments={"order_id": "A-17", "amount": 9}
        )
    ]
    await api.invoke_tool(sid, "refund", {"order_id": "B", "amount": 1}, confirmed=True)
    store = SqliteProjectionStore(tmp_path / "p.db")
    await catch_up(log, store)
    before = {name: [dict(r) for r in store.table(name)] for name in READ_MODELS}
    await rebuild(log, store)
    after = {name: [dict(r) for r in store.table(name)] for name in READ_MODELS}
    assert before == after
    calls = {r["call_id"]: r for r in before["tool_calls"]}
    assert calls["call_refund"]["approval"] == "edited"
    (direct,) = [r for r in before["tool_calls"] if r["invoked_by"] == "api"]
    assert (direct["turn_id"], direct["tool_name"], direct["status"]) == ("", "refund", "success")


async def test_cancel_while_paused_ends_the_wait_without_running_the_call(log: SqliteEventLog) -> None:
    api, sid, refunds = await paused_session(log)
    await api.cancel(sid, "never mind the refund")
    _ = [item async for item in api.run_pending(sid)]
    events = await log.read_session(sid)
    assert path(events)[-1] == ("PAUSED_FOR_USER", "CANCELLED", "interrupt")
    assert of(events, ev.TurnFinished)[-1].reason == "cancelled"
    assert refunds == [] and (await api.get_state(sid)).pending_approvals == []
    with pytest.raises(ApprovalError):
        await api.post_tool_decision(sid, "call_refund", "approve")
