#!/usr/bin/env python
"""turnlog gateway and worker in two processes on one embedded log: how soon a posted message is
seen, run and streamed.

    PYTHONPATH=. .venv/bin/python bench/split_latency.py [--messages 30] [--warmup 5] [--out FILE]

Starts `turnlog serve --no-worker` and `turnlog worker` on one home (one SQLite log file, the
example agent with its scripted model), makes a session over HTTP, holds its SSE stream open and
posts ``--warmup`` + ``--messages`` messages one after the other, each once the previous turn's
TurnFinished has been streamed (the warm-up turns are not counted). For each message it notes,
from the POST being sent: when the stream shows the message (its UserMessageReceived), when it
shows the turn starting (TurnStarted, written by the worker process), the first token delta, and
the turn's end. Reported: p50 / p95 / max of each, and how many turns streamed any delta.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
MARKS = ("UserMessageReceived", "TurnStarted", "delta", "TurnFinished")
QUESTION = "Which orders had logistics anomalies last week?"


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("TURNLOG_BASE_URL", "OPENAI_BASE_URL", "TURNLOG_MODEL", "TURNLOG_KEYS"):
        env.pop(name, None)
    return env


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def processes(home: Path, port: int) -> Iterator[str]:
    """The gateway (no worker) and a worker on ``home``; yields an API key."""
    turnlog = [sys.executable, "-m", "turnlog"]
    made = subprocess.run(
        [*turnlog, "add-key", "bench", "--role", "user", "--home", str(home)],
        capture_output=True, text=True, env=_env(), check=True,
    )  # fmt: skip
    key = made.stdout.strip().splitlines()[-1]
    quiet: dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": _env()}
    serve = ["serve", "--home", str(home), "--port", str(port), "--no-worker"]
    worker = ["worker", "--home", str(home), "--id", "bench-worker"]
    procs = [subprocess.Popen([*turnlog, *command], **quiet) for command in (serve, worker)]
    try:
        yield key
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=60)


async def wait_ready(client: httpx.AsyncClient, headers: dict[str, str]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            if (await client.get("/v1/sessions", headers=headers)).status_code == 200:
                return
        await asyncio.sleep(0.1)
    raise SystemExit("turnlog serve did not answer in 120 s")


async def measure(url: str, key: str, messages: int, warmup: int) -> list[dict[str, float]]:
    """Seconds from each POST to each of MARKS on the session's stream, after ``warmup`` turns
    that are not counted (the worker's first turns load what it loads lazily)."""
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        await wait_ready(client, headers)
        created = await client.post("/v1/sessions", json={"agent": "logistics-assistant"}, headers=headers)
        sid = created.json()["session_id"]
        rows: list[dict[str, float]] = []
        async with client.stream("GET", f"/v1/sessions/{sid}/events", headers=headers) as stream:
            lines = stream.aiter_lines()
            for _ in range(warmup + messages):
                sent = time.perf_counter()
                posted = await client.post(
                    f"/v1/sessions/{sid}/messages", json={"text": QUESTION}, headers=headers
                )
                assert posted.status_code == 202, posted.text
                seen: dict[str, float] = {}
                async for line in lines:
                    if line.startswith("event: "):
                        name = line[7:]
                        if name in MARKS and name not in seen:
                            seen[name] = time.perf_counter() - sent
                        if name == "TurnFinished":
                            break
                rows.append(seen)
        return rows[warmup:]


def summary(rows: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {"turns": len(rows), "turns_with_deltas": sum(1 for r in rows if "delta" in r)}
    for mark in MARKS:
        values = sorted(r[mark] * 1000 for r in rows if mark in r)
        if values:
            out[mark] = {
                "p50_ms": statistics.median(values),
                "p95_ms": values[min(len(values) - 1, int(len(values) * 0.95))],
                "max_ms": values[-1],
            }
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5, help="turns run first and not counted")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "split.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="turnlog-split-") as tmp:
        port = _free_port()
        with processes(Path(tmp) / "home", port) as key:
            rows = await measure(f"http://127.0.0.1:{port}", key, args.messages, args.warmup)
    result = summary(rows)
    print(f"{result['turns']} turns, {result['turns_with_deltas']} streamed deltas")
    for mark in MARKS:
        if mark in result:
            m = result[mark]
            print(
                f"POST -> {mark:<20} p50 {m['p50_ms']:7.1f} ms   p95 {m['p95_ms']:7.1f} ms   "
                f"max {m['max_ms']:7.1f} ms"
            )
    machine = {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine, "result": result}, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
