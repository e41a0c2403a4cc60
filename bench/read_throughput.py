"""Reading the embedded log back: events/s through ``read_partition``, and the decoder alone.

    PYTHONPATH=. .venv/bin/python bench/read_throughput.py              # ~1 min
    PYTHONPATH=/path/to/other/checkout .venv/bin/python bench/read_throughput.py --label before

Builds a log through the engine (sessions of turns with one tool step each, the peers' S3
shape, snapshots on), then times a fresh reader reading every partition from offset 0 with
``read_partition`` (1,000 records a call), wall and process CPU, best of ``--reps``. Then the
codec alone on the same records: ``codec.decode`` (the compiled decoder where the checkout has
one) and fastavro's ``schemaless_reader`` on the same bytes, so both are measured in one run on
one machine. Also the file's size after a checkpoint. Results are appended under ``--label``
to ``results/read.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fastavro  # noqa: E402
from snapshot_load import OneToolModel, lookup  # noqa: E402

from turnlog.engine import Agent, AgentDirectory, AgentSessions, SqliteEventLog, codec  # noqa: E402


async def build(path: Path, sessions: int, turns: int) -> SqliteEventLog:
    log = SqliteEventLog(path, durability="process")
    api = AgentSessions(log, AgentDirectory([Agent("a", OneToolModel(), [lookup])]))
    for s in range(sessions):
        sid = (await api.create_session("a", f"u{s}")).session_id
        for n in range(turns):
            async for _ in api.send_user_message(sid, f"where is order {n} of session {s}?"):
                pass
    return log


async def read_all(path: Path, partitions: int) -> tuple[int, float, float]:
    reader = SqliteEventLog(path, partitions=partitions)
    wall, cpu = time.perf_counter(), time.process_time()
    total = 0
    for p in range(partitions):
        offset = 0
        while records := await reader.read_partition(p, offset, 1000):
            total += len(records)
            offset = records[-1].offset + 1
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    await reader.close()
    return total, wall, cpu


def raw_values(path: Path) -> list[bytes]:
    """Every record as the codec wrote it (decompressed where the file stores it compressed)."""
    with sqlite3.connect(path) as db:
        try:
            from turnlog.engine.log.sqlite_layout import all_records
        except ImportError:  # a checkout before layout 3: a row per event, compressed or not
            from turnlog.engine.log.zdict import unpack

            return [unpack(bytes(v)) for (v,) in db.execute("SELECT value FROM events ORDER BY position")]
        return all_records(db)


def fastavro_decode(values: list[bytes]) -> None:
    by_fp = codec._registry()[1]
    for v in values:
        c = by_fp[v[2:10]]
        fastavro.schemaless_reader(io.BytesIO(memoryview(v)[10:]), c.schema, None)


def best(fn: Any, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--label", default="after")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "read.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="turnlog-read-") as tmp:
        path = Path(tmp) / "log.db"
        log = await build(path, args.sessions, args.turns)
        partitions = log.partitions
        log._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        await log.close()
        size = path.stat().st_size
        runs = [await read_all(path, partitions) for _ in range(args.reps)]
        total = runs[0][0]
        wall = min(r[1] for r in runs)
        cpu = min(r[2] for r in runs)
        values = raw_values(path)
    decode_cpu = best(lambda: [codec.decode(v) for v in values], args.reps)
    fastavro_cpu = best(lambda: fastavro_decode(values), args.reps)
    result = {
        "label": args.label,
        "events": total,
        "log_kb": round(size / 1024),
        "read_partition_events_per_s_wall": round(total / wall),
        "read_partition_events_per_s_cpu": round(total / cpu),
        "codec_decode_us_per_event_cpu": round(decode_cpu / len(values) * 1e6, 2),
        "fastavro_reader_us_per_event_cpu": round(fastavro_cpu / len(values) * 1e6, 2),
        "load_average": os.getloadavg()[0],
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(json.dumps(result, indent=2))
    doc = json.loads(args.out.read_text()) if args.out.exists() else {"runs": []}
    doc["runs"].append(result)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
