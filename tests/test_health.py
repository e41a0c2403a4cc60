"""/healthz and /readyz: the gateway on both backends, `turnlog worker` and `turnlog projector`
with --health-port. Readiness follows the broker (a broker of the test's own, frozen with
SIGSTOP so the shared one keeps serving the other tests), the projections' lag and SIGTERM."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from tests.gateway_support import auth, create, serve_gateway
from tests.openai_server import free_port
from tests.services import need_service, postgres_store
from turnlog.consumers import Projector
from turnlog.engine import SqliteEventLog
from turnlog.engine.log.kafka_held import DEFAULT_INDEX_BYTES
from turnlog.projections import SqliteProjectionStore

REPO = Path(__file__).resolve().parent.parent
DEADLINE_S = 60.0
OUTPUT: dict[int, Path] = {}
"""Where each process the tests start writes its output (by pid), for failure messages."""


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for key in ("TURNLOG_BASE_URL", "OPENAI_BASE_URL", "TURNLOG_MODEL", "TURNLOG_KEYS"):
        env.pop(key, None)
    return env


def wait_for(url: str, status: int, *, proc: subprocess.Popen[bytes] | None = None) -> dict[str, Any]:
    """Poll ``url`` until it answers ``status``; its JSON body."""
    deadline = time.monotonic() + DEADLINE_S
    last: Any = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process exited with {proc.returncode}: {_output(proc)}")
        try:
            response = httpx.get(url, timeout=10)
            last = (response.status_code, response.text)
            if response.status_code == status:
                body: dict[str, Any] = response.json()
                return body
        except httpx.TransportError as exc:
            last = repr(exc)
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer {status} within {DEADLINE_S:g} s; last: {last}")


def _output(proc: subprocess.Popen[bytes]) -> str:
    path = OUTPUT.get(proc.pid)
    return path.read_text(errors="replace")[-3000:] if path is not None and path.exists() else ""


def test_gateway_health_and_readiness_need_no_key_and_show_no_session(tmp_path: Path) -> None:
    with serve_gateway(tmp_path) as gw, httpx.Client(base_url=gw.url, timeout=30) as client:
        sid = client.post("/v1/sessions", json={"agent": "support"}, headers=auth("alice")).json()[
            "session_id"
        ]
        alive = client.get("/healthz")
        assert (alive.status_code, alive.json()) == (200, {"status": "alive"})
        ready = client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json() == {"ready": True, "checks": {"log": "ok", "schemas": "ok", "projections": "ok"}}
        assert sid not in alive.text + ready.text and ready.headers["cache-control"] == "no-store"


async def test_gateway_is_not_ready_while_the_projections_lag(tmp_path: Path) -> None:
    """A gateway whose projections another process folds is ready only once they are within
    their bound of the log."""
    with serve_gateway(tmp_path, run_projector=False, max_projection_lag_s=0.2) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            await create(client, "alice")
            body = wait_for(f"{gw.url}/readyz", 503)
            assert body["ready"] is False and body["checks"]["log"] == "ok"
            assert "projections are" in body["checks"]["projections"]
            assert "check that the projector runs" in body["checks"]["projections"]
            log = SqliteEventLog(tmp_path / "log.db", partitions=gw.gateway.log.partitions)
            store = SqliteProjectionStore(tmp_path / "projections.db")
            try:
                assert await Projector(log, store).catch_up() > 0
            finally:
                store.close()
                await log.close()
            assert wait_for(f"{gw.url}/readyz", 200)["ready"] is True


@contextlib.contextmanager
def turnlog_process(tmp_path: Path, name: str, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """`python -m turnlog ARGS` with its output in ``tmp_path/NAME.out``; killed if still running."""
    with (tmp_path / f"{name}.out").open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "turnlog", *args], stdout=out, stderr=subprocess.STDOUT, env=_env()
        )
    OUTPUT[proc.pid] = tmp_path / f"{name}.out"
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def with_a_key(home: Path) -> Path:
    """``home``, with a key file (`turnlog serve` refuses to start without one)."""
    run = subprocess.run(
        [sys.executable, "-m", "turnlog", "add-key", "alice", "--home", str(home)],
        capture_output=True, text=True, env=_env(), timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    return home


def test_sigterm_turns_readiness_off_while_the_gateway_still_answers(tmp_path: Path) -> None:
    port = free_port()
    home = with_a_key(tmp_path / "home")
    args = ("serve", "--home", str(home), "--port", str(port), "--drain-delay", "30")
    with turnlog_process(tmp_path, "serve", *args) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_for(f"{url}/readyz", 200, proc=proc)
        proc.send_signal(signal.SIGTERM)
        body = wait_for(f"{url}/readyz", 503, proc=proc)
        assert body == {
            "ready": False,
            "checks": {"process": "draining: stopping after SIGTERM, takes no new work"},
        }
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
        proc.send_signal(signal.SIGTERM)  # a second signal stops it at once
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)


class Broker:
    """A Kafka broker of this test module's own (scripts/kafka.sh on other ports and folder)."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        while not _free(self.port + 1):  # kafka.sh puts the controller on port + 1
            self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.env = {
            **_env(),
            "TURNLOG_KAFKA_PORT": str(self.port),
            "TURNLOG_KAFKA_DIR": str(folder),
            "TURNLOG_KAFKA_HEAP": "256m",
        }
        shared_jars = REPO / ".services" / "kafka" / "libs"
        if shared_jars.is_dir():
            self.env["TURNLOG_KAFKA_LIBS"] = str(shared_jars)
        self.pid_file = folder / "broker.pid"

    def script(self, action: str) -> None:
        run = subprocess.run(
            [str(REPO / "scripts" / "kafka.sh"), action],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stdout + run.stderr

    def signal(self, sig: signal.Signals) -> None:
        os.kill(int(self.pid_file.read_text()), sig)


def _free(port: int) -> bool:
    with contextlib.closing(socket.socket()) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    need_service("TURNLOG_KAFKA_BOOTSTRAP")  # Kafka is part of this run: its jars are here
    own = Broker(tmp_path_factory.mktemp("kafka"))
    own.script("start")
    try:
        yield own
    finally:
        with contextlib.suppress(Exception):
            own.signal(signal.SIGCONT)
        own.script("stop")


def test_readiness_is_off_while_the_broker_is_down_and_back_after(tmp_path: Path, broker: Broker) -> None:
    """The gateway (with its worker) and a `turnlog worker` on one broker: both ready, both not
    ready while the broker does not answer, both ready again when it does."""
    dsn = need_service("TURNLOG_POSTGRES_DSN")
    topic = f"test.{uuid.uuid4().hex[:12]}"
    kafka = ("--kafka", broker.bootstrap, "--topic", topic, "--partitions", "2")
    gateway_port, worker_port = free_port(), free_port()
    with postgres_store(dsn) as store:
        home = with_a_key(tmp_path / "gw")
        serve_args = ("serve", "--home", str(home), "--port", str(gateway_port), *kafka,
                      "--postgres", dsn, "--schema", store.schema, "--no-memory")  # fmt: skip
        worker_args = ("worker", "--home", str(tmp_path / "wk"), *kafka, "--id", "w2",
                       "--no-memory", "--health-port", str(worker_port))  # fmt: skip
        with (
            turnlog_process(tmp_path, "serve", *serve_args) as gateway,
            turnlog_process(tmp_path, "worker", *worker_args) as worker,
        ):
            urls = {
                gateway: f"http://127.0.0.1:{gateway_port}/readyz",
                worker: f"http://127.0.0.1:{worker_port}/readyz",
            }
            for proc, url in urls.items():
                assert wait_for(url, 200, proc=proc)["checks"]["log"] == "ok"
            broker.signal(signal.SIGSTOP)
            try:
                for proc, url in urls.items():
                    problem = wait_for(url, 503, proc=proc)["checks"]["log"]
                    assert "does not answer" in problem or "no answer within" in problem, problem
            finally:
                broker.signal(signal.SIGCONT)
            for proc, url in urls.items():
                assert wait_for(url, 200, proc=proc)["ready"] is True
            for proc in urls:
                proc.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=60) == 0


def test_projector_serves_readiness_and_stops_on_sigterm(tmp_path: Path) -> None:
    bootstrap = need_service("TURNLOG_KAFKA_BOOTSTRAP")
    dsn = need_service("TURNLOG_POSTGRES_DSN")
    port = free_port()
    topic = f"test.{uuid.uuid4().hex[:12]}"
    with postgres_store(dsn) as store:
        args = ("projector", "--kafka", bootstrap, "--topic", topic, "--partitions", "2", "--postgres", dsn,
                "--schema", store.schema, "--health-port", str(port))  # fmt: skip
        with turnlog_process(tmp_path, "projector", *args) as proc:
            body = wait_for(f"http://127.0.0.1:{port}/readyz", 200, proc=proc)
            assert body["checks"] == {"log": "ok", "schemas": "ok", "projections": "ok"}
            assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).json() == {"status": "alive"}
            metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text  # its Kafka log's
            assert f"turnlog_kafka_index_budget_bytes {DEFAULT_INDEX_BYTES}\n" in metrics
            assert "turnlog_kafka_index_sessions_unloaded_total 0\n" in metrics
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
