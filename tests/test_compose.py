"""docker-compose.yml cannot run here (no Docker engine): check that it parses and names the
same Kafka version, ports and settings, and the same PostgreSQL role and database, as the
scripts that start the services for tests and CI; that every turnlog command in it is one the
CLI takes, on one topic; that the agents it mounts load; and that the image installs what the
programs import."""

from __future__ import annotations

import re
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent


def compose() -> dict[str, Any]:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


TURNLOG_SERVICES = ("gateway", "worker", "projector", "analytics", "memory")


def test_it_has_every_service_with_a_health_check_or_a_healthy_dependency() -> None:
    services = compose()["services"]
    assert set(services) == {"kafka", "postgres", "qdrant", *TURNLOG_SERVICES}
    for name in ("kafka", "postgres", "qdrant"):
        assert services[name]["healthcheck"]["test"], name
    for name in TURNLOG_SERVICES:
        deps = services[name]["depends_on"]
        assert {deps[s]["condition"] for s in ("kafka", "postgres", "qdrant")} == {"service_healthy"}, name
    assert services["worker"]["deploy"]["replicas"] >= 2


def test_the_gateway_the_workers_and_the_projector_are_checked_by_their_readiness() -> None:
    """Each healthcheck asks /readyz on the port the service's command serves it on, and the
    gateway starts once a worker and the projector are ready."""
    services = compose()["services"]
    for name in ("gateway", "worker", "projector"):
        command, check = services[name]["command"], " ".join(services[name]["healthcheck"]["test"])
        port = (
            command[command.index("--port") + 1]
            if name == "gateway"
            else command[command.index("--health-port") + 1]
        )
        assert f"http://127.0.0.1:{port}/readyz" in check, name
    gateway = services["gateway"]["depends_on"]
    assert gateway["worker"]["condition"] == gateway["projector"]["condition"] == "service_healthy"


def test_every_turnlog_command_is_one_the_cli_takes() -> None:
    """Each command parses with the real CLI (an option it does not know fails here), and the
    whole system splits the work once: turns in the workers, memory in its service, projections
    and analytics in theirs, the gateway owning nothing."""
    import typer.main

    from turnlog.cli import app

    cli = typer.main.get_command(app)
    services = compose()["services"]
    for name in TURNLOG_SERVICES:
        command = services[name]["command"]
        assert command[:2] == ["turnlog", name if name != "gateway" else "serve"], name
        group = cli.make_context("turnlog", list(command[1:2]))
        program = cli.get_command(group, command[1])  # type: ignore[attr-defined]
        assert program is not None, name
        program.make_context(command[1], list(command[2:]), parent=group)  # refuses unknown options
    gateway, worker = services["gateway"]["command"], services["worker"]["command"]
    assert {"--no-worker", "--no-projector"} <= set(gateway) and "--no-memory" in worker
    assert "8080:8080" in services["gateway"]["ports"] and "--host" in gateway


def test_the_gateway_mounts_its_key_file_and_everyone_the_agents() -> None:
    services = compose()["services"]
    gateway = services["gateway"]
    keys = gateway["command"][gateway["command"].index("--keys") + 1]
    assert any(v.endswith(f":{keys}:ro") and v.startswith("./keys.toml") for v in gateway["volumes"])
    for name in TURNLOG_SERVICES:
        service = services[name]
        env = service["environment"]
        host, mounted, _ = next(v for v in service["volumes"] if "/agents/" in v).split(":")
        assert mounted.startswith(env["PYTHONPATH"] + "/") and (REPO / host).is_dir(), name
        module = env["TURNLOG_AGENTS"].split(":")[0]
        assert module.split(".")[0] == Path(mounted).name, name
        assert env["TURNLOG_QDRANT_URL"] == "http://qdrant:6333"


def test_the_mounted_agents_load(tmp_path: Path) -> None:
    """The agents package docker-compose.yml mounts loads as TURNLOG_AGENTS names it."""
    from turnlog.agents import AgentContext, AgentsTarget, load_agents
    from turnlog.config import ModelSettings

    worker = compose()["services"]["worker"]
    host = next(v for v in worker["volumes"] if "/agents/" in v).split(":")[0]
    target = worker["environment"]["TURNLOG_AGENTS"]
    sys.path.insert(0, str((REPO / host).parent))
    try:
        agents = load_agents(
            AgentsTarget(target, "compose"), AgentContext(tmp_path, ModelSettings(None, None, None), "worker")
        )
    finally:
        sys.path.remove(str((REPO / host).parent))
    assert [a.agent_id for a in agents] == ["shop-support"]


def test_the_image_installs_every_package_the_programs_import() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    for folder in ("schemas", "engine", "projections", "consumers", "gateway", "turnlog", "examples"):
        assert f"COPY {folder} {folder}" in dockerfile, folder
    assert '".[gateway,memory]"' in dockerfile  # serve needs the gateway extra, memory the memory one
    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert find["include"] == ["turnlog", "turnlog.*"]
    for folder in ("schemas", "engine", "projections", "consumers", "gateway", "examples"):
        link = REPO / "turnlog" / folder  # the package takes each folder in through a link
        assert link.is_symlink() and link.resolve() == REPO / folder, folder


def test_kafka_matches_the_pom_and_the_script() -> None:
    kafka = compose()["services"]["kafka"]
    pom = ET.parse(REPO / "services/kafka/pom.xml").getroot()
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    version = pom.find("m:properties/m:kafka.version", ns)
    assert version is not None and kafka["image"] == f"apache/kafka:{version.text}"
    script = (REPO / "scripts/kafka.sh").read_text()
    port = re.search(r'PORT="\$\{TURNLOG_KAFKA_PORT:-(\d+)\}"', script)
    assert port is not None and kafka["ports"] == [f"{port.group(1)}:{port.group(1)}"]
    env = kafka["environment"]
    assert f"PLAINTEXT://127.0.0.1:{port.group(1)}" in env["KAFKA_ADVERTISED_LISTENERS"]
    for setting, value in [
        ("process.roles", env["KAFKA_PROCESS_ROLES"]),
        ("transaction.state.log.replication.factor", env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"]),
        ("transaction.state.log.min.isr", env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"]),
        ("offsets.topic.replication.factor", env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"]),
        ("auto.create.topics.enable", env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"]),
        ("log.retention.hours", env["KAFKA_LOG_RETENTION_HOURS"]),
        ("group.initial.rebalance.delay.ms", env["KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS"]),
    ]:
        assert f"\n{setting}={value}\n" in script, setting
    assert "-Xmx512m" in env["KAFKA_HEAP_OPTS"] and 'HEAP="${TURNLOG_KAFKA_HEAP:-512m}"' in script


def test_postgres_matches_the_script_and_ci() -> None:
    pg = compose()["services"]["postgres"]
    script = (REPO / "scripts/postgres.sh").read_text()
    port = re.search(r'PORT="\$\{TURNLOG_POSTGRES_PORT:-(\d+)\}"', script)
    db = re.search(r'DB="\$\{TURNLOG_POSTGRES_DB:-(\w+)\}"', script)
    role = re.search(r"^ROLE=(\w+)$", script, re.M)
    assert port and db and role
    assert pg["ports"] == [f"{port.group(1)}:{port.group(1)}"]
    env = pg["environment"]
    assert (env["POSTGRES_USER"], env["POSTGRES_PASSWORD"], env["POSTGRES_DB"]) == (
        role.group(1),
        role.group(1),
        db.group(1),
    )
    dsn = f"postgresql://{role.group(1)}:{role.group(1)}@127.0.0.1:{port.group(1)}/{db.group(1)}"
    ci = (REPO / ".ci/run").read_text()
    assert dsn.replace(port.group(1), "$TURNLOG_POSTGRES_PORT") in ci
    projector = compose()["services"]["projector"]["command"]
    assert dsn.replace("127.0.0.1", "postgres") in projector


def test_every_program_uses_the_same_log_and_database() -> None:
    services = compose()["services"]

    def option(command: list[str], name: str) -> str | None:
        return command[command.index(name) + 1] if name in command else None

    commands = {name: services[name]["command"] for name in TURNLOG_SERVICES}
    for name in ("--kafka", "--topic", "--partitions"):
        assert len({option(c, name) for c in commands.values()}) == 1, name
    assert option(commands["worker"], "--kafka") == "kafka:29092"
    postgres = {
        option(c, "--postgres") for n, c in commands.items() if n in ("gateway", "projector", "analytics")
    }
    assert len(postgres) == 1
