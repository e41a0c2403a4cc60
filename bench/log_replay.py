#!/usr/bin/env python
"""The embedded log's share of a step: the appends of the S1 workload, replayed onto the log alone.

    PYTHONPATH=. .venv/bin/python bench/log_replay.py [--reps 5] [--rounds 1]
    TURNLOG_ENGINE_DIR=<dir> ... bench/log_replay.py     # another engine (bench/engine_version.py)

A whole step in the peers harness spreads over 300-900 µs on this machine from one hour to the
next, so a change to the log worth a few µs a step cannot be seen there. This takes the log on
its own: the S1 workload of bench/engine_overhead.py (20 sessions x 10 turns x 4 idempotent tool
steps = 1,000 model steps; the same model and tool) runs once on an in-memory log while every
append is recorded (its events, expected version and ``redoable`` mark, as the engine made them),
then the recorded appends are replayed, in order, onto a fresh SQLite file ``--reps`` times in
each durability. Reported, per model step: wall and CPU µs of the replay (min and median over the
reps; the log's connection closed and the file removed between reps), then the file's rows and
bytes, and the rate of reading it back (every session's events, every partition from offset 0,
and each session's newest snapshot). ``--rounds`` repeats everything, for interleaving runs of two
engines by hand. JSON in bench/results/log_replay.json (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import tempfile
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import engine_overhead as eo  # noqa: E402  (sets sys.path: the engine from TURNLOG_ENGINE_DIR or the repo)

from turnlog.engine import SqliteEventLog  # noqa: E402
from turnlog.engine.events import Event  # noqa: E402

Append = tuple[list[Event], int, bool]
DURABILITIES = ("process", "power")


async def record(sessions: int, turns: int, k: int) -> list[Append]:
    """The appends the engine makes for the workload, in order."""
    bench = eo.Bench("memory", None, k)
    appends: list[Append] = []
    counting = bench.log.append

    async def recording(events: Any, *, expected_version: int, redoable: bool = False) -> Any:
        appends.append((list(events), expected_version, redoable))
        return await counting(events, expected_version=expected_version, redoable=redoable)

    bench.log.append = recording  # type: ignore[method-assign]
    for s in range(sessions):
        for t in range(turns):
            await bench.turn(f"sess-{s:04d}", eo.user_text(s, t), t == 0)
    await bench.close()
    return appends


async def replay(appends: list[Append], path: Path, durability: str) -> tuple[float, float]:
    """Wall and CPU seconds to append everything onto a fresh file (closing it included)."""
    eo.remove_db(path)
    log = SqliteEventLog(path, durability=durability)  # type: ignore[arg-type]
    c0, t0 = time.process_time(), time.perf_counter()
    for events, expected, redoable in appends:
        await log.append(events, expected_version=expected, redoable=redoable)
    await log.close()
    return time.perf_counter() - t0, time.process_time() - c0


async def read_back(path: Path, session_ids: list[str]) -> dict[str, float]:
    """Events per second reading the file back, and µs per newest-snapshot lookup (best of 5)."""
    log = SqliteEventLog(path)
    best = {"read_session": 0.0, "read_partition": 0.0, "latest_snapshot_us": float("inf")}
    try:
        for _ in range(5):
            t0 = time.perf_counter()
            n = sum([len(await log.read_session(s)) for s in session_ids])
            best["read_session"] = max(best["read_session"], n / (time.perf_counter() - t0))
            t0, m = time.perf_counter(), 0
            for p in range(log.partitions):
                offset = 0
                while records := await log.read_partition(p, offset, 500):
                    m, offset = m + len(records), records[-1].offset + 1
            best["read_partition"] = max(best["read_partition"], m / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            for s in session_ids:
                if await log.latest_snapshot(s) is None:
                    raise AssertionError(f"{s}: no snapshot on the log")
            lookup = (time.perf_counter() - t0) / len(session_ids) * 1e6
            best["latest_snapshot_us"] = min(best["latest_snapshot_us"], lookup)
        if n != m:
            raise AssertionError(f"read_session gave {n} events, read_partition {m}")
        best["events"] = n
    finally:
        await log.close()
    with closing(sqlite3.connect(path)) as db:
        best["rows"] = db.execute("SELECT count(*) FROM batches").fetchone()[0]
    return best


async def run(a: argparse.Namespace) -> dict[str, Any]:
    appends = await record(a.sessions, a.turns, a.k)
    steps = a.sessions * a.turns * (a.k + 1)
    session_ids = sorted({events[0].session_id for events, _, _ in appends})
    doc: dict[str, Any] = {
        "engine": eo.engine_version.fingerprint(eo.ENGINE_DIR),
        "machine": eo.machine(),
        "appends": len(appends),
        "redoable_appends": sum(1 for _, _, r in appends if r),
        "model_steps": steps,
        "rounds": [],
    }
    with tempfile.TemporaryDirectory(prefix="turnlog-log-replay-") as tmp:
        path = Path(tmp) / "replay.db"
        for _ in range(a.rounds):
            result: dict[str, Any] = {}
            for durability in DURABILITIES:
                runs = [await replay(appends, path, durability) for _ in range(a.reps)]
                walls = [w / steps * 1e6 for w, _ in runs]
                cpus = [c / steps * 1e6 for _, c in runs]
                result[durability] = {
                    "wall_us_min": min(walls),
                    "wall_us_median": statistics.median(walls),
                    "cpu_us_min": min(cpus),
                    "cpu_us_median": statistics.median(cpus),
                }
            result["bytes"] = path.stat().st_size
            result.update(await read_back(path, session_ids))
            eo.remove_db(path)
            doc["rounds"].append(result)
            print_round(doc, result)
    return doc


def print_round(doc: dict[str, Any], r: dict[str, Any]) -> None:
    print(
        f"engine {doc['engine']['sha256_12']}: {doc['appends']} appends ({doc['redoable_appends']} redoable) "
        f"for {doc['model_steps']} model steps"
    )
    for d in DURABILITIES:
        x = r[d]
        print(
            f"  {d:8s} per step: wall min {x['wall_us_min']:6.1f} median {x['wall_us_median']:6.1f} µs, "
            f"CPU min {x['cpu_us_min']:6.1f} median {x['cpu_us_median']:6.1f} µs"
        )
    print(
        f"  file: {r['rows']} rows, {r['bytes']:,} bytes; read back: read_session {r['read_session']:,.0f} "
        f"events/s, read_partition {r['read_partition']:,.0f} events/s, newest snapshot "
        f"{r['latest_snapshot_us']:.1f} µs"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--sessions", type=int, default=20)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--k", type=int, default=4, help="tool steps a turn")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", type=Path, default=eo.HERE / "results" / "log_replay.json")
    a = p.parse_args()
    doc = asyncio.run(run(a))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
