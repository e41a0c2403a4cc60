"""docker-compose.yml cannot run here (no Docker engine): check that it parses and names the
same Kafka version, ports and settings, and the same PostgreSQL role and database, as the
scripts that start the services for tests and CI."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent


def compose() -> dict[str, Any]:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_it_has_every_service_with_a_health_check_or_a_healthy_dependency() -> None:
    services = compose()["services"]
    assert set(services) == {"kafka", "postgres", "qdrant", "worker", "projector"}
    for name in ("kafka", "postgres", "qdrant"):
        assert services[name]["healthcheck"]["test"], name
    for name in ("worker", "projector"):
        deps = services[name]["depends_on"]
        assert deps["kafka"]["condition"] == deps["postgres"]["condition"] == "service_healthy"
    assert services["worker"]["deploy"]["replicas"] >= 2


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


def test_workers_and_projector_use_the_same_topic_and_partitions() -> None:
    services = compose()["services"]

    def option(command: list[str], name: str) -> str:
        return command[command.index(name) + 1]

    worker, projector = services["worker"]["command"], services["projector"]["command"]
    assert worker[:2] == ["turnlog", "worker"] and projector[:2] == ["turnlog", "projector"]
    for name in ("--kafka", "--topic", "--partitions"):
        assert option(worker, name) == option(projector, name)
    assert option(worker, "--kafka") == "kafka:29092"
