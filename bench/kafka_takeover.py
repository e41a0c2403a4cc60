#!/usr/bin/env python
"""What taking over a Kafka partition costs: the new owner (and any reader that owns nothing)
reads the partition from offset 0 into its index (engine/log/kafka_index.py).

    scripts/kafka.sh start
    export TURNLOG_KAFKA_BOOTSTRAP=127.0.0.1:9092
    PYTHONPATH=. .venv/bin/python bench/kafka_takeover.py [--sessions 200] [--turns 25]

One partition holds ``--sessions`` sessions of ``--turns`` answered turns each (9 events a turn:
message, turn start, two state changes, a model call's two events, the answer, the turn's end
and its snapshot), appended one session per transaction. Then:

* reader catch-up: a fresh log that owns nothing answers ``read_session`` of one session, which
  reads the whole partition (read_committed, decode, fold into the index);
* owner takeover: a fresh owner joins the group and takes the partition (fence, read, dead
  letters), until ``wait_owned`` returns;
* in-process: the same records folded into a fresh PartitionIndex without Kafka (decode, and
  index with the per-session fold), to split the time between the broker and the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid

from engine import codec
from engine import events as ev
from engine.fold import SessionState
from engine.log.base import LogRecord
from engine.log.kafka import KafkaEventLog
from engine.log.kafka_index import PartitionIndex
from engine.snapshots import SnapshotEncoder, take
from engine.states import Cause, SessionStatus
from engine.writer import SessionWriter


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


async def main(sessions: int, turns: int) -> None:
    bootstrap = os.environ["TURNLOG_KAFKA_BOOTSTRAP"]
    topic = f"bench.takeover.{uuid.uuid4().hex[:8]}"
    writer = KafkaEventLog(bootstrap, topic=topic, partitions=1, session_timeout_ms=6000)
    await writer.start()
    await writer.wait_owned()
    encoder = SnapshotEncoder()
    started = time.perf_counter()
    total = 0
    for i in range(sessions):
        events = session_events(writer, f"s{i:05d}", turns, encoder)
        await writer.append(events, expected_version=0)
        total += len(events)
    print(f"appended {total} events in {sessions} transactions: {time.perf_counter() - started:.1f} s")
    await writer.close()

    reader = KafkaEventLog(bootstrap, topic=topic, partitions=1, owner=False)
    await reader.start()
    started = time.perf_counter()
    await reader.read_session("s00000")
    took = time.perf_counter() - started
    print(f"reader catch-up: {total} events in {took:.2f} s = {total / took:,.0f} events/s")
    records = reader._parts[0].records
    await reader.close()

    owner = KafkaEventLog(bootstrap, topic=topic, partitions=1, session_timeout_ms=6000)
    started = time.perf_counter()
    await owner.start()
    await owner.wait_owned()
    took = time.perf_counter() - started
    print(f"owner takeover (join, fence, read, dead letters): {took:.2f} s")
    await owner.close()

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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--turns", type=int, default=25)
    args = parser.parse_args()
    asyncio.run(main(args.sessions, args.turns))
