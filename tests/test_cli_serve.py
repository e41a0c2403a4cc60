"""`turnlog add-key` and `turnlog serve` in real subprocesses: the demo task through the gateway
on the embedded backend, with JSON logs on stderr."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx
import uvicorn
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.openai_server import free_port
from turnlog.examples.logistics import AGENT_ID, TASK

REPO = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO)}
    for key in ("TURNLOG_BASE_URL", "OPENAI_BASE_URL", "TURNLOG_MODEL", "TURNLOG_KEYS"):
        env.pop(key, None)
    return env


def add_key(home: Path, user: str, role: str) -> str:
    run = subprocess.run(
        [sys.executable, "-m", "turnlog", "add-key", user, "--role", role, "--home", str(home)],
        capture_output=True, text=True, env=_env(), timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return run.stdout.strip().splitlines()[-1]


@contextlib.contextmanager
def otlp_receiver() -> Iterator[tuple[str, list[dict[str, object]]]]:
    """A minimal OTLP/HTTP traces endpoint on loopback: decodes each export, keeps its spans."""
    spans: list[dict[str, object]] = []

    async def traces(request: Request) -> Response:
        export = ExportTraceServiceRequest.FromString(await request.body())
        for resource in export.resource_spans:
            service = {a.key: a.value.string_value for a in resource.resource.attributes}["service.name"]
            for scope in resource.scope_spans:
                for span in scope.spans:
                    attributes = {a.key: a.value.string_value or a.value.int_value for a in span.attributes}
                    spans.append({"name": span.name, "service": service, "attributes": attributes})
        return Response(b"", media_type="application/x-protobuf")

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])]), log_level="warning")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", spans
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def test_serve_runs_the_demo_task_over_http(tmp_path: Path) -> None:
    with otlp_receiver() as (otlp_url, spans):
        serve_demo_task(tmp_path, otlp_url, spans)
    names = {str(span["name"]) for span in spans}
    assert {"invoke_agent logistics-assistant", "chat scripted-demo", "execute_tool query_orders"} <= names
    assert {span["service"] for span in spans} == {"turnlog-gateway"}
    chat = next(span for span in spans if span["name"] == "chat scripted-demo")
    assert chat["attributes"]["gen_ai.operation.name"] == "chat"  # type: ignore[index]


def serve_demo_task(tmp_path: Path, otlp_url: str, spans: list[dict[str, object]]) -> None:
    home = tmp_path / "home"
    key = add_key(home, "alice", "user")
    assert key.startswith("tlk_") and key not in (home / "keys.toml").read_text()
    bad = subprocess.run(
        [sys.executable, "-m", "turnlog", "add-key", "eve", "--role", "root", "--home", str(home)],
        capture_output=True, text=True, env=_env(), timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "role must be one of user, admin" in bad.stdout

    port = free_port()
    stderr_path = tmp_path / "serve.err"
    with stderr_path.open("w") as stderr:
        command = ["serve", "--home", str(home), "--port", str(port), "--sample-rate", "1"]
        env = {**_env(), "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "turnlog", *command], stdout=subprocess.DEVNULL, stderr=stderr, env=env
        )
    try:
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, stderr_path.read_text()
                try:
                    if client.get("/v1/sessions", headers=headers).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "turnlog serve did not answer in 60 s"
                time.sleep(0.1)
            sid = client.post("/v1/sessions", json={"agent": AGENT_ID}, headers=headers).json()["session_id"]
            seen = []
            with client.stream("GET", f"/v1/sessions/{sid}/events", headers=headers) as response:
                for line in response.iter_lines():
                    if line.startswith("event: "):
                        seen.append(line[7:])
                        if seen[-1] == "SessionCreated":  # listening: now post, and watch the turn live
                            url = f"/v1/sessions/{sid}/messages"
                            assert client.post(url, json={"text": TASK}, headers=headers).status_code == 202
                        if seen[-1] == "TurnFinished":
                            break
            assert "ToolCallFinished" in seen and "delta" in seen
            model_marks = [e for e in seen if e in ("ModelCallStarted", "ModelCallFinished", "delta")]
            for i, name in enumerate(model_marks):  # deltas sit inside their model call
                if name == "delta":
                    assert [m for m in model_marks[:i] if m != "delta"][-1] == "ModelCallStarted"
            session = client.get(f"/v1/sessions/{sid}", headers=headers).json()
            assert session["turns"] == 1 and session["current_state"] == "FINISHED"
            for _ in range(600):  # the observability consumer ends the turn's span; the batch exports it
                if any(str(span["name"]).startswith("invoke_agent") for span in spans):
                    break
                time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    lines = [json.loads(line) for line in stderr_path.read_text().splitlines() if line.startswith("{")]
    kinds = {line["event"] for line in lines}
    assert {"model.call", "tool.execution", "state.transition", "turn.context"} <= kinds
    assert all("timestamp" in line and "level" in line for line in lines)


def test_serve_without_worker_and_a_separate_turnlog_worker(tmp_path: Path) -> None:
    from turnlog.engine import SqliteEventLog

    home = tmp_path / "home"
    key = add_key(home, "alice", "user")
    port = free_port()
    base = [sys.executable, "-m", "turnlog"]
    commands = [
        ["serve", "--home", str(home), "--port", str(port), "--no-worker"],
        ["worker", "--home", str(home), "--id", "cli-worker"],
    ]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = [subprocess.Popen([*base, *command], env=_env(), **quiet) for command in commands]  # type: ignore[call-overload]
    try:
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            deadline = time.monotonic() + 60
            while True:
                assert all(p.poll() is None for p in procs)
                with contextlib.suppress(httpx.TransportError):
                    if client.get("/v1/sessions", headers=headers).status_code == 200:
                        break
                assert time.monotonic() < deadline, "turnlog serve did not answer in 60 s"
                time.sleep(0.1)
            sid = client.post("/v1/sessions", json={"agent": AGENT_ID}, headers=headers).json()["session_id"]
            streamed = stream_one_turn(client, sid, headers)
            session = client.get(f"/v1/sessions/{sid}", headers=headers).json()
            assert session["turns"] == 1 and session["current_state"] == "FINISHED"
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)
    import asyncio

    async def producers() -> set[str]:
        log = SqliteEventLog(home / "log.db")
        try:
            return {e.producer for e in await log.read_session(sid) if e.type == "TurnFinished"}
        finally:
            await log.close()

    assert asyncio.run(producers()) == {"cli-worker"}
    # the worker's token deltas reached the gateway's stream, each inside its model call
    kinds = [name for name, _ in streamed]
    assert "delta" in kinds and kinds[-1] == "TurnFinished"
    open_call: tuple[str, int] | None = None
    deltas: dict[tuple[str, int], str] = {}
    for name, data in streamed:
        if name == "ModelCallStarted":
            open_call = (data["turn_id"], data["step"])
        elif name == "ModelCallFinished":
            open_call = None
        elif name == "delta":
            assert open_call == (data["turn_id"], data["step"]), streamed
            deltas[open_call] = deltas.get(open_call, "") + data["text"]
    answers = "".join(data["text"] for name, data in streamed if name == "AssistantMessage")
    assert all(text and text in answers for text in deltas.values()), (deltas, answers)


def stream_one_turn(client: httpx.Client, sid: str, headers: dict[str, str]) -> list[tuple[str, dict]]:
    """Post the task once the session's stream is open; (event, data) of what the stream carries
    until the turn ends."""
    streamed: list[tuple[str, dict]] = []
    with client.stream("GET", f"/v1/sessions/{sid}/events", headers=headers) as response:
        name = ""
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                streamed.append((name, json.loads(line[6:])))
                if name == "SessionCreated":  # listening: now post
                    url = f"/v1/sessions/{sid}/messages"
                    assert client.post(url, json={"text": TASK}, headers=headers).status_code == 202
                if name == "TurnFinished":
                    return streamed
    raise AssertionError(f"the stream ended before the turn did: {[n for n, _ in streamed]}")
