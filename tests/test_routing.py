"""Routing by configuration: models per agent from a file that is reloaded while the engine runs,
sticky gray release, and the model used on every model-call event. Real HTTP servers on loopback."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from bench.fault_server import FaultServer
from tests.openai_server import FakeOpenAIServer, FakeReply, serve_openai
from turnlog.engine import AgentSessions, SqliteEventLog
from turnlog.engine import events as ev
from turnlog.engine.agent import Agent, AgentDirectory
from turnlog.engine.errors import ConfigurationError
from turnlog.engine.models.routing import RoutedModel, Routing, in_candidate_share

AGENT = "support"


def _write(path: Path, routing: dict[str, Any]) -> None:
    text = json.dumps(routing)
    path.write_text(text)
    # make the change visible to a stat() even within one clock tick
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))


def _routing(main: FakeOpenAIServer, nxt: FakeOpenAIServer, **route: Any) -> dict[str, Any]:
    return {
        "models": {
            "main": {"base_url": main.base_url, "model": "main-model", "api_key_env": "TURNLOG_TEST_KEY"},
            "next": {
                "base_url": nxt.base_url,
                "model": "next-model",
                "api_key_env": "TURNLOG_TEST_KEY",
            },
        },
        "agents": {AGENT: {"model": "main", **route}},
    }


async def _ask(api: AgentSessions, session_id: str) -> list[ev.Event]:
    return [i async for i in api.send_user_message(session_id, "hi") if isinstance(i, ev.Event)]


async def test_gray_release_is_sticky_and_reload_needs_no_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TURNLOG_TEST_KEY", "k")
    config = tmp_path / "routing.json"
    with (
        serve_openai([FakeReply("from main")] * 200) as main,
        serve_openai([FakeReply("from next")] * 200) as nxt,
    ):
        _write(config, _routing(main, nxt, candidate="next", candidate_share=0.3))
        model = RoutedModel(config, AGENT)
        log = SqliteEventLog(tmp_path / "log.db", partitions=2)
        api = AgentSessions(log, AgentDirectory([Agent.build(AGENT, model)]))
        sessions = [(await api.create_session(AGENT, f"user-{n}")).session_id for n in range(40)]
        first = {sid: await _ask(api, sid) for sid in sessions}
        second = {sid: await _ask(api, sid) for sid in sessions}

        _write(config, _routing(main, nxt, candidate="next", candidate_share=1.0))  # full release, live
        after = {sid: await _ask(api, sid) for sid in sessions}
        await model.aclose()
        await log.close()

    def used(events: list[ev.Event]) -> tuple[str, str]:
        started = next(e for e in events if isinstance(e, ev.ModelCallStarted))
        answer = next(e for e in events if isinstance(e, ev.AssistantMessage))
        return started.model, answer.text

    on_candidate = {sid for sid in sessions if in_candidate_share(AGENT, sid, 0.3)}
    assert 0 < len(on_candidate) < len(sessions)
    for sid in sessions:
        expected = ("next", "from next") if sid in on_candidate else ("main", "from main")
        assert used(first[sid]) == used(second[sid]) == expected  # sticky per session
        assert used(after[sid]) == ("next", "from next")  # the reloaded file, no restart
    finished = [e for e in after[sessions[0]] if isinstance(e, ev.ModelCallFinished)]
    assert finished[0].model == "next-model"  # what the server says answered


async def test_a_broken_reload_keeps_the_last_good_routing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TURNLOG_TEST_KEY", "k")
    config = tmp_path / "routing.json"
    with serve_openai([FakeReply("from main")] * 5) as main, serve_openai([]) as nxt:
        _write(config, _routing(main, nxt))
        model = RoutedModel(config, AGENT)
        log = SqliteEventLog(tmp_path / "log.db", partitions=2)
        api = AgentSessions(log, AgentDirectory([Agent.build(AGENT, model)]))
        sid = (await api.create_session(AGENT, "u")).session_id
        config.write_text('{"models": {"main": {"model": 3}}}')
        events = await _ask(api, sid)
        await model.aclose()
        await log.close()
    assert [e.text for e in events if isinstance(e, ev.AssistantMessage)] == ["from main"]


def test_backup_from_the_routing_file_takes_over(tmp_path: Path) -> None:
    routing = Routing.parse(
        {
            "models": {"a": {"model": "x"}, "b": {"model": "y"}},
            "agents": {AGENT: {"model": "a", "backup": "b"}},
        },
        "test",
    )
    assert routing.agents[AGENT].backup == "b"


@pytest.mark.parametrize(
    "data, problem",
    [
        ({}, "expected"),
        ({"models": {"a": {}}}, "needs at least"),
        ({"models": {"a": {"model": "x", "temp": 1}}}, "unknown settings"),
        ({"models": {"a": {"model": "x"}}, "agents": {AGENT: {"model": "b"}}}, "not under models"),
        ({"models": {"a": {"model": "x"}}, "agents": {AGENT: {"model": "a", "candidate_share": 2}}},
         "between 0"),
        ({"models": {"a": {"model": "x", "max_in_flight": 0}}}, "model 'a': endpoint limit max_in_flight"),
        ({"models": {"a": {"model": "x", "breaker": {"failure": 3}}}}, "breaker must be an object with"),
        ({"models": {"a": {"model": "x", "breaker": {"cooldown_s": 0}}}}, "cooldown_s"),
    ],
)  # fmt: skip
def test_bad_routing_files_say_what_is_wrong(data: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem):
        Routing.parse(data, "routing.json")


def test_an_agent_missing_from_the_file_fails_at_start(tmp_path: Path) -> None:
    config = tmp_path / "routing.json"
    config.write_text(json.dumps({"models": {"a": {"model": "x"}}, "agents": {}}))
    with pytest.raises(ConfigurationError, match="no entry for agent 'support'"):
        RoutedModel(config, AGENT)


async def test_limits_and_breaker_settings_come_from_the_routing_file_and_its_reloads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TURNLOG_TEST_KEY", "k")
    config = tmp_path / "routing.json"
    async with FaultServer(lambda body: (f"from {body['model']}", [])) as server:

        def routing(breaker: dict[str, Any]) -> dict[str, Any]:
            main = {"base_url": server.base_url, "model": "main-model", "api_key_env": "TURNLOG_TEST_KEY"}
            nxt = {"base_url": server.base_url, "model": "next-model", "api_key_env": "TURNLOG_TEST_KEY"}
            main.update(max_in_flight=4, requests_per_minute=6000, breaker=breaker)
            return {
                "models": {"main": main, "next": nxt},
                "agents": {AGENT: {"model": "main", "backup": "next"}},
            }

        _write(config, routing({"failures": 2, "cooldown_s": 60}))
        model = RoutedModel(config, AGENT)
        log = SqliteEventLog(tmp_path / "log.db", partitions=2)
        api = AgentSessions(log, AgentDirectory([Agent.build(AGENT, model)]))
        server.set("main-model", status=500)
        asked = [await _ask(api, (await api.create_session(AGENT, "u")).session_id) for _ in range(3)]
        opened = [e for e in asked[1] if isinstance(e, ev.ModelBreakerChanged)]
        assert [(e.model, e.to_state) for e in opened] == [("main", "open")]  # after 2 failures, not 5
        assert [e.cause for e in asked[2] if isinstance(e, ev.ModelFallback)] == ["breaker_open"]
        assert server.count("main-model") == 2

        _write(config, routing({"failures": 0}))  # the breaker turned off by a reload, live
        server.clear("main-model")
        again = await _ask(api, (await api.create_session(AGENT, "u")).session_id)
        assert [e.text for e in again if isinstance(e, ev.AssistantMessage)] == ["from main-model"]
        assert server.count("main-model") == 3
        await model.aclose()
        await log.close()
