"""`turnlog add-key` and `turnlog serve` in real subprocesses: the demo task through the gateway
on the embedded backend, with JSON logs on stderr."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from examples.logistics import AGENT_ID, TASK
from tests.openai_server import free_port

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


def test_serve_runs_the_demo_task_over_http(tmp_path: Path) -> None:
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
        proc = subprocess.Popen(
            [sys.executable, "-m", "turnlog", *command], stdout=subprocess.DEVNULL, stderr=stderr, env=_env()
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
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    lines = [json.loads(line) for line in stderr_path.read_text().splitlines() if line.startswith("{")]
    kinds = {line["event"] for line in lines}
    assert {"model.call", "tool.execution", "state.transition", "turn.context"} <= kinds
    assert all("timestamp" in line and "level" in line for line in lines)
