#!/usr/bin/env python
"""The peers' S1 through turnlog's adapter, in this process: for A/B runs of two engines.

    PYTHONPATH=. .venv/bin/python bench/peers/s1_inprocess.py --persist sqlite_normal --reps 5
    TURNLOG_ENGINE_DIR=<dir> PYTHONPATH=. .venv/bin/python bench/peers/s1_inprocess.py ...

``run_peers.py`` takes ~15 minutes for every framework and starts a process per measurement; a
change worth 5 % of a step is lost in the hour-to-hour spread of those runs. This runs only S1
(20 sessions x 10 turns x 4 tool steps, the peers' workload module and ``turnlog_impl``'s adapter
unchanged) ``--reps`` times in one process, each on a fresh store after the harness's warm-up, and
prints wall and CPU µs per model step (every rep, sorted) and the COMMITs of the last rep's log.
Alternate it between two engine copies (``TURNLOG_ENGINE_DIR``: a snapshot made by
bench/engine_version.py) in the same hour; quote medians per round.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PEERS = os.path.abspath(os.environ.get("PEERS_BENCH_DIR", os.path.join(REPO, "..", "shared", "peers-bench")))
sys.path[:0] = [os.environ.get("TURNLOG_ENGINE_DIR", REPO), PEERS, HERE]

import workload as W  # noqa: E402  (the peers' workload)
from turnlog_impl import TurnlogAdapter  # noqa: E402


async def one_rep(persist: str, sessions: int, turns: int, k: int) -> tuple[float, float, int | None]:
    """Wall and CPU µs per model step of one S1 run on a fresh store, and its COMMIT count."""
    with tempfile.TemporaryDirectory() as scratch:
        warm = TurnlogAdapter(k=k, model_delay_s=0.0)
        await warm.open(persist, os.path.join(scratch, "warm.db"))
        for t in range(W.WARMUP_TURNS):
            await warm.run_turn("warmup", W.user_message(-1, t))
        await warm.close()
        adapter = TurnlogAdapter(k=k, model_delay_s=0.0)
        await adapter.open(persist, os.path.join(scratch, "s1.db"))
        wall, cpu = time.perf_counter(), time.process_time()
        for s in range(sessions):
            for t in range(turns):
                text = await adapter.run_turn(W.session_id(s), W.user_message(s, t))
                if text != W.FINAL_TEXT:
                    raise AssertionError(f"session {s} turn {t} answered {text!r}")
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        group = getattr(adapter.log, "group", None)
        commits = group.commits if group is not None else None
        await adapter.close()
    steps = sessions * turns * (k + 1)
    return wall / steps * 1e6, cpu / steps * 1e6, commits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--persist", choices=("sqlite", "sqlite_normal", "memory"), default="sqlite_normal")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    spec = W.SCENARIOS["S1"]
    runs = [asyncio.run(one_rep(args.persist, spec.sessions, spec.turns, spec.k)) for _ in range(args.reps)]
    walls, cpus = sorted(r[0] for r in runs), sorted(r[1] for r in runs)
    print(
        f"{args.persist}: wall µs/step {[round(w) for w in walls]} (median {statistics.median(walls):.0f}), "
        f"CPU {[round(c) for c in cpus]} (median {statistics.median(cpus):.0f}), COMMITs {runs[-1][2]}"
    )


if __name__ == "__main__":
    main()
