"""The lifecycle sweeper (consumers/lifecycle.py): what a sweep costs when nothing is due, and
how fast it expires and erases what is.

    PYTHONPATH=. .venv/bin/python bench/lifecycle.py                       # embedded only
    TURNLOG_POSTGRES_DSN=postgresql://... PYTHONPATH=. .venv/bin/python bench/lifecycle.py

Makes ``--sessions`` sessions on the embedded log (each created and left IDLE), folds them into
the projections (SQLite; and PostgreSQL with ``TURNLOG_POSTGRES_DSN``), then, on a clock the
benchmark sets: a sweep when none is due (the steady state: one indexed query per limit), a
sweep that expires ``--due`` of them (the oldest), and after folding the closes a sweep that
erases them (an eraser that does nothing, so the sweeper's own work is measured: the claim and
the done mark in ``lifecycle_erasures``). Wall time and process CPU of each, best of
``--reps`` for the idle sweep. Results are appended under ``--label`` to
``results/lifecycle.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any, Awaitable, Callable

from turnlog.consumers.lifecycle import LifecycleSweeper
from turnlog.consumers.projector import Projector
from turnlog.engine import Agent, AgentDirectory, AgentSessions, Lifecycle, ScriptedModel, SqliteEventLog
from turnlog.projections.postgres import PostgresProjectionStore
from turnlog.projections.store import ProjectionStore, SqliteProjectionStore

HERE = Path(__file__).resolve().parent
IDLE = timedelta(minutes=30)
HOUR_MS = 3_600_000


class NoEraser:
    async def erase_session(self, session_id: str, reason: str, *, actor: str = "admin") -> None:
        return None


async def timed(work: Callable[[], Awaitable[Any]]) -> tuple[Any, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = await work()
    return result, time.perf_counter() - wall, time.process_time() - cpu


async def run(store: ProjectionStore, folder: Path, sessions: int, due: int, reps: int) -> dict[str, Any]:
    log = SqliteEventLog(folder / f"log-{uuid.uuid4().hex[:6]}.db", durability="process")
    lifecycle = Lifecycle(idle_expiry=IDLE, retain_closed_for=IDLE)
    directory = AgentDirectory([Agent.build("a", ScriptedModel(["ok"]))], lifecycle=lifecycle)
    api = AgentSessions(log, directory)
    base = int(time.time() * 1000)
    for i in range(sessions):
        await api.create_session("a", "u", session_id=f"s{i:06d}")
    await Projector(log, store).catch_up()
    rows = store._query("SELECT session_id FROM sessions ORDER BY session_id LIMIT ?", [due])
    ids = [r["session_id"] for r in rows]  # their last activity an hour earlier than the rest's
    store.write(lambda w: w.execute(
        f"UPDATE sessions SET update_time_ms = update_time_ms - {HOUR_MS} WHERE session_id IN "
        f"({', '.join('?' for _ in ids)})", ids))  # fmt: skip
    clock_now = [base]
    sweeper = LifecycleSweeper(api, store, eraser=NoEraser(), clock=lambda: clock_now[0])
    out: dict[str, Any] = {"sessions": sessions, "due": due}
    idle = []
    for _ in range(reps):
        clock_now[0] = base - 40 * 60 * 1000  # the hour-old ones idle for 20 minutes: none due
        _, wall, cpu = await timed(sweeper.sweep_once)
        idle.append((wall, cpu))
    out["idle_sweep_ms"] = round(min(w for w, _ in idle) * 1000, 2)
    clock_now[0] = base + 10 * 60 * 1000  # the hour-old ones are due, the rest idle for 10 minutes
    swept, wall, cpu = await timed(sweeper.sweep_once)
    assert len(swept.expired) == due, len(swept.expired)
    out["expire"] = {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "per_s": round(due / wall)}
    await Projector(log, store).catch_up()
    clock_now[0] += 2 * HOUR_MS  # the expired ones past their retention; the rest would expire: erase only
    retention = AgentSessions(log, AgentDirectory(directory, lifecycle=Lifecycle(retain_closed_for=IDLE)))
    eraser = LifecycleSweeper(retention, store, eraser=NoEraser(), clock=lambda: clock_now[0])
    swept, wall, cpu = await timed(eraser.sweep_once)
    assert len(swept.erased) == due, len(swept.erased)
    out["erase"] = {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "per_s": round(due / wall)}
    await log.close()
    return out


async def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--sessions", type=int, default=20_000)
    parser.add_argument("--due", type=int, default=2_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--label", default="dev")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        sqlite = SqliteProjectionStore(folder / "projections.db")
        results["sqlite"] = await run(sqlite, folder, args.sessions, args.due, args.reps)
        sqlite.close()
        dsn = os.environ.get("TURNLOG_POSTGRES_DSN")
        if dsn:
            pg = PostgresProjectionStore(dsn, schema=f"bench_{uuid.uuid4().hex[:10]}")
            try:
                results["postgres"] = await run(pg, folder, args.sessions, args.due, args.reps)
            finally:
                pg.drop_schema()
                pg.close()
    print(json.dumps(results, indent=2))
    path = HERE / "results" / "lifecycle.json"
    kept = json.loads(path.read_text()) if path.exists() else {}
    kept[args.label] = results
    path.write_text(json.dumps(kept, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
