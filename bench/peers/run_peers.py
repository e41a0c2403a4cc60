#!/usr/bin/env python
"""Run the shared peers benchmark with turnlog added, without writing into shared/.

shared/peers-bench is laid out read-only (and its bench.py would overwrite the peers' reference
results/latest.json), so this script loads its unchanged ``bench.py`` by path, adds one registry
entry (``turnlog -> turnlog_impl:TurnlogAdapter``, the adapter beside this file), points the
results directory at ``bench/results/peers/`` and makes every isolated run re-enter this script.
Everything else -- workload, harness, timing, verification, medians, table, fsync counting -- is
the peers' own code. It takes the same options as peers bench.py:

    PYTHONPATH=. /work/peers-venv/bin/python bench/peers/run_peers.py \\
        --framework all --persistence all --reps 3 --count-fsyncs

PEERS_BENCH_DIR overrides where peers-bench is (default: ../shared/peers-bench next to the repo).

The engine may be edited while a run takes its ~25 minutes, so the orchestrating process copies
engine/ + schemas/ once into a temporary snapshot and every worker imports that copy
(TURNLOG_ENGINE_DIR); the snapshot's content hash is added to the results JSON as
"turnlog_engine".
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PEERS = os.path.abspath(os.environ.get("PEERS_BENCH_DIR", os.path.join(REPO, "..", "shared", "peers-bench")))
RESULTS = os.path.join(REPO, "bench", "results", "peers")

sys.path.insert(0, PEERS)  # workload, harness, frameworks (the peers' own modules)
sys.path.insert(1, HERE)  # turnlog_impl
if os.environ.get("TURNLOG_ENGINE_DIR"):  # a worker: import the run's engine snapshot
    sys.path.insert(0, os.environ["TURNLOG_ENGINE_DIR"])
elif REPO not in sys.path:
    sys.path.append(REPO)  # engine

_spec = importlib.util.spec_from_file_location("peers_bench", os.path.join(PEERS, "bench.py"))
pb = importlib.util.module_from_spec(_spec)
sys.modules["peers_bench"] = pb
_spec.loader.exec_module(pb)

pb.REGISTRY["turnlog"] = "turnlog_impl:TurnlogAdapter"  # same dict object frameworks.load() reads
pb.RESULTS = RESULTS


def run_isolated(
    framework: str, scenario: str, persistence: str, rep: int, strace_out: str | None = None
) -> dict:
    """peers bench.run_isolated, re-entering this script instead of peers' bench.py."""
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        "--framework",
        framework,
        "--scenario",
        scenario,
        "--persistence",
        persistence,
        "--rep",
        str(rep),
    ]
    env = dict(os.environ)
    if strace_out:  # fsync-counting pass: not timed, no warm-up
        cmd = ["strace", "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", strace_out, *cmd]
        env["BENCH_SKIP_WARMUP"] = "1"
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=PEERS, env=env)
    if p.returncode != 0:
        return {
            "framework": framework,
            "scenario": scenario,
            "persistence": persistence,
            "rep": rep,
            "error": (p.stderr or p.stdout)[-3000:],
        }
    return json.loads(p.stdout.strip().splitlines()[-1])


pb.run_isolated = run_isolated


def _orchestrate() -> None:
    sys.path.insert(0, os.path.join(REPO, "bench"))
    import engine_version

    os.makedirs(RESULTS, exist_ok=True)
    given = os.environ.get("TURNLOG_ENGINE_DIR")  # an existing snapshot to reuse
    snap = Path(given) if given else Path(tempfile.mkdtemp(prefix="turnlog-engine-"))
    try:
        if given:
            info = engine_version.fingerprint(snap)
        else:
            info = engine_version.snapshot(snap, Path(REPO))
            info["snapshot_taken"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            os.environ["TURNLOG_ENGINE_DIR"] = str(snap)
        print(f"turnlog engine snapshot {info['sha256_12']} in {snap}", file=sys.stderr, flush=True)
        before = set(glob.glob(os.path.join(RESULTS, "run-*.json")))
        pb.main()
        new = set(glob.glob(os.path.join(RESULTS, "run-*.json"))) - before
        for path in [*new, os.path.join(RESULTS, "latest.json")] if new else []:
            with open(path) as f:
                doc = json.load(f)
            doc["turnlog_engine"] = info
            with open(path, "w") as f:
                json.dump(doc, f, indent=1)
    finally:
        if not given:
            shutil.rmtree(snap, ignore_errors=True)


if __name__ == "__main__":
    if "--worker" in sys.argv or "--resummarize" in sys.argv:
        pb.main()
    else:
        _orchestrate()
