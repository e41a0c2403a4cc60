#!/usr/bin/env python
"""Projection throughput: the batched apply against the old one, and against the floor.

    export TURNLOG_KAFKA_BOOTSTRAP=127.0.0.1:9092   # optional: Kafka + PostgreSQL columns
    export TURNLOG_POSTGRES_DSN=postgresql://turnlog:turnlog@127.0.0.1:5432/turnlog_test
    PYTHONPATH=. .venv/bin/python bench/projection_batches.py [--sessions 600] [--turns 3] [--reps 3]

The workload is real engine output: ``--sessions`` sessions talking at once (so their events
interleave in every partition), ``--turns`` turns each, two tool calls per turn, on an embedded
log of 8 partitions; with Kafka it is copied record by record to a fresh 8-partition topic.

* **apply**: the records, read into memory first, applied in batches of ``BATCH`` (5,000: the
  grouping ``turnlog.projections.rebuild`` uses) into a fresh store: the store's cost alone. ``old`` is the code
  before the batched apply (``--baseline``, imported from git: one SELECT of the version and one
  round trip per statement, per event); ``new`` the batched apply; on PostgreSQL also two other
  ways to send the same plan: ``executemany`` (new rows as INSERTs in a pipeline instead of
  COPY) and ``statements`` (every statement its own ``execute`` in one pipeline). The floors:
  the log's own records (session, version, type, Avro bytes: one row per event) written to an
  unindexed table in the same batches, with COPY and with executemany.
* **rebuild**: ``turnlog.projections.rebuild`` (drop, refold from offset 0) from the log, old and new:
  embedded log into SQLite, embedded log into PostgreSQL, and Kafka into PostgreSQL (a fresh
  reader each time: a new process's view). The floor there is reading the log alone.

Every figure is events per second, the median of ``--reps`` runs, old and new interleaved in
each run; ``cpu_us`` is this process's CPU (all threads) per event. JSON goes to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Awaitable, Callable

from aiokafka import AIOKafkaProducer

from turnlog.engine import (
    Agent,
    AgentDirectory,
    AgentSessions,
    FunctionModel,
    KafkaEventLog,
    SqliteEventLog,
    call,
    codec,
    reply,
    tool,
)
from turnlog.engine.log.base import EventLog, LogRecord
from turnlog.engine.log.kafka import _headers
from turnlog.engine.models.base import ModelRequest
from turnlog.projections import PostgresProjectionStore, SqliteProjectionStore, rebuild
from turnlog.projections.batch import Group, NewRows
from turnlog.projections.changes import insert_sql
from turnlog.projections.postgres import PostgresWriter, to_pyformat
from turnlog.projections.rebuild import BATCH, read_batches

REPO = Path(__file__).resolve().parent.parent
PARTITIONS = 8
BASELINE = "2c68758"
"""The last commit before the batched apply: the ``old`` columns."""


# --------------------------------------------------------------------------- workload


@tool(idempotent=True)
async def lookup(order_id: str) -> dict:
    """Look up an order."""
    return {"order_id": order_id, "status": "delayed", "eta": "tomorrow"}


def _two_lookups(request: ModelRequest):
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    results = [m for m in request.messages[last_user + 1 :] if m.role == "tool"]
    if len(results) < 2:
        return reply("checking", call("lookup", {"order_id": f"O-{len(results)}"}, f"c{len(results)}"))
    return reply("your order is delayed and arrives tomorrow")


async def write_workload(path: Path, sessions: int, turns: int) -> SqliteEventLog:
    log = SqliteEventLog(path, partitions=PARTITIONS)
    api = AgentSessions(log, AgentDirectory([Agent.build("agent", FunctionModel(_two_lookups), [lookup])]))

    async def talk(s: int) -> None:
        sid = (await api.create_session("agent", f"user-{s % 50}")).session_id
        for _ in range(turns):
            async for _ in api.send_user_message(sid, "where is my order?"):
                pass

    await asyncio.gather(*(talk(s) for s in range(sessions)))
    return log


async def all_batches(log: EventLog) -> list[list[LogRecord]]:
    return [batch async for batch in read_batches(log, {}, BATCH)]


async def copy_to_kafka(log: EventLog, bootstrap: str) -> str:
    """The embedded log's records, same partitions and order, on a fresh topic."""
    topic = f"bench.proj.{uuid.uuid4().hex[:8]}"
    creator = KafkaEventLog(bootstrap, topic=topic, partitions=PARTITIONS, owner=False)
    await creator.start()
    await creator.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=1 << 20)
    await producer.start()
    try:
        for batch in await all_batches(log):
            for r in batch:
                e = r.event
                await producer.send(
                    topic,
                    codec.encode(e),
                    key=e.session_id.encode(),
                    partition=r.partition,
                    headers=_headers(e),
                )
        await producer.flush()
    finally:
        await producer.stop()
    return topic


# --------------------------------------------------------------------------- stores


def baseline_package(rev: str, into: Path) -> Any:
    """The ``projections`` package as it was at ``rev``, importable as ``baseline_projections``."""
    package = into / "baseline_projections"
    package.mkdir()
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", rev, "projections/"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for name in names:
        source = subprocess.run(
            ["git", "show", f"{rev}:{name}"], cwd=REPO, check=True, capture_output=True
        ).stdout
        (package / Path(name).name).write_bytes(source)
    sys.path.insert(0, str(into))
    return importlib.import_module("baseline_projections")


class ExecutemanyWriter(PostgresWriter):
    """The same plan, new rows as INSERT executemany in a pipeline instead of COPY."""

    def insert_rows(self, rows: NewRows) -> None:
        self.run_groups([Group(insert_sql(rows.table, rows.columns), rows.rows)])


class StatementWriter(PostgresWriter):
    """The same plan, every statement its own execute in one pipeline."""

    def run_groups(self, groups: Any) -> list[int]:
        cursors: list[list[Any]] = []
        with self.conn.pipeline():
            for group in groups:
                statement = to_pyformat(group.sql)
                cursors.append([self.conn.execute(statement, row) for row in group.rows])
        return [sum(c.rowcount for c in group) for group in cursors]

    def insert_rows(self, rows: NewRows) -> None:
        self.run_groups([Group(insert_sql(rows.table, rows.columns), rows.rows)])


class Stores:
    """Fresh stores of each kind; PostgreSQL schemas are dropped at the end."""

    def __init__(self, tmp: Path, baseline: Any) -> None:
        self.tmp = tmp
        self.baseline = baseline
        self.dsn = os.environ.get("TURNLOG_POSTGRES_DSN", "")
        self.schemas: list[str] = []

    def open(self, kind: str, writer: type[PostgresWriter] = PostgresWriter) -> Any:
        name = f"bench_{uuid.uuid4().hex[:10]}"
        if kind == "sqlite":
            return SqliteProjectionStore(self.tmp / f"{name}.db")
        if kind == "sqlite_old":
            return self.baseline.SqliteProjectionStore(self.tmp / f"{name}.db")
        self.schemas.append(name)
        if kind == "postgres_old":  # one connection: its backend's CPU is the server's share
            return self.baseline.PostgresProjectionStore(self.dsn, schema=name, max_size=1)
        store = PostgresProjectionStore(self.dsn, schema=name, max_size=1)
        store.writer_class = writer
        return store

    def drop(self) -> None:
        import psycopg

        if not self.schemas:
            return
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for schema in self.schemas:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


# --------------------------------------------------------------------------- measures


def backend_pid(store: Any) -> int | None:
    """The PostgreSQL backend of a one-connection store (None for SQLite)."""
    if not hasattr(store, "schema"):
        return None
    return int(store._query("SELECT pg_backend_pid() AS pid")[0]["pid"])


def process_cpu_s(pid: int | None) -> float:
    """CPU seconds a local process has used (the PostgreSQL backend runs on this machine)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def timed(events: int, work: Callable[[], Awaitable[Any]], server: int | None) -> dict[str, float]:
    wall, cpu, server_cpu = time.perf_counter(), time.process_time(), process_cpu_s(server)
    await work()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    result = {"events_per_s": events / wall, "cpu_us": cpu / events * 1e6}
    if server is not None:
        result["server_cpu_us"] = (process_cpu_s(server) - server_cpu) / events * 1e6
    return result


async def apply_all(store: Any, batches: list[list[LogRecord]]) -> None:
    for batch in batches:
        store.apply(batch)


FLOOR_DDL = "CREATE TABLE floor_{0} (session_id TEXT, version BIGINT, type TEXT, value {1})"


def floor_rows(batches: list[list[LogRecord]]) -> list[list[tuple[Any, ...]]]:
    return [
        [(r.event.session_id, r.event.version, r.event.type, codec.encode(r.event)) for r in b]
        for b in batches
    ]


def sqlite_floor(tmp: Path, rows: list[list[tuple[Any, ...]]]) -> Callable[[], Awaitable[None]]:
    import sqlite3

    db = sqlite3.connect(tmp / f"floor-{uuid.uuid4().hex}.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute(FLOOR_DDL.format("many", "BLOB"))

    async def work() -> None:
        for batch in rows:
            db.execute("BEGIN")
            db.executemany("INSERT INTO floor_many VALUES (?, ?, ?, ?)", batch)
            db.execute("COMMIT")
        db.close()

    return work


def postgres_floor(
    dsn: str, rows: list[list[tuple[Any, ...]]], how: str
) -> tuple[Callable[[], Awaitable[None]], int]:
    import psycopg

    conn = psycopg.connect(dsn)
    pid = conn.info.backend_pid
    schema = f"bench_floor_{uuid.uuid4().hex[:8]}"
    conn.execute(f"CREATE SCHEMA {schema}")
    conn.execute(f"SET search_path = {schema}")
    conn.execute(FLOOR_DDL.format(how, "BYTEA"))
    conn.commit()

    async def work() -> None:
        for batch in rows:
            with conn.transaction():
                if how == "copy":
                    with conn.cursor().copy("COPY floor_copy FROM STDIN") as copy:
                        for row in batch:
                            copy.write_row(row)
                else:
                    conn.cursor().executemany("INSERT INTO floor_many VALUES (%s, %s, %s, %s)", batch)
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
        conn.commit()
        conn.close()

    return work, pid


async def old_rebuild(log: EventLog, store: Any, baseline: Any) -> int:
    return int(await baseline.rebuild(log, store))


async def read_only(log: EventLog) -> None:
    for p in range(log.partitions):
        offset = 0
        while records := await log.read_partition(p, offset, BATCH):
            offset = records[-1].offset + 1


def median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(r[k] for r in runs), 1) for k in runs[0]}


class Bench:
    def __init__(
        self, log: SqliteEventLog, batches: list[list[LogRecord]], stores: Stores, reps: int
    ) -> None:
        self.log = log
        self.batches = batches
        self.events = sum(map(len, batches))
        self.stores = stores
        self.reps = reps
        self.runs: dict[str, list[dict[str, float]]] = {}

    async def case(
        self, name: str, work: Callable[[], Awaitable[Any]], close: Any = None, server: int | None = None
    ) -> None:
        result = await timed(self.events, work, server if server is not None else backend_pid(close))
        if close is not None:
            close.close()
        self.runs.setdefault(name, []).append(result)
        print(f"  {name}: {result['events_per_s']:,.0f} events/s", file=sys.stderr, flush=True)

    async def apply_cases(self, postgres: bool) -> None:
        rows = floor_rows(self.batches)
        for kind in ("sqlite_old", "sqlite"):
            store = self.stores.open(kind)
            await self.case(f"apply {kind}", lambda s=store: apply_all(s, self.batches), store)
        await self.case("apply sqlite floor", sqlite_floor(self.stores.tmp, rows))
        if not postgres:
            return
        for name, kind, writer in (
            ("apply postgres_old", "postgres_old", PostgresWriter),
            ("apply postgres", "postgres", PostgresWriter),
            ("apply postgres executemany", "postgres", ExecutemanyWriter),
            ("apply postgres statements", "postgres", StatementWriter),
        ):
            store = self.stores.open(kind, writer)
            await self.case(name, lambda s=store: apply_all(s, self.batches), store)
        for how in ("copy", "many"):
            work, pid = postgres_floor(self.stores.dsn, rows, how)
            await self.case(f"apply postgres floor {how}", work, server=pid)

    async def rebuild_cases(self, kafka: tuple[str, str] | None) -> None:
        sources: list[tuple[str, Callable[[], Awaitable[EventLog]], tuple[str, ...]]] = [
            ("sqlite", self._embedded, ("sqlite", "postgres") if kafka else ("sqlite",))
        ]
        if kafka is not None:
            sources.append(("kafka", lambda: self._kafka_reader(*kafka), ("postgres",)))
        for source, open_log, kinds in sources:
            reader = await open_log()
            await self.case(f"read {source}", lambda r=reader: read_only(r))
            await reader.close()
            for kind in kinds:
                for old in (True, False):
                    reader, store = await open_log(), self.stores.open(f"{kind}_old" if old else kind)
                    work = (
                        (lambda r=reader, s=store: old_rebuild(r, s, self.stores.baseline))
                        if old
                        else (lambda r=reader, s=store: rebuild(r, s))
                    )
                    await self.case(f"rebuild {source}->{kind}{'_old' if old else ''}", work, store)
                    await reader.close()

    async def _embedded(self) -> EventLog:
        return SqliteEventLog(self.log.path, partitions=PARTITIONS)

    async def _kafka_reader(self, bootstrap: str, topic: str) -> EventLog:
        reader = KafkaEventLog(bootstrap, topic=topic, partitions=PARTITIONS, owner=False)
        await reader.start()
        return reader


def code_version() -> str:
    """The commit measured, with "+changes" when projections/ or this file differ from it."""
    git = ["git", "-C", str(REPO)]
    head = subprocess.run(
        [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "projections", "bench/projection_batches.py"],
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    return head + ("+changes" if dirty else "")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def main(args: argparse.Namespace) -> dict[str, Any]:
    bootstrap = os.environ.get("TURNLOG_KAFKA_BOOTSTRAP")
    postgres = bool(os.environ.get("TURNLOG_POSTGRES_DSN"))
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        started = time.perf_counter()
        log = await write_workload(tmp / "log.db", args.sessions, args.turns)
        batches = await all_batches(log)
        events = sum(map(len, batches))
        print(f"workload: {events} events in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        kafka = (bootstrap, await copy_to_kafka(log, bootstrap)) if bootstrap and postgres else None
        stores = Stores(tmp, baseline_package(args.baseline, tmp))
        bench = Bench(log, batches, stores, args.reps)
        loads = [load()]
        try:
            for rep in range(args.reps):
                print(f"rep {rep + 1}/{args.reps} (load {load()})", file=sys.stderr, flush=True)
                await bench.apply_cases(postgres)
                await bench.rebuild_cases(kafka)
                loads.append(load())
        finally:
            stores.drop()
            await log.close()
            if kafka is not None:
                from tests.services import delete_topics

                await delete_topics(*kafka)
    return {
        "commit": code_version(),
        "events": events,
        "sessions": args.sessions,
        "turns": args.turns,
        "batch": BATCH,
        "reps": args.reps,
        "baseline": args.baseline,
        "load_average_1_5_15": loads,
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "results": {name: median(runs) for name, runs in bench.runs.items()},
    }


def table(report: dict[str, Any]) -> str:
    r = report["results"]
    out = ["| case | events/s | CPU µs/event: this process | PostgreSQL backend |", "|---|---:|---:|---:|"]
    for name, v in r.items():
        server = f"{v['server_cpu_us']:.1f}" if "server_cpu_us" in v else "-"
        out.append(f"| {name} | {v['events_per_s']:,.0f} | {v['cpu_us']:.1f} | {server} |")
    return "\n".join(out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=600)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--baseline", default=BASELINE)
    parser.add_argument("--out", default="bench/results/projections.json")
    arguments = parser.parse_args()
    report = asyncio.run(main(arguments))
    print(table(report))
    Path(arguments.out).write_text(json.dumps(report, indent=2))
