#!/usr/bin/env python
"""Session load time from the newest snapshot vs a full fold, and what snapshots cost a turn.

    PYTHONPATH=. .venv/bin/python bench/snapshot_load.py                 # 10, 100, 1000 turns
    PYTHONPATH=. .venv/bin/python bench/snapshot_load.py --turns 10 100  # a subset

For each size N, one session of N turns x 1 tool step (the peers' S3 shape: 4 history items
per turn) is built twice through ``AgentSessions.send_user_message`` on a
``durability="process"`` SQLite log in a temp dir: once with snapshots (the default: one after
every tool step and one at every turn end) and once with ``runner.snapshots = None``.

Reported per N:

* load: a cold load as a restarted worker does it, ``TurnRunner(...).load(sid)`` on a fresh
  runner (latest snapshot + the events after it), against ``fold(sid, log.read_session(sid))``
  (every event from version 1) on the same log and on the log built without snapshots (what a
  cold load cost before snapshots). Median of ``--reps`` loads each; the states are checked
  equal. The speed-up is full fold without snapshots / load from the newest snapshot.
* turn: after the N turns, ``--pairs`` more turns with snapshots and as many without,
  alternating turn by turn on the same session (hot path, runner cache warm): median wall and
  CPU ms per turn. Also the size of the newest snapshot and of the keyframe it builds on, and
  of the log file with and without snapshots after N turns.

Results: a table on stdout and JSON in bench/results/snapshots.json (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, AsyncIterator

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _p in (str(REPO), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import engine_version  # noqa: E402

from turnlog.engine import Agent, AgentDirectory, AgentSessions, SqliteEventLog, TurnRunner, fold, tool  # noqa: E402
from turnlog.engine import events as ev  # noqa: E402
from turnlog.engine.models.base import Model, ModelChunk, ModelRequest, ModelResponse, Usage  # noqa: E402


class OneToolModel(Model):
    """Calls ``lookup`` once after each user message, then answers "done"."""

    name = "free"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        messages = request.messages
        if messages[-1].role == "user":
            call = ev.ToolCallSpec(
                f"call_{len(messages)}", "lookup", json.dumps({"order_id": f"A{len(messages)}"})
            )
            yield ModelResponse(text="", tool_calls=(call,), usage=Usage(1, 1), finish_reason="tool_calls")
        else:
            yield ModelResponse(text="done", usage=Usage(1, 1))


@tool(idempotent=True)
async def lookup(order_id: str) -> dict:
    """Look up an order."""
    return {"order_id": order_id, "status": "delayed"}


async def build(path: Path, turns: int, snapshots: bool) -> tuple[SqliteEventLog, AgentSessions, str]:
    log = SqliteEventLog(path, durability="process")
    api = AgentSessions(log, AgentDirectory([Agent("a", OneToolModel(), [lookup])]))
    if not snapshots:
        api.runner.snapshots = None
    sid = (await api.create_session("a", "u")).session_id
    for n in range(turns):
        async for _ in api.send_user_message(sid, f"where is order {n}?"):
            pass
    return log, api, sid


async def time_turns(api: AgentSessions, sid: str, pairs: int) -> dict[str, float]:
    """Median wall and CPU ms of a turn with and without snapshots, alternating turn by turn on
    the same session and log, so both see the same history, file and machine load."""
    encoder = api.runner.snapshots
    samples: dict[str, list[float]] = {"wall_on": [], "wall_off": [], "cpu_on": [], "cpu_off": []}
    for n in range(2 * pairs):
        mode = "on" if n % 2 == 0 else "off"
        api.runner.snapshots = encoder if mode == "on" else None
        wall, cpu = time.perf_counter(), time.process_time()
        async for _ in api.send_user_message(sid, f"one more {n}"):
            pass
        samples[f"wall_{mode}"].append((time.perf_counter() - wall) * 1000)
        samples[f"cpu_{mode}"].append((time.process_time() - cpu) * 1000)
    api.runner.snapshots = encoder
    return {f"turn_{k}_ms": statistics.median(v) for k, v in samples.items()}


async def time_loads(log: SqliteEventLog, api: AgentSessions, sid: str, reps: int) -> dict[str, float]:
    expected = fold(sid, await log.read_session(sid))
    from_snapshot: list[float] = []
    full: list[float] = []
    for _ in range(reps):
        runner = TurnRunner(log, api.agents.get)
        t0 = time.perf_counter()
        state = await runner.load(sid)
        from_snapshot.append(time.perf_counter() - t0)
        assert state == expected
        t0 = time.perf_counter()
        state = fold(sid, await log.read_session(sid))
        full.append(time.perf_counter() - t0)
        assert state == expected
    return {
        "snapshot_ms": statistics.median(from_snapshot) * 1000,
        "full_fold_ms": statistics.median(full) * 1000,
    }


async def time_full_fold(log: SqliteEventLog, sid: str, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fold(sid, await log.read_session(sid))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


async def run_size(turns: int, reps: int, pairs: int, tmp: Path) -> dict[str, Any]:
    log, api, sid = await build(tmp / f"snap-{turns}.db", turns, snapshots=True)
    loads = await time_loads(log, api, sid, reps)
    latest = await log.latest_snapshot(sid)
    assert isinstance(latest, ev.SnapshotTaken)
    keyframe = await log.latest_snapshot(sid, latest.keyframe_version) if latest.keyframe_version else latest
    assert isinstance(keyframe, ev.SnapshotTaken)
    events = await log.session_version(sid)
    log_mb = _size(tmp / f"snap-{turns}.db") / 2**20
    turn_times = await time_turns(api, sid, pairs)
    await log.close()
    plain_log, _, plain_sid = await build(tmp / f"plain-{turns}.db", turns, snapshots=False)
    plain_fold_ms = await time_full_fold(plain_log, plain_sid, reps)
    await plain_log.close()
    return {
        "turns": turns,
        "events": events,
        **loads,
        "full_fold_no_snapshots_ms": plain_fold_ms,
        "speedup": plain_fold_ms / loads["snapshot_ms"],
        **turn_times,
        "snapshot_kb": len(latest.state_json.encode()) / 1024,
        "keyframe_kb": len(keyframe.state_json.encode()) / 1024,
        "log_mb_snapshots": log_mb,
        "log_mb_no_snapshots": _size(tmp / f"plain-{turns}.db") / 2**20,
    }


def _size(db: Path) -> int:
    """The log file's size once its WAL is checkpointed into it."""
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| turns | events | load from newest snapshot ms | full fold ms (log without / with snapshots) "
        "| speed-up | turn wall ms with / without snapshots | turn CPU ms with / without "
        "| newest snapshot / its keyframe KB "
        "| log MB with / without |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['turns']} | {r['events']} | {r['snapshot_ms']:.2f} | "
            f"{r['full_fold_no_snapshots_ms']:.2f} / {r['full_fold_ms']:.2f} | "
            f"{r['speedup']:.1f}x | {r['turn_wall_on_ms']:.2f} / {r['turn_wall_off_ms']:.2f} | "
            f"{r['turn_cpu_on_ms']:.2f} / {r['turn_cpu_off_ms']:.2f} | "
            f"{r['snapshot_kb']:.1f} / {r['keyframe_kb']:.1f} | "
            f"{r['log_mb_snapshots']:.1f} / {r['log_mb_no_snapshots']:.1f} |"
        )
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--reps", type=int, default=21, help="loads per method and size (median)")
    parser.add_argument("--pairs", type=int, default=25, help="turns timed with and without snapshots")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "snapshots.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [await run_size(n, args.reps, args.pairs, Path(tmp)) for n in args.turns]
    print(table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "engine": engine_version.fingerprint()["sha256_12"],
                "python": platform.python_version(),
                "machine": platform.machine(),
                "rows": rows,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    asyncio.run(main())
