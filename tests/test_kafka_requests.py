"""Requests from a process that does not own the session's Kafka partition: a cancel, a
force-finish, an approval or budget decision and a fork go through the inbox and the owner
applies them (engine/log/kafka_inbox.py). The force-finish of a running turn from a non-owner
is tests/test_turn_loop.py (both backends)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from decimal import Decimal

import pytest

from tests.services import kafka_log, need_service
from turnlog.consumers import TurnWorker
from turnlog.engine import (
    Agent,
    AgentDirectory,
    AgentSessions,
    FunctionModel,
    SessionAdmin,
    call,
    reply,
    tool,
)
from turnlog.engine import events as ev
from turnlog.engine.budget import Budget
from turnlog.engine.errors import (
    ApprovalError,
    NotAwaitingBudgetError,
    NoTurnRunningError,
    SessionClosedError,
    SessionNotFoundError,
)
from turnlog.engine.log.kafka import KafkaEventLog
from turnlog.engine.models.base import ModelRequest, ModelResponse, Usage
from turnlog.engine.models.pricing import Price, PriceTable


@pytest.fixture
async def owner() -> AsyncIterator[KafkaEventLog]:
    async with kafka_log(need_service("TURNLOG_KAFKA_BOOTSTRAP"), partitions=2) as log:
        yield log


def agents(release: asyncio.Event) -> AgentDirectory:
    @tool(timeout_s=30)
    async def export(table: str) -> str:
        """A long export."""
        await release.wait()
        return "exported"

    def decide(request: ModelRequest) -> ModelResponse | str:
        if request.messages[-1].role == "tool":
            return "done"
        return reply("", call("export", {"table": "orders"}, "x1"))

    return AgentDirectory([Agent("a", FunctionModel(decide), [export])])


async def test_a_cancel_from_a_non_owner_stops_the_owners_turn(owner: KafkaEventLog) -> None:
    release = asyncio.Event()
    api = AgentSessions(owner, agents(release), producer="worker")
    sid = (await api.create_session("a", "u")).session_id
    running = asyncio.create_task(_drain(api, sid, "export everything"))
    await until_logged(owner, sid, ev.ToolCallStarted)
    async with kafka_log(owner.bootstrap, partitions=2, topic=owner.topics.events, owner=False) as other_log:
        other = AgentSessions(other_log, api.agents, producer="tab-2")
        await until_logged(other_log, sid, ev.ToolCallStarted)  # its view of the log may lag a little
        cancelled = await other.cancel(sid, "changed my mind")  # once the owner has sequenced it
        assert (cancelled.request.version > 0, cancelled.request.producer) == (True, "tab-2")
        turn = next(e for e in await owner.read_session(sid) if isinstance(e, ev.TurnStarted))
        assert (cancelled.stopped_turn, cancelled.dropped) == (turn.turn_id, ())
        release.set()
        await asyncio.wait_for(running, 30)
        events = await owner.read_session(sid)
        changes = [(e.from_state, e.to_state, e.cause) for e in events if isinstance(e, ev.StateChanged)]
        assert changes[-1] == ("PROCESSING", "CANCELLED", "interrupt")
        (cancel,) = [e for e in events if isinstance(e, ev.CancelRequested)]
        assert (cancel.reason, cancel.producer) == ("changed my mind", "tab-2")
        with pytest.raises(NoTurnRunningError):
            await other.cancel(sid)  # the owner found nothing to cancel


async def test_a_force_finish_from_a_non_owner_is_refused_as_on_the_owner(owner: KafkaEventLog) -> None:
    api = AgentSessions(owner, agents(asyncio.Event()), producer="worker")
    sid = (await api.create_session("a", "u")).session_id
    async with kafka_log(owner.bootstrap, partitions=2, topic=owner.topics.events, owner=False) as other_log:
        other = AgentSessions(other_log, api.agents, producer="ops")
        await until_logged(other_log, sid, ev.SessionCreated)
        with pytest.raises(SessionNotFoundError):
            await other.force_finish("nobody", "x")
        info = await other.force_finish(sid, "fraud", actor="ops")
        assert (info.status, info.version) == ("FINISHED", 3)
        with pytest.raises(SessionClosedError):
            await other.force_finish(sid, "again")
    events = await owner.read_session(sid)
    assert [e.type for e in events] == ["SessionCreated", "StateChanged", "SessionClosed"]
    assert all(e.producer == "ops" for e in events[1:])
    with pytest.raises(SessionClosedError):  # the owner refuses a close that races another
        await owner.submit(ev.SessionClosed(session_id=sid, version=0, reason="late", actor="ops"))


def approvals_agents(refunds: list[dict[str, object]]) -> AgentDirectory:
    @tool(requires_approval=True)
    def refund(order_id: str, amount: int) -> str:
        """Refund an order (waits for the user's approval)."""
        refunds.append({"order_id": order_id, "amount": amount})
        return f"refunded {amount}"

    def answer(request: ModelRequest) -> ModelResponse | str:
        if request.messages[-1].role == "tool":
            return "result: " + request.messages[-1].content
        return reply("", call("refund", {"order_id": "A-17", "amount": 40}, "r1"))

    def metered(request: ModelRequest) -> ModelResponse:
        text = "A-17 is delayed." if request.messages[-1].role == "tool" else ""
        calls = () if text else (call("lookup", {"order_id": "A-17"}, "l1"),)
        return ModelResponse(text, calls, Usage(100, 100), "stop" if text else "tool_calls", "metered")

    @tool(idempotent=True)
    def lookup(order_id: str) -> str:
        """Look an order up."""
        return "delayed"

    prices = PriceTable(
        {"metered": Price(Decimal("2.5"), Decimal("1.25"), Decimal("10"), max_output_tokens=1000)}
    )
    budget = Budget(per_turn_micros=11_000, on_exceed="pause")  # the second call's worst case is over it
    return AgentDirectory(
        [
            Agent.build("refunds", FunctionModel(answer), [refund]),
            Agent.build(
                "metered", FunctionModel(metered, name="metered"), [lookup], prices=prices, budget=budget
            ),
        ]
    )


async def test_decisions_and_a_fork_from_a_non_owner_are_applied_by_the_owner(owner: KafkaEventLog) -> None:
    refunds: list[dict[str, object]] = []
    directory = approvals_agents(refunds)
    api = AgentSessions(owner, directory, producer="worker")
    worker = TurnWorker(owner, directory, worker_id="worker")
    running = asyncio.create_task(worker.run())
    try:
        paid = (await api.create_session("refunds", "u")).session_id
        paused = (await api.create_session("metered", "u")).session_id
        async with kafka_log(
            owner.bootstrap, partitions=2, topic=owner.topics.events, owner=False
        ) as other_log:
            gateway = AgentSessions(other_log, directory, producer="gateway")
            await gateway.post_user_message(paid, "refund A-17")
            await gateway.post_user_message(paused, "where is A-17?")
            await until_logged(other_log, paid, ev.ApprovalRequested)
            await until_logged(other_log, paused, ev.BudgetExceeded)

            edited = await gateway.post_tool_decision(
                paid, "r1", "edit", arguments={"order_id": "A-17", "amount": 25}
            )
            assert [(r.event.type, r.event.version, r.pending) for r in edited] == [
                ("ApprovalDecided", 0, True)
            ]
            await until_logged(other_log, paid, ev.TurnFinished)
            assert refunds == [{"order_id": "A-17", "amount": 25}]  # run once, as edited
            with pytest.raises(ApprovalError):  # checked on the non-owner's read of the log
                await gateway.post_tool_decision(paid, "r1", "approve")
            late = ev.ApprovalDecided(
                session_id=paid,
                version=0,
                turn_id="t",
                call_id="r1",
                decision="approved",
                arguments_json="{}",
            )
            with pytest.raises(ApprovalError):  # and by the owner: a decision that lost a race
                await owner.submit(late)

            (stop,) = await gateway.post_budget_decision(paused, "stop", note="enough")
            assert (stop.event.type, stop.event.version, stop.pending) == ("BudgetDecided", 0, True)
            await until_logged(other_log, paused, ev.TurnFinished)
            with pytest.raises(NotAwaitingBudgetError):
                await gateway.post_budget_decision(paused, "raise", extra_micros=5)

            snapshot = max(s.version for s in await SessionAdmin(other_log).snapshots(paid))
            (submitted,) = await SessionAdmin(other_log, producer="ops").fork_events(paid, snapshot)
            assert submitted.pending and submitted.event.version == 0
            forked = (await gateway.on_log(submitted, "the fork")).event
            fork_state = await gateway.get_state(forked.session_id)
            assert (forked.version, fork_state.user_id, fork_state.agent_id) == (1, "u", "refunds")
    finally:
        worker.stop()
        await running
    paid_events = await owner.read_session(paid)
    decided = [e for e in paid_events if isinstance(e, ev.ApprovalDecided)]
    assert [(d.decision, d.producer, d.event_id) for d in decided] == [
        ("edited", "gateway", edited[0].event.event_id)
    ]
    assert any(isinstance(e, ev.StateChanged) and e.cause == "user_approval" for e in paid_events)
    budget_events = await owner.read_session(paused)
    finished = [e for e in budget_events if isinstance(e, ev.TurnFinished)]
    assert [(f.reason) for f in finished] == ["budget"]
    assert budget_events[-1].type == "SnapshotTaken"


async def _drain(api: AgentSessions, sid: str, text: str) -> None:
    async for _ in api.send_user_message(sid, text):
        pass


async def until_logged(log: KafkaEventLog, sid: str, kind: type[ev.Event], timeout_s: float = 30.0) -> None:
    """Wait until an event of ``kind`` is on the session's log; fail after ``timeout_s``."""
    for _ in range(int(timeout_s / 0.02)):
        if any(isinstance(e, kind) for e in await log.read_session(sid)):
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"no {kind.type} for {sid} within {timeout_s:g} s")
