"""Session expiry and retention (issue 43, item 1), on both backends, with a clock the test
moves: an idle session is closed as expired once (an event on the log, with the transition the
table allows), by one of two sweepers; a later message gets an error that says it expired and
when, or goes to a new session if the agent says so; a stale or busy expiry is refused; after
the retention the content is erased once, and not again after a restart. The sweepers read the
projections (folded here by the Projector) and act through the log; on Kafka the second sweeper
owns no partition, so its expiries go through the inbox to the owner."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import timedelta

import pytest

from tests.lifecycle_support import IDLE, RETAIN, RETAIN_MS, MemoryEraser, TestClock, agents
from tests.tool_harness import of, path
from turnlog.consumers.lifecycle import RETENTION, LifecycleSweeper, sweeper_for
from turnlog.consumers.projector import Projector
from turnlog.engine import AgentDirectory, AgentSessions, Lifecycle, SessionClient
from turnlog.engine import events as ev
from turnlog.engine.errors import (
    ApprovalError,
    ConcurrencyError,
    ConfigurationError,
    SessionActiveError,
    SessionExpiredError,
)
from turnlog.engine.expiry import successor_id
from turnlog.engine.log.base import EventLog
from turnlog.projections.lifecycle import LifecycleStore
from turnlog.projections.store import ProjectionStore

MINUTE = timedelta(minutes=1)
WAIT_S = 60.0
"""Deadline for what another process's log handle or the Kafka owner does in the background."""
Reopen = Callable[[], AbstractAsyncContextManager[EventLog]]


def sweeper(
    api: AgentSessions,
    store: ProjectionStore,
    clock: TestClock,
    *,
    eraser: MemoryEraser | None = None,
    name: str = "s1",
) -> LifecycleSweeper:
    """A sweeper of ``api``'s log; one that owns no partition (a Kafka reader) sweeps them all."""
    owns = bool(api.log.owned_partitions())
    return LifecycleSweeper(api, store, eraser=eraser, clock=clock, name=name, owned_only=owns)


async def answered(api: AgentSessions, agent: str = "desk", text: str = "hello") -> str:
    sid = (await api.create_session(agent, "u1")).session_id
    [item async for item in api.send_user_message(sid, text)]
    return sid


async def closes(log: EventLog, sid: str) -> list[ev.SessionClosed]:
    return of(await log.read_session(sid), ev.SessionClosed)


async def until_closed(log: EventLog, *sids: str) -> None:
    """Wait (bounded) until every session has a SessionClosed on the log: an expiry sent through
    the inbox is applied by the owner in the background."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while True:
        missing = [sid for sid in sids if not await closes(log, sid)]
        if not missing:
            return
        assert loop.time() < deadline, f"not closed within {WAIT_S:g} s: {missing}"
        await log.wait_for_append(0.2)


async def test_an_idle_session_expires_once_with_the_transition_and_the_time(
    log: EventLog, store: ProjectionStore, reopen: Reopen
) -> None:
    directory = agents(Lifecycle(idle_expiry=IDLE))
    api = AgentSessions(log, directory)
    talked = await answered(api)
    silent = (await api.create_session("desk", "u1")).session_id  # no message: IDLE
    projector = Projector(log, store)
    await projector.catch_up()
    clock = TestClock(ev.now_ms())
    async with reopen() as other_log:
        other = AgentSessions(other_log, directory, producer="other")
        first, second = sweeper(api, store, clock), sweeper(other, store, clock, name="s2")

        clock.advance(IDLE - MINUTE)
        assert (await first.sweep_once()).expired == []
        expired_at = clock.advance(2 * MINUTE)
        swept = await asyncio.gather(first.sweep_once(), second.sweep_once())
        await until_closed(log, talked, silent)
        # on Kafka the second one's requests went to the owner's inbox: it cannot tell which won
        assert {sid for s in swept for sid in s.expired} == {talked, silent}

        for sid in (talked, silent):
            (closed,) = await closes(log, sid)
            assert (closed.reason, closed.actor, closed.time_ms) == ("expired", "lifecycle", expired_at)
        assert path(await log.read_session(silent)) == [("IDLE", "FINISHED", "expired")]
        assert path(await log.read_session(talked))[-1] == ("PROCESSING", "FINISHED", "model_answer")

        await projector.catch_up()
        row = store.session(talked)
        assert row is not None and (row["closed"], row["close_reason"]) == (True, "expired")
        assert row["closed_at_ms"] == expired_at
        clock.advance(IDLE * 10)
        again = await asyncio.gather(first.sweep_once(), second.sweep_once())
        assert [s.expired for s in again] == [[], []]
    assert [len(await closes(log, sid)) for sid in (talked, silent)] == [1, 1]

    with pytest.raises(SessionExpiredError) as refused:
        await api.post_user_message(talked, "are you there?")
    assert refused.value.expired_ms == expired_at
    assert "expired at 20" in str(refused.value) and "start a new session" in str(refused.value)
    with pytest.raises(SessionExpiredError, match="expired at 20"):
        [item async for item in api.send_user_message(silent, "hello?")]
    with pytest.raises(SessionExpiredError) as client_refused:  # a producer without the agents
        await SessionClient(log).post_message(talked, "anyone?")
    assert client_refused.value.expired_ms == expired_at


async def test_an_expiry_decided_before_a_message_is_refused(log: EventLog, store: ProjectionStore) -> None:
    api = AgentSessions(log, agents(Lifecycle(idle_expiry=IDLE)))
    sid = await answered(api)
    await Projector(log, store).catch_up()
    read = store.session(sid)
    assert read is not None
    clock = TestClock(ev.now_ms())
    clock.advance(IDLE + MINUTE)
    await api.post_user_message(sid, "one more thing")  # after the sweeper's read of the projections

    swept = await sweeper(api, store, clock).sweep_once()
    assert (swept.expired, swept.refused) == ([], 1)
    with pytest.raises(ConcurrencyError):
        await api.expire(sid, int(read["state_version"]), clock())
    with pytest.raises(SessionActiveError, match="only an idle session expires"):  # a message waits
        await api.expire(sid, (await api.get_state(sid)).version, clock())
    [item async for item in api.run_pending(sid)]
    assert not await closes(log, sid)
    assert (await api.get_state(sid)).turns_finished == 2


async def test_a_session_paused_for_approval_expires_with_its_turn(
    log: EventLog, store: ProjectionStore
) -> None:
    api = AgentSessions(log, agents(Lifecycle(idle_expiry=IDLE)))
    sid = await answered(api, text="refund A-17 please")
    assert str((await api.get_state(sid)).status) == "PAUSED_FOR_USER"
    await Projector(log, store).catch_up()
    clock = TestClock(ev.now_ms())
    clock.advance(IDLE + MINUTE)

    assert (await sweeper(api, store, clock).sweep_once()).expired == [sid]
    events = await log.read_session(sid)
    assert path(events)[-1] == ("PAUSED_FOR_USER", "FINISHED", "expired")
    (finished,) = of(events, ev.TurnFinished)
    assert finished.reason == "expired"
    assert [e.type for e in events[-4:]] == ["StateChanged", "TurnFinished", "SessionClosed", "SnapshotTaken"]
    with pytest.raises(ApprovalError, match="not waiting"):  # the turn it waited in is over
        await api.post_tool_decision(sid, "call-refund", "approve")


async def test_a_message_to_an_expired_session_goes_to_its_successor_when_the_agent_says_so(
    log: EventLog, store: ProjectionStore
) -> None:
    api = AgentSessions(log, agents(desk=Lifecycle(idle_expiry=IDLE, after_expiry="new_session")))
    sid = await answered(api)
    await Projector(log, store).catch_up()
    clock = TestClock(ev.now_ms())
    clock.advance(IDLE + MINUTE)
    assert (await sweeper(api, store, clock).sweep_once()).expired == [sid]

    posted = await asyncio.gather(*(api.post_user_message(sid, f"back again {i}") for i in range(3)))
    successor = successor_id(sid)
    assert {r.event.session_id for r in posted} == {successor}
    events = await log.read_session(successor)
    (created,) = of(events, ev.SessionCreated)
    assert (created.agent_id, created.user_id, created.role) == ("desk", "u1", "user")
    assert json.loads(created.metadata_json) == {"continues": sid}
    assert len(of(events, ev.UserMessageReceived)) == 3
    streamed = [item async for item in api.send_user_message(sid, "and this")]
    assert {e.session_id for e in streamed if isinstance(e, ev.Event)} == {successor}
    assert (await api.get_state(successor)).turns_finished == 4
    assert not of(await log.read_session(sid), ev.UserMessageReceived)[1:]  # the old one took no more


async def test_each_agent_ages_by_its_own_policy_or_the_default(
    log: EventLog, store: ProjectionStore
) -> None:
    directory = agents(Lifecycle(idle_expiry=IDLE), desk=Lifecycle(idle_expiry=4 * IDLE), keeper=True)
    api = AgentSessions(log, directory)
    desk, keeper = await answered(api, "desk"), await answered(api, "keeper")
    never = AgentSessions(log, agents(desk=Lifecycle()))  # its own policy: never expires
    await Projector(log, store).catch_up()
    clock = TestClock(ev.now_ms())

    clock.advance(2 * IDLE)
    assert (await sweeper(api, store, clock).sweep_once()).expired == [keeper]
    assert (await sweeper(never, store, clock).sweep_once()).expired == []
    clock.advance(3 * IDLE)
    assert (await sweeper(api, store, clock).sweep_once()).expired == [desk]


async def test_retention_erases_a_closed_session_once_across_sweepers_and_restarts(
    log: EventLog, store: ProjectionStore, reopen: Reopen
) -> None:
    directory = agents(Lifecycle(idle_expiry=IDLE, retain_closed_for=RETAIN))
    api = AgentSessions(log, directory)
    expiring, finished, open_ = await answered(api), await answered(api), await answered(api)
    projector = Projector(log, store)
    await projector.catch_up()
    clock = TestClock(ev.now_ms())
    erasers = [MemoryEraser(), MemoryEraser(), MemoryEraser()]
    async with reopen() as other_log:
        other = AgentSessions(other_log, directory, producer="other")
        first = sweeper(api, store, clock, eraser=erasers[0])
        second = sweeper(other, store, clock, eraser=erasers[1], name="s2")
        await api.force_finish(finished, "the user left", actor="admin")  # closed now, not expired
        clock.advance(IDLE + MINUTE)
        await api.post_user_message(open_, "still here")  # after the read: open_ is not idle
        assert (await first.sweep_once()).expired == [expiring]
        [item async for item in api.run_pending(open_)]
        await projector.catch_up()
        closed_at = {sid: _closed_at(store, sid) for sid in (finished, expiring)}  # the admin's first

        async def both() -> list[str]:
            swept = await asyncio.gather(first.sweep_once(), second.sweep_once())
            return sorted(sid for s in swept for sid in s.erased)

        clock.set(closed_at[finished] + RETAIN_MS - 60_000)
        assert await both() == []
        clock.set(closed_at[finished] + RETAIN_MS)
        assert await both() == [finished]
        clock.set(closed_at[expiring] + RETAIN_MS)
        assert await both() == [expiring]
        restarted = sweeper(api, store, clock, eraser=erasers[2], name="s1")
        clock.advance(RETAIN)
        assert (await restarted.sweep_once()).erased == []

    asks = [ask for eraser in erasers for ask in eraser.asks]
    assert sorted(asks) == sorted([(expiring, RETENTION), (finished, RETENTION)])  # once each
    rows = {r["session_id"]: r for r in LifecycleStore(store).erasures()}
    assert set(rows) == {expiring, finished} and all(r["erased_ms"] for r in rows.values())


def _closed_at(store: ProjectionStore, sid: str) -> int:
    row = store.session(sid)
    assert row is not None and row["closed_at_ms"] is not None
    return int(row["closed_at_ms"])


async def test_an_erasure_left_by_a_dead_sweeper_is_taken_over_after_its_lease(
    log: EventLog, store: ProjectionStore
) -> None:
    api = AgentSessions(log, agents(Lifecycle(idle_expiry=IDLE, retain_closed_for=RETAIN)))
    sid = await answered(api)
    projector = Projector(log, store)
    await projector.catch_up()
    clock = TestClock(ev.now_ms())
    clock.advance(IDLE + MINUTE)
    assert (await sweeper(api, store, clock, eraser=MemoryEraser()).sweep_once()).expired == [sid]
    await projector.catch_up()
    clock.advance(RETAIN + MINUTE)

    hanging = _HangingEraser()
    dying = sweeper(api, store, clock, eraser=hanging, name="dying")  # type: ignore[arg-type]
    sweep = asyncio.create_task(dying.sweep_once())
    await asyncio.wait_for(hanging.started.wait(), WAIT_S)
    sweep.cancel()  # the process died while erasing: its claim stays
    eraser = MemoryEraser()
    survivor = sweeper(api, store, clock, eraser=eraser, name="survivor")
    assert (await survivor.sweep_once()).erased == []  # the claim's lease still holds
    clock.advance(timedelta(minutes=11))
    assert (await survivor.sweep_once()).erased == [sid]
    assert eraser.asks == [(sid, RETENTION)]


class _HangingEraser:
    def __init__(self) -> None:
        self.started = asyncio.Event()

    async def erase_session(self, session_id: str, reason: str, *, actor: str = "admin") -> None:
        self.started.set()
        await asyncio.Event().wait()


async def test_retention_needs_an_eraser_and_the_policy_sane_values(
    log: EventLog, store: ProjectionStore
) -> None:
    api = AgentSessions(log, AgentDirectory(lifecycle=Lifecycle(retain_closed_for=RETAIN)))
    with pytest.raises(ConfigurationError, match="no eraser"):
        LifecycleSweeper(api, store)
    with pytest.raises(ConfigurationError, match="positive timedelta"):
        Lifecycle(idle_expiry=timedelta(0))
    with pytest.raises(ConfigurationError, match="'refuse' or 'new_session'"):
        Lifecycle(after_expiry="reopen")  # type: ignore[arg-type]
    desk = AgentSessions(log, agents())
    assert sweeper_for(desk, store) is None  # nothing configured: nothing to sweep
