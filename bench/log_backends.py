#!/usr/bin/env python
"""The two log backends side by side: embedded (SQLite log + SQLite projections) and distributed
(Kafka log + PostgreSQL projections).

    scripts/kafka.sh start && scripts/postgres.sh start
    export TURNLOG_KAFKA_BOOTSTRAP=127.0.0.1:9092
    export TURNLOG_POSTGRES_DSN=postgresql://turnlog:turnlog@127.0.0.1:5432/turnlog_test
    PYTHONPATH=. .venv/bin/python bench/log_backends.py [--events 4000] [--out FILE]

For each backend, on a fresh log (fresh topics / a fresh schema):

* append: ``--events`` single-event appends (``EventLog.append``, each durable when it returns:
  one SQLite transaction, or one Kafka transaction), on 1 partition and on 8 partitions, with
  16 sessions appending concurrently (one writer per session, as in the engine);
* consume: a fresh reader reads everything back with ``read_partition`` (a new process's view:
  on Kafka, read_committed from the broker), 1 and 8 partitions;
* latency: a producer submits a user message (``post_user_message``) and a turn worker on the
  same log runs it with a zero-latency scripted model; measured from the submit to the moment a
  reader that polls the log sees the turn's first StateChanged (median and p95 of 50);
* rebuild: ``turnlog.projections.rebuild`` (drop, refold from offset 0) of the appended events into the
  backend's projection store, events per second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from turnlog.consumers import TurnWorker
from turnlog.engine import Agent, AgentDirectory, AgentSessions, KafkaEventLog, ScriptedModel, SqliteEventLog
from turnlog.engine import events as ev
from turnlog.engine.log.base import EventLog
from turnlog.projections import PostgresProjectionStore, SqliteProjectionStore, rebuild
from turnlog.projections.store import ProjectionStore

CONCURRENCY = 16


class Backend:
    def __init__(self, name: str, tmp: Path) -> None:
        self.name = name
        self.tmp = tmp
        self.topics: list[str] = []

    async def log(self, partitions: int, *, owner: bool = True, topic: str | None = None) -> EventLog:
        if self.name == "sqlite":
            return SqliteEventLog(self.tmp / f"{topic or uuid.uuid4().hex}.db", partitions=partitions)
        name = topic or f"bench.{uuid.uuid4().hex[:10]}"
        self.topics.append(name)
        log = KafkaEventLog(
            os.environ["TURNLOG_KAFKA_BOOTSTRAP"], topic=name, partitions=partitions, owner=owner
        )
        await log.start()
        if owner:
            await log.wait_owned()
        return log

    def store(self) -> ProjectionStore:
        if self.name == "sqlite":
            return SqliteProjectionStore(self.tmp / f"p-{uuid.uuid4().hex}.db")
        return PostgresProjectionStore(
            os.environ["TURNLOG_POSTGRES_DSN"], schema=f"bench_{uuid.uuid4().hex[:10]}"
        )


def topic_of(log: EventLog) -> str | None:
    return log.topics.events if isinstance(log, KafkaEventLog) else Path(getattr(log, "path", "x")).stem


async def append_run(backend: Backend, partitions: int, events: int) -> tuple[EventLog, float]:
    log = await backend.log(partitions)
    sessions = [f"s{i}" for i in range(CONCURRENCY)]
    per_session = events // CONCURRENCY

    async def writer(sid: str) -> None:
        await log.append(
            [ev.SessionCreated(session_id=sid, version=1, agent_id="a", user_id="u")], expected_version=0
        )
        for v in range(2, per_session + 1):
            msg = ev.UserMessageReceived(session_id=sid, version=v, message_id=f"m{v}", text="x" * 100)
            await log.append([msg], expected_version=v - 1)

    start = time.perf_counter()
    await asyncio.gather(*(writer(s) for s in sessions))
    elapsed = time.perf_counter() - start
    return log, per_session * CONCURRENCY / elapsed


async def consume_run(backend: Backend, written: EventLog) -> float:
    reader = await backend.log(written.partitions, owner=False, topic=topic_of(written))
    start = time.perf_counter()
    total = 0
    for p in range(reader.partitions):
        offset = 0
        while records := await reader.read_partition(p, offset, 1000):
            total += len(records)
            offset = records[-1].offset + 1
    elapsed = time.perf_counter() - start
    await reader.close()
    return total / elapsed


async def rebuild_run(backend: Backend, written: EventLog) -> float:
    reader = await backend.log(written.partitions, owner=False, topic=topic_of(written))
    store = backend.store()
    start = time.perf_counter()
    applied = await rebuild(reader, store)
    elapsed = time.perf_counter() - start
    store.close()
    await reader.close()
    return applied / elapsed


async def latency_run(backend: Backend, samples: int) -> tuple[float, float]:
    log = await backend.log(4)
    agent = Agent("bench", ScriptedModel(["ok"] * (samples + 5)), [])
    agents = AgentDirectory([agent])
    api = AgentSessions(log, agents, producer="bench")
    worker = TurnWorker(log, agents, worker_id="bench-worker")
    worker.consumer.idle_wait_s = 0.01
    running = asyncio.create_task(worker.run())
    reader = log if backend.name == "sqlite" else await backend.log(4, owner=False, topic=topic_of(log))
    times: list[float] = []
    try:
        for i in range(samples):
            sid = (await api.create_session("bench", "u", session_id=f"lat-{i}")).session_id
            start = time.perf_counter()
            await api.post_user_message(sid, "hi")
            while not any(isinstance(e, ev.StateChanged) for e in await reader.read_session(sid)):
                await asyncio.sleep(0.001)
            times.append((time.perf_counter() - start) * 1000)
    finally:
        worker.stop()
        await running
        if reader is not log:
            await reader.close()
        await log.close()
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.95) - 1]


async def run_backend(name: str, events: int, samples: int, tmp: Path) -> dict[str, Any]:
    backend = Backend(name, tmp)
    result: dict[str, Any] = {}
    for partitions in (1, 8):
        log, rate = await append_run(backend, partitions, events)
        print(f"{name}: append {partitions}p {rate:.0f}/s", file=sys.stderr, flush=True)
        result[f"append_{partitions}p_events_per_s"] = round(rate)
        result[f"consume_{partitions}p_events_per_s"] = round(await consume_run(backend, log))
        if partitions == 8:
            result["rebuild_events_per_s"] = round(await rebuild_run(backend, log))
        await log.close()
    print(f"{name}: consume + rebuild done", file=sys.stderr, flush=True)
    median, p95 = await latency_run(backend, samples)
    result["latency_ms_median"] = round(median, 2)
    result["latency_ms_p95"] = round(p95, 2)
    if name == "kafka":
        await delete_topics(backend.topics)
    return result


async def delete_topics(topics: list[str]) -> None:
    from tests.services import delete_topics as delete

    for topic in topics:
        await delete(os.environ["TURNLOG_KAFKA_BOOTSTRAP"], topic)


def table(results: dict[str, dict[str, Any]]) -> str:
    rows = [
        ("append, 1 partition (events/s)", "append_1p_events_per_s"),
        ("append, 8 partitions (events/s)", "append_8p_events_per_s"),
        ("consume, 1 partition (events/s)", "consume_1p_events_per_s"),
        ("consume, 8 partitions (events/s)", "consume_8p_events_per_s"),
        ("user message -> first StateChanged seen, median (ms)", "latency_ms_median"),
        ("user message -> first StateChanged seen, p95 (ms)", "latency_ms_p95"),
        ("rebuild (events/s)", "rebuild_events_per_s"),
    ]
    names = list(results)
    out = ["| measure | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for label, key in rows:
        out.append(f"| {label} | " + " | ".join(str(results[n].get(key, "-")) for n in names) + " |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=4000)
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--out", default="bench/results/backends.json")
    args = parser.parse_args()
    backends = ["sqlite"]
    if os.environ.get("TURNLOG_KAFKA_BOOTSTRAP") and os.environ.get("TURNLOG_POSTGRES_DSN"):
        backends.append("kafka")
    else:
        print(
            "TURNLOG_KAFKA_BOOTSTRAP / TURNLOG_POSTGRES_DSN not set: embedded backend only", file=sys.stderr
        )
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in backends:
            results["SQLite + SQLite" if name == "sqlite" else "Kafka + PostgreSQL"] = asyncio.run(
                run_backend(name, args.events, args.samples, Path(tmp))
            )
    print(table(results))
    Path(args.out).write_text(
        json.dumps({"events": args.events, "samples": args.samples, "results": results}, indent=2)
    )


if __name__ == "__main__":
    main()
