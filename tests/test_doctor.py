"""`turnlog --version` and `turnlog doctor` in real subprocesses: what they find on a healthy
setup and what they tell the user to do about each problem."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

from tests.openai_server import free_port, serve_openai
from tests.services import need_service

REPO = Path(__file__).resolve().parent.parent


def turnlog(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "400"}
    for key in (
        "TURNLOG_BASE_URL", "OPENAI_BASE_URL", "TURNLOG_MODEL", "TURNLOG_API_KEY",
        "TURNLOG_KEYSTORE", "TURNLOG_MASTER_KEY", "TURNLOG_MASTER_KEY_FILE",
    ):  # fmt: skip
        base.pop(key, None)
    return subprocess.run(
        [sys.executable, "-m", "turnlog", *args],
        capture_output=True,
        text=True,
        env={**base, **env},
        timeout=120,
    )


def lines_of(run: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """The doctor's findings by part: "ok ..." or "problem ..."."""
    found = {}
    for line in run.stdout.splitlines():
        status, _, rest = line.partition(" ")
        part, _, text = rest.strip().partition(": ")
        if status in ("ok", "problem"):
            found[part] = f"{status} {text}"
    return found


def test_version_names_turnlog_python_and_the_install() -> None:
    run = turnlog("--version")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("turnlog 0.1.0 (Python 3.")
    assert "editable checkout" in run.stdout or "installed in" in run.stdout


def test_doctor_on_a_fresh_home_finds_nothing_wrong(tmp_path: Path) -> None:
    run = turnlog("doctor", "--home", str(tmp_path / "fresh"))
    assert run.returncode == 0, run.stdout + run.stderr
    found = lines_of(run)
    assert found["python"].startswith("ok 3.")
    assert found["schemas"].startswith("ok ") and "event types load" in found["schemas"]
    assert "no embedded log yet" in found["log"] and found["log"].startswith("ok")
    assert found["projections"].startswith("ok") and "not created yet" in found["projections"]
    assert found["model"].startswith("ok no endpoint configured")
    encryption = found["encryption"]
    assert encryption.startswith("ok on: key store ") and "made with the first session" in encryption
    assert {"extra gateway", "extra memory", "extra local"} <= found.keys()
    assert not (tmp_path / "fresh").exists(), "the doctor looks; it creates nothing"


def test_doctor_names_each_problem_with_its_fix(tmp_path: Path) -> None:
    closed = free_port()
    run = turnlog(
        "doctor", "--home", str(tmp_path), "--kafka", f"127.0.0.1:{closed}",
        "--postgres", f"postgresql://nobody@127.0.0.1:{closed}/none",
        TURNLOG_BASE_URL=f"http://127.0.0.1:{closed}/v1", TURNLOG_MODEL="m",
    )  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    found = lines_of(run)
    assert found["log"].startswith("problem") and "scripts/kafka.sh start" in found["log"]
    assert found["projections"].startswith("problem") and "scripts/postgres.sh start" in found["projections"]
    assert found["model"].startswith("problem") and "check TURNLOG_BASE_URL" in found["model"]


def test_doctor_checks_the_model_endpoint_and_the_model_name(tmp_path: Path) -> None:
    with serve_openai([], model="served-model") as fake:
        good = lines_of(turnlog("doctor", "--home", str(tmp_path), TURNLOG_BASE_URL=fake.base_url,
                                TURNLOG_MODEL="served-model"))  # fmt: skip
        wrong = turnlog(
            "doctor", "--home", str(tmp_path), TURNLOG_BASE_URL=fake.base_url, TURNLOG_MODEL="other"
        )
    assert good["model"].startswith("ok") and "using served-model" in good["model"]
    assert wrong.returncode == 1
    assert "serves no model 'other' (it has served-model); fix TURNLOG_MODEL" in lines_of(wrong)["model"]


def test_doctor_reads_a_kafka_topic_without_creating_it(tmp_path: Path) -> None:
    bootstrap = need_service("TURNLOG_KAFKA_BOOTSTRAP")
    run = turnlog(
        "doctor", "--home", str(tmp_path), "--kafka", bootstrap, "--topic", "test.doctor-nothing-here"
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "no topic test.doctor-nothing-here yet" in lines_of(run)["log"]
    again = turnlog(
        "doctor", "--home", str(tmp_path), "--kafka", bootstrap, "--topic", "test.doctor-nothing-here"
    )
    assert "no topic test.doctor-nothing-here yet" in lines_of(again)["log"]


def test_doctor_says_whether_a_kafka_deployment_encrypts_and_if_its_keys_open(tmp_path: Path) -> None:
    bootstrap = need_service("TURNLOG_KAFKA_BOOTSTRAP")
    dsn = need_service("TURNLOG_POSTGRES_DSN")
    kafka = ("doctor", "--home", str(tmp_path), "--kafka", bootstrap, "--topic", "test.doctor-keys")
    clear = lines_of(turnlog(*kafka))["encryption"]
    assert clear.startswith("ok off: content is written in clear") and "TURNLOG_KEYSTORE" in clear

    master = base64.b64encode(os.urandom(32)).decode()
    keyed = turnlog(*kafka, TURNLOG_KEYSTORE=dsn, TURNLOG_MASTER_KEY=master)
    assert keyed.returncode == 0, keyed.stdout + keyed.stderr
    found = lines_of(keyed)["encryption"]
    assert found.startswith("ok on: key store postgresql://") and "from TURNLOG_MASTER_KEY" in found
    password = dsn.split("://", 1)[1].split("@", 1)[0].partition(":")[2]
    assert ":***@" in found and (not password or f":{password}@" not in found)  # no password shown

    no_master = turnlog(*kafka, TURNLOG_KEYSTORE=dsn)
    assert no_master.returncode == 1
    assert lines_of(no_master)["encryption"].startswith("problem ")
    assert "TURNLOG_MASTER_KEY" in lines_of(no_master)["encryption"]

    nowhere = "postgresql://nobody:x@127.0.0.1:1/none"
    dead = turnlog(*kafka, TURNLOG_KEYSTORE=nowhere, TURNLOG_MASTER_KEY=master)
    assert dead.returncode == 1 and "does not answer" in lines_of(dead)["encryption"]
