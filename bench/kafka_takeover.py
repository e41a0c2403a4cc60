#!/usr/bin/env python
"""What taking over a Kafka partition costs: without the session index the new owner (and any
reader that owns nothing) reads the partition from offset 0 into its index
(engine/log/kafka_index.py); with it (engine/log/kafka_sessions.py) it reads the index, folds
the live sessions and the events after the index's watermark.

    scripts/kafka.sh start
    export TURNLOG_KAFKA_BOOTSTRAP=127.0.0.1:9092
    PYTHONPATH=. .venv/bin/python bench/kafka_takeover.py [--sessions 200] [--turns 25] \
        [--live-every 100] [--no-in-process] [--out bench/results/kafka_takeover.json]

One partition holds ``--sessions`` sessions of ``--turns`` answered turns each (9 events a turn:
message, turn start, two state changes, a model call's two events, the answer, the turn's end
and its snapshot; every ``--live-every``-th session has one more turn, running), appended 32
sessions per transaction by an owner that writes the session index. Then, in one run:

* reader catch-up: a fresh log that owns nothing answers ``read_session`` of one session, which
  reads the whole partition (read_committed, decode, fold into the index);
* the floor: the same takeover of an empty partition (join the group, fence, read nothing);
* owner takeover before (``session_index=False``: the full read) and after (from the session
  index): a fresh owner joins the group and takes the partition (fence, read, dead letters),
  until ``wait_owned`` returns; then it reads one finished session it has not loaded;
* in-process: the same records folded into a fresh PartitionIndex without Kafka (decode, and
  index with the per-session fold), to split the time between the broker and the engine.

The topics are deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient

from turnlog.engine import codec
from turnlog.engine import events as ev
from turnlog.engine.errors import LogUnavailableError
from turnlog.engine.fold import SessionState
from turnlog.engine.log.base import LogRecord
from turnlog.engine.log.kafka import KafkaEventLog
from turnlog.engine.log.kafka_index import PartitionIndex
from turnlog.engine.log.kafka_topics import TopicNames
from turnlog.engine.snapshots import SnapshotEncoder, take
from turnlog.engine.states import Cause, SessionStatus
from turnlog.engine.writer import SessionWriter


def session_events(log: KafkaEventLog, sid: str, turns: int, encoder: SnapshotEncoder) -> list[ev.Event]:
    w = SessionWriter(log, SessionState(sid), "bench")
    w.add(ev.SessionCreated, agent_id="a", user_id="u")
    for t in range(turns):
        tid, mid = f"t{t}", f"m{t}"
        w.add(ev.UserMessageReceived, message_id=mid, text=f"question {t} " * 8)
        w.add(ev.TurnStarted, turn_id=tid, message_id=mid)
        w.transition(SessionStatus.PROCESSING, Cause.USER_MESSAGE)
        w.add(ev.ModelCallStarted, turn_id=tid, step=0, model="m", message_count=2 * t + 1, tools_offered=0)
        w.add(
            ev.ModelCallFinished,
            turn_id=tid,
            step=0,
            model="m",
            status="ok",
            input_tokens=50,
            output_tokens=40,
        )
        w.add(ev.AssistantMessage, turn_id=tid, message_id=f"a{t}", text=f"answer {t} " * 16)
        w.transition(SessionStatus.FINISHED, Cause.MODEL_ANSWER)
        w.add(
            ev.TurnFinished, turn_id=tid, message_id=mid, reason="answered", iterations=0,
            model_calls=1, input_tokens=50, output_tokens=40,
        )  # fmt: skip
        take(w, encoder)
    return w.take_pending()


def live_session_events(log: KafkaEventLog, sid: str, turns: int, encoder: SnapshotEncoder) -> list[ev.Event]:
    """A session of ``turns`` answered turns and one more that is running (its worker died)."""
    events = session_events(log, sid, turns, encoder)
    state = SessionState(sid)
    for event in events:
        state.apply(event)
    w = SessionWriter(log, state, "bench")
    w.add(ev.UserMessageReceived, message_id="m-live", text="one more question")
    w.add(ev.TurnStarted, turn_id="t-live", message_id="m-live")
    w.transition(SessionStatus.PROCESSING, Cause.USER_MESSAGE)
    return [*events, *w.take_pending()]


async def write_partition(bootstrap: str, topic: str, sessions: int, turns: int, live_every: int) -> int:
    """Fill the topic's one partition; the writer's close writes the session index."""
    writer = KafkaEventLog(bootstrap, topic=topic, partitions=1, session_timeout_ms=30000)  # a busy machine
    await writer.start()
    await writer.wait_owned()
    encoder = SnapshotEncoder()
    started = time.perf_counter()
    total = 0

    async def one(i: int) -> int:
        sid = f"s{i:06d}"
        build = live_session_events if live_every and i % live_every == 0 else session_events
        events = build(writer, sid, turns, encoder)
        await writer.append(events, expected_version=0)
        return len(events)

    for first in range(0, sessions, 32):  # 32 sessions per transaction (group commit)
        total += sum(await asyncio.gather(*(one(i) for i in range(first, min(first + 32, sessions)))))
    print(f"appended {total} events of {sessions} sessions: {time.perf_counter() - started:.1f} s")
    await writer.close()
    return total


async def until_read(log: KafkaEventLog, sid: str) -> list[ev.Event]:
    """``read_session`` on a fresh reader; a catch-up cut by the log's 30 s operation bound
    continues where it stopped."""
    while True:
        try:
            return await log.read_session(sid)
        except LogUnavailableError:
            continue


async def takeover(bootstrap: str, topic: str, *, session_index: bool, probe: str) -> dict[str, float]:
    """A fresh owner takes the partition over; then reads one session it did not load."""
    owner = KafkaEventLog(
        bootstrap, topic=topic, partitions=1, session_timeout_ms=30000, session_index=session_index
    )
    from_index = owner._reader.from_session_index
    index_s: list[float] = []

    async def timed(part: PartitionIndex) -> bool:  # the index read and the live sessions' fold
        started = time.perf_counter()
        try:
            return await from_index(part)
        finally:
            index_s.append(time.perf_counter() - started)

    owner._reader.from_session_index = timed  # type: ignore[method-assign]
    started = time.perf_counter()
    await owner.start()
    await owner.wait_owned(timeout=1800)
    took = time.perf_counter() - started
    part = owner._owners[0].index
    loaded, unloaded = len(part.sessions), len(part.unloaded)
    started = time.perf_counter()
    events = await owner.read_session(probe)
    probe_s = time.perf_counter() - started
    await owner.close()
    label = "with the session index" if session_index else "full read (no session index)"
    print(
        f"owner takeover, {label}: {took:.2f} s (index read and live sessions' fold {sum(index_s):.2f} s); "
        f"sessions folded {loaded}, left in the index {unloaded}; then read_session of a finished one "
        f"({len(events)} events): {probe_s * 1000:.1f} ms"
    )
    return {
        "index_and_live_s": round(sum(index_s), 3),
        "takeover_s": round(took, 3),
        "sessions_folded": loaded,
        "sessions_unloaded": unloaded,
        "first_read_ms": round(probe_s * 1000, 1),
    }


async def main(sessions: int, turns: int, live_every: int, in_process: bool, out: Path | None) -> None:
    bootstrap = os.environ["TURNLOG_KAFKA_BOOTSTRAP"]
    topic = f"bench.takeover.{uuid.uuid4().hex[:8]}"
    results: dict[str, Any] = {"sessions": sessions, "turns": turns, "live_every": live_every}
    try:
        floor = f"{topic}.empty"  # the floor: join the group, fence, read an empty partition
        await write_partition(bootstrap, floor, 0, 0, 0)
        results["floor"] = await takeover(bootstrap, floor, session_index=True, probe="none")
        await delete_topics(bootstrap, floor)
        total = results["events"] = await write_partition(bootstrap, topic, sessions, turns, live_every)
        probe = f"s{sessions - 1:06d}" if live_every and (sessions - 1) % live_every else "s000001"

        reader = KafkaEventLog(bootstrap, topic=topic, partitions=1, owner=False)
        await reader.start()
        started = time.perf_counter()
        await until_read(reader, "s000000")
        took = time.perf_counter() - started
        print(f"reader catch-up: {total} events in {took:.2f} s = {total / took:,.0f} events/s")
        results["reader_catch_up_s"] = round(took, 3)
        records = reader._owners[0].index.records if in_process else []
        await reader.close()

        results["before"] = await takeover(bootstrap, topic, session_index=False, probe=probe)
        results["after"] = await takeover(bootstrap, topic, session_index=True, probe=probe)

        if in_process:
            values = [codec.encode(r.event) for r in records]
            started = time.perf_counter()
            decoded = [codec.decode(v) for v in values]
            decode_s = time.perf_counter() - started
            started = time.perf_counter()
            PartitionIndex(0).add([LogRecord(0, i, e) for i, e in enumerate(decoded)])
            index_s = time.perf_counter() - started
            print(
                f"in-process: decode {decode_s:.2f} s ({total / decode_s:,.0f}/s), "
                f"index with fold {index_s:.2f} s ({total / index_s:,.0f}/s)"
            )
            results["in_process"] = {"decode_s": round(decode_s, 3), "index_s": round(index_s, 3)}
    finally:
        await delete_topics(bootstrap, topic)
    results["load_average"] = os.getloadavg()[0]
    if out is not None:
        out.write_text(json.dumps(results, indent=1) + "\n")


async def delete_topics(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics(list(TopicNames(topic).all()))
    finally:
        await admin.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--turns", type=int, default=25)
    parser.add_argument("--live-every", type=int, default=100, help="every n-th session has a turn running")
    parser.add_argument("--no-in-process", action="store_true", help="skip the in-process decode and fold")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    asyncio.run(main(args.sessions, args.turns, args.live_every, not args.no_in_process, args.out))
