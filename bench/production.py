#!/usr/bin/env python
"""The production path end to end: HTTP gateway -> log -> turn worker(s) -> a model with a fixed
latency -> tools -> projections, with many users at once.

    scripts/kafka.sh start && scripts/postgres.sh start        # for the kafka cases
    export TURNLOG_KAFKA_BOOTSTRAP=127.0.0.1:9092
    export TURNLOG_POSTGRES_DSN=postgresql://turnlog:turnlog@127.0.0.1:5432/turnlog_test
    PYTHONPATH=. .venv/bin/python bench/production.py [--sessions 500] [--turns 3] [--latency 0.2] \
        [--cases embedded,kafka-1,kafka-2] [--shapes real,bare] [--out bench/results/production-500.json]
    PYTHONPATH=. .venv/bin/python bench/production.py --inflight 10000 --latency 60 [--active 20]

Processes, all on this machine:

* a model server: bench/lean_model_server.py on loopback (OpenAI-compatible, next to no CPU
  per call), answering every chat completion after ``--latency`` seconds: ``lookup``, then
  ``notify``, then a text answer (three model calls and two tool steps per turn), called
  through the real ``openai`` SDK;
* the model layer alone: the same calls, one after the other per session, all sessions at once,
  through the same model adapter in a process of its own, without the engine: the floor that
  the model latency and the model layer's CPU allow on this machine, and the model client's
  own CPU per turn (engine CPU per turn = the deployment's CPU per turn minus that);
* ``embedded``: one gateway process (SQLite log and projections, the turn worker, projector,
  analytics and observability consumers in it);
* ``embedded-1`` (real shape only): `turnlog serve --no-worker` and one `turnlog worker` on the
  same SQLite file, the turns on a second core;
* ``kafka-N``: a gateway process on Kafka + PostgreSQL that owns no partition (it posts through
  the inbox, reads the log, and projects into PostgreSQL) and N turn-worker processes in the
  owners' group.

Two shapes of each case (``--shapes``):

* ``real`` (bench/production_real.py): `turnlog serve` and `turnlog worker` as users run them,
  the agent with long-term memory on, one user with a key of their own per session, and every
  session's client holding its SSE stream as a browser does; measured on those streams;
* ``bare``: the bench's own gateway and worker processes, the agent without memory, and a
  driver that reads the log directly (no SSE): the shape of the earlier runs.

The driver creates ``--sessions`` sessions over HTTP, then every session posts ``--turns``
messages, one after the other, each once its previous turn has ended (a user reading the
answer), all sessions at once. Bare: a reader in the driver follows the log and notes when each
message's turn starts (its first event) and ends; it also samples how many finished turns the
projections show. Reported: turns/s, POST -> first event and POST -> turn end (p50, p95, max),
the run's wall time against the floor the model latency alone allows (turns x 3 calls x
latency), and the projector's lag (for each finished turn, how long after the log had it the
projections had it: p50, max). ``--inflight N``: bench/production_inflight.py.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import signal
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

if __package__ in (None, ""):  # run as a script: bench/ is a package of the repository
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import production_real
from bench.production_common import (
    PARTITIONS,
    REPO,
    Case,
    CpuMeter,
    bench_command,
    cases,
    drop_topics,
    free_port,
    key_store_env,
    percentiles,
    process,
    service_pids,
    wait_accepting,
    wait_owners,
)

CALLS_PER_TURN = 3
KEY_USER = "bench"


# --- the agent every worker runs --------------------------------------------------------------


def bench_agent(model_url: str) -> Any:
    from turnlog.engine import Agent, tool
    from turnlog.engine.models.openai_compat import OpenAICompatibleModel

    @tool(idempotent=True)
    async def lookup(order_id: str) -> dict:
        """Look an order up (read-only)."""
        return {"order_id": order_id, "status": "delayed"}

    @tool(idempotent=False)
    async def notify(order_id: str) -> str:
        """Tell the customer about the order."""
        return "sent"

    model = OpenAICompatibleModel("bench-model", base_url=model_url, api_key="bench")
    return Agent("bench", model, [lookup, notify])


# --- subcommands: the processes ----------------------------------------------------------------


def model_server(port: int, latency: float) -> None:
    from bench.lean_model_server import serve

    asyncio.run(serve(port, latency))


def gateway(args: argparse.Namespace) -> None:
    import uvicorn

    from turnlog.engine import AgentDirectory, KafkaEventLog, SqliteEventLog
    from turnlog.gateway import Gateway, GatewayConfig, KeyStore, Limits
    from turnlog.projections import PostgresProjectionStore, SqliteProjectionStore

    agents = AgentDirectory([bench_agent(args.model_url)])
    limits = Limits(requests_per_second=1e6, burst=1_000_000, streams_per_user=10_000)
    home = Path(args.home)
    if args.kafka:
        log: Any = KafkaEventLog(
            args.kafka, topic=args.topic, partitions=PARTITIONS, owner=False, sealer=_cipher(args)
        )
        store: Any = PostgresProjectionStore(args.postgres, schema=args.schema)
    else:
        log = SqliteEventLog(home / "log.db", partitions=PARTITIONS, encrypt=args.encrypt)
        store = SqliteProjectionStore(home / "projections.db")
    config = GatewayConfig(limits=limits, run_worker=not args.kafka, log_sample_rate=0.0)

    async def serve() -> None:
        if args.kafka:
            await log.start()  # on the loop that serves: aiokafka's clients are bound to it
        app = Gateway(log, store, agents, KeyStore.from_file(home / "keys.toml"), config).app()
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
        )
        await server.serve()

    asyncio.run(serve())


async def worker(args: argparse.Namespace) -> None:
    from turnlog.consumers import TurnWorker
    from turnlog.engine import AgentDirectory, KafkaEventLog

    log = KafkaEventLog(
        args.kafka, topic=args.topic, partitions=PARTITIONS, client_id=args.id, sealer=_cipher(args)
    )
    await log.start()
    turn_worker = TurnWorker(log, AgentDirectory([bench_agent(args.model_url)]), worker_id=args.id)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, turn_worker.stop)
    await turn_worker.run()
    await log.close()


def _cipher(args: argparse.Namespace) -> Any:
    """The Kafka processes' content cipher when the case encrypts (TURNLOG_KEYSTORE, set by the
    driver to a schema of the case's PostgreSQL), else None."""
    from turnlog.engine.crypto.setup import configured_cipher

    return configured_cipher() if args.encrypt else None


async def model_floor(args: argparse.Namespace) -> None:
    """The model layer alone, in a process of its own: every session's calls, one after the
    other as its turns make them, all sessions at once, through the same model adapter (one
    OpenAI SDK client) against the same model server, with the history growing as in a turn:
    what the model latency and the model layer's CPU allow on this machine, minus the engine."""
    from turnlog.engine.messages import ChatMessage
    from turnlog.engine.models.base import ModelRequest, ModelResponse
    from turnlog.engine.models.openai_compat import OpenAICompatibleModel

    model = OpenAICompatibleModel("bench-model", base_url=args.model_url, api_key="bench")

    async def one_session() -> None:
        messages = [ChatMessage.system("You are the bench agent.")]
        for _ in range(args.turns):
            messages.append(ChatMessage.user("Where is order A-1?"))
            for _step in range(CALLS_PER_TURN):
                request = ModelRequest(list(messages), (), "floor", "floor")
                response = None
                async for chunk in model.stream(request):
                    response = chunk
                assert isinstance(response, ModelResponse)
                messages.append(ChatMessage("assistant", response.text, response.tool_calls))
                for call in response.tool_calls:
                    messages.append(ChatMessage("tool", "delayed", tool_call_id=call.call_id, name=call.name))

    await one_session()  # warm: connections, imports
    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one_session() for _ in range(args.sessions)))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(json.dumps({"wall_s": round(wall, 2), "cpu_s": round(cpu, 3)}), flush=True)
    await model.aclose()


async def measure_model_floor(model_url: str, args: argparse.Namespace) -> dict[str, float]:
    """Run ``model_floor`` in a process of its own: its wall time and CPU, in seconds."""
    proc = await asyncio.create_subprocess_exec(
        *bench_command("--sessions", str(args.sessions), "--turns", str(args.turns), "model-floor",
                       "--model-url", model_url),
        env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"the model-layer floor run failed ({proc.returncode})")
    found = json.loads(out.decode().strip().splitlines()[-1])
    return {"wall_s": float(found["wall_s"]), "cpu_s": float(found["cpu_s"])}


# --- the driver --------------------------------------------------------------------------------


@dataclass
class Turn:
    posted: float = 0.0
    started: float = 0.0
    ended: asyncio.Future[float] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class LogWatcher:
    """Follows the log from its end at start-up and notes, per message id, when its turn starts
    and ends. Embedded: it reads the SQLite log every ``poll_s``; Kafka: a read_committed
    consumer tails every partition (what any reader of the topic sees, and when)."""

    def __init__(self, case: Case, poll_s: float = 0.01) -> None:
        self.case = case
        self.poll_s = poll_s
        self.turns: dict[str, Turn] = {}
        self.finished_at: list[float] = []

    def expect(self, message_id: str) -> Turn:
        turn = self.turns[message_id] = Turn()
        return turn

    def seen(self, event: Any, now: float) -> None:
        from turnlog.engine import events as ev

        if isinstance(event, ev.TurnStarted) and event.message_id in self.turns:
            self.turns[event.message_id].started = now
        elif isinstance(event, ev.TurnFinished) and event.message_id in self.turns:
            self.finished_at.append(now)
            turn = self.turns[event.message_id]
            if not turn.ended.done():
                turn.ended.set_result(now)

    async def run(self) -> None:
        if self.case.kafka:
            await self._tail_kafka()
        else:
            await self._poll_sqlite()

    async def _poll_sqlite(self) -> None:
        from turnlog.engine import SqliteEventLog

        log = SqliteEventLog(self.case.home / "log.db", partitions=PARTITIONS)
        offsets = {p: await log.end_offset(p) for p in range(PARTITIONS)}
        try:
            while True:
                for p in range(PARTITIONS):
                    while records := await log.read_partition(p, offsets[p], 2000):
                        now = time.perf_counter()
                        offsets[p] = records[-1].offset + 1
                        for record in records:
                            self.seen(record.event, now)
                await asyncio.sleep(self.poll_s)
        finally:
            await log.close()

    async def _tail_kafka(self) -> None:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        from turnlog.engine import codec

        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.case.kafka, isolation_level="read_committed", fetch_max_wait_ms=10
        )
        await consumer.start()
        try:
            tps = [TopicPartition(self.case.topic, p) for p in range(PARTITIONS)]
            consumer.assign(tps)
            await consumer.seek_to_end(*tps)
            while True:
                batches = await consumer.getmany(timeout_ms=100, max_records=2000)
                now = time.perf_counter()
                for messages in batches.values():
                    for message in messages:
                        with contextlib.suppress(Exception):  # poison is not ours to judge here
                            self.seen(codec.decode(message.value), now)
        finally:
            await consumer.stop()


class ProjectionSampler:
    """How many finished turns the projections show, sampled every ``every_s``."""

    QUERY = "SELECT count(*) FROM turns WHERE outcome IS NOT NULL"

    def __init__(self, case: Case, every_s: float = 0.05) -> None:
        self.case = case
        self.every_s = every_s
        self.samples: list[tuple[float, int]] = []
        self._conn: Any = None

    def count(self) -> int:
        if self.case.kafka:
            import psycopg

            if self._conn is None:
                options = f"-c search_path={self.case.schema}"
                self._conn = psycopg.connect(str(self.case.postgres), options=options, autocommit=True)
            row = self._conn.execute(self.QUERY).fetchone()
        else:
            with contextlib.closing(sqlite3.connect(self.case.home / "projections.db", timeout=30)) as db:
                try:
                    row = db.execute(self.QUERY).fetchone()
                except sqlite3.OperationalError:  # not created yet
                    row = (0,)
        return int(row[0]) if row else 0

    async def run(self) -> None:
        try:
            while True:
                count = await asyncio.to_thread(self.count)
                self.samples.append((time.perf_counter(), count))
                await asyncio.sleep(self.every_s)
        finally:
            if self._conn is not None:
                self._conn.close()

    def lag(self, base: int, finished_at: list[float]) -> list[float]:
        """For the k-th finished turn: when the projections showed k (beyond ``base``) minus
        when the log had it."""
        lags, i = [], 0
        for k, seen in enumerate(sorted(finished_at), start=1):
            while i < len(self.samples) and self.samples[i][1] - base < k:
                i += 1
            if i == len(self.samples):
                break
            lags.append(max(0.0, self.samples[i][0] - seen))
        return lags


async def create_sessions(client: httpx.AsyncClient, count: int) -> list[str]:
    async def one(i: int) -> str:
        response = await client.post("/v1/sessions", json={"agent": "bench"})
        response.raise_for_status()
        return str(response.json()["session_id"])

    sessions: list[str] = []
    for start in range(0, count, 50):
        sessions += await asyncio.gather(*(one(i) for i in range(start, min(count, start + 50))))
    return sessions


async def post(client: httpx.AsyncClient, sid: str, message_id: str) -> None:
    for _ in range(200):  # on Kafka a just-created session is sequenced by its owner first
        try:
            response = await client.post(
                f"/v1/sessions/{sid}/messages", json={"text": "Where is order A-1?", "message_id": message_id}
            )
        except httpx.TransportError:  # a kept-alive connection the gateway closed as it was reused:
            continue  # the message id makes the retry safe
        if response.status_code != 404:
            response.raise_for_status()
            return
        await asyncio.sleep(0.05)
    raise SystemExit(f"session {sid} never appeared on the log")


async def converse(client: httpx.AsyncClient, watcher: LogWatcher, sid: str, turns: int) -> None:
    for t in range(turns):
        message_id = f"{sid}-t{t}"
        turn = watcher.expect(message_id)
        turn.posted = time.perf_counter()
        await post(client, sid, message_id)
        await turn.ended


async def drive(
    case: Case, port: int, sessions: int, turns: int, latency: float, meter: CpuMeter
) -> dict[str, Any]:
    watcher, sampler = LogWatcher(case), ProjectionSampler(case)
    key = (case.home / "key.txt").read_text().strip()
    headers = {"Authorization": f"Bearer {key}"}
    # idle connections expire before the gateway's keep-alive (5 s) closes them under a request
    limits = httpx.Limits(max_connections=sessions, max_keepalive_connections=sessions, keepalive_expiry=2.0)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=120, limits=limits
    ) as client:
        following = [asyncio.create_task(watcher.run()), asyncio.create_task(sampler.run())]
        try:
            (warm,) = await create_sessions(client, 1)  # the whole path once, before the clock
            await converse(client, watcher, warm, 1)
            sids = [s for s in await create_sessions(client, sessions + 1) if s != warm][:sessions]
            base = await asyncio.to_thread(sampler.count)
            meter.start()
            started = time.perf_counter()
            await asyncio.gather(*(converse(client, watcher, sid, turns) for sid in sids))
            wall = time.perf_counter() - started
            meter.stop()
            for _ in range(600):  # let the projections catch up, then measure their lag
                if sampler.samples and sampler.samples[-1][1] - base >= sessions * turns:
                    break
                await asyncio.sleep(0.05)
        finally:
            for task in following:
                task.cancel()
            await asyncio.gather(*following, return_exceptions=True)
    measured = [t for mid, t in watcher.turns.items() if not mid.startswith(warm)]
    floor = turns * CALLS_PER_TURN * latency
    return {
        "sessions": sessions,
        "turns": len(measured),
        "wall_s": round(wall, 2),
        "floor_s": round(floor, 2),
        "wall_over_floor": round(wall / floor, 2),
        "turns_per_s": round(len(measured) / wall, 1),
        "floor_turns_per_s": round(len(measured) / floor, 1),
        "post_to_first_event_ms": percentiles([t.started - t.posted for t in measured]),
        "post_to_turn_end_ms": percentiles([t.ended.result() - t.posted for t in measured]),
        "turn_floor_ms": round(CALLS_PER_TURN * latency * 1000, 1),
        "projector_lag_ms": percentiles(sampler.lag(base, watcher.finished_at[1:])),
        "cpu_ms_per_turn": {name: round(s * 1000 / len(measured), 2) for name, s in meter.spent.items()},
    }


def make_key(home: Path) -> None:
    from turnlog.serve import add_key

    (home / "key.txt").write_text(add_key(home / "keys.toml", KEY_USER, "user"))


async def run_case(case: Case, model_url: str, args: argparse.Namespace) -> dict[str, Any]:
    case.home.mkdir(parents=True, exist_ok=True)
    make_key(case.home)
    port = free_port()
    common = ["--model-url", model_url]
    common += ["--encrypt"] if case.encrypt else []
    key_env = key_store_env(case)
    gw_args = ["gateway", "--home", str(case.home), "--port", str(port), *common]
    if case.kafka:
        gw_args += ["--kafka", case.kafka, "--topic", case.topic, "--postgres", str(case.postgres)]
        gw_args += ["--schema", case.schema]
    with contextlib.ExitStack() as stack:
        gw = stack.enter_context(process(bench_command(*gw_args), name=f"{case.name}-gateway", env=key_env))
        await wait_accepting(port, gw, "the gateway")
        workers = []
        for i in range(case.workers):
            worker_args = ["worker", "--kafka", str(case.kafka), "--topic", case.topic, "--id", f"w{i}"]
            name = f"{case.name}-worker-{i}"
            command = bench_command(*worker_args, *common)
            workers.append(stack.enter_context(process(command, name=name, env=key_env)))
        if case.workers > 1:
            await wait_owners(case)  # a rebalance while measuring would move partitions mid-run
        meter = CpuMeter({"gateway": [gw.pid], "workers": [w.pid for w in workers], **service_pids(case)})
        print(f"{case.name}: {args.sessions} sessions x {args.turns} turns", file=sys.stderr, flush=True)
        result = await drive(case, port, args.sessions, args.turns, args.latency, meter)
    await drop_topics(case, args.keep_topics)
    return result


def table(results: dict[str, dict[str, Any]]) -> str:
    rows = [
        ("turns", lambda r: r["turns"]),
        ("wall time (s) / latency floor", lambda r: f"{r['wall_s']} ({r['wall_over_floor']}x)"),
        ("/ model layer alone (s)", lambda r: f"{r['model_layer_s']} ({r['wall_over_model_layer']}x)"),
        ("turns/s", lambda r: r["turns_per_s"]),
        ("POST -> first event p50 / p95 / max (ms)", lambda r: _ms(r["post_to_first_event_ms"])),
        ("POST -> turn end p50 / p95 / max (ms)", lambda r: _ms(r["post_to_turn_end_ms"])),
        (
            "turn end p50 by round (ms)",
            lambda r: " / ".join(map(str, r.get("turn_end_p50_ms_by_round", ["-"]))),
        ),
        (
            "POST -> first event by leg, p50 (ms)",
            lambda r: ", ".join(f"{k} {v}" for k, v in r.get("first_event_p50_ms_by_leg", {}).items()) or "-",
        ),
        ("event latency p50 / p95 / max (ms)", lambda r: _ms(r.get("event_latency_ms", {}))),
        ("projector lag p50 / p95 / max (ms)", lambda r: _ms(r.get("projector_lag_ms", {}))),
        ("idle, before any session: CPU per second (ms)", lambda r: _cpu(r.get("idle_cpu_ms_per_s", {}))),
        ("CPU per turn (ms)", lambda r: _cpu(r.get("cpu_ms_per_turn", {}))),
        ("model client alone, CPU per turn (ms)", lambda r: r["model_client_cpu_ms_per_turn"]),
        ("the driver's clients, CPU per turn (ms)", lambda r: r.get("driver_cpu_ms_per_turn", "-")),
        (
            "engine CPU per turn (ms) / model client's",
            lambda r: f"{r['engine_cpu_ms_per_turn']} ({r['engine_over_model_client']}x)",
        ),
        ("busiest process: CPU / wall; its CPU / model layer's wall", _busiest),
        ("all processes and the driver: CPU / (wall x cores)", lambda r: r.get("machine_cpu_share", "-")),
        ("model layer alone: CPU / wall", lambda r: r.get("model_layer_cpu_share", "-")),
    ]
    names = list(results)
    out = ["| measure | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for label, cell in rows:
        out.append(f"| {label} | " + " | ".join(str(cell(results[n])) for n in names) + " |")
    return "\n".join(out)


def _busiest(r: dict[str, Any]) -> str:
    if "busiest_process" not in r:
        return "-"
    return f"{r['busiest_process']} {r['busiest_cpu_share']}; {r['busiest_cpu_over_model_layer']}x"


def _cpu(spent: dict[str, float]) -> str:
    return ", ".join(f"{name} {ms}" for name, ms in spent.items() if ms) or "-"


def _ms(p: dict[str, float]) -> str:
    return f"{p.get('p50', '-')} / {p.get('p95', '-')} / {p.get('max', '-')}"


def compared(result: dict[str, Any], floor: dict[str, float], args: argparse.Namespace) -> dict[str, Any]:
    """The case's figures against the floors: the latency floor, the model layer alone (its wall
    time, and its CPU per turn: the model client's own), engine CPU = all of it minus that."""
    latency_floor = args.turns * CALLS_PER_TURN * args.latency
    model_cpu = floor["cpu_s"] * 1000 / (args.sessions * args.turns)
    total = sum(result.get("cpu_ms_per_turn", {}).values())
    engine = total - model_cpu
    return {
        **result,
        "floor_s": round(latency_floor, 2),
        "wall_over_floor": round(result["wall_s"] / latency_floor, 2),
        "model_layer_s": floor["wall_s"],
        "wall_over_model_layer": round(result["wall_s"] / floor["wall_s"], 2),
        "model_client_cpu_ms_per_turn": round(model_cpu, 2),
        "cpu_ms_per_turn_total": round(total, 2),
        "engine_cpu_ms_per_turn": round(engine, 2),
        "engine_over_model_client": round(engine / model_cpu, 2),
        **cpu_bound(result, floor),
    }


def cpu_bound(result: dict[str, Any], floor: dict[str, float]) -> dict[str, Any]:
    """How close to CPU-bound the run was: the busiest process's CPU as a share of the wall time,
    and as a multiple of the model layer's wall time (one process uses one core, so that multiple
    is the least ``wall_over_model_layer`` its CPU per turn allows); the measured processes' and
    the driver's CPU as a share of the machine's cores (the model server's is not counted); the
    model layer's own share says whether the floor was CPU-bound too."""
    spent = result.get("cpu_ms_per_turn", {})
    if not spent:
        return {}
    name, ms = max(spent.items(), key=lambda item: item[1])  # a process, or a group (workers)
    busiest_s = ms * result["turns"] / 1000
    all_s = (sum(spent.values()) + result.get("driver_cpu_ms_per_turn", 0.0)) * result["turns"] / 1000
    return {
        "busiest_process": name,
        "busiest_cpu_share": round(busiest_s / result["wall_s"], 2),
        "busiest_cpu_over_model_layer": round(busiest_s / floor["wall_s"], 2),
        "machine_cpu_share": round(all_s / (result["wall_s"] * (os.cpu_count() or 1)), 2),
        "model_layer_cpu_share": round(floor["cpu_s"] / floor["wall_s"], 2),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    results: dict[str, Any] = {}
    server = bench_command("model-server", "--port", str(port), "--latency", str(args.latency))
    with (
        tempfile.TemporaryDirectory(prefix="turnlog-bench-") as tmp,
        process(server, name="model") as model,
    ):
        await wait_accepting(port, model, "the model server")
        model_url = f"http://127.0.0.1:{port}/v1"
        print(
            f"the model layer alone: {args.sessions} sessions x {args.turns} turns",
            file=sys.stderr,
            flush=True,
        )
        floor = await measure_model_floor(model_url, args)
        for shape in args.shapes.split(","):
            for case in cases(args.cases.split(","), Path(tmp) / shape):
                if shape == "real" and not case.encrypt and case.kafka is None:
                    print(f"{case.name} (real): skipped, `turnlog serve` always encrypts", file=sys.stderr)
                    continue
                if shape == "bare" and case.workers and case.kafka is None:
                    print(f"{case.name} (bare): skipped, a real-shape case only", file=sys.stderr)
                    continue
                if shape == "real":
                    result = await production_real.run_case(case, model_url, args)
                else:
                    result = await run_case(case, model_url, args)
                results[f"{case.name} {shape}"] = compared(result, floor, args)
                print(json.dumps(results[f"{case.name} {shape}"]), file=sys.stderr, flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command")
    ms = sub.add_parser("model-server")
    ms.add_argument("--port", type=int, required=True)
    ms.add_argument("--latency", type=float, required=True)
    gw = sub.add_parser("gateway")
    for p in (gw, wk := sub.add_parser("worker")):
        p.add_argument("--model-url", required=True)
        p.add_argument("--kafka")
        p.add_argument("--topic", default="")
        p.add_argument("--encrypt", action="store_true", help="content encryption (engine.crypto)")
    gw.add_argument("--home", required=True)
    gw.add_argument("--port", type=int, required=True)
    gw.add_argument("--postgres")
    gw.add_argument("--schema", default="")
    wk.add_argument("--id", required=True)
    mf = sub.add_parser("model-floor")
    mf.add_argument("--model-url", required=True)
    parser.add_argument("--sessions", type=int, default=500)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--cases", default="embedded,kafka-1,kafka-2")
    parser.add_argument(
        "--shapes",
        default="real,bare",
        help="real: `turnlog serve`/`worker`, SSE clients, memory; bare: as before",
    )
    parser.add_argument(
        "--profile", type=Path, default=None, help="py-spy the processes while measured, into DIR"
    )
    parser.add_argument("--inflight", type=int, default=0, help="N turns waiting on a model of --latency s")
    parser.add_argument("--active", type=int, default=20, help="with --inflight: sessions that keep talking")
    parser.add_argument(
        "--idle-window",
        type=float,
        default=20.0,
        help="with --inflight: seconds CPU is measured while only waiting",
    )
    parser.add_argument(
        "--idle",
        type=float,
        default=0.0,
        help="real shape: first measure each process's CPU over this many seconds with nothing to do",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--keep-topics", action="store_true", help="keep each Kafka case's topics, to read what happened"
    )
    args = parser.parse_args()
    if args.command in ("gateway", "worker", "model-floor"):
        from turnlog.collector import tune_collector

        tune_collector()  # as `turnlog serve` and `turnlog worker` do: the floor runs as they do
    if args.command == "model-server":
        model_server(args.port, args.latency)
    elif args.command == "gateway":
        gateway(args)
    elif args.command == "worker":
        asyncio.run(worker(args))
    elif args.command == "model-floor":
        asyncio.run(model_floor(args))
    elif args.inflight:
        from bench import production_inflight

        production_inflight.main(args)
    else:
        os.environ.setdefault("TURNLOG_MASTER_KEY", base64.b64encode(os.urandom(32)).decode())
        CpuMeter.profile_dir = args.profile
        results = asyncio.run(run(args))
        load = os.getloadavg()
        from bench.engine_version import fingerprint

        settings = {"sessions": args.sessions, "turns": args.turns, "latency_s": args.latency}
        doc = {"settings": settings, "engine": fingerprint(), "results": results, "loadavg": load}
        out = args.out or REPO / "bench" / "results" / f"production-{args.sessions}.json"
        out.write_text(json.dumps(doc, indent=1))
        print(table(results))
        print(f"load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")


if __name__ == "__main__":
    main()
