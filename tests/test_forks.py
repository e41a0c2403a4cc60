"""Forks of a session, on both backends: a fork from a mid-turn snapshot needs the admin's
choice; ``continue`` is carried on by a turn worker at once and never repeats a side effect its
origin had started for that turn; ``rest`` closes the turn and waits; ``recall_history`` on a
fork finds what the origin had archived before the fork."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from turnlog.consumers import TurnWorker
from turnlog.engine import Agent, AgentDirectory, AgentSessions, EventLog, FunctionModel, call, reply, tool
from turnlog.engine import events as ev
from turnlog.engine.admin import SessionAdmin
from turnlog.engine.context import ContextPolicy
from turnlog.engine.errors import InputError
from turnlog.engine.models.base import ModelRequest, ModelResponse


@dataclass
class Shop:
    """An origin session whose turn looks an order up, then notifies the customer (a side
    effect that cannot be repeated: no key), then answers."""

    api: AgentSessions
    agents: AgentDirectory
    sid: str
    notified: list[str] = field(default_factory=list)


def shop_agents(notified: list[str]) -> AgentDirectory:
    @tool(idempotent=True)
    def lookup(order: str) -> str:
        """Look an order up."""
        return f"{order}: delayed two days"

    @tool
    def send_notification(order: str) -> str:
        """Tell the customer (a message that cannot be unsent)."""
        notified.append(order)
        return f"notified about {order}"

    def decide(request: ModelRequest) -> ModelResponse | str:
        last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
        results = [m for m in request.messages[last_user:] if m.role == "tool"]
        if not results:
            return reply("", call("lookup", {"order": "A-17"}, "c-lookup"))
        if len(results) == 1:
            return reply("", call("send_notification", {"order": "A-17"}, "c-notify"))
        return f"done: {results[-1].content}"

    return AgentDirectory([Agent("shop", FunctionModel(decide), [lookup, send_notification])])


@pytest.fixture
async def shop(log: EventLog) -> Shop:
    notified: list[str] = []
    agents = shop_agents(notified)
    api = AgentSessions(log, agents)
    sid = (await api.create_session("shop", "u1")).session_id
    async for _ in api.send_user_message(sid, "where is A-17?"):
        pass
    assert notified == ["A-17"]
    return Shop(api, agents, sid, notified)


async def mid_turn_snapshot(log: EventLog, sid: str) -> ev.SnapshotTaken:
    """The snapshot after the lookup step: the turn runs on, the notification is still to come."""
    snaps = [e for e in await log.read_session(sid) if isinstance(e, ev.SnapshotTaken)]
    assert [s.last_tool for s in snaps] == ["lookup", "send_notification", "send_notification"]
    assert snaps[0].status == "PROCESSING"
    return snaps[0]


async def test_a_mid_turn_fork_needs_the_admins_choice(log: EventLog, shop: Shop) -> None:
    mid = await mid_turn_snapshot(log, shop.sid)
    with pytest.raises(InputError, match="turn .* running .*unfinished='continue'.*'rest'"):
        await SessionAdmin(log).fork(shop.sid, mid.version)


async def test_a_continued_fork_is_carried_on_by_a_worker_and_never_repeats_the_origins_side_effect(
    log: EventLog, shop: Shop
) -> None:
    mid = await mid_turn_snapshot(log, shop.sid)
    forked = await SessionAdmin(log).fork(shop.sid, mid.version, unfinished="continue")
    carried = json.loads(forked.origin_calls_json)
    assert [(c["tool_name"], c["status"]) for c in carried] == [("send_notification", "success")]

    await TurnWorker(log, shop.agents, worker_id="w").poll_once()  # nobody posts a message

    events = await log.read_session(forked.session_id)
    (finished,) = [e for e in events if isinstance(e, ev.TurnFinished)]
    assert finished.reason == "answered"
    (refused,) = [e for e in events if isinstance(e, ev.ToolCallFinished)]
    assert (refused.tool_name, refused.status) == ("send_notification", "rejected")
    assert "already ran it" in refused.content and "notified about A-17" in refused.content
    assert not [e for e in events if isinstance(e, ev.ToolCallStarted)], "nothing was started again"
    assert shop.notified == ["A-17"], "the customer was notified once, by the origin"
    state = await shop.api.get_state(forked.session_id)
    assert state.turn is None and state.status == "FINISHED"


async def test_a_fork_made_to_rest_closes_the_turn_and_waits_for_a_message(log: EventLog, shop: Shop) -> None:
    mid = await mid_turn_snapshot(log, shop.sid)
    forked = await SessionAdmin(log).fork(shop.sid, mid.version, unfinished="rest")
    events = await log.read_session(forked.session_id)
    assert [e.type for e in events] == ["SessionForked", "StateChanged", "TurnFinished", "SnapshotTaken"]
    moved = events[1]
    assert isinstance(moved, ev.StateChanged)
    assert (moved.from_state, moved.to_state, moved.cause) == ("PROCESSING", "CANCELLED", "admin")
    assert events[2].reason == "cancelled"  # type: ignore[attr-defined]

    await TurnWorker(log, shop.agents, worker_id="w").poll_once()
    assert len(await log.read_session(forked.session_id)) == 4, "a resting fork does nothing on its own"

    async for _ in shop.api.send_user_message(forked.session_id, "where is A-17 now?"):
        pass
    assert shop.notified == ["A-17", "A-17"], "a new request in the fork is the fork's own to act on"
    state = await shop.api.get_state(forked.session_id)
    assert [m.content for m in state.messages if m.role == "user"] == ["where is A-17?", "where is A-17 now?"]


async def test_recall_history_on_a_fork_finds_what_the_origin_archived(log: EventLog) -> None:
    def decide(request: ModelRequest) -> ModelResponse | str:
        last = request.messages[-1]
        offered = [t["name"] for t in request.tools]
        if last.role == "user" and "locker" in last.content and "recall_history" in offered:
            return reply("", call("recall_history", {"query": "locker code"}, "c-recall"))
        if last.role == "tool":
            return f"found: {last.content}"
        return "noted"

    agent = Agent(
        "keeper", FunctionModel(decide), [], context=ContextPolicy(summarizer="extractive", verbatim_turns=1)
    )
    api = AgentSessions(log, AgentDirectory([agent]))
    sid = (await api.create_session("keeper", "u1")).session_id
    for text in ("my locker code is 4471", "the weather is fine", "tea or coffee?"):
        async for _ in api.send_user_message(sid, text):
            pass
    origin = await log.read_session(sid)
    assert any(isinstance(e, ev.HistorySummarized) for e in origin), "the first turns were archived"
    end = [e for e in origin if isinstance(e, ev.SnapshotTaken)][-1]

    forked = await SessionAdmin(log).fork(sid, end.version)
    fork_state = await api.get_state(forked.session_id)
    assert all(m.ref < 0 for m in fork_state.messages), "inherited messages never share a ref with the fork's"
    async for _ in api.send_user_message(forked.session_id, "what was my locker code?"):
        pass

    events = await log.read_session(forked.session_id)
    (recalled,) = [e for e in events if isinstance(e, ev.ToolCallFinished)]
    assert recalled.status == "success" and "my locker code is 4471" in recalled.content
    assert "4471" in (await api.get_history(forked.session_id))[-1].content
