"""The analytics export (`turnlog export`): events/s into Parquet, beside the log's own read.

    PYTHONPATH=. .venv/bin/python bench/export.py                       # embedded only
    TURNLOG_KAFKA_BOOTSTRAP=127.0.0.1:9092 PYTHONPATH=. .venv/bin/python bench/export.py

Builds a log of ``--events`` events through the engine (sessions of turns with one tool step
each, the shape of bench/read_throughput.py; on 8 partitions), then, best of ``--reps``:

* embedded: a fresh reader reads every partition with ``read_partition`` (5,000 records a call),
  and a fresh ``Exporter`` exports the log into an empty directory (no content columns);
* Kafka (with ``TURNLOG_KAFKA_BOOTSTRAP``): the same events appended to a fresh topic of ONE
  partition (a session's events per transaction), then a fresh reader that owns nothing reads
  it, and a fresh exporter on a fresh reader exports it.

Wall time and process CPU for each; the export's time includes its log read. Results are
appended under ``--label`` to ``results/export.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any, Awaitable, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from snapshot_load import OneToolModel, lookup  # noqa: E402

from turnlog.consumers.export import Exporter  # noqa: E402
from turnlog.engine import Agent, AgentDirectory, AgentSessions, KafkaEventLog, SqliteEventLog  # noqa: E402
from turnlog.engine.events import Event  # noqa: E402
from turnlog.engine.log.base import EventLog  # noqa: E402
from turnlog.engine.log.kafka_topics import TopicNames  # noqa: E402


async def build(path: Path, events: int) -> list[Event]:
    """A log of at least ``events`` events made by the engine; its events in log order."""
    log = SqliteEventLog(path, durability="process")
    api = AgentSessions(log, AgentDirectory([Agent("a", OneToolModel(), [lookup])]))
    s, found = 0, []
    while len(found) < events:
        sid = (await api.create_session("a", f"u{s}")).session_id
        for n in range(50):
            async for _ in api.send_user_message(sid, f"where is order {n} of session {s}?"):
                pass
        s += 1
        if s % 10 == 0:
            found = [r.event for r in await _all(log)]
    await log.close()
    return found


async def _all(log: EventLog) -> list[Any]:
    found = []
    for p in range(log.partitions):
        offset = 0
        while records := await log.read_partition(p, offset, 5000):
            found += records
            offset = records[-1].offset + 1
    return found


async def timed(fn: Callable[[], Awaitable[int]]) -> tuple[int, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    count = await fn()
    return count, time.perf_counter() - wall, time.process_time() - cpu


async def read_all(opener: Callable[[], Awaitable[EventLog]]) -> int:
    log = await opener()
    try:
        return len(await _all(log))
    finally:
        await log.close()


async def export_all(opener: Callable[[], Awaitable[EventLog]], source: str) -> int:
    log = await opener()
    try:
        with tempfile.TemporaryDirectory(prefix="turnlog-export-") as out:
            exporter = Exporter(log, Path(out), source=source)
            exporter.open()
            try:
                await exporter.export()
            finally:
                exporter.close()
            return exporter.done
    finally:
        await log.close()


Opener = Callable[[], Awaitable[EventLog]]


async def measure(name: str, opener: Opener, source: str, reps: int) -> dict[str, Any]:
    reads = [await timed(lambda: read_all(opener)) for _ in range(reps)]
    exports = [await timed(lambda: export_all(opener, source)) for _ in range(reps)]
    events = reads[0][0]
    read_wall, read_cpu = min(r[1] for r in reads), min(r[2] for r in reads)
    export_wall, export_cpu = min(e[1] for e in exports), min(e[2] for e in exports)
    result = {
        "backend": name,
        "events": events,
        "read_events_per_s_wall": round(events / read_wall),
        "read_events_per_s_cpu": round(events / read_cpu),
        "export_events_per_s_wall": round(events / export_wall),
        "export_events_per_s_cpu": round(events / export_cpu),
        "export_s": round(export_wall, 3),
    }
    print(json.dumps(result), flush=True)
    return result


async def kafka_copy(bootstrap: str, events: list[Event]) -> str:
    """The events on a fresh one-partition topic, each session's events in one transaction."""
    topic = f"bench.export.{uuid.uuid4().hex[:8]}"
    log = KafkaEventLog(bootstrap, topic=topic, partitions=1, owner=True)
    await log.start()
    await log.wait_owned()
    by_session: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        by_session[e.session_id].append(e)
    try:
        for session in by_session.values():
            for i in range(0, len(session), 500):
                await log.append(session[i : i + 500], expected_version=session[i].version - 1)
    finally:
        await log.close()
    return topic


async def delete_topic(bootstrap: str, topic: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics(list(TopicNames(topic).all()))
    finally:
        await admin.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--label", default="after")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "export.json")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="turnlog-export-log-") as tmp:
        path = Path(tmp) / "log.db"
        events = await build(path, args.events)

        async def sqlite() -> EventLog:
            return SqliteEventLog(path)

        results.append(await measure("sqlite (8 partitions)", sqlite, f"sqlite:{path}", args.reps))
    bootstrap = os.environ.get("TURNLOG_KAFKA_BOOTSTRAP")
    if bootstrap:
        topic = await kafka_copy(bootstrap, events)

        async def kafka() -> EventLog:
            log = KafkaEventLog(bootstrap, topic=topic, partitions=1, owner=False)
            await log.start()
            return log

        try:
            results.append(await measure("kafka (1 partition)", kafka, f"kafka:{topic}", args.reps))
        finally:
            await delete_topic(bootstrap, topic)
    run = {
        "label": args.label,
        "results": results,
        "load_average": os.getloadavg()[0],
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    doc = json.loads(args.out.read_text()) if args.out.exists() else {"runs": []}
    doc["runs"].append(run)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
