#!/usr/bin/env python
"""turnlog gateway overhead: what HTTP, auth and SSE add around the engine.

    PYTHONPATH=. .venv/bin/python bench/gateway_overhead.py            # all three parts (~1 min)
    PYTHONPATH=. .venv/bin/python bench/gateway_overhead.py --streams 50,200,500

The gateway runs in its own process (uvicorn on a loopback port, embedded SQLite backend, the
bench's agent with a zero-latency model); the client is httpx in this process.

1. post: N user messages posted one after another (keep-alive connection), gateway started without
   a worker so only the post path is timed; compared with ``AgentSessions.post_user_message``
   called directly on a log of the same kind, and with the same client posting to a bare
   Starlette route on uvicorn (the HTTP floor). Reported: microseconds per message, and the
   gateway's own overhead = gateway - engine append - HTTP floor (auth, rate limit, ownership
   check, JSON, the position lookup, the hub, and the consumers woken by the append).
2. stream: one session with E events on the log, streamed from the start over SSE until the last
   id arrives; compared with reading the same records with ``read_session_records``. Reported:
   microseconds per event, both, the difference, and the server's CPU per event.

Wall times depend on how busy the machine is; the server's CPU time (from /proc) per message or
event does much less, so both are reported.
3. concurrent streams: K SSE streams held open on K sessions (one per user key), then one message
   posted to each with the worker running, so every stream carries a whole turn (16 events and a
   few deltas); reported: whether every stream saw its TurnFinished, the time from the first post
   to the last TurnFinished, and the gateway's resident memory with the streams open.

Results: a table on stdout, JSON in bench/results/gateway.json (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from turnlog.engine import Agent, AgentDirectory, AgentSessions, FunctionModel, SqliteEventLog, call, reply  # noqa: E402
from turnlog.engine.models.base import ModelRequest, ModelResponse  # noqa: E402
from turnlog.engine.tools import tool  # noqa: E402

USERS = 600


@tool(idempotent=True)
async def lookup(order_id: str) -> dict[str, str]:
    """Look up an order."""
    return {"order_id": order_id, "status": "delayed"}


def _answer(request: ModelRequest) -> ModelResponse | str:
    if request.messages[-1].role == "user":
        return reply("", call("lookup", {"order_id": "A-1"}, "c1"))
    return "Order A-1 is delayed by two days; the customer has been told."


def agents() -> AgentDirectory:
    return AgentDirectory(
        [Agent.build("bench", FunctionModel(_answer, name="bench", chunk_chars=16), [lookup])]
    )


def key(i: int) -> str:
    return f"tlk_bench_user_{i:04d}_0123456789abcdef"


def _serve_floor(port: int) -> None:
    """The HTTP floor: a bare Starlette route that reads a JSON body and answers 202."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"ok": len(await request.json())}, 202)

    uvicorn.run(
        Starlette(routes=[Route("/", echo, methods=["POST"])]), host="127.0.0.1", port=port, log_level="error"
    )


def _serve(home: str, port: int, worker: bool) -> None:
    import uvicorn

    from turnlog.gateway import Gateway, GatewayConfig, KeyStore, Limits, Principal
    from turnlog.gateway.observe import configure_json_logs
    from turnlog.projections import SqliteProjectionStore

    configure_json_logs(open(os.devnull, "w"))  # the JSON logs are part of the cost; not their terminal
    keys = {key(i): Principal(f"u{i}", "user") for i in range(USERS)}
    limits = Limits(requests_per_second=1e9, burst=10**9, streams_per_user=10**6, max_message_bytes=1 << 20)
    gateway = Gateway(
        SqliteEventLog(Path(home) / "log.db"),
        SqliteProjectionStore(Path(home) / "projections.db"),
        agents(),
        KeyStore.from_plain(keys),
        GatewayConfig(limits=limits, run_worker=worker, log_sample_rate=0),
    )
    uvicorn.run(gateway.app(), host="127.0.0.1", port=port, log_level="error", backlog=2048)


class Server:
    def __init__(self, worker: bool, *, floor: bool = False) -> None:
        self.home = tempfile.mkdtemp(prefix="turnlog-gw-bench-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        ctx = multiprocessing.get_context("spawn")
        target, args = (_serve_floor, (self.port,)) if floor else (_serve, (self.home, self.port, worker))
        self.proc = ctx.Process(target=target, args=args, daemon=True)
        self.floor = floor
        self.url = f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Server:
        self.proc.start()
        async with httpx.AsyncClient(base_url=self.url) as client:
            for _ in range(600):
                try:
                    if self.floor:
                        await client.post("/", json={})
                    else:
                        await client.get("/openapi.json", headers=auth(0))
                    return self
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
        raise RuntimeError("the gateway did not start")

    async def __aexit__(self, *_: object) -> None:
        self.proc.terminate()
        self.proc.join(10)

    def cpu_s(self) -> float:
        """User + system CPU seconds the server process has used (robust to a busy machine)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0


def auth(i: int) -> dict[str, str]:
    return {"Authorization": f"Bearer {key(i)}"}


async def bench_floor(n: int) -> tuple[float, float]:
    """Wall and server-CPU microseconds per request of the bare route."""
    async with Server(worker=False, floor=True) as server, httpx.AsyncClient(base_url=server.url) as client:
        for _ in range(50):
            await client.post("/", json={"text": "hello"})
        start, cpu = time.perf_counter(), server.cpu_s()
        for _ in range(n):
            await client.post("/", json={"text": "hello"})
        return (time.perf_counter() - start) / n * 1e6, (server.cpu_s() - cpu) / n * 1e6


async def bench_post(n: int) -> dict[str, float]:
    floor_us, floor_cpu_us = await bench_floor(n)
    async with Server(worker=False) as server, httpx.AsyncClient(base_url=server.url) as client:
        sid = (await client.post("/v1/sessions", json={"agent": "bench"}, headers=auth(0))).json()[
            "session_id"
        ]
        for _ in range(50):  # warm-up
            await client.post(f"/v1/sessions/{sid}/messages", json={"text": "hello"}, headers=auth(0))
        start, cpu = time.perf_counter(), server.cpu_s()
        for _ in range(n):
            r = await client.post(f"/v1/sessions/{sid}/messages", json={"text": "hello"}, headers=auth(0))
            assert r.status_code == 202, r.text
        await asyncio.sleep(1.5)  # let the consumers woken by these appends finish: their CPU counts
        http_us = (time.perf_counter() - start - 1.5) / n * 1e6
        gateway_cpu_us = (server.cpu_s() - cpu) / n * 1e6
    with tempfile.TemporaryDirectory() as home:
        log = SqliteEventLog(Path(home) / "log.db")
        api = AgentSessions(log, agents())
        sid = (await api.create_session("bench", "u0")).session_id
        for _ in range(50):
            await api.post_user_message(sid, "hello")
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            await api.post_user_message(sid, "hello")
        direct_us = (time.perf_counter() - start) / n * 1e6
        direct_cpu_us = (time.process_time() - cpu) / n * 1e6
        await log.close()
    return {
        "messages": n,
        "http_us": http_us,
        "floor_us": floor_us,
        "direct_us": direct_us,
        "overhead_us": http_us - direct_us - floor_us,
        "gateway_cpu_us": gateway_cpu_us,
        "floor_cpu_us": floor_cpu_us,
        "direct_cpu_us": direct_cpu_us,
        "overhead_cpu_us": gateway_cpu_us - floor_cpu_us - direct_cpu_us,
    }


async def bench_stream(n_messages: int) -> dict[str, float]:
    async with Server(worker=False) as server, httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        sid = (await client.post("/v1/sessions", json={"agent": "bench"}, headers=auth(0))).json()[
            "session_id"
        ]
        last = 0
        for _ in range(n_messages):
            r = await client.post(f"/v1/sessions/{sid}/messages", json={"text": "hello"}, headers=auth(0))
            last = r.json()["position"]
        await asyncio.sleep(1.5)  # the consumers woken by the posts are done
        count, start, cpu = 0, time.perf_counter(), server.cpu_s()
        async with client.stream("GET", f"/v1/sessions/{sid}/events", headers=auth(0)) as response:
            async for line in response.aiter_lines():
                if line.startswith("id: "):
                    count += 1
                    if int(line[4:]) == last:
                        break
        sse_us = (time.perf_counter() - start) / count * 1e6
        sse_cpu_us = (server.cpu_s() - cpu) / count * 1e6
        log = SqliteEventLog(Path(server.home) / "log.db")
        start = time.perf_counter()
        records = await log.read_session_records(sid)
        read_us = (time.perf_counter() - start) / len(records) * 1e6
        await log.close()
    return {
        "events": count,
        "sse_us": sse_us,
        "sse_cpu_us": sse_cpu_us,
        "read_us": read_us,
        "overhead_us": sse_us - read_us,
    }


async def _one_stream(
    client: httpx.AsyncClient, i: int, sid: str, ready: asyncio.Event, done: list[float]
) -> bool:
    async with client.stream("GET", f"/v1/sessions/{sid}/events", headers=auth(i)) as response:
        async for line in response.aiter_lines():
            if line == "event: SessionCreated":
                ready.set()
            elif line == "event: TurnFinished":
                done.append(time.perf_counter())
                return True
    return False


async def bench_streams(k: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=k + 20, max_keepalive_connections=k + 20)
    async with (
        Server(worker=True) as server,
        httpx.AsyncClient(base_url=server.url, timeout=300, limits=limits) as client,
    ):
        sids = [
            (await client.post("/v1/sessions", json={"agent": "bench"}, headers=auth(i))).json()["session_id"]
            for i in range(k)
        ]
        readies = [asyncio.Event() for _ in range(k)]
        done: list[float] = []
        tasks = [
            asyncio.create_task(_one_stream(client, i, sid, readies[i], done)) for i, sid in enumerate(sids)
        ]
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 300)
        rss = server.rss_mb()
        start = time.perf_counter()
        for i, sid in enumerate(sids):
            r = await client.post(
                f"/v1/sessions/{sid}/messages", json={"text": "where is A-1?"}, headers=auth(i)
            )
            assert r.status_code == 202, r.text
        results = await asyncio.wait_for(asyncio.gather(*tasks), 600)
    return {
        "streams": k,
        "all_finished": all(results),
        "seconds_to_last_turn_finished": max(done) - start if done else None,
        "turns_per_s": k / (max(done) - start) if done else None,
        "gateway_rss_mb_streams_open": rss,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--posts", type=int, default=1000)
    parser.add_argument("--stream-messages", type=int, default=300, help="messages whose events are streamed")
    parser.add_argument("--streams", default="50,200,500")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gateway.json")
    args = parser.parse_args()

    posts = [await bench_post(args.posts) for _ in range(args.reps)]
    streams = [await bench_stream(args.stream_messages) for _ in range(args.reps)]
    held = [await bench_streams(int(k)) for k in args.streams.split(",")]

    def median(rows: list[dict[str, float]], name: str) -> float:
        return statistics.median(r[name] for r in rows)

    post = {n: median(posts, n) for n in posts[0] if n != "messages"}
    stream = {n: median(streams, n) for n in streams[0] if n != "events"}
    print(
        f"post    ({args.posts} messages, median of {args.reps}): HTTP {post['http_us']:.0f} us/message, "
        f"bare HTTP round trip {post['floor_us']:.0f} us, engine append {post['direct_us']:.0f} us, "
        f"gateway overhead {post['overhead_us']:.0f} us\n"
        f"        server CPU per message: gateway {post['gateway_cpu_us']:.0f} us, bare route "
        f"{post['floor_cpu_us']:.0f} us, engine append {post['direct_cpu_us']:.0f} us, "
        f"gateway's own {post['overhead_cpu_us']:.0f} us"
    )
    print(
        f"stream  ({streams[0]['events']:.0f} events, median of {args.reps}): "
        f"SSE {stream['sse_us']:.1f} us/event, "
        f"direct read {stream['read_us']:.1f} us, gateway overhead {stream['overhead_us']:.1f} us, "
        f"server CPU {stream['sse_cpu_us']:.1f} us/event"
    )
    for row in held:
        print(
            f"streams {row['streams']}: all finished {row['all_finished']}, last TurnFinished after "
            f"{row['seconds_to_last_turn_finished']:.2f} s ({row['turns_per_s']:.0f} turns/s), "
            f"gateway RSS {row['gateway_rss_mb_streams_open']:.0f} MB"
        )
    machine = {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"machine": machine, "post": posts, "stream": streams, "held": held}, indent=2)
    )


if __name__ == "__main__":
    asyncio.run(main())
