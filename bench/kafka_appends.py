#!/usr/bin/env python
"""Appends to one Kafka partition: turnlog's group commit against a bare transaction loop.

    scripts/kafka.sh start
    TURNLOG_KAFKA_BOOTSTRAP=127.0.0.1:9092 PYTHONPATH=. .venv/bin/python bench/kafka_appends.py \
        [--seconds 10] [--out bench/results/kafka_appends.json]

* bare: one aiokafka transactional producer on the same broker, in a loop: begin, send one
  record of an encoded event's size, commit. What one partition's transactions alone allow:
  the floor for one writer's latency; once with aiokafka's defaults and once with the settings
  the owners' producers use (``turnlog.engine.log.kafka_txn``: a shorter wait while the coordinator
  writes the previous transaction's markers).
* turnlog: ``KafkaEventLog.append`` of one event per call on a 1-partition topic, by 1, 16 and
  64 sessions appending concurrently (each session waits for its append before the next, as the
  engine's writers do). Appends that arrive while a transaction is in flight share the next.

Each case runs ``--seconds``; the table gives appends/s, append latency p50/p95 (ms) and the
appends per transaction (from the log's offsets: each transaction ends with a commit marker).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.producer import sender as aiokafka_sender

from tests.services import delete_topics
from turnlog.engine import KafkaEventLog, codec
from turnlog.engine import events as ev
from turnlog.engine.log.kafka_topics import TopicNames, ensure_topics
from turnlog.engine.log.kafka_txn import owner_producer

BOOTSTRAP = os.environ.get("TURNLOG_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
AIOKAFKA_CONCURRENT_TXN_RETRY_S = 0.02


def sample_event(sid: str, version: int) -> ev.Event:
    return ev.UserMessageReceived(session_id=sid, version=version, message_id=f"m{version}", text="x" * 100)


def summary(latencies: list[float], elapsed: float, transactions: int | None) -> dict[str, Any]:
    latencies.sort()
    return {
        "appends_per_s": round(len(latencies) / elapsed),
        "p50_ms": round(statistics.median(latencies), 2),
        "p95_ms": round(latencies[int(len(latencies) * 0.95) - 1], 2),
        "mean_ms": round(statistics.fmean(latencies), 2),
        "max_ms": round(latencies[-1], 2),
        "appends": len(latencies),
        "appends_per_transaction": round(len(latencies) / transactions, 1) if transactions else None,
    }


async def bare_loop(seconds: float, *, tuned: bool) -> dict[str, Any]:
    """The floor: ``tuned`` with the owners' producer settings (engine.log.kafka_txn), else with
    aiokafka's defaults (run first: tuning sets a constant of aiokafka's for the process)."""
    topic = f"bench.bare.{uuid.uuid4().hex[:8]}"
    names = TopicNames(topic)
    await ensure_topics(BOOTSTRAP, names, 1, 1)
    if tuned:
        producer = owner_producer(BOOTSTRAP, "bench", f"{topic}.tx")
    else:
        assert aiokafka_sender.BACKOFF_OVERRIDE == AIOKAFKA_CONCURRENT_TXN_RETRY_S, "run before tuning"
        producer = AIOKafkaProducer(
            bootstrap_servers=BOOTSTRAP, transactional_id=f"{topic}.tx", enable_idempotence=True, acks="all"
        )
    await producer.start()
    value = codec.encode(sample_event("s", 2))
    latencies: list[float] = []
    try:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            began = time.perf_counter()
            async with producer.transaction():
                await producer.send(topic, value, key=b"s", partition=0)
            latencies.append((time.perf_counter() - began) * 1000)
        elapsed = time.perf_counter() - start
    finally:
        await producer.stop()
        await delete_topics(BOOTSTRAP, topic)
    return summary(latencies, elapsed, len(latencies))


async def turnlog_appends(sessions: int, seconds: float) -> dict[str, Any]:
    topic = f"bench.append.{uuid.uuid4().hex[:8]}"
    log = KafkaEventLog(BOOTSTRAP, topic=topic, partitions=1)
    await log.start()
    await log.wait_owned()
    latencies: list[float] = []
    offsets: list[int] = []
    stop_at = time.perf_counter() + seconds

    async def writer(sid: str) -> None:
        await log.append(
            [ev.SessionCreated(session_id=sid, version=1, agent_id="a", user_id="u")], expected_version=0
        )
        version = 1
        while time.perf_counter() < stop_at:
            began = time.perf_counter()
            (record,) = await log.append([sample_event(sid, version + 1)], expected_version=version)
            latencies.append((time.perf_counter() - began) * 1000)
            offsets.append(record.offset)
            version += 1

    try:
        start = time.perf_counter()
        await asyncio.gather(*(writer(f"s{i}") for i in range(sessions)))
        elapsed = time.perf_counter() - start
    finally:
        await log.close()
        await delete_topics(BOOTSTRAP, topic)
    offsets.sort()
    transactions = 1 + sum(1 for a, b in zip(offsets, offsets[1:], strict=False) if b != a + 1)
    return summary(latencies, elapsed, transactions)


def table(results: dict[str, dict[str, Any]]) -> str:
    out = [
        "| writer | appends/s | p50 ms | p95 ms | mean ms | max ms | appends per transaction |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        keys = ("appends_per_s", "p50_ms", "p95_ms", "mean_ms", "max_ms", "appends_per_transaction")
        cells = [r[k] for k in keys]
        out.append(f"| {name} | " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(out)


async def run(seconds: float) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    results["floor: bare aiokafka, its defaults"] = await bare_loop(seconds, tuned=False)
    results["floor: bare aiokafka, the owners' settings"] = await bare_loop(seconds, tuned=True)
    print("bare loops done", file=sys.stderr, flush=True)
    for sessions in (1, 16, 64):
        results[f"turnlog, {sessions} session(s)"] = await turnlog_appends(sessions, seconds)
        print(f"turnlog {sessions} done", file=sys.stderr, flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=Path("bench/results/kafka_appends.json"))
    args = parser.parse_args()
    results = asyncio.run(run(args.seconds))
    load = os.getloadavg()
    args.out.write_text(json.dumps({"results": results, "loadavg": load}, indent=1) + "\n")
    print(table(results))
    print(f"load average during the run: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")


if __name__ == "__main__":
    main()
