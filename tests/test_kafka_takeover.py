"""Taking a Kafka partition over through the session index (engine/log/kafka_sessions.py): the
new owner folds the live sessions and the events after the index's watermark, loads the others
when first asked for, and knows everything its predecessor knew (versions, submission keys,
closed sessions); without an index, or with one that lags, it reads more and is just as right.
On a real broker (TURNLOG_KAFKA_BOOTSTRAP)."""

from __future__ import annotations

import pytest

from tests.kafka_owner_support import full_read, message, owner_of, positions, write_finished, write_live
from turnlog.engine import events as ev
from turnlog.engine.errors import ConcurrencyError, SessionClosedError
from turnlog.engine.fold import fold
from turnlog.engine.log import kafka_commits
from turnlog.engine.log.kafka import KafkaEventLog
from turnlog.engine.snapshots import load_latest

FINISHED = 12


async def test_a_takeover_loads_only_the_live_sessions_and_refuses_repeats_on_the_others(
    bootstrap: str, topic: str
) -> None:
    finished = [f"done-{i}" for i in range(FINISHED)]
    async with owner_of(bootstrap, topic) as first:
        for sid in finished:
            await write_finished(first, sid)
        await write_live(first, "live")
        closed = "closed"
        await first.submit(ev.SessionCreated(session_id=closed, version=1, agent_id="a", user_id="u"))
        await first.submit(ev.SessionClosed(session_id=closed, version=0, reason="done", actor="u"))
        held = (await first.submit(message(finished[0], "client-1")))[0].event
        assert held.version == 16
    history = await full_read(bootstrap, topic, [*finished, "live", closed])

    async with owner_of(bootstrap, topic) as second:
        part = second._owners[0].index
        assert set(part.sessions) == {"live", finished[0]}  # a turn running, a message waiting
        assert set(part.unloaded) == {*finished[1:], closed}
        assert part.states["live"] == fold("live", history["live"])
        assert part.states[finished[0]] == fold(finished[0], history[finished[0]])

        again = (await second.submit(message(finished[0], "client-1")))[0].event  # the same message id
        assert (again.event_id, again.version) == (held.event_id, 16)
        answered = history[finished[1]][1]
        repeat = (await second.submit(message(finished[1], "m0")))[0].event  # answered long ago, not loaded
        assert (repeat.event_id, repeat.version) == (answered.event_id, 2)
        stale = ev.TurnStarted(session_id=finished[1], version=14, turn_id="t9", message_id="m1")
        with pytest.raises(ConcurrencyError):
            await second.append([stale], expected_version=13)
        created = ev.SessionCreated(session_id=finished[2], version=1, agent_id="a", user_id="u")
        with pytest.raises(ConcurrencyError):  # a creation of a session that exists
            await second.submit(created)
        with pytest.raises(SessionClosedError):
            await second.submit(ev.CancelRequested(session_id=closed, version=0, reason="x", actor="u"))
        assert set(part.sessions) == {"live", finished[0], finished[1], finished[2], closed}

        assert await second.read_session(finished[3]) == history[finished[3]]
        state = await load_latest(second, finished[3])  # the snapshot is a cache of the fold
        assert state == fold(finished[3], history[finished[3]][:-1])
        reader = KafkaEventLog(bootstrap, topic=topic, partitions=1, owner=False)
        await reader.start()
        try:  # a consumer reading from 0 gets the records before the watermark too
            assert await positions(second) == await positions(reader)
        finally:
            await reader.close()
        nxt = ev.UserMessageReceived(
            session_id=finished[4], version=0, message_id="m9", text="x", user_id="u"
        )
        assert (await second.submit(nxt))[0].event.version == len(history[finished[4]]) + 1


async def test_without_a_session_index_a_takeover_reads_everything_and_writes_the_index(
    bootstrap: str, topic: str
) -> None:
    finished = [f"old-{i}" for i in range(4)]
    async with owner_of(bootstrap, topic, session_index=False) as first:
        for sid in finished:
            await write_finished(first, sid)
    async with owner_of(bootstrap, topic) as second:  # no index on the topic: the full read
        assert set(second._owners[0].index.sessions) == set(finished) and not second._owners[0].index.unloaded
        with pytest.raises(ConcurrencyError):
            await second.append(
                [ev.TurnStarted(session_id=finished[0], version=2, turn_id="t", message_id="m")],
                expected_version=1,
            )
    async with owner_of(bootstrap, topic) as third:  # the second wrote every session's entry
        assert set(third._owners[0].index.unloaded) == set(finished) and not third._owners[0].index.sessions
        assert await third.session_version(finished[1]) == 15
        assert (await third.read_session(finished[1]))[-1].version == 15


async def test_an_index_that_lags_is_caught_up_from_the_events_after_its_watermark(
    bootstrap: str, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with owner_of(bootstrap, topic) as first:
        for sid in ("a", "b", "c"):
            await write_finished(first, sid)
    async with owner_of(bootstrap, topic) as second:
        # it dies before writing the index again: what it appended is only on the events topic
        monkeypatch.setattr(kafka_commits, "index_due", lambda owner, force=False: False)
        grown = (await second.submit(message("a", "late")))[0].event
        await write_finished(second, "d")
    async with owner_of(bootstrap, topic) as third:
        part = third._owners[0].index
        assert set(part.sessions) == {"a", "d"} and set(part.unloaded) == {"b", "c"}
        assert (await third.submit(message("a", "late")))[0].event.event_id == grown.event_id
        with pytest.raises(ConcurrencyError):
            await third.append(
                [ev.TurnStarted(session_id="d", version=14, turn_id="t", message_id="m")], expected_version=13
            )
        history = await full_read(bootstrap, topic, ["a", "b", "c", "d"])
        for sid, events in history.items():
            assert await third.read_session(sid) == events
