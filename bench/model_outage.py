#!/usr/bin/env python
"""Model outages and provider limits across a fleet of sessions (issue 44), bench/README.md §16.

    PYTHONPATH=. .venv/bin/python bench/model_outage.py [--parts outage,rate] [--sessions 200] \\
        [--latency 0.1] [--run-s 120] [--hang-from 30] [--hang-s 60] [--out bench/results/model_outage.json]

Processes: the fault-injecting model server (bench/fault_server.py, raw asyncio, next to no
CPU) and this one, which runs every session through ``AgentSessions`` on an embedded log, as a
worker does: the production benchmark's agent (``lookup``, ``notify``, then a text answer: three
model calls a turn) with a primary and a backup model, both OpenAI-compatible endpoints of the
fault server, called through the real OpenAI SDK. Every session posts a message, waits for its
turn to end, and posts the next, for ``--run-s`` seconds.

* **outage**: the same run twice, without and with the primary hanging (no status line, nothing)
  from ``--hang-from`` for ``--hang-s`` seconds. Counted from each turn's events: turns that
  waited out the first-token limit (a ``ModelFallback`` naming it), turns whose call the breaker
  handed over (``breaker_open``, "opened while this call waited"), turns that started on the
  backup (``breaker_open``, "is open"), probes; and turns/s over the run and over the outage's
  window, against the run without it.
* **rate**: the primary answers 429 beyond ``--rate`` requests in any second (with
  ``retry-after`` and ``x-ratelimit-*`` headers); ``--rate-sessions`` sessions ask for more than
  that. With the client-side limit at the same rate (``requests_per_minute``), with no limits
  configured (a 429's reset is still waited for), and with neither (``max_retry_wait_s=0``: a
  429 fails over at once, as every 429 did before issue 44): the share of calls answered 429,
  turns that fell back, turns/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent


def bench_agent(url: str, primary: str, backup: str, limits: Any = None) -> Any:
    from turnlog.engine import Agent, tool
    from turnlog.engine.models.fallback import FallbackModel
    from turnlog.engine.models.openai_compat import OpenAICompatibleModel

    @tool(idempotent=True)
    async def lookup(order_id: str) -> dict:
        """Look an order up (read-only)."""
        return {"order_id": order_id, "status": "delayed"}

    @tool(idempotent=False)
    async def notify(order_id: str) -> str:
        """Tell the customer about the order."""
        return "sent"

    main = OpenAICompatibleModel(primary, base_url=url, api_key="bench", limits=limits)
    spare = OpenAICompatibleModel(backup, base_url=url, api_key="bench")
    return Agent.build("bench", FallbackModel(main, spare), [lookup, notify])


@dataclass
class Turn:
    started: float
    ended: float
    fallbacks: list[tuple[str, str]] = field(default_factory=list)
    """(cause, reason) of each ModelFallback."""
    changes: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    """Why the breaker opened, when this turn opened it."""
    waits: int = 0

    @property
    def waited_out_limit(self) -> bool:
        return any(c == "failed" and "first-token limit" in r for c, r in self.fallbacks)

    @property
    def handed_over(self) -> bool:
        return any(c == "breaker_open" and "opened while" in r for c, r in self.fallbacks)

    @property
    def started_on_backup(self) -> bool:
        return any(c == "breaker_open" and "opened while" not in r for c, r in self.fallbacks)


def classify(started: float, ended: float, items: list[Any]) -> Turn:
    from turnlog.engine import events as ev
    from turnlog.engine.stream import ModelWaiting

    turn = Turn(started, ended)
    for item in items:
        if isinstance(item, ev.ModelFallback):
            turn.fallbacks.append((item.cause, item.reason))
        elif isinstance(item, ev.ModelBreakerChanged):
            turn.changes.append(item.to_state)
            if item.to_state == "open":
                turn.reasons.append(item.reason)
        elif isinstance(item, ModelWaiting) and item.waiting:
            turn.waits += 1
    return turn


class FaultProcess:
    """bench/fault_server.py in a process of its own, controlled over HTTP."""

    def __init__(self, latency: float) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.latency = latency
        self.url = f"http://127.0.0.1:{self.port}/v1"
        script = REPO / "bench" / "fault_server.py"
        args = [sys.executable, str(script), "--port", str(self.port), "--latency", str(latency)]
        self.proc = subprocess.Popen(args, env={**os.environ, "PYTHONPATH": str(REPO)})
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(f"{self.url}/stats", timeout=1)
                return
            except httpx.TransportError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise SystemExit("the fault server did not start") from None
                time.sleep(0.05)

    async def set(self, model: str, **faults: Any) -> None:
        async with httpx.AsyncClient(timeout=10) as client:
            body = {"model": model, "faults": {"latency_s": self.latency, **faults}}
            (await client.post(f"{self.url}/faults", json=body)).raise_for_status()

    async def stats(self, model: str) -> dict[str, int]:
        async with httpx.AsyncClient(timeout=10) as client:
            return dict((await client.get(f"{self.url}/stats")).json().get(model, {}))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


async def run_fleet(
    server: FaultProcess, sessions: int, run_s: float, primary: str, limits: Any = None, fault: Any = None
) -> tuple[list[Turn], float]:
    """``sessions`` sessions posting turns one after the other for ``run_s`` seconds; ``fault`` is
    awaited beside them (it sets the server's faults on its own schedule). Returns the turns and
    the CPU seconds this process spent."""
    from turnlog.engine import AgentDirectory, AgentSessions, SqliteEventLog

    with tempfile.TemporaryDirectory() as home:
        log = SqliteEventLog(Path(home) / "log.db", partitions=8)
        agent = bench_agent(server.url, primary, f"{primary}-backup", limits)
        api = AgentSessions(log, AgentDirectory([agent]), producer="bench-worker")
        ids = [(await api.create_session("bench", f"user-{n}")).session_id for n in range(sessions)]
        loop = asyncio.get_running_loop()
        start = loop.time()
        stop_at = start + run_s
        turns: list[Turn] = []

        async def one(sid: str) -> None:
            while loop.time() < stop_at:
                began = loop.time()
                items = [i async for i in api.send_user_message(sid, "Where is order A-1?")]
                turns.append(classify(began - start, loop.time() - start, items))

        cpu = time.process_time()
        extra = [asyncio.create_task(fault(start))] if fault is not None else []
        await asyncio.gather(*(one(sid) for sid in ids), *extra)
        cpu = time.process_time() - cpu
        await agent.model.aclose()
        await log.close()
    return turns, cpu


def rate(turns: list[Turn], start: float, end: float) -> float:
    return sum(1 for t in turns if start <= t.ended < end) / (end - start)


def outage_summary(turns: list[Turn], args: argparse.Namespace, cpu_s: float) -> dict[str, Any]:
    window = (args.hang_from, args.hang_from + args.hang_s)
    in_window = [t for t in turns if window[0] <= t.started < window[1]]
    durations = [t.ended - t.started for t in in_window] or [0.0]
    handed = [t.ended - t.started for t in turns if t.handed_over] or [0.0]
    ordered = sorted(turns, key=lambda t: t.ended)
    return {
        "turns": len(turns),
        "turns_per_s": round(rate(turns, 0, args.run_s), 2),
        "turns_per_s_outage_window": round(rate(turns, *window), 2),
        "turns_waited_out_first_token_limit": sum(t.waited_out_limit for t in turns),
        "turns_handed_over_by_the_breaker": sum(t.handed_over for t in turns),
        "turns_started_on_the_backup": sum(t.started_on_backup for t in turns),
        "probes": sum(t.changes.count("half_open") for t in turns),
        "breaker_changes": [c for t in ordered for c in t.changes],
        "open_reasons": [r for t in ordered for r in t.reasons][:3],
        "handed_over_turn_s_p50_max": [round(statistics.median(handed), 2), round(max(handed), 2)],
        "turn_s_in_window_p50_p95_max": [
            round(statistics.median(durations), 2),
            round(sorted(durations)[int(0.95 * (len(durations) - 1))], 2),
            round(max(durations), 2),
        ],
        "cpu_s": round(cpu_s, 1),
    }


async def outage(server: FaultProcess, args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for rep in range(args.reps):
        for case in ("no-outage", "outage"):
            primary = f"primary-{case}-{rep}"

            async def hang(start: float, primary: str = primary) -> None:
                loop = asyncio.get_running_loop()
                await asyncio.sleep(max(0.0, start + args.hang_from - loop.time()))
                await server.set(primary, hang=True)
                await asyncio.sleep(max(0.0, start + args.hang_from + args.hang_s - loop.time()))
                await server.set(primary)

            fault = hang if case == "outage" else None
            turns, cpu = await run_fleet(server, args.sessions, args.run_s, primary, fault=fault)
            summary = outage_summary(turns, args, cpu)
            summary["server"] = await server.stats(primary)
            results.setdefault(case, []).append(summary)
            print(case, json.dumps(summary), flush=True)
    return results


async def rate_limit(server: FaultProcess, args: argparse.Namespace) -> dict[str, Any]:
    from turnlog.engine.models.ratelimit import EndpointLimits

    results: dict[str, Any] = {}
    cases = {
        "limiter": EndpointLimits(requests_per_minute=args.rate * 60),
        "no-limits": None,  # a 429's reset is still waited for
        "no-limits-no-wait": EndpointLimits(max_retry_wait_s=0),  # a 429 fails over at once, as before
    }
    for case, limits in cases.items():
        primary = f"primary-rate-{case}"
        await server.set(primary, requests_per_s=args.rate)
        turns, cpu = await run_fleet(server, args.rate_sessions, args.rate_run_s, primary, limits)
        stats = await server.stats(primary)
        summary = {
            "turns": len(turns),
            "turns_per_s": round(rate(turns, 0, args.rate_run_s), 2),
            "primary_requests": stats.get("requests", 0),
            "answered_429": stats.get("rate_limited", 0),
            "share_429": round(stats.get("rate_limited", 0) / max(1, stats.get("requests", 0)), 4),
            "turns_that_fell_back": sum(1 for t in turns if t.fallbacks),
            "calls_that_waited": sum(t.waits for t in turns),
            "cpu_s": round(cpu, 1),
        }
        results[case] = summary
        print(case, json.dumps(summary), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", default="outage,rate")
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--latency", type=float, default=0.1, help="the model server's latency, s")
    parser.add_argument("--run-s", type=float, default=120.0)
    parser.add_argument("--hang-from", type=float, default=30.0)
    parser.add_argument("--hang-s", type=float, default=60.0)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--rate", type=float, default=20.0, help="the endpoint's requests per second")
    parser.add_argument("--rate-sessions", type=int, default=40)
    parser.add_argument("--rate-run-s", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "model_outage.json")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "bench"))
    import engine_version

    server = FaultProcess(args.latency)
    report: dict[str, Any] = {
        "engine": engine_version.fingerprint()["sha256_12"],
        "args": {k: str(v) for k, v in vars(args).items()},
        "loadavg_at_start": os.getloadavg(),
    }
    try:
        parts = args.parts.split(",")
        if "outage" in parts:
            report["outage"] = asyncio.run(outage(server, args))
        if "rate" in parts:
            report["rate"] = asyncio.run(rate_limit(server, args))
    finally:
        server.stop()
    report["loadavg_at_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
