"""`--agents module:attr`: your agents in `turnlog serve`, `worker` and `demo`, from the option, the
TURNLOG_AGENTS variable or HOME/turnlog.toml; every mistake stops the program with what to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_support import turnlog
from turnlog.agents import DEFAULT_AGENTS, AgentContext, AgentsTarget, agents_target, load_agents
from turnlog.config import ModelSettings
from turnlog.engine import AgentDirectory
from turnlog.engine.errors import ConfigurationError


def context(home: Path, program: str = "serve") -> AgentContext:
    return AgentContext(home, ModelSettings(None, None, None), program)


def load(target: str, home: Path) -> AgentDirectory:
    return load_agents(AgentsTarget(target, "--agents"), context(home))


def test_a_directory_or_a_function_returning_one(tmp_path: Path) -> None:
    assert [a.agent_id for a in load("tests.agentpkg.good:directory", tmp_path)] == ["shop"]
    assert [a.agent_id for a in load("tests.agentpkg.good:build", tmp_path)] == ["shop-serve"]
    assert [a.agent_id for a in load("tests.agentpkg.good:build_plain", tmp_path)] == ["plain"]
    (shop,) = load("tests.agentpkg.good:directory", tmp_path)
    assert shop.tools.names == ["stock"] and shop.max_tool_iterations == 3


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("tests.agentpkg.good", "write it as package.module:attribute"),
        ("tests.agentpkg.nothing_here:directory", "no module named 'tests.agentpkg.nothing_here'"),
        ("tests.agentpkg.needs_missing:directory", "importing tests.agentpkg.needs_missing"),
        ("tests.agentpkg.good:directry", "has no attribute 'directry'"),
        ("tests.agentpkg.good:not_a_directory", "is a list, not an AgentDirectory"),
        ("tests.agentpkg.good:empty", "holds no agents"),
        ("tests.agentpkg.twins:directory", "two agents have the id 'twin'"),
        ("tests.agentpkg.bad_schema:directory", "tool broken: parameters are not a valid JSON Schema"),
    ],
)
def test_configuration_errors_say_what_to_fix(tmp_path: Path, target: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace(".", r"\.").replace("(", r"\(")):
        load(target, tmp_path)


def test_the_option_then_the_environment_then_the_config_file_then_the_example(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TURNLOG_AGENTS", raising=False)
    monkeypatch.delenv("TURNLOG_CONFIG", raising=False)
    assert agents_target(None, tmp_path).target == DEFAULT_AGENTS
    (tmp_path / "turnlog.toml").write_text('agents = "from.file:directory"\n')
    from_file = AgentsTarget("from.file:directory", str(tmp_path / "turnlog.toml"))
    assert agents_target(None, tmp_path) == from_file
    monkeypatch.setenv("TURNLOG_AGENTS", "from.env:directory")
    assert agents_target(None, tmp_path) == AgentsTarget("from.env:directory", "TURNLOG_AGENTS")
    assert agents_target("from.option:d", tmp_path) == AgentsTarget("from.option:d", "--agents")
    monkeypatch.delenv("TURNLOG_AGENTS")
    (tmp_path / "turnlog.toml").write_text('agent = "typo:directory"\n')
    with pytest.raises(ConfigurationError, match="unknown setting 'agent'; the settings are agents"):
        agents_target(None, tmp_path)
    (tmp_path / "turnlog.toml").write_text("agents = [")
    with pytest.raises(ConfigurationError, match="is not valid TOML"):
        agents_target(None, tmp_path)


def test_every_program_stops_with_the_message(tmp_path: Path) -> None:
    assert turnlog(tmp_path, "add-key", "alice").returncode == 0  # serve needs a key file first
    for program in (["serve"], ["worker"], ["demo"]):
        run = turnlog(tmp_path, *program, "--agents", "tests.agentpkg.twins:directory")
        assert run.returncode == 2, (program, run.stdout, run.stderr)
        assert "two agents have the id 'twin'" in run.stdout, program
    run = turnlog(tmp_path, "worker", TURNLOG_AGENTS="tests.agentpkg.good:not_a_directory")
    assert run.returncode == 2 and "(from TURNLOG_AGENTS) is a list" in run.stdout


def test_the_demo_runs_your_agent(tmp_path: Path) -> None:
    (tmp_path / "turnlog.toml").write_text('agents = "tests.agentpkg.good:build"\n')
    run = turnlog(tmp_path, "demo", "--message", "Is P-1 in stock?")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Is P-1 in stock?" in run.stdout and 'In stock: {"sku":"P-1","in_stock":3}' in run.stdout
    run = turnlog(tmp_path, "demo", "--agent", "other")
    assert run.returncode == 2 and "no agent 'other' among --agents; the agents are shop-demo" in run.stdout
