#!/usr/bin/env python
"""What one long turn writes to the log: snapshot bytes against the tool results they record.

    PYTHONPATH=. .venv/bin/python bench/long_turn.py                    # 8, 32, 128 tool steps
    PYTHONPATH=. .venv/bin/python bench/long_turn.py --steps 32 --result-bytes 4000

One session, one user turn of K tool steps (one ``fetch`` call each, an idempotent tool whose
result is ``--result-bytes`` of seeded pseudo-random lowercase words, which zstd shrinks by
about a third, as it does text it has not seen), then the answer, through
``AgentSessions.send_user_message`` on a ``durability="process"`` SQLite log; built once with
snapshots (one after every tool step and at the turn end) and once without
(``runner.snapshots = None``). Reported per K: the tool results' bytes, the snapshots'
``state_json`` bytes, the log file with and without snapshots (after a WAL checkpoint; values
are zstd-compressed), and the turn's CPU ms with and without. A snapshot that costs what
changed writes about what the step added (its tool message and its loop-guard record, each
holding the result): linear in K, not K²/2.

Results: a table on stdout and JSON in bench/results/long_turn.json (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import tempfile
import time
from pathlib import Path
from string import ascii_lowercase
from typing import Any, AsyncIterator

import engine_version
from snapshot_load import HERE, _size

from turnlog.engine import Agent, AgentDirectory, AgentSessions, SqliteEventLog, tool
from turnlog.engine import events as ev
from turnlog.engine.messages import turn_tool_results
from turnlog.engine.models.base import Model, ModelChunk, ModelRequest, ModelResponse, Usage


class StepsModel(Model):
    """Calls ``fetch`` once per step until the turn holds ``steps`` tool results, then answers."""

    name = "steps"

    def __init__(self, steps: int) -> None:
        self.steps = steps

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        done = len(turn_tool_results(request.messages))
        if done < self.steps:
            call = ev.ToolCallSpec(f"call_{done}", "fetch", json.dumps({"page": done}))
            yield ModelResponse(text="", tool_calls=(call,), usage=Usage(1, 1), finish_reason="tool_calls")
        else:
            yield ModelResponse(text="done", usage=Usage(1, 1))


def fetch_tool(result_bytes: int) -> Any:
    async def fetch(page: int) -> str:
        """Fetch one page of the report."""
        rnd = random.Random(page)
        letters = "".join(rnd.choice(ascii_lowercase + " " * 4) for _ in range(result_bytes))
        return letters

    return tool(fetch, idempotent=True)


async def one_turn(path: Path, steps: int, result_bytes: int, snapshots: bool) -> dict[str, float]:
    log = SqliteEventLog(path, durability="process")
    agent = Agent("a", StepsModel(steps), [fetch_tool(result_bytes)], max_tool_iterations=steps + 1)
    api = AgentSessions(log, AgentDirectory([agent]))
    if not snapshots:
        api.runner.snapshots = None
    try:
        sid = (await api.create_session("a", "u")).session_id
        cpu = time.process_time()
        async for _ in api.send_user_message(sid, "write me the report"):
            pass
        cpu_ms = (time.process_time() - cpu) * 1000
        events = await log.read_session(sid)
    finally:
        await log.close()
    results = [e for e in events if isinstance(e, ev.ToolCallFinished)]
    if len(results) != steps:
        raise RuntimeError(f"the turn ran {len(results)} tool steps, not {steps}")
    snaps = [e for e in events if isinstance(e, ev.SnapshotTaken)]
    return {
        "cpu_ms": cpu_ms,
        "results_kb": sum(len(e.content.encode()) for e in results) / 1000,
        "snapshots": len(snaps),
        "snapshot_kb": sum(len(s.state_json.encode()) for s in snaps) / 1000,
        "log_mb": _size(path) / 1e6,
    }


async def run_steps(steps: int, result_bytes: int, tmp: Path) -> dict[str, Any]:
    on = await one_turn(tmp / f"on-{steps}.db", steps, result_bytes, snapshots=True)
    off = await one_turn(tmp / f"off-{steps}.db", steps, result_bytes, snapshots=False)
    row = {"steps": steps, "result_bytes": result_bytes, **on}
    row.update(log_mb_no_snapshots=off["log_mb"], cpu_ms_no_snapshots=off["cpu_ms"])
    print(f"  {steps} tool steps: {row['snapshot_kb']:.0f} KB of snapshots", flush=True)
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| tool steps | tool results KB | snapshots | snapshot JSON KB | snapshot / results "
        "| log MB with / without snapshots | turn CPU ms with / without |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['steps']} | {r['results_kb']:.0f} | {r['snapshots']} | {r['snapshot_kb']:.0f} | "
            f"{r['snapshot_kb'] / r['results_kb']:.1f}x | "
            f"{r['log_mb']:.2f} / {r['log_mb_no_snapshots']:.2f} | "
            f"{r['cpu_ms']:.1f} / {r['cpu_ms_no_snapshots']:.1f} |"
        )
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--result-bytes", type=int, default=4000, help="each tool result's size")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "long_turn.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        await one_turn(Path(tmp) / "warm-up.db", 1, args.result_bytes, snapshots=True)  # imports, tables
        rows = [await run_steps(k, args.result_bytes, Path(tmp)) for k in args.steps]
    print(table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"engine": engine_version.fingerprint()["sha256_12"], "python": platform.python_version()}
    args.out.write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
