#!/usr/bin/env python
"""The demo on the default local model (issue 15): does it finish, how long does it take, and how
much of each prompt does llama.cpp's prompt cache spare.

    PYTHONPATH=. .venv/bin/python bench/local_demo.py --runs 3                # on the machine as it is
    PYTHONPATH=. .venv/bin/python bench/local_demo.py --runs 10 --busy 1      # + one busy loop per core
    PYTHONPATH=. .venv/bin/python bench/local_demo.py --probe --busy 1        # raw speed, 1 vs 2 threads

Each run is the seed's task (``turnlog demo``: query last week's orders, notify each affected
customer, save a report, answer naming the failed notice) in a fresh embedded log, through the
same code as the CLI: ``turnlog.examples.logistics.build_agent`` on the local model's server (one server
for all runs, threads chosen as ``turnlog demo`` chooses them unless ``--threads``). Run n plays
the task n days after today (the prompt's dates change, as they do from day to day for users),
unless ``--same-day``.

``--busy N`` starts N busy-loop processes per core first and waits until the 1-minute load
average has risen to them (the thread choice reads it), then starts the server. The load average
is sampled at every run's start and end (other work on the machine counts too: say so).

Reported per run: outcome (``TurnFinished.reason``); clean: answered, each affected customer with
an email address notified exactly once and nobody else, a report saved, and the answer naming the
failed notice (customer C-105 / order O-1008); wall time, model calls, corrections, duplicate side effects
(a notice sent twice, a second report), and per model step the prompt tokens sent, served from
the prompt cache and processed (sent - cached), output tokens and latency. The floor of the same
run: the model's raw prompt and generation speed on this machine right before the runs (a bare
request with a fresh prompt), from which the model time the steps needed is estimated.

``--probe`` measures only the raw speeds, once per thread setting (one thread for everything; one
generating and every core reading the prompt; every core for both), under the same load.

Results: JSON in bench/results/local_demo.json (``--out``; one entry per configuration label), a
table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _p in (str(REPO), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import engine_version  # noqa: E402

from turnlog.engine import AgentSessions, SqliteEventLog  # noqa: E402
from turnlog.engine import events as ev  # noqa: E402
from turnlog.engine.agent import AgentDirectory  # noqa: E402
from turnlog.examples.logistics import AGENT_ID, TASK, LogisticsBackend, build_agent  # noqa: E402
from turnlog.examples.logistics.backend import ANOMALIES, last_week  # noqa: E402
from turnlog.local_model import LocalModelServer, Threads, assemble_model, choose_threads, usable_cores  # noqa: E402

FAILED_NOTICE = ("C-105", "O-1008")
PROBE_PROMPT_WORDS = 130
PROBE_OUTPUT_TOKENS = 64


@contextlib.contextmanager
def busy_loops(per_core: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``per_core`` busy-loop processes per core, stopped on exit (only these, by their handles)."""
    loops = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(per_core * usable_cores())
    ]
    try:
        yield loops
    finally:
        for loop in loops:
            loop.terminate()
        for loop in loops:
            loop.wait()


def wait_for_load(target: float, limit_s: float = 150.0) -> float:
    """Wait until the 1-minute load average reaches ``target`` (or ``limit_s``); return it."""
    deadline = time.monotonic() + limit_s
    while os.getloadavg()[0] < target and time.monotonic() < deadline:
        time.sleep(5)
    return os.getloadavg()[0]


def raw_speed(base_url: str) -> dict[str, float]:
    """Prompt and generation tokens/s of one bare request with a fresh (uncached) prompt."""
    filler = " ".join(f"word{i}" for i in range(PROBE_PROMPT_WORDS))
    body = {
        "model": "probe",
        "messages": [
            {"role": "system", "content": f"probe {time.time_ns()} {filler}"},
            {"role": "user", "content": "Count from 1 to 40 in words, comma separated."},
        ],
        "temperature": 0,
        "max_tokens": PROBE_OUTPUT_TOKENS,
    }
    request = urllib.request.Request(
        f"{base_url}/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=900) as answer:
        timings = json.load(answer)["timings"]
    return {
        "prompt_tokens": timings["prompt_n"],
        "prompt_tok_s": round(timings["prompt_per_second"], 2),
        "output_tokens": timings["predicted_n"],
        "output_tok_s": round(timings["predicted_per_second"], 2),
    }


async def one_run(server: LocalModelServer, workdir: Path, today: dt.date) -> dict[str, Any]:
    model = server.model()
    backend = LogisticsBackend(today=today, reports_dir=workdir / "reports")
    log = SqliteEventLog(workdir / "log.db", partitions=2)
    api = AgentSessions(log, AgentDirectory([build_agent(model, backend)]))
    session = await api.create_session(AGENT_ID, "bench-user")
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    events = [i async for i in api.send_user_message(session.session_id, TASK) if isinstance(i, ev.Event)]
    wall = time.perf_counter() - started
    await log.close()
    await model.aclose()
    return summarize(events, backend, wall, load_before, os.getloadavg()[0])


def summarize(
    events: list[ev.Event], backend: LogisticsBackend, wall: float, load_before: float, load_after: float
) -> dict[str, Any]:
    finished = [e for e in events if isinstance(e, ev.TurnFinished)]
    answers = [e for e in events if isinstance(e, ev.AssistantMessage) and not e.tool_calls]
    answer = answers[-1].text if answers else ""
    calls = [e for e in events if isinstance(e, ev.ModelCallFinished)]
    notices = [(m["customer_id"], m["order_id"]) for m in backend.outbox]
    reports = [e for e in events if isinstance(e, ev.ToolCallFinished) and e.tool_name == "save_report"]
    outcome = finished[0].reason if finished else "none"
    named = any(x in answer for x in FAILED_NOTICE)
    saved = sum(1 for r in reports if r.status == "success")
    right_notices = sorted(notices) == sorted(reachable_notices(backend))
    return {
        "today": backend.today.isoformat(),
        "outcome": outcome,
        "clean": outcome == "answered" and named and right_notices and saved >= 1,
        "right_notices": right_notices,
        "names_failed_notice": named,
        "answer": answer,
        "wall_s": round(wall, 1),
        "load_before": round(load_before, 2),
        "load_after": round(load_after, 2),
        "model_calls": len(calls),
        "tool_steps": finished[0].iterations if finished else 0,
        "corrections": [e.kind for e in events if isinstance(e, ev.ModelCorrected)],
        "notices_sent": len(notices),
        "duplicate_notices": len(notices) - len(set(notices)),
        "reports_saved": saved,
        "error": next((c.error for c in calls if c.status != "ok"), None),
        "steps": [
            {
                "step": c.step,
                "sent": c.input_tokens,
                "cached": c.cached_input_tokens,
                "processed": c.input_tokens - c.cached_input_tokens,
                "output": c.output_tokens,
                "latency_s": round(c.latency_ms / 1000, 1),
            }
            for c in calls
        ],
    }


def run_line(run: dict[str, Any]) -> str:
    return (
        f"{run['outcome']}{' (clean)' if run['clean'] else ''}, failed notice named: "
        f"{run['names_failed_notice']}, right notices: {run['right_notices']}, {run['wall_s']} s, "
        f"{run['model_calls']} model calls, corrections {run['corrections']}, "
        f"load {run['load_before']}-{run['load_after']}"
    )


def reachable_notices(backend: LogisticsBackend) -> list[tuple[str, str]]:
    """The notices the task should send: each affected order of last week whose customer has an email."""
    monday, sunday = last_week(backend.today)
    lo, hi = monday.isoformat(), sunday.isoformat()
    return [
        (o["customer_id"], o["order_id"])
        for o in backend.orders
        if lo <= o["order_date"] <= hi
        and o["logistics_status"] in ANOMALIES
        and (backend.customer(o["customer_id"]) or {}).get("email")
    ]


def estimated_model_s(run: dict[str, Any], floor: dict[str, float]) -> float:
    processed = sum(s["processed"] for s in run["steps"])
    output = sum(s["output"] for s in run["steps"])
    return round(processed / floor["prompt_tok_s"] + output / floor["output_tok_s"], 1)


def serve(model_path: Path, log_path: Path, threads: Threads) -> LocalModelServer:
    server = LocalModelServer(model_path, log_path, threads=threads)
    server.start()
    return server


async def bench_runs(args: argparse.Namespace, model_path: Path) -> dict[str, Any]:
    threads = Threads(args.threads, usable_cores(), "--threads") if args.threads else choose_threads()
    server = serve(model_path, Path(tempfile.gettempdir()) / "turnlog-bench-server.log", threads)
    try:
        floor = raw_speed(server.base_url)
        print(f"threads: {threads.describe()}; floor: {floor}", flush=True)
        runs = []
        for n in range(args.runs):
            today = dt.date.today() + dt.timedelta(days=0 if args.same_day else n)
            with tempfile.TemporaryDirectory(prefix="turnlog-local-demo-") as tmp:
                run = await one_run(server, Path(tmp), today)
            run["estimated_model_s"] = estimated_model_s(run, floor)
            runs.append(run)
            print(f"run {n + 1}/{args.runs}: {run_line(run)}", flush=True)
    finally:
        server.stop()
    return {"threads": threads.describe(), "floor": floor, "runs": runs}


def probe(model_path: Path) -> dict[str, Any]:
    out = {}
    cores = usable_cores()
    for generate, prompt in sorted({(1, 1), (1, cores), (cores, cores)}):
        threads = Threads(generate, prompt, "probe")
        server = serve(model_path, Path(tempfile.gettempdir()) / "turnlog-bench-server.log", threads)
        try:
            raw_speed(server.base_url)  # warm-up: the first request after loading is slower
            out[threads.describe()] = {"load": round(os.getloadavg()[0], 2), **raw_speed(server.base_url)}
            print(threads.describe(), out[threads.describe()], flush=True)
        finally:
            server.stop()
    return out


def report(label: str, result: dict[str, Any]) -> None:
    runs = result["runs"]
    walls = [r["wall_s"] for r in runs]
    answered = sum(r["outcome"] == "answered" for r in runs)
    clean = sum(r["clean"] for r in runs)
    print(f"\n## {label}: {result['threads']}")
    floor = result["floor"]
    print(f"floor: prompt {floor['prompt_tok_s']} tok/s, generation {floor['output_tok_s']} tok/s")
    print(
        f"answered {answered}/{len(runs)}, clean {clean}/{len(runs)} (the right notices, a report, the "
        "failed notice named); "
        f"wall median {statistics.median(walls):.0f} s, worst {max(walls):.0f} s"
    )
    print("| run | date | outcome | clean | wall s | model s | calls | sent | cached | processed | out |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n, r in enumerate(runs, 1):
        steps = r["steps"]
        print(
            f"| {n} | {r['today']} | {r['outcome']} | {'yes' if r['clean'] else 'no'} | {r['wall_s']} | "
            f"{r['estimated_model_s']} | {r['model_calls']} | "
            f"{sum(s['sent'] for s in steps)} | {sum(s['cached'] for s in steps)} | "
            f"{sum(s['processed'] for s in steps)} | {sum(s['output'] for s in steps)} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--busy", type=int, default=0, help="busy-loop processes per core during the runs")
    parser.add_argument(
        "--threads", type=int, default=0, help="generating threads (default: as turnlog demo)"
    )
    parser.add_argument("--probe", action="store_true", help="only the raw speed with 1 and 2 threads")
    parser.add_argument(
        "--same-day", action="store_true", help="every run on today's date (default: run n is n days later)"
    )
    parser.add_argument(
        "--home", type=Path, default=REPO / ".turnlog", help="where the model file is assembled"
    )
    parser.add_argument("--label", default="", help="name of this configuration in the results file")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "local_demo.json")
    args = parser.parse_args()
    model_path = assemble_model(args.home)
    label = args.label or ("probe" if args.probe else "busy" if args.busy else "as is") + f" x{args.runs}"
    with busy_loops(args.busy) if args.busy else contextlib.nullcontext([]):
        if args.busy:
            print(f"busy loops started; load average {wait_for_load(0.8 * args.busy * usable_cores()):.2f}")
        result = probe(model_path) if args.probe else asyncio.run(bench_runs(args, model_path))
    if not args.probe:
        report(label, result)
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    results.setdefault("configurations", {})[label] = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "engine": engine_version.fingerprint()["sha256_12"],
        "machine": platform.machine(),
        "cores": usable_cores(),
        "busy_loops_per_core": args.busy,
        **result,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
