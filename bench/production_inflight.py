"""``bench/production.py --inflight N --latency S``: how many waiting turns one worker holds.

One `turnlog serve` process (embedded: the gateway and its turn worker, as users start it) runs
the agents of ``bench.production_agents:inflight``: ``slow``, whose model (a lean model server
in ``--plain`` mode) answers every call ``S`` seconds after it arrives, and ``bench``, the
three-call agent on a fast model server (``FAST_LATENCY_S``). The process is started with
``--max-turns`` and ``--model-connections`` sized for N + the active sessions: the settings a
deployment sets for it.

Phases, each measured on the process (/proc: resident memory, CPU):

1. warm: one active session's whole turn; ``rss_start``;
2. N sessions created (each its own user and key), nothing run: ``rss_sessions``;
3. one message posted to each: N turns start, each waiting on the slow model; once the slow
   server holds N calls, ``rss_inflight`` (per in-flight turn: its rise over phase 2, / N);
4. CPU while only waiting, over ``--idle-window`` seconds, cut to end before the first slow
   answer is due (``answered_during_idle`` checks that none came);
5. 20 further sessions (``--active``), each holding its SSE stream as a browser does, converse
   ``--turns`` turns with the fast agent while the N wait: their event latency (received on the
   stream minus the producer's time stamp) and POST -> first event;
6. the slow answers arrive, the N turns end and their sessions sit idle in the worker's cache:
   ``rss_idle`` (per cached idle session: its rise over phase 1, / N; an upper bound, since
   memory freed inside the process is not always handed back to the system).

The N waiting sessions hold no event stream (what a stream costs is the gateway's, per viewer,
not the worker's, per turn); the slow calls are all made at once, so the N in flight are reached
only if posting them takes less than S.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.production_common import (
    CpuMeter,
    free_port,
    percentiles,
    process,
    rss_mb,
    turnlog_command,
    wait_accepting,
)
from bench.production_real import Seen, User, converse, make_keys, open_session, post

AGENTS = "bench.production_agents:inflight"
FAST_LATENCY_S = 0.2
BATCH = 200
"""Requests the driver has open at once while it creates the sessions and posts their messages."""


def model_server(port: int, latency: float, plain: bool) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "bench.lean_model_server",
        "--port",
        str(port),
        "--latency",
        str(latency),
    ]
    return command + (["--plain"] if plain else [])


async def slow_stats(http: aiohttp.ClientSession, port: int) -> dict[str, int]:
    async with http.get(f"http://127.0.0.1:{port}/stats") as response:
        return dict(await response.json())


async def create_slow(http: aiohttp.ClientSession, keys: list[str]) -> list[User]:
    users = [User(k) for k in keys]

    async def one(user: User) -> None:
        async with http.post("/v1/sessions", json={"agent": "slow"}, headers=user.headers) as response:
            response.raise_for_status()
            user.sid = str((await response.json())["session_id"])

    for start in range(0, len(users), BATCH):
        await asyncio.gather(*(one(u) for u in users[start : start + BATCH]))
    return users


async def post_all(http: aiohttp.ClientSession, users: list[User]) -> float:
    """Post one message to each session; the seconds it took."""
    started = time.perf_counter()
    for start in range(0, len(users), BATCH):
        batch = users[start : start + BATCH]
        await asyncio.gather(*(post(http, u.sid, u.headers, f"{u.sid}-slow") for u in batch))
    return time.perf_counter() - started


async def wait_for(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.perf_counter() + timeout_s
    while not await condition():
        if time.perf_counter() > deadline:
            raise SystemExit(f"gave up waiting for {what}")
        await asyncio.sleep(0.5)


MARGIN_S = 2.0
"""How long before the first slow answer is due the idle window ends."""


def idle_window(wanted_s: float, until_answers_s: float) -> float:
    """``--idle-window``, cut to end ``MARGIN_S`` before the first slow answer can arrive, so the
    CPU it measures is waiting only; a window under a second says to use a longer ``--latency``
    (posting took most of it)."""
    window = min(wanted_s, until_answers_s - MARGIN_S)
    if window < 1.0:
        raise SystemExit(
            f"posting left {until_answers_s:.0f} s before the first answer: no idle window to "
            f"measure; run with a longer --latency"
        )
    if window < wanted_s:
        print(f"idle window cut to {window:.1f} s (the first answers are due)", file=sys.stderr)
    return window


async def cpu_over(pid: int, seconds: float) -> float:
    """The process's CPU over ``seconds``, as a share of one core."""
    before, started = CpuMeter.cpu_s(pid) or 0.0, time.perf_counter()
    await asyncio.sleep(seconds)
    return ((CpuMeter.cpu_s(pid) or 0.0) - before) / (time.perf_counter() - started)


async def active_phase(http: aiohttp.ClientSession, keys: list[str], turns: int) -> dict[str, Any]:
    """The active sessions, each with its SSE stream, conversing while the N wait."""
    seen = Seen()
    users = [User(k) for k in keys]
    streams = await asyncio.gather(*(open_session(http, u, seen) for u in users))
    seen.latencies.clear()
    rounds: list[list[Any]] = [[] for _ in range(turns)]
    await asyncio.gather(*(converse(http, u, turns, rounds) for u in users))
    for task in streams:
        task.cancel()
    await asyncio.gather(*streams, return_exceptions=True)
    measured = [t for r in rounds for t in r]
    return {
        "active_sessions": len(users),
        "active_turns": len(measured),
        "event_latency_ms": percentiles(seen.latencies),
        "post_to_first_event_ms": percentiles([t.started - t.posted for t in measured]),
        "post_to_turn_end_ms": percentiles([t.ended.result() - t.posted for t in measured]),
        "stream_reconnects": seen.reconnects,
    }


async def drive(
    args: argparse.Namespace, keys: list[str], port: int, slow_port: int, pid: int
) -> dict[str, Any]:
    """The phases (see the module's docstring); ``keys``: the warm-up's, the active sessions',
    then the waiting sessions' (one user each)."""
    n, active = args.inflight, args.active
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    out: dict[str, Any] = {"inflight": n, "latency_s": args.latency}
    async with aiohttp.ClientSession(
        f"http://127.0.0.1:{port}", connector=connector, timeout=timeout
    ) as http:
        warm = User(keys[0])
        stream = await open_session(http, warm, Seen())
        await converse(http, warm, 1, [[]])
        stream.cancel()
        await asyncio.sleep(2.0)
        out["rss_start_mb"] = round(rss_mb(pid), 1)
        slow = await create_slow(http, keys[1 + active :])
        await asyncio.sleep(2.0)
        out["rss_sessions_mb"] = round(rss_mb(pid), 1)
        first_answer_at = time.perf_counter() + args.latency  # no call is answered before this
        out["post_all_s"] = round(await post_all(http, slow), 1)

        async def all_waiting() -> bool:
            return (await slow_stats(http, slow_port))["waiting"] >= n

        await wait_for(all_waiting, args.latency, f"{n} calls waiting at the slow model")
        out["rss_inflight_mb"] = round(rss_mb(pid), 1)
        window = idle_window(args.idle_window, first_answer_at - time.perf_counter())
        out["idle_window_s"] = round(window, 1)
        out["idle_cpu_core_share"] = round(await cpu_over(pid, window), 4)
        out["answered_during_idle"] = (await slow_stats(http, slow_port))["answered"]
        out["rss_inflight_after_idle_mb"] = round(rss_mb(pid), 1)
        before = CpuMeter.cpu_s(pid) or 0.0
        out.update(await active_phase(http, keys[1 : 1 + active], args.turns))
        out["active_cpu_ms_per_turn"] = round(
            ((CpuMeter.cpu_s(pid) or 0.0) - before) * 1000 / (active * args.turns), 2
        )
        out["still_waiting_after_active"] = (await slow_stats(http, slow_port))["waiting"]

        async def all_answered() -> bool:
            return (await slow_stats(http, slow_port))["answered"] >= n

        await wait_for(all_answered, args.latency * 3 + 600, f"{n} slow answers")
        await settle(pid)
        out["rss_idle_mb"] = round(rss_mb(pid), 1)
        out["slow_turns_answered_of_sampled"] = await answered(http, slow[:: max(1, n // SAMPLED)])
    out["kb_per_inflight_turn"] = round((out["rss_inflight_mb"] - out["rss_sessions_mb"]) * 1024 / n, 1)
    out["kb_per_created_session"] = round((out["rss_sessions_mb"] - out["rss_start_mb"]) * 1024 / n, 1)
    out["kb_per_idle_session"] = round((out["rss_idle_mb"] - out["rss_start_mb"]) * 1024 / n, 1)
    return out


SAMPLED = 50
"""Waiting sessions whose history is read at the end, to check their turn was answered."""


async def answered(http: aiohttp.ClientSession, users: list[User]) -> str:
    """How many of ``users``' sessions end with the slow model's answer ("k/n"): a turn that
    timed out or failed instead was not waiting all along."""
    from bench.lean_model_server import ANSWER

    count = 0
    for user in users:
        async with http.get(f"/v1/sessions/{user.sid}/history", headers=user.headers) as response:
            response.raise_for_status()
            body = await response.json()
        messages = body["messages"] if isinstance(body, dict) else body
        count += bool(messages) and messages[-1].get("content") == ANSWER
    return f"{count}/{len(users)}"


async def settle(pid: int, quiet: float = 0.05) -> None:
    """Until the process spends under ``quiet`` of a core for two seconds (the N turns ended)."""
    for _ in range(600):
        if await cpu_over(pid, 2.0) < quiet:
            return


async def run(args: argparse.Namespace) -> dict[str, Any]:
    fast_port, slow_port, port = free_port(), free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="turnlog-inflight-") as tmp:
        home = Path(tmp)
        sized = str(args.inflight + args.active + 10)
        command = turnlog_command(
            "serve", "--home", str(home), "--port", str(port), "--keys", str(home / "keys.toml"),
            "--agents", AGENTS, "--base-url", f"http://127.0.0.1:{fast_port}/v1", "--model", "bench-model",
            "--api-key", "bench", "--max-turns", sized, "--model-connections", sized,
        )  # fmt: skip
        env = {"BENCH_SLOW_URL": f"http://127.0.0.1:{slow_port}/v1"}
        with (
            process(model_server(fast_port, FAST_LATENCY_S, False), name="inflight-fast") as fast,
            process(model_server(slow_port, args.latency, True), name="inflight-slow") as slow,
        ):
            await wait_accepting(fast_port, fast, "the fast model server")
            await wait_accepting(slow_port, slow, "the slow model server")
            # the keys first: the gateway reads its keys file at start
            keys = make_keys(home, args.inflight + args.active + 1)
            with process(command, name="inflight-gateway", env=env) as gw:
                await wait_accepting(port, gw, "the gateway")
                print(
                    f"inflight: {args.inflight} turns waiting {args.latency} s", file=sys.stderr, flush=True
                )
                return await drive(args, keys, port, slow_port, gw.pid)


def main(args: argparse.Namespace) -> None:
    from bench.engine_version import fingerprint

    result = asyncio.run(run(args))
    load = os.getloadavg()
    doc = {"engine": fingerprint(), "result": result, "loadavg": load}
    out = (
        args.out or Path(__file__).resolve().parent / "results" / f"production-inflight-{args.inflight}.json"
    )
    out.write_text(json.dumps(doc, indent=1))
    print(json.dumps(result, indent=1))
    print(f"load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
