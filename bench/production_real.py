"""The real shape of bench/production.py: the production path as users run it.

The programs are `turnlog serve` and `turnlog worker` as a deployment starts them, with the
agents of bench/production_agents.py (``directory``: long-term memory on, Qdrant Edge in each
process's home, the ``remember`` tool offered). Every session belongs to a user with a key of
their own, and its client does what a browser page does (the viewer, AG-UI, the SDKs): it opens
the session's SSE stream and holds it, reconnecting with ``Last-Event-ID`` if it drops, and
posts each message once the previous turn's end has reached it on that stream. What is measured
is what the users see: POST -> the turn's first event on the stream, POST -> its end, and each
event's latency (received on the stream minus the ``time_ms`` its producer stamped), plus the
CPU each process spends per turn.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.production_common import (
    Case,
    CpuMeter,
    drop_topics,
    free_port,
    key_store_env,
    percentiles,
    process,
    service_pids,
    turnlog_command,
    wait_accepting,
    wait_owners,
)

AGENTS = "bench.production_agents:directory"
TEXT = "Where is order A-1?"


@dataclass
class Turn:
    posted: float = 0.0
    started: float = 0.0
    posted_wall: float = 0.0
    message_wall: float = 0.0
    started_wall: float = 0.0
    call_wall: float = 0.0
    """The ``time_ms`` (s) of the turn's UserMessageReceived, TurnStarted and first
    ModelCallStarted (committed with its TurnStarted): when the process that wrote each made it."""
    seen_wall: float = 0.0
    ended: asyncio.Future[float] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass
class Seen:
    """What every stream of the run received."""

    latencies: list[float] = field(default_factory=list)
    """Per event: received (wall clock) minus its producer's ``time_ms``, seconds."""
    reconnects: int = 0
    out_of_order: int = 0
    """Events whose position was not after the previous one's on the same stream (a repeat)."""


class BrowserStream:
    """One session's event stream as a browser's EventSource holds it: open until closed,
    reconnecting with the last id it saw (``Last-Event-ID``) when the connection drops."""

    def __init__(self, http: aiohttp.ClientSession, sid: str, headers: dict[str, str], seen: Seen) -> None:
        self.http, self.sid, self.headers, self.seen = http, sid, headers, seen
        self.turns: dict[str, Turn] = {}
        self.last_id: str | None = None
        self.open = asyncio.Event()

    async def run(self) -> None:
        while True:
            headers = {**self.headers, "Accept": "text/event-stream"}
            if self.last_id is not None:
                headers["Last-Event-ID"] = self.last_id
            try:
                async with self.http.get(f"/v1/sessions/{self.sid}/events", headers=headers) as response:
                    response.raise_for_status()
                    self.open.set()
                    await self._read(response)
            except (TimeoutError, aiohttp.ClientError):
                pass
            self.seen.reconnects += 1
            await asyncio.sleep(0.5)  # an EventSource's retry delay (shortened)

    async def _read(self, response: aiohttp.ClientResponse) -> None:
        kind, data, event_id = "", "", None
        async for raw in response.content:
            line = raw.decode().rstrip("\r\n")
            if not line:
                if data:
                    self._event(kind, data, event_id)
                kind, data, event_id = "", "", None
            elif line.startswith("event:"):
                kind = line[6:].strip()
            elif line.startswith("data:"):
                data += line[5:].strip()
            elif line.startswith("id:"):
                event_id = line[3:].strip()

    def _event(self, kind: str, data: str, event_id: str | None) -> None:
        if event_id is None:
            return  # a delta or a wait: ephemeral, no id, no time stamp
        now_wall, now = time.time(), time.perf_counter()
        if self.last_id is not None and int(event_id) <= int(self.last_id):
            self.seen.out_of_order += 1
        self.last_id = event_id
        body = json.loads(data)
        self.seen.latencies.append(now_wall - body["time_ms"] / 1000)
        turn = self.turns.get(body.get("message_id") or body.get("turn_id") or "")
        if turn is None:
            return
        if kind == "UserMessageReceived":
            turn.message_wall = body["time_ms"] / 1000
        if kind == "ModelCallStarted" and not turn.call_wall:
            turn.call_wall = body["time_ms"] / 1000
        if kind == "TurnStarted" and not turn.started:
            turn.started, turn.started_wall, turn.seen_wall = now, body["time_ms"] / 1000, now_wall
            self.turns[body["turn_id"]] = turn  # its model calls name the turn, not the message
        elif kind == "TurnFinished" and not turn.ended.done():
            turn.ended.set_result(now)


async def post(http: aiohttp.ClientSession, sid: str, headers: dict[str, str], message_id: str) -> None:
    body = {"text": TEXT, "message_id": message_id}
    for _ in range(200):  # on Kafka a just-created session is sequenced by its owner first
        try:
            async with http.post(f"/v1/sessions/{sid}/messages", json=body, headers=headers) as response:
                if response.status != 404:
                    response.raise_for_status()
                    return
        except aiohttp.ServerDisconnected:  # a kept-alive connection closed as it was reused:
            continue  # the message id makes the retry safe
        await asyncio.sleep(0.05)
    raise SystemExit(f"session {sid} never appeared on the log")


async def create_session(http: aiohttp.ClientSession, headers: dict[str, str]) -> str:
    async with http.post("/v1/sessions", json={"agent": "bench"}, headers=headers) as response:
        response.raise_for_status()
        return str((await response.json())["session_id"])


@dataclass
class User:
    key: str
    sid: str = ""
    stream: BrowserStream | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


async def open_session(http: aiohttp.ClientSession, user: User, seen: Seen) -> asyncio.Task[None]:
    """The user's session and its stream, held open from now on (a page loaded)."""
    user.sid = await create_session(http, user.headers)
    user.stream = BrowserStream(http, user.sid, user.headers, seen)
    task = asyncio.create_task(user.stream.run())
    await user.stream.open.wait()
    return task


async def converse(http: aiohttp.ClientSession, user: User, turns: int, rounds: list[list[Turn]]) -> None:
    assert user.stream is not None
    for t in range(turns):
        message_id = f"{user.sid}-t{t}"
        turn = user.stream.turns[message_id] = Turn()
        rounds[t].append(turn)
        turn.posted, turn.posted_wall = time.perf_counter(), time.time()
        await post(http, user.sid, user.headers, message_id)
        await asyncio.wait_for(turn.ended, 600)


async def drive(port: int, keys: list[str], turns: int, meter: CpuMeter) -> dict[str, Any]:
    seen = Seen()
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0)  # under the gateway's 5 s
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    users = [User(k) for k in keys]
    async with aiohttp.ClientSession(
        f"http://127.0.0.1:{port}", connector=connector, timeout=timeout
    ) as http:
        streams = [await open_session(http, users[0], seen)]  # the whole path once, before the clock
        await converse(http, users[0], 1, [[]])
        for start in range(1, len(users), 50):
            batch = users[start : start + 50]
            streams += await asyncio.gather(*(open_session(http, u, seen) for u in batch))
        seen.latencies.clear()
        rounds: list[list[Turn]] = [[] for _ in range(turns)]
        meter.start()
        started, driver_started = time.perf_counter(), time.process_time()
        await asyncio.gather(*(converse(http, u, turns, rounds) for u in users[1:]))
        wall, driver_s = time.perf_counter() - started, time.process_time() - driver_started
        meter.stop()
        for task in streams:
            task.cancel()
        await asyncio.gather(*streams, return_exceptions=True)
    measured = [t for r in rounds for t in r]
    return {
        "sessions": len(users) - 1,
        "turns": len(measured),
        "wall_s": round(wall, 2),
        "turns_per_s": round(len(measured) / wall, 1),
        "post_to_first_event_ms": percentiles([t.started - t.posted for t in measured]),
        "post_to_turn_end_ms": percentiles([t.ended.result() - t.posted for t in measured]),
        "first_event_p50_ms_by_leg": first_event_legs(measured),
        "turn_end_p50_ms_by_round": [
            percentiles([t.ended.result() - t.posted for t in r]).get("p50") for r in rounds
        ],
        "event_latency_ms": percentiles(seen.latencies),
        "stream_reconnects": seen.reconnects,
        "events_repeated": seen.out_of_order,
        "cpu_ms_per_turn": {name: round(s * 1000 / len(measured), 2) for name, s in meter.spent.items()},
        "driver_cpu_ms_per_turn": round(driver_s * 1000 / len(measured), 2),
    }


def first_event_legs(turns: list[Turn]) -> dict[str, float | None]:
    """POST -> first event in legs (p50 each, ms), from the events' own ``time_ms`` (when the
    process that wrote each made it): the user's message made, the turn started, its first
    model call started (the recall and the context before it), and the stream's TurnStarted,
    which is committed with that call's start (the commit and the delivery)."""
    legs = {
        "post_to_message": [t.message_wall - t.posted_wall for t in turns if t.message_wall],
        "message_to_turn_started": [t.started_wall - t.message_wall for t in turns if t.message_wall],
        "turn_started_to_first_call": [t.call_wall - t.started_wall for t in turns if t.call_wall],
        "first_call_to_stream": [t.seen_wall - t.call_wall for t in turns if t.call_wall],
    }
    return {name: percentiles(values).get("p50") for name, values in legs.items()}


def make_keys(home: Path, count: int) -> list[str]:
    """One user per session (and one for the warm-up), each with a key of their own."""
    from turnlog.serve import add_key

    return [add_key(home / "keys.toml", f"user{i}", "user") for i in range(count)]


def commands(case: Case, port: int, model_url: str) -> tuple[list[str], list[list[str]]]:
    """The gateway's command line and the workers'."""
    model = ["--agents", AGENTS, "--base-url", model_url, "--model", "bench-model", "--api-key", "bench"]
    keys = ["--keys", str(case.home / "keys.toml")]
    if not case.kafka:
        home = ["--home", str(case.home)]
        gateway = turnlog_command("serve", *home, "--port", str(port), *keys, *model)
        if not case.workers:
            return gateway, []
        return [*gateway, "--no-worker"], [turnlog_command("worker", *home, *model)]
    kafka = ["--kafka", case.kafka, "--topic", case.topic]
    gateway = turnlog_command(
        "serve", "--home", str(case.home / "gateway"), "--port", str(port), *keys, *model, *kafka,
        "--postgres", str(case.postgres), "--schema", case.schema, "--no-worker",
    )  # fmt: skip
    workers = [
        turnlog_command("worker", "--home", str(case.home / f"w{i}"), "--id", f"w{i}", *kafka, *model)
        for i in range(case.workers)
    ]
    return gateway, workers


async def run_case(case: Case, model_url: str, args: argparse.Namespace) -> dict[str, Any]:
    case.home.mkdir(parents=True, exist_ok=True)
    keys = make_keys(case.home, args.sessions + 1)
    port = free_port()
    gateway_command, worker_commands = commands(case, port, model_url)
    with contextlib.ExitStack() as stack:
        key_env = key_store_env(case)
        gw = stack.enter_context(process(gateway_command, name=f"{case.name}-real-gateway", env=key_env))
        await wait_accepting(port, gw, "the gateway")
        workers = [
            stack.enter_context(process(command, name=f"{case.name}-real-worker-{i}", env=key_env))
            for i, command in enumerate(worker_commands)
        ]
        if case.workers > 1:
            await wait_owners(case)
        meter = CpuMeter({"gateway": [gw.pid], "workers": [w.pid for w in workers], **service_pids(case)})
        idle = await idle_cpu(meter.groups, args.idle) if args.idle else None
        print(
            f"{case.name} (real): {args.sessions} sessions x {args.turns} turns", file=sys.stderr, flush=True
        )
        result = await drive(port, keys, args.turns, meter)
    await drop_topics(case, args.keep_topics)
    return result if idle is None else {**result, "idle_cpu_ms_per_s": idle}


IDLE_SETTLE_S = 5.0
"""How long a deployment just started runs before its idle CPU is measured (start-up work done)."""


async def idle_cpu(groups: dict[str, list[int]], seconds: float) -> dict[str, float]:
    """CPU each group of processes spends a second while the deployment has nothing to do
    (``--idle``): its polling, heartbeats and housekeeping, before any session exists."""
    await asyncio.sleep(IDLE_SETTLE_S)
    every = [pid for group in groups.values() for pid in group]
    before = _cpu_now(every)
    await asyncio.sleep(seconds)
    after = _cpu_now(every)
    spent = {pid: after[pid] - before[pid] for pid in after if pid in before}
    return {
        name: round(sum(spent.get(pid, 0.0) for pid in pids) * 1000 / seconds, 1)
        for name, pids in groups.items()
    }


def _cpu_now(pids: list[int]) -> dict[int, float]:
    """CPU seconds each process has spent so far (a process gone is left out)."""
    return {pid: cpu for pid in pids if (cpu := CpuMeter.cpu_s(pid)) is not None}
