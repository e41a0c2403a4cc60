"""What bench/production.py's shapes share: the processes they start, what they read of them in
/proc (CPU, resident memory), the Kafka cases, and percentiles."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PARTITIONS = 8
SERVICES_ENV = "BENCH_SERVICES"
"""Where the broker's and PostgreSQL's pid files are (default: the repository's .services)."""


@dataclass
class Case:
    name: str
    home: Path
    kafka: str | None = None
    postgres: str | None = None
    topic: str = ""
    schema: str = ""
    workers: int = 0
    encrypt: bool = True
    """Content encryption (the default); a ``-plain`` case turns it off, to compare."""


def key_store_env(case: Case) -> dict[str, str]:
    """The Kafka processes' key store (a schema of the case's own) when the case encrypts, and
    none when it does not; the embedded log keeps its keys beside it by itself."""
    if case.kafka is None:
        return {}
    if not case.encrypt:
        return {"TURNLOG_KEYSTORE": ""}
    return {"TURNLOG_KEYSTORE": str(case.postgres), "TURNLOG_KEYSTORE_SCHEMA": f"{case.schema}_keys"}


def cases(names: list[str], root: Path) -> list[Case]:
    out = []
    for name in names:
        encrypt = not name.endswith("-plain")
        if name.startswith("embedded"):
            split = name.startswith("embedded-1")
            out.append(Case(name, root / name, workers=1 if split else 0, encrypt=encrypt))
            continue
        workers = int(name.split("-")[1])
        out.append(
            Case(
                name,
                root / name,
                kafka=os.environ["TURNLOG_KAFKA_BOOTSTRAP"],
                postgres=os.environ["TURNLOG_POSTGRES_DSN"],
                topic=f"bench.prod.{uuid.uuid4().hex[:8]}",
                schema=f"bench_{uuid.uuid4().hex[:8]}",
                workers=workers,
                encrypt=encrypt,
            )
        )
    return out


# --- /proc -------------------------------------------------------------------------------------


class CpuMeter:
    """CPU seconds (user + system) each named group of processes spends between ``start`` and
    ``stop``: the gateway, the workers, and the services (the broker, PostgreSQL) next to them.
    A process that ended in between is left out (its CPU can no longer be read)."""

    TICK = os.sysconf("SC_CLK_TCK")

    profile_dir: Path | None = None
    """Set (``--profile DIR``): py-spy records each Python process of the groups while measured,
    as collapsed stacks in DIR/<group>-<pid>.txt (``py-spy record --format raw``)."""

    def __init__(
        self, groups: dict[str, list[int]], python: tuple[str, ...] = ("gateway", "workers")
    ) -> None:
        self.groups = groups
        self.python = python
        self.spent: dict[str, float] = {}
        self._at_start: dict[int, float] = {}
        self._spies: list[subprocess.Popen[bytes]] = []

    @classmethod
    def cpu_s(cls, pid: int) -> float | None:
        fields = proc_stat(pid)
        return None if fields is None else (int(fields[11]) + int(fields[12])) / cls.TICK  # utime, stime

    def _sample(self) -> dict[int, float]:
        now = {pid: self.cpu_s(pid) for pids in self.groups.values() for pid in pids}
        return {pid: cpu for pid, cpu in now.items() if cpu is not None}

    def start(self) -> None:
        if self.profile_dir is not None:
            self._spy(self.profile_dir)
        self._at_start = self._sample()

    def _spy(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        spy = Path(sys.executable).parent / "py-spy"
        for name in self.python:
            for pid in self.groups.get(name, []):
                target = out / f"{name}-{pid}.txt"
                command = [
                    str(spy),
                    "record",
                    "--format",
                    "raw",
                    "--rate",
                    "200",
                    "-o",
                    str(target),
                    "--pid",
                    str(pid),
                ]
                self._spies.append(
                    subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                )

    def stop(self) -> None:
        for spy in self._spies:
            spy.send_signal(signal.SIGINT)
        for spy in self._spies:
            spy.wait(timeout=60)
        self._spies = []
        now, before = self._sample(), self._at_start
        self.spent = {
            name: round(sum(now[pid] - before[pid] for pid in pids if pid in now and pid in before), 3)
            for name, pids in self.groups.items()
        }


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), or None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def rss_mb(pid: int) -> float:
    """The process's resident memory now, MB (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def service_pids(case: Case) -> dict[str, list[int]]:
    """The broker's and PostgreSQL's processes, from the pid files the repo's scripts write."""
    if not case.kafka:
        return {}
    services = Path(os.environ.get(SERVICES_ENV) or REPO / ".services")
    groups: dict[str, list[int]] = {}
    with contextlib.suppress(OSError, ValueError):
        groups["kafka broker"] = [int((services / "kafka" / "broker.pid").read_text().split()[0])]
    with contextlib.suppress(OSError, ValueError):
        postmaster = int((services / "postgres" / "data" / "postmaster.pid").read_text().split()[0])
        groups["postgresql"] = [postmaster, *children(postmaster)]
    return groups


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` now (PostgreSQL's backends and helpers)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        fields = proc_stat(int(entry.name))
        if fields is not None and fields[1] == str(pid):
            found.append(int(entry.name))
    return found


# --- processes ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bench_command(*args: str) -> list[str]:
    """A subcommand of bench/production.py as a command line."""
    return [sys.executable, str(REPO / "bench" / "production.py"), *args]


def turnlog_command(*args: str) -> list[str]:
    """The `turnlog` program as users run it."""
    return [sys.executable, "-m", "turnlog", *args]


@contextlib.contextmanager
def process(
    command: list[str], *, name: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    out = open(Path(tempfile.gettempdir()) / f"turnlog-bench-{name}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        command,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        cwd=REPO,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out.close()


async def wait_accepting(
    port: int, proc: subprocess.Popen[bytes], what: str, timeout_s: float = 120.0
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if proc.poll() is not None:
            logs = f"{tempfile.gettempdir()}/turnlog-bench-*.log"
            raise SystemExit(f"{what} exited with {proc.returncode}; see {logs}")
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        await asyncio.sleep(0.1)
    raise SystemExit(f"{what} did not accept connections on port {port}")


async def wait_owners(case: Case, timeout_s: float = 120.0) -> None:
    """Until every worker is a member of the owners' group and its rebalance is over."""
    from aiokafka.admin import AIOKafkaAdminClient

    from turnlog.engine.log.kafka_topics import TopicNames

    group = TopicNames(case.topic).owners_group
    admin = AIOKafkaAdminClient(bootstrap_servers=case.kafka)
    await admin.start()
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                (response,) = await admin.describe_consumer_groups([group])
                _error, _group, state, _kind, _protocol, members, *_ = response.groups[0]
                if state == "Stable" and len(members) == case.workers:
                    break
                await asyncio.sleep(0.2)
    finally:
        await admin.close()
    await asyncio.sleep(2.0)  # each member takes its partitions over once assigned


async def drop_topics(case: Case, keep: bool) -> None:
    if case.kafka and keep:
        print(f"{case.name}: the log is kept in topic {case.topic}", file=sys.stderr, flush=True)
    elif case.kafka:
        from tests.services import delete_topics

        await delete_topics(case.kafka, case.topic)


# --- figures -----------------------------------------------------------------------------------


def percentiles(values: list[float]) -> dict[str, float]:
    """p50, p95 and max of seconds, in ms."""
    if not values:
        return {}
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered) * 1000, 1),
        "p95": round(ordered[max(0, int(len(ordered) * 0.95) - 1)] * 1000, 1),
        "max": round(ordered[-1] * 1000, 1),
    }
