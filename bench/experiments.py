#!/usr/bin/env python
"""Experiments (issue 17): record N sessions, replay them against the same agent with
``ExperimentRunner`` (tools answered from the recording), and report the wall time of the replay
next to the recording's.

    PYTHONPATH=. .venv/bin/python bench/experiments.py --sessions 200                 # scripted model
    PYTHONPATH=. .venv/bin/python bench/experiments.py --model local --sessions 200   # the local model

Each session is the logistics demo agent (``turnlog.examples.logistics.build_agent``) on the embedded
log in a fresh temporary folder. Session i asks, in turn order, SCRIPTS[i % 4] (the test's mix:
the task alone, a lookup alone, a lookup then the task, the task then a lookup), unless
``--message`` gives one question for every session (one turn). Recording runs ``--concurrency``
sessions at once through ``AgentSessions`` (as a busy gateway would); the replay runs the same
number at once. The replay's candidate is the recorded agent on the same model (a fresh model
object), so the report should show no divergence with the scripted model; with the local model
sampling may differ, and the report says how much.

Reported: wall time of recording and of the replay (and, apart, of making the report from the log),
sessions and turns, model calls and the models' own time (sum of ``ModelCallFinished.latency_ms``:
the floor of a replay that calls the same model), divergent sessions and turns. The load average
is sampled before and after (the machine is shared: say so). Results: JSON in
bench/results/experiments.json under ``--label`` (default: the model and N), a line on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _p in (str(REPO), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import engine_version  # noqa: E402

from turnlog.engine import AgentDirectory, AgentSessions, SqliteEventLog  # noqa: E402
from turnlog.engine.experiments import ExperimentRunner, Selection  # noqa: E402
from turnlog.engine.models.base import Model  # noqa: E402
from turnlog.examples.logistics import TASK, LogisticsBackend, build_agent, demo_model  # noqa: E402

LOOKUP = "Which orders had logistics anomalies last week?"
SCRIPTS = ([TASK], [LOOKUP], [LOOKUP, TASK], [TASK, LOOKUP])
TODAY = dt.date(2026, 11, 30)


def agents(model: Model, folder: Path) -> AgentDirectory:
    agent = build_agent(model, LogisticsBackend(today=TODAY, reports_dir=folder / "reports"))
    return AgentDirectory([agent])


async def record(
    log: SqliteEventLog, directory: AgentDirectory, n: int, concurrency: int, message: str | None
) -> int:
    api = AgentSessions(log, directory, producer="bench-recorder")
    gate = asyncio.Semaphore(concurrency)
    turns = 0

    async def one(i: int) -> None:
        nonlocal turns
        async with gate:
            session = await api.create_session("logistics-assistant", f"user-{i % 10}")
            for text in [message] if message else SCRIPTS[i % len(SCRIPTS)]:
                async for _ in api.send_user_message(session.session_id, text):
                    pass
                turns += 1

    await asyncio.gather(*(one(i) for i in range(n)))
    return turns


async def run(args: argparse.Namespace, folder: Path, model_factory: Any) -> dict[str, Any]:
    log = SqliteEventLog(folder / "log.db", partitions=8)
    recorded_model, candidate_model = model_factory(), model_factory()
    try:
        load_before = os.getloadavg()
        started = time.perf_counter()
        recorder = agents(recorded_model, folder)
        turns = await record(log, recorder, args.sessions, args.concurrency, args.message)
        recorded_s = time.perf_counter() - started
        done = f"recorded {args.sessions} sessions, {turns} turns in {recorded_s:.1f} s"
        print(done, file=sys.stderr, flush=True)
        runner = ExperimentRunner(log, agents(candidate_model, folder / "candidate"))
        spec = await runner.define(Selection(), candidate="the recorded agent", concurrency=args.concurrency)
        started = time.perf_counter()
        await runner.replay(spec)
        replayed_s = time.perf_counter() - started
        started = time.perf_counter()
        report = await runner.report(spec)
        report_s = time.perf_counter() - started
        summary = report.summary()
        model_calls = [0, 0]
        for s in report.sessions:
            model_calls[0] += sum(t.model_calls for t in (await _turns(log, s.origin_session_id)))
            model_calls[1] += sum(t.model_calls for t in (await _turns(log, s.replay_session_id)))
        return {
            "model": args.model,
            "sessions": args.sessions,
            "turns": turns,
            "concurrency": args.concurrency,
            "message": args.message or "SCRIPTS mix",
            "record_s": round(recorded_s, 3),
            "replay_s": round(replayed_s, 3),
            "replay_over_record": round(replayed_s / recorded_s, 3),
            "report_s": round(report_s, 3),
            "record_ms_per_session": round(1000 * recorded_s / args.sessions, 2),
            "replay_ms_per_session": round(1000 * replayed_s / args.sessions, 2),
            "model_calls": {"record": model_calls[0], "replay": model_calls[1]},
            "model_latency_ms": summary["model_latency_ms"],
            "sessions_divergent": summary["sessions_divergent"],
            "turns_divergent": summary["turns_divergent"],
            "calls_unmatched": summary["calls_unmatched"],
            "sessions_complete": summary["sessions_complete"],
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        }
    finally:
        for model in (recorded_model, candidate_model):
            await model.aclose()
        await log.close()


async def _turns(log: SqliteEventLog, session_id: str) -> list[Any]:
    from turnlog.engine.experiments.recording import load_recording

    return (await load_recording(log, session_id)).turns


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--model", choices=("scripted", "local"), default="scripted")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--message", default=None, help="one question for every session (one turn each)")
    parser.add_argument("--label", default=None)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "experiments.json")
    args = parser.parse_args()
    label = args.label or f"{args.model}-{args.sessions}"
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        folder = Path(tmp)
        if args.model == "local":
            from turnlog.local_model import serve_local_model

            server = stack.enter_context(
                serve_local_model(Path(os.environ.get("TURNLOG_HOME", REPO / ".turnlog")))
            )
            factory: Any = server.model
            threads = server.threads.describe() if server.threads else ""
        else:
            factory, threads = (lambda: demo_model(TODAY, chunk_chars=0)), ""
        result = asyncio.run(run(args, folder, factory))
    result["local_threads"] = threads
    result["engine"] = engine_version.fingerprint()
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    result["at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    results[label] = result
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(
        f"{label}: {result['sessions']} sessions, {result['turns']} turns, "
        f"concurrency {result['concurrency']}: "
        f"record {result['record_s']} s, replay {result['replay_s']} s ({result['replay_over_record']}x), "
        f"report {result['report_s']} s; divergent sessions {result['sessions_divergent']}, turns "
        f"{result['turns_divergent']}; load {result['loadavg_before']} -> {result['loadavg_after']}"
    )


if __name__ == "__main__":
    main()
