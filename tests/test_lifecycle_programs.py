"""The session lifecycle as a deployment sets it: the duration options and their environment
variables, `turnlog serve --idle-expiry` (the gateway's own sweeper) and `turnlog lifecycle`
(the sweeper as a program of its own, beside `turnlog serve`), in real processes on the embedded
backend. These run on the real clock with a one-second limit, the shortest a deployment would
not use but a test can wait for; tests/test_lifecycle*.py move a test clock instead."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.deployment import Program, program_env, wait_answering, write_keys
from tests.openai_server import free_port
from turnlog.engine import AgentDirectory, Lifecycle
from turnlog.engine.crypto.fields import ERASED_TEXT
from turnlog.engine.errors import ConfigurationError
from turnlog.engine.expiry import successor_id
from turnlog.examples.logistics import AGENT_ID
from turnlog.lifecycle import LifecycleOptions, parse_duration

KEY = "tlk_alice_lifecycle_0123456789abcdef"
WAIT_S = 60.0


def test_durations_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_duration("90s", "x") == timedelta(seconds=90)
    assert parse_duration("30m", "x") == timedelta(minutes=30)
    assert parse_duration("1.5h", "x") == timedelta(minutes=90)
    assert parse_duration("30d", "x") == timedelta(days=30)
    assert parse_duration("2w", "x") == timedelta(days=14)
    assert parse_duration("45", "x") == timedelta(seconds=45)
    assert parse_duration("never", "x") is None
    for bad in ("0s", "soon", "-5m", "3y"):
        with pytest.raises(ConfigurationError, match="--idle-expiry must be a positive duration"):
            parse_duration(bad, "--idle-expiry")

    for name in ("TURNLOG_IDLE_EXPIRY", "TURNLOG_RETAIN_CLOSED_FOR", "TURNLOG_AFTER_EXPIRY"):
        monkeypatch.delenv(name, raising=False)
    assert LifecycleOptions().default() is None  # nothing set: the directory's own default stays
    own = AgentDirectory(lifecycle=Lifecycle(idle_expiry=timedelta(hours=1)))
    assert LifecycleOptions().apply(own).lifecycle == Lifecycle(idle_expiry=timedelta(hours=1))
    monkeypatch.setenv("TURNLOG_IDLE_EXPIRY", "12h")
    monkeypatch.setenv("TURNLOG_RETAIN_CLOSED_FOR", "30d")
    assert LifecycleOptions(idle_expiry="30m").default() == Lifecycle(
        idle_expiry=timedelta(minutes=30), retain_closed_for=timedelta(days=30)
    )  # the option wins over the environment, which fills in the rest
    monkeypatch.setenv("TURNLOG_IDLE_EXPIRY", "")  # docker-compose's "${TURNLOG_IDLE_EXPIRY:-}": unset
    assert LifecycleOptions().default() == Lifecycle(retain_closed_for=timedelta(days=30))
    monkeypatch.setenv("TURNLOG_AFTER_EXPIRY", "reopen")
    with pytest.raises(ConfigurationError, match="'refuse' or 'new_session'"):
        LifecycleOptions().default()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    write_keys(tmp_path / "keys.toml", {"alice": (KEY, "user")})
    return tmp_path


def serve(home: Path, port: int, *extra: str, **env: str) -> Program:
    args = ["serve", "--home", str(home), "--port", str(port), "--keys", str(home / "keys.toml"), *extra]
    return Program("serve", args, home / "serve.out", program_env(**env)).start()


async def until_session(client: httpx.AsyncClient, sid: str, holds: Any, program: Program) -> dict[str, Any]:
    async with asyncio.timeout(WAIT_S):
        while True:
            program.check_alive()
            row: dict[str, Any] = (await client.get(f"/v1/sessions/{sid}")).json()
            if holds(row):
                return row
            await asyncio.sleep(0.1)


async def until_timeline(
    client: httpx.AsyncClient, sid: str, holds: Any, program: Program
) -> dict[str, Any]:
    async with asyncio.timeout(WAIT_S):
        while True:
            program.check_alive()
            timeline: dict[str, Any] = (await client.get(f"/v1/sessions/{sid}/timeline")).json()
            if holds(timeline):
                return timeline
            await asyncio.sleep(0.1)


def _types(timeline: dict[str, Any]) -> set[str]:
    return {e["type"] for e in timeline["events"]}


def _contents(timeline: dict[str, Any]) -> set[str]:
    return {r["content"] for r in timeline["messages"] if r["content"]}


async def test_serve_expires_idle_sessions_by_its_option(home: Path) -> None:
    port = free_port()
    program = serve(home, port, "--idle-expiry", "1s")
    try:
        url = f"http://127.0.0.1:{port}"
        await wait_answering(url, KEY, program)
        async with httpx.AsyncClient(
            base_url=url, timeout=30, headers={"Authorization": f"Bearer {KEY}"}
        ) as client:
            sid = (await client.post("/v1/sessions", json={"agent": AGENT_ID})).json()["session_id"]
            row = await until_session(client, sid, lambda r: r["closed"], program)
            assert (row["close_reason"], row["current_state"]) == ("expired", "FINISHED")
            answer = await client.post(f"/v1/sessions/{sid}/messages", json={"text": "hello?"})
            assert (answer.status_code, answer.json()["error"]) == (409, "session_expired")
    finally:
        program.stop()


async def test_the_lifecycle_program_sweeps_beside_serve(home: Path) -> None:
    port = free_port()
    program = serve(home, port, TURNLOG_AFTER_EXPIRY="new_session")  # no limit: the gateway sweeps nothing
    sweeper = None
    try:
        url = f"http://127.0.0.1:{port}"
        await wait_answering(url, KEY, program)
        refused = Program("lifecycle", ["lifecycle", "--home", str(home)], home / "refused.out").start()
        assert refused.proc is not None and refused.proc.wait(timeout=120) == 2
        assert "nothing to sweep" in refused.output()
        sweeping = ["lifecycle", "--home", str(home), "--idle-expiry", "1s", "--retain-closed-for", "2s"]
        sweeper = Program("lifecycle", [*sweeping, "--health-port", str(free_port())], home / "lifecycle.out")
        sweeper.start()
        async with httpx.AsyncClient(
            base_url=url, timeout=30, headers={"Authorization": f"Bearer {KEY}"}
        ) as client:
            sid = (await client.post("/v1/sessions", json={"agent": AGENT_ID})).json()["session_id"]
            secret = "my parcel code is PARCEL-7f3e"
            posted = await client.post(f"/v1/sessions/{sid}/messages", json={"text": secret})
            assert posted.status_code == 202, posted.text
            await until_session(client, sid, lambda r: r["closed"], sweeper)
            answer = await client.post(f"/v1/sessions/{sid}/messages", json={"text": "hello again"})
            assert answer.status_code == 202, answer.text
            assert (answer.json()["session_id"], answer.json()["continued_from"]) == (successor_id(sid), sid)
            # retention, through the deployment's eraser in the sweeper's process: the erasure is on
            # the log, then (the keys destroyed, the rows refolded) the content reads erased
            timeline = await until_timeline(client, sid, lambda t: _contents(t) == {ERASED_TEXT}, sweeper)
            assert "SessionErased" in _types(timeline) and "PARCEL-7f3e" not in json.dumps(timeline)
        sweeper.stop()
        assert sweeper.proc is not None and sweeper.proc.returncode == 0, sweeper.output()
    finally:
        if sweeper is not None:
            sweeper.stop()
        program.stop()


async def test_a_worker_expires_the_sessions_it_runs(home: Path) -> None:
    port = free_port()
    program = serve(home, port, "--no-worker")
    worker = Program(
        "worker", ["worker", "--home", str(home), "--idle-expiry", "1s"], home / "worker.out"
    ).start()
    try:
        url = f"http://127.0.0.1:{port}"
        await wait_answering(url, KEY, program)
        async with httpx.AsyncClient(
            base_url=url, timeout=30, headers={"Authorization": f"Bearer {KEY}"}
        ) as client:
            sid = (await client.post("/v1/sessions", json={"agent": AGENT_ID})).json()["session_id"]
            row = await until_session(client, sid, lambda r: r["closed"], worker)
            assert row["close_reason"] == "expired"
    finally:
        worker.stop()
        program.stop()
