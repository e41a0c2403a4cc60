"""`turnlog doctor`: what this installation has and reaches, and what to do about each problem.

Each finding is one line: a part (Python, an extra, the schemas, the log, the projections,
content encryption, the model endpoint), what was found, and, for a problem, the fix. Missing
extras are not problems (each is optional) but say how to turn them on. The exit status is 1
when anything is a problem.
"""

from __future__ import annotations

import asyncio
import os
import platform
import re
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import aiohttp

from turnlog.engine import codec, extras
from turnlog.engine.crypto.master import MasterKeys
from turnlog.engine.crypto.setup import MASTER_KEY_FILE, keystore_beside
from turnlog.engine.errors import TurnlogError
from turnlog.engine.log.kafka_topics import TopicNames, describe_topics

from .app import ReadSide
from .config import ModelSettings

MODEL_TIMEOUT_S = 5.0
MIN_PYTHON = (3, 11)


@dataclass(frozen=True)
class Finding:
    part: str
    text: str
    problem: bool = False


def version_line() -> str:
    """``turnlog --version``: the version, the Python it runs on and how it was installed."""
    return f"turnlog {turnlog_version()} (Python {platform.python_version()}, {install_kind()})"


def turnlog_version() -> str:
    try:
        return metadata.version("turnlog")
    except metadata.PackageNotFoundError:
        return "unknown (not installed: run from a checkout without pip install)"


def install_kind() -> str:
    checkout = extras.editable_checkout()
    if checkout is not None:
        return f"editable checkout at {checkout}"
    return f"installed in {Path(__file__).resolve().parent.parent}"


async def examine(side: ReadSide, settings: ModelSettings) -> list[Finding]:
    """Every finding, in the order they are shown."""
    found = [_python(), *_extras(), _schemas()]
    found.append(await _log(side))
    found.append(_projections(side))
    found.append(_encryption(side))
    found.append(await _model(settings))
    return found


def _python() -> Finding:
    ok = sys.version_info[:2] >= MIN_PYTHON
    text = f"{platform.python_version()} at {sys.executable}"
    return Finding("python", text if ok else f"{text}: turnlog needs Python 3.11 or newer", not ok)


def _extras() -> list[Finding]:
    found = []
    for name, purpose in extras.PURPOSES.items():
        status = extras.status(name)
        text = f"on: {purpose}" if status.present else f"off: {purpose}; {extras.missing_note(name)}"
        found.append(Finding(f"extra {name}", text))
    return found


def _schemas() -> Finding:
    problem = codec.schema_problem()
    if problem is None:
        return Finding("schemas", f"{len(codec.EVENT_TYPES)} event types load from {codec.SCHEMA_DIR}")
    return Finding("schemas", f"{problem}; reinstall turnlog (the wheel ships them as package data)", True)


async def _log(side: ReadSide) -> Finding:
    if side.kafka is not None:
        return await _kafka(side.kafka, side.topic, side.partitions)
    path = side.home / "log.db"
    if not path.exists():
        return Finding("log", f"no embedded log yet at {path} (the first command that writes creates it)")
    fix = "check the folder's permissions and free disk space, or pass --home"
    try:
        event_log = await side.open_log(owner=False, client_id="doctor")
        try:
            problem = await event_log.readiness_problem()
        finally:
            await event_log.close()
    except Exception as exc:  # a damaged or unreadable file: report it, do not crash the report
        problem = f"{type(exc).__name__}: {exc}"
    if problem is not None:
        return Finding("log", f"embedded at {path}: {problem}; {fix}", True)
    return Finding("log", f"embedded at {path}: answers")


async def _kafka(bootstrap: str, topic: str, partitions: int) -> Finding:
    """The broker answers and the log's topic has the partitions given (nothing is created)."""
    fix = "start the broker (scripts/kafka.sh start) or fix --kafka"
    try:
        found = await asyncio.wait_for(describe_topics(bootstrap, TopicNames(topic)), 15)
    except TimeoutError:
        return Finding("log", f"Kafka at {bootstrap} does not answer within 15 s; {fix}", True)
    except TurnlogError as exc:
        return Finding("log", f"{exc}; {fix}", True)
    count = found.get(topic)
    if count is None:
        return Finding(
            "log", f"Kafka at {bootstrap} answers; no topic {topic} yet (a worker or gateway makes it)"
        )
    if count != partitions:
        return Finding(
            "log", f"topic {topic} has {count} partitions, not {partitions}; pass --partitions {count}", True
        )
    return Finding("log", f"Kafka at {bootstrap} answers; topic {topic} has {count} partitions")


def _projections(side: ReadSide) -> Finding:
    if side.postgres is None:
        path = side.home / "projections.db"
        state = "present" if path.exists() else "not created yet (the first command that folds creates it)"
        return Finding("projections", f"embedded at {path}: {state}")
    reason = _postgres_problem(side.postgres)
    if reason is not None:
        fix = "start it (scripts/postgres.sh start) or fix --postgres"
        return Finding("projections", f"PostgreSQL does not answer: {reason}; {fix}", True)
    return Finding("projections", f"PostgreSQL answers (schema {side.schema})")


def _postgres_problem(dsn: str) -> str | None:
    """Why the database at ``dsn`` does not answer a query, or None when it does."""
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return " ".join(str(exc).split())
    return None


def _encryption(side: ReadSide) -> Finding:
    """Whether content is encrypted, where its keys are, and that they load (nothing is made)."""
    if side.kafka is None:
        keys = keystore_beside(side.home / "log.db")
        master = _master_key_source(side.home / MASTER_KEY_FILE)
        where = f"key store {keys} ({'present' if keys.exists() else 'made with the first session'})"
        return Finding("encryption", f"on: {where}, master key {master}; back both up apart from the log")
    spec = os.environ.get("TURNLOG_KEYSTORE", "").strip()
    if not spec:
        return Finding(
            "encryption",
            "off: content is written in clear and cannot be erased; set TURNLOG_KEYSTORE (a PostgreSQL "
            "DSN) and TURNLOG_MASTER_KEY in every process of the deployment",
        )
    try:
        MasterKeys.load(None)  # the environment's: a Kafka process has no default file
    except (TurnlogError, OSError) as exc:
        return Finding("encryption", f"TURNLOG_KEYSTORE is set but the keys do not open: {exc}", True)
    reason = _postgres_problem(spec) if spec.startswith(("postgresql://", "postgres://")) else None
    if reason is not None:
        return Finding("encryption", f"the key store at {_redacted(spec)} does not answer: {reason}", True)
    return Finding("encryption", f"on: key store {_redacted(spec)}, master key {_master_key_source(None)}")


def _master_key_source(default_file: Path | None) -> str:
    if os.environ.get("TURNLOG_MASTER_KEY", "").strip():
        return "from TURNLOG_MASTER_KEY"
    if path := os.environ.get("TURNLOG_MASTER_KEY_FILE", "").strip():
        return f"from {path}"
    if default_file is None:
        return "missing (set TURNLOG_MASTER_KEY)"
    return f"{default_file} ({'present' if default_file.exists() else 'made on first use'})"


def _redacted(dsn: str) -> str:
    """A DSN without its password."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", dsn)


async def _model(settings: ModelSettings) -> Finding:
    if not settings.configured:
        return Finding(
            "model",
            "no endpoint configured: the demo runs the local model (with the local extra) or the "
            "scripted one; set TURNLOG_BASE_URL and TURNLOG_MODEL to use an OpenAI-compatible endpoint",
        )
    url = f"{str(settings.base_url).rstrip('/')}/models"
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=MODEL_TIMEOUT_S)) as http:
            async with http.get(url, headers=headers) as response:
                status = response.status
                body = await response.json(content_type=None) if status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        fix = "check TURNLOG_BASE_URL and that the server runs"
        return Finding("model", f"{url} does not answer ({type(exc).__name__}: {exc}); {fix}", True)
    if status in (401, 403):
        return Finding("model", f"{url} refused the key (HTTP {status}); check TURNLOG_API_KEY", True)
    if status != 200:
        return Finding(
            "model", f"{url} answered HTTP {status}; check TURNLOG_BASE_URL (it ends in /v1)", True
        )
    names = [str(m.get("id")) for m in (body or {}).get("data", []) if isinstance(m, dict)]
    if settings.model and names and settings.model not in names:
        served = ", ".join(names[:5])
        return Finding(
            "model", f"{url} serves no model {settings.model!r} (it has {served}); fix TURNLOG_MODEL", True
        )
    return Finding("model", f"{url} answers ({len(names)} models; using {settings.model or 'none set'})")
