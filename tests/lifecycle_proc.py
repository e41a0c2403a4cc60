"""A worker process of the lifecycle fleet test (tests/test_lifecycle_fleet.py): the turn worker
and the lifecycle sweeper together, as `turnlog worker` runs them, with the test's clock (a
file it writes) and the test's eraser (tests/lifecycle_support.TableEraser).

python tests/lifecycle_proc.py CLOCK_FILE SWEEPS_FILE NAME HANG_ON LOG PARTITIONS STORE [SCHEMA]
    LOG is a SQLite log file, or ``kafka:BOOTSTRAP:TOPIC`` (a member of the owners' group);
    STORE is the projections' SQLite file, or a PostgreSQL DSN with SCHEMA. The eraser records in
    the same place (SCHEMA's ``erased`` table, or STORE's file). HANG_ON ``*`` makes every
    erasure hang (a process killed while erasing), ``-`` none. After each sweep the process
    writes how many it has made to SWEEPS_FILE, so the test knows sweeps ran without sleeping.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from tests.lifecycle_support import IDLE, RETAIN, TableEraser, agents, file_clock
from turnlog.consumers import TurnWorker
from turnlog.consumers.lifecycle import LifecycleSweeper
from turnlog.engine import AgentSessions, KafkaEventLog, Lifecycle, SqliteEventLog
from turnlog.engine.errors import LogUnavailableError
from turnlog.engine.log.base import EventLog
from turnlog.projections.postgres import PostgresProjectionStore
from turnlog.projections.store import ProjectionStore, SqliteProjectionStore

SWEEP_EVERY_S = 0.05


def open_log(where: str, partitions: int, name: str) -> EventLog:
    if where.startswith("kafka:"):
        _, bootstrap_host, port, topic = where.split(":", 3)
        return KafkaEventLog(
            f"{bootstrap_host}:{port}",
            topic=topic,
            partitions=partitions,
            client_id=name,
            session_timeout_ms=6000,
        )
    return SqliteEventLog(where, partitions=partitions)


def open_store(where: str, schema: str) -> ProjectionStore:
    if where.startswith("postgresql://"):
        return PostgresProjectionStore(where, schema=schema)
    return SqliteProjectionStore(where)


class HangingEraser(TableEraser):
    """Every erasure hangs before it records anything (``hang_on`` ``*``)."""

    async def erase_session(self, session_id: str, reason: str, *, actor: str = "admin") -> None:
        await asyncio.Event().wait()


async def main(clock: str, sweeps: str, name: str, hang_on: str, where: str, partitions: str, store_at: str,
               schema: str = "") -> None:  # fmt: skip
    log = open_log(where, int(partitions), name)
    if isinstance(log, KafkaEventLog):
        await log.start()
    store = open_store(store_at, schema)
    directory = agents(Lifecycle(idle_expiry=IDLE, retain_closed_for=RETAIN))
    eraser_class = HangingEraser if hang_on == "*" else TableEraser
    eraser = eraser_class(store_at, schema, name)
    worker = TurnWorker(log, directory, worker_id=name)
    sweeper = LifecycleSweeper(
        AgentSessions(log, directory, producer=name),
        store,
        eraser=eraser,
        clock=file_clock(Path(clock)),
        name=name,
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    running = asyncio.create_task(worker.run())
    made = 0
    while not stop.is_set():
        try:
            await sweeper.sweep_once()
        except LogUnavailableError as exc:  # a partition moving between workers: sweep again
            print(f"sweep failed: {exc}", flush=True)
            continue
        made += 1
        written = Path(f"{sweeps}.tmp")
        written.write_text(str(made))
        written.replace(sweeps)
        try:
            await asyncio.wait_for(stop.wait(), SWEEP_EVERY_S)
        except TimeoutError:
            pass
    worker.stop()
    await running
    store.close()
    await log.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
