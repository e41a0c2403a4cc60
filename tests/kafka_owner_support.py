"""Kafka logs that own the one partition of a topic, and sessions written to them: what the
takeover and index-bound tests share. On a real broker (TURNLOG_KAFKA_BOOTSTRAP)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from turnlog.engine import events as ev
from turnlog.engine.admission import AdmissionRules
from turnlog.engine.fold import SessionState
from turnlog.engine.log.kafka import KafkaEventLog
from turnlog.engine.snapshots import SnapshotEncoder, take
from turnlog.engine.states import Cause, SessionStatus
from turnlog.engine.writer import SessionWriter


@contextlib.asynccontextmanager
async def owner_of(bootstrap: str, topic: str, **options: object) -> AsyncIterator[KafkaEventLog]:
    """The owner of the topic's one partition, closed (handing its session index over) after."""
    log = KafkaEventLog(bootstrap, topic=topic, partitions=1, session_timeout_ms=6000, **options)  # type: ignore[arg-type]
    log.admit_with(AdmissionRules())  # as its TurnWorker would: a close and a cancel are submitted below
    await log.start()
    try:
        await log.wait_owned()
        yield log
    finally:
        await log.close()


def message(sid: str, message_id: str) -> ev.UserMessageReceived:
    return ev.UserMessageReceived(session_id=sid, version=0, message_id=message_id, text="hi", user_id="u")


def answered_turn(w: SessionWriter, n: int, encoder: SnapshotEncoder) -> None:
    """A user message and its answered turn, with the turn's snapshot."""
    tid, mid = f"t{n}", f"m{n}"
    w.add(ev.UserMessageReceived, message_id=mid, text=f"question {n}", user_id="u")
    w.add(ev.TurnStarted, turn_id=tid, message_id=mid)
    w.transition(SessionStatus.PROCESSING, Cause.USER_MESSAGE)
    w.add(ev.AssistantMessage, turn_id=tid, message_id=f"a{n}", text=f"answer {n}")
    w.transition(SessionStatus.FINISHED, Cause.MODEL_ANSWER)
    w.add(
        ev.TurnFinished,
        turn_id=tid,
        message_id=mid,
        reason="answered",
        iterations=0,
        model_calls=0,
        input_tokens=0,
        output_tokens=0,
    )
    take(w, encoder)


async def write_finished(log: KafkaEventLog, sid: str, turns: int = 2) -> None:
    w = SessionWriter(log, SessionState(sid), "test")
    w.add(ev.SessionCreated, agent_id="a", user_id="u")
    encoder = SnapshotEncoder()
    for n in range(turns):
        answered_turn(w, n, encoder)
    await log.append(w.take_pending(), expected_version=0)


async def write_live(log: KafkaEventLog, sid: str) -> None:
    """A session whose turn is running (its worker died with the old owner)."""
    w = SessionWriter(log, SessionState(sid), "test")
    w.add(ev.SessionCreated, agent_id="a", user_id="u")
    w.add(ev.UserMessageReceived, message_id="m0", text="question", user_id="u")
    w.add(ev.TurnStarted, turn_id="t0", message_id="m0")
    w.transition(SessionStatus.PROCESSING, Cause.USER_MESSAGE)
    await log.append(w.take_pending(), expected_version=0)


async def full_read(bootstrap: str, topic: str, sids: list[str]) -> dict[str, list[ev.Event]]:
    """The sessions as a process that owns nothing reads them (the whole partition)."""
    reader = KafkaEventLog(bootstrap, topic=topic, partitions=1, owner=False)
    await reader.start()
    try:
        return {sid: await reader.read_session(sid) for sid in sids}
    finally:
        await reader.close()


async def positions(log: KafkaEventLog) -> list[tuple[int, str]]:
    """Every record of the partition a consumer reads from offset 0, 7 at a time: (offset,
    event id)."""
    found: list[tuple[int, str]] = []
    offset = 0
    while records := await log.read_partition(0, offset, limit=7):
        found += [(r.offset, r.event.event_id) for r in records]
        offset = records[-1].offset + 1
    return found
