"""Sequencing is idempotent: a submission a session already holds (the same event id, or a user
message with the same message id) never enters the session twice, whoever submits it again and
however (a producer's retry after a lost acknowledgement, a client's retry with its message id,
a second process). And a submission never loses a version race: the log gives it the next
version where it orders appends. Both backends; the Kafka-only interleavings (a lost commit response, an inbox
read again by a new owner) are in tests/test_log_kafka.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import pytest

from tests.procs import worker_agent
from turnlog.consumers import TurnWorker
from turnlog.engine import AgentDirectory, AgentSessions, EventLog
from turnlog.engine import events as ev
from turnlog.engine.errors import ConcurrencyError, DuplicateSubmissionError, InputError, SessionNotFoundError
from turnlog.engine.log.memory import MemoryEventLog


def user_message(sid: str, message_id: str, text: str = "hi") -> ev.UserMessageReceived:
    return ev.UserMessageReceived(session_id=sid, version=0, message_id=message_id, text=text, user_id="u")


def received(events: list[ev.Event]) -> list[str]:
    return [e.message_id for e in events if isinstance(e, ev.UserMessageReceived)]


async def test_a_retried_submission_is_taken_once_and_answered_with_the_held_event(log: EventLog) -> None:
    created = ev.SessionCreated(session_id="s-1", version=1, agent_id="agent", user_id="u")
    assert (await log.submit(created))[0].event.event_id == created.event_id
    assert (await log.submit(created))[0].event.event_id == created.event_id  # a retry, not a conflict
    message = user_message("s-1", "m-1")
    (first,) = await log.submit(message)
    (again,) = await log.submit(message)  # the producer never saw the first acknowledgement
    assert first == again and first.event.version == 2 and again.event.event_id == message.event_id
    assert [first] == await log.read_session_records("s-1", 1), "with its position on the log"
    events = await log.read_session("s-1")
    assert [e.type for e in events] == ["SessionCreated", "UserMessageReceived"]


async def test_a_message_id_resent_by_a_client_enters_the_session_once(log: EventLog) -> None:
    calls: list[str] = []
    agents = AgentDirectory([worker_agent(False, calls)])
    api = AgentSessions(log, agents, producer="gateway")
    sid = (await api.create_session("agent", "u")).session_id
    first = (await api.post_user_message(sid, "where is O-1?", message_id="client-42")).event
    retry = (await api.post_user_message(sid, "where is O-1?", message_id="client-42")).event
    assert retry.event_id == first.event_id and retry.version == first.version
    other = (await api.post_user_message(sid, "and O-2?", message_id="client-43")).event
    await TurnWorker(log, agents, worker_id="w1").poll_once()

    events = await log.read_session(sid)
    assert received(events) == ["client-42", "client-43"]
    assert [e.message_id for e in events if isinstance(e, ev.TurnFinished)] == ["client-42", "client-43"]
    assert other.version > first.version
    with pytest.raises(InputError, match="1 to 128 characters"):
        await api.post_user_message(sid, "hi", message_id="x" * 129)


async def test_another_process_resubmitting_a_held_message_adds_nothing(
    log: EventLog, reopen: Callable[[], AbstractAsyncContextManager[EventLog]]
) -> None:
    await log.submit(ev.SessionCreated(session_id="s-2", version=1, agent_id="agent", user_id="u"))
    message = user_message("s-2", "m-1")
    await log.submit(message)
    async with reopen() as second:
        await second.submit(message)  # on Kafka: through the inbox, to the owner, who skips it
        same_id = user_message("s-2", "m-1")
        await second.submit(same_id)
        marker = user_message("s-2", "m-2")
        await second.submit(marker)
        for _ in range(400):  # the owner sequences in order: once m-2 is in, the repeats were seen
            if received(await log.read_session("s-2")) != ["m-1"]:
                break
            await asyncio.sleep(0.05)
    assert received(await log.read_session("s-2")) == ["m-1", "m-2"]


async def test_an_append_that_repeats_a_held_submission_is_refused(log: EventLog) -> None:
    await log.submit(ev.SessionCreated(session_id="s-3", version=1, agent_id="agent", user_id="u"))
    message = user_message("s-3", "m-1")
    await log.submit(message)
    again = ev.UserMessageReceived(session_id="s-3", version=3, message_id="m-1", text="hi", user_id="u")
    with pytest.raises(DuplicateSubmissionError, match="already holds message m-1 .at version 2."):
        await log.append([again], expected_version=2)
    assert await log.session_version("s-3") == 2


async def test_concurrent_submissions_all_take_the_next_versions_in_turn(
    log: EventLog, reopen: Callable[[], AbstractAsyncContextManager[EventLog]]
) -> None:
    """The log gives a submission its version where it orders appends: 60 submitted at once, from
    two processes, none refused, versions without a gap; a writer whose append then names a
    version a submission took loses the race (its ConcurrencyError, as before)."""
    await log.submit(ev.SessionCreated(session_id="s-4", version=1, agent_id="agent", user_id="u"))
    async with reopen() as second:
        await second.wait_for_append(0)  # on Kafka: a reader that owns nothing
        submitted = await asyncio.gather(
            *(
                (log if i % 2 else second).submit(user_message("s-4", f"m-{i:02d}", f"question {i}"))
                for i in range(60)
            )
        )
        repeated = await asyncio.gather(
            *(log.submit(user_message("s-4", f"m-{i:02d}")) for i in range(0, 60, 7))
        )
    events = await log.read_session("s-4")
    assert [e.version for e in events] == list(range(1, 62))
    assert sorted(received(events)) == [f"m-{i:02d}" for i in range(60)]
    held = {e.message_id: e.version for e in events if isinstance(e, ev.UserMessageReceived)}
    # the other process's come back with version 0 on Kafka (the owner orders them); ours with theirs
    answers = [r.event for rs in [*submitted, *repeated] for r in rs]
    mine = [e for e in answers if isinstance(e, ev.UserMessageReceived) and e.version > 0]
    assert len(mine) >= 30 + 9 and all(held[e.message_id] == e.version for e in mine)
    late = ev.TurnStarted(session_id="s-4", version=2, turn_id="t", message_id="m-00")
    with pytest.raises(ConcurrencyError):
        await log.append([late], expected_version=1)


async def test_the_memory_log_sequences_concurrent_submissions_too() -> None:
    log = MemoryEventLog()
    await log.submit(ev.SessionCreated(session_id="s", version=1, agent_id="agent", user_id="u"))
    taken = [
        r.event
        for rs in await asyncio.gather(*(log.submit(user_message("s", f"m-{i}")) for i in range(20)))
        for r in rs
    ]
    assert sorted(e.version for e in taken) == list(range(2, 22))
    assert (await log.submit(user_message("s", "m-3")))[0].event.version == taken[3].version
    with pytest.raises(SessionNotFoundError):
        await log.submit(user_message("nowhere", "m-1"))
