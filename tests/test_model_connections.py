"""The model client's connection pool and keep-alive as deployment settings: they reach the
OpenAI SDK's HTTP client, a turn whose call finds every connection busy shows as waiting in its
stream (then answers), and bad settings from the CLI or the environment fail with a clear
error. Real HTTP on loopback (bench/fault_server.py) through the real OpenAI SDK."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.fault_server import FaultServer
from tests.test_model_outages import until
from turnlog.config import ModelSettings, connections_from_env, max_turns_from_env
from turnlog.engine import AgentSessions, SqliteEventLog
from turnlog.engine import events as ev
from turnlog.engine.agent import Agent, AgentDirectory
from turnlog.engine.errors import ConfigurationError
from turnlog.engine.models.connections import ModelConnections
from turnlog.engine.models.openai_compat import OpenAICompatibleModel
from turnlog.engine.stream import ModelWaiting

REPO = Path(__file__).resolve().parent.parent


def _echo(body: dict[str, Any]) -> tuple[str, list[Any]]:
    return f"answer to {body['messages'][-1]['content']}", []


async def _gather(api: AgentSessions, sid: str, text: str, into: list[Any]) -> None:
    async for item in api.send_user_message(sid, text):
        into.append(item)


async def test_a_turn_beyond_the_pool_waits_in_its_stream_then_answers_on_a_kept_connection(
    tmp_path: Path,
) -> None:
    async with FaultServer(_echo) as server:
        pool = ModelConnections(max_connections=2, keepalive_s=60.0)
        model = OpenAICompatibleModel("primary", base_url=server.base_url, api_key="k", connections=pool)
        log = SqliteEventLog(tmp_path / "log.db", partitions=2)
        api = AgentSessions(log, AgentDirectory([Agent.build("a", model)]))
        server.set("primary", hang=True)
        sids = [(await api.create_session("a", "u")).session_id for _ in range(3)]
        items: list[list[Any]] = [[], [], []]
        turns = [asyncio.create_task(_gather(api, sids[i], f"m{i}", items[i])) for i in range(2)]
        await until(lambda: server.count("primary", "hung") == 2)
        turns.append(asyncio.create_task(_gather(api, sids[2], "m2", items[2])))
        await until(lambda: any(isinstance(i, ModelWaiting) for i in items[2]))
        [wait] = [i for i in items[2] if isinstance(i, ModelWaiting)]
        assert (wait.waiting, wait.model) == (True, "primary")
        assert "all 2 connections to the endpoint are in use" in wait.reason
        assert (server.count("primary"), server.accepted) == (2, 2)  # the third was not sent
        server.clear("primary")
        await asyncio.wait_for(asyncio.gather(*turns), 60)
        answers = [[i.text for i in got if isinstance(i, ev.AssistantMessage)] for got in items]
        assert answers == [["answer to m0"], ["answer to m1"], ["answer to m2"]]
        assert [i.waiting for i in items[2] if isinstance(i, ModelWaiting)] == [True, False]
        # the pool's size and keep-alive reached the SDK's client: the third call went out on
        # one of the two connections kept alive, not on a connection of its own
        assert server.accepted == 2
        await model.aclose()
        await log.close()


def test_the_pool_settings_come_from_the_options_else_the_environment(monkeypatch: Any) -> None:
    monkeypatch.setenv("TURNLOG_MODEL_CONNECTIONS", "3")
    monkeypatch.setenv("TURNLOG_MODEL_KEEPALIVE_S", "2.5")
    monkeypatch.setenv("TURNLOG_MAX_TURNS", "40")
    assert connections_from_env() == ModelConnections(3, 2.5)
    assert connections_from_env(7, None) == ModelConnections(7, 2.5)
    assert max_turns_from_env(None, 10) == 40
    assert max_turns_from_env(5, 10) == 5
    settings = ModelSettings.from_env("http://127.0.0.1:9/v1", "k", "m")
    model = settings.build()
    assert isinstance(model, OpenAICompatibleModel)
    assert model.connections == ModelConnections(3, 2.5)
    assert model.endpoint.connections == 3  # what the endpoint's limiter admits at once
    for name in ("TURNLOG_MODEL_CONNECTIONS", "TURNLOG_MODEL_KEEPALIVE_S", "TURNLOG_MAX_TURNS"):
        monkeypatch.delenv(name)
    assert connections_from_env() == ModelConnections()
    assert max_turns_from_env(None, 10) == 10


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TURNLOG_MODEL_CONNECTIONS": "many"}, "TURNLOG_MODEL_CONNECTIONS='many' is not a whole number"),
        ({"TURNLOG_MODEL_CONNECTIONS": "0"}, "max_connections must be at least 1, not 0"),
        ({"TURNLOG_MODEL_KEEPALIVE_S": "-1"}, "keepalive_s must be >= 0 seconds, not -1.0"),
        (
            {"TURNLOG_MAX_TURNS": "0"},
            "turn limit must be at least 1, not 0 (--max-turns or TURNLOG_MAX_TURNS)",
        ),
    ],
)
def test_bad_settings_from_the_environment_fail_with_a_clear_error(
    monkeypatch: Any, env: dict[str, str], message: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as caught:
        connections_from_env()
        max_turns_from_env(None, 10)
    assert message in str(caught.value)


def test_the_worker_command_refuses_bad_settings_before_starting(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", "TURNLOG_MODEL_CONNECTIONS": "lots"}
    run = subprocess.run(
        [sys.executable, "-m", "turnlog", "worker", "--home", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2, run.stdout + run.stderr
    assert "TURNLOG_MODEL_CONNECTIONS='lots' is not a whole number" in run.stdout + run.stderr
    env.pop("TURNLOG_MODEL_CONNECTIONS")
    run = subprocess.run(
        [sys.executable, "-m", "turnlog", "worker", "--home", str(tmp_path), "--model-connections", "0"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2
    assert "--model-connections" in run.stdout + run.stderr
