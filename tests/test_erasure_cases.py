"""Erasure, the other cases (issue 43): one session of a user (the others stay), an erasure that
races a running turn (the turn is stopped first, nothing of it reaches the log in clear after),
and a log written before encryption: `turnlog migrate-encrypt` copies it into an encrypted log
(embedded and Kafka) and says what the old one still holds; an erasure on it names the sessions
it could not reach."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.erasure_support import hits, pg_cipher
from tests.services import delete_topics, fresh_topic, kafka_log, need_service
from tests.test_erasure import kafka_bytes
from tests.test_layout import REPO
from turnlog.consumers import TurnWorker
from turnlog.consumers.projector import Projector
from turnlog.engine import (
    Agent,
    AgentDirectory,
    AgentSessions,
    FunctionModel,
    ModelRequest,
    SessionNotFoundError,
)
from turnlog.engine import events as ev
from turnlog.engine.crypto.fields import ERASED_TEXT
from turnlog.engine.log.sqlite import SqliteEventLog
from turnlog.engine.models.base import Model, ModelResponse, TextDelta
from turnlog.projections.erasure import open_eraser
from turnlog.projections.store import SqliteProjectionStore

WAIT_S = 60.0


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "turnlog", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "300", **(env or {})},
    )


async def test_erasing_one_session_leaves_the_users_others(tmp_path: Path) -> None:
    log = SqliteEventLog(tmp_path / "log.db", compress=False)
    store = SqliteProjectionStore(tmp_path / "projections.db")
    api = AgentSessions(log, AgentDirectory([Agent.build("a", FunctionModel(lambda r: "ok"))]))
    try:
        gone, kept = [(await api.create_session("a", "ann")).session_id for _ in range(2)]
        for sid, text in ((gone, "GONEzq secret"), (kept, "KEPTzq note")):
            async for _ in api.send_user_message(sid, text):
                pass
        eraser = open_eraser(api, store)
        assert eraser is not None
        report = await eraser.erase_session(gone, "retention", actor="sweeper")
        assert (report.scope, report.sessions, report.erased_now) == ("session", 1, 1)
        again = await eraser.erase_session(gone, "retention", actor="sweeper")
        assert (again.erasure_id, again.erased_now) == (report.erasure_id, 0)  # idempotent: the same request
        with pytest.raises(SessionNotFoundError):
            await eraser.erase_session("no-such-session", "retention")
        erased = (await log.read_session(gone))[-1]
        assert isinstance(erased, ev.SessionErased)
        assert (erased.scope, erased.reason, erased.actor) == ("session", "retention", "sweeper")
        assert erased.user_id == "ann"
        texts = {e.text for e in await log.read_session(kept) if isinstance(e, ev.UserMessageReceived)}
        assert texts == {"KEPTzq note"}
        await Projector(log, store).catch_up()
        assert [r["content"] for r in store.rows_of("messages", kept)][0] == "KEPTzq note"
    finally:
        store.close()
        await log.close()
    assert hits([tmp_path], ["GONEzq"]) == {}


class HeldModel(Model):
    """Streams the start of an answer, then waits (a slow provider) until released."""

    name = "held"

    def __init__(self) -> None:
        self.streaming = asyncio.Event()
        self.release = asyncio.Event()
        self.stopped = False

    async def stream(self, request: ModelRequest):  # type: ignore[no-untyped-def]
        yield TextDelta("HELDzq the start of an answer ")
        self.streaming.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.stopped = True
            raise
        yield ModelResponse("HELDzq the start of an answer and its end")


async def test_an_erasure_stops_a_running_turn_first(tmp_path: Path) -> None:
    log = SqliteEventLog(tmp_path / "log.db", compress=False)
    store = SqliteProjectionStore(tmp_path / "projections.db")
    model = HeldModel()
    agents = AgentDirectory([Agent.build("slow", model)])
    api = AgentSessions(log, agents)
    worker = TurnWorker(log, agents, worker_id="w")
    running = asyncio.create_task(worker.run())
    try:
        sid = (await api.create_session("slow", "ann")).session_id
        await api.post_user_message(sid, "HELDzq question")
        await asyncio.wait_for(model.streaming.wait(), WAIT_S)
        eraser = open_eraser(api, store)
        assert eraser is not None
        await eraser.erase_session(sid, "asked")
        async with asyncio.timeout(WAIT_S):  # the worker read the erasure: the call in flight is stopped
            while not model.stopped:
                await asyncio.sleep(0.02)
        model.release.set()
        events = await log.read_session(sid)
        kinds = [e.type for e in events]
        closing = kinds[kinds.index("SessionClosed") :]
        assert closing in (
            ["SessionClosed", "SessionErased"],
            ["SessionClosed", "SnapshotTaken", "SessionErased"],
        )
        (finished,) = [e for e in events if isinstance(e, ev.TurnFinished)]
        assert finished.reason == "forced"  # stopped by the erasure's force-finish, in its commit
        assert not any(isinstance(e, ev.AssistantMessage) for e in events)
        assert {e.text for e in events if isinstance(e, ev.UserMessageReceived)} == {ERASED_TEXT}
        state = await api.get_state(sid)
        assert state.closed and state.turn is None
    finally:
        worker.stop()
        await running
        store.close()
        await log.close()
    assert hits([tmp_path], ["HELDzq"]) == {}


async def _plain_log(path: Path, marker: str) -> list[str]:
    """Sessions of user ``old`` on a log written before encryption (``encrypt=False``)."""
    log = SqliteEventLog(path, compress=False, encrypt=False)
    api = AgentSessions(log, AgentDirectory([Agent.build("a", FunctionModel(lambda r: f"answer {marker}"))]))
    sids = []
    try:
        for i in range(3):
            sid = (await api.create_session("a", "old")).session_id
            async for _ in api.send_user_message(sid, f"{marker} question {i}"):
                pass
            sids.append(sid)
    finally:
        await log.close()
    return sids


async def test_migrate_encrypt_copies_an_old_log_and_says_what_it_still_holds(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    sids = await _plain_log(old / "log.db", "OLDzq")
    assert hits([old], ["OLDzq question"]), "written before encryption: in the clear"

    moved = cli("migrate-encrypt", "--home", str(old), "--to", str(new))
    assert moved.returncode == 0, moved.stderr + moved.stdout
    assert "hold the plaintext" in moved.stdout and f"{old / 'log.db'}" in moved.stdout
    assert hits([new], ["OLDzq"]) == {}
    before, after = SqliteEventLog(old / "log.db", encrypt=False), SqliteEventLog(new / "log.db")
    try:
        for sid in sids:
            assert await after.read_session(sid) == await before.read_session(sid)
    finally:
        await before.close()
        await after.close()

    erased = cli("erase", "--home", str(new), "--user", "old", "--agents", "tests.agentpkg.desk:directory")
    assert erased.returncode == 0 and "3 session(s) (3 now)" in erased.stdout, erased.stdout + erased.stderr
    assert "before encryption" not in erased.stdout
    unreached = cli("erase", "--home", str(old), "--user", "old", "--agents", "tests.agentpkg.desk:directory")
    assert unreached.returncode == 0, unreached.stdout + unreached.stderr
    assert "3 session(s) were written before encryption" in unreached.stdout


async def test_migrate_encrypt_copies_a_kafka_topic_and_says_the_old_topic_keeps_it(tmp_path: Path) -> None:
    bootstrap, dsn = need_service("TURNLOG_KAFKA_BOOTSTRAP"), need_service("TURNLOG_POSTGRES_DSN")
    new_topic = fresh_topic()
    async with kafka_log(bootstrap, partitions=2) as old:
        api = AgentSessions(old, AgentDirectory([Agent.build("a", FunctionModel(lambda r: "answer KAFzq"))]))
        sid = (await api.create_session("a", "old")).session_id
        async for _ in api.send_user_message(sid, "KAFzq question"):
            pass
        with pg_cipher(dsn) as cipher:
            schema = str(getattr(cipher.keys, "where", "")).rsplit(" ", 1)[-1]
            env = {"TURNLOG_KEYSTORE": dsn, "TURNLOG_KEYSTORE_SCHEMA": schema}
            env["TURNLOG_MASTER_KEY"] = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
            try:
                args = ["--kafka", bootstrap, "--topic", old.topics.events, "--partitions", "2"]
                args += ["--to-topic", new_topic, "--home", str(tmp_path)]
                moved = cli("migrate-encrypt", *args, env=env)
                assert moved.returncode == 0, moved.stdout + moved.stderr
                assert f"The old topic {old.topics.events}" in moved.stdout
                assert "delete the old topics" in moved.stdout
                records = await kafka_bytes(bootstrap, new_topic)
                copied = [blob for name, blob in records if "headers" not in name]
                assert copied and not any(b"KAFzq" in blob for blob in copied)
            finally:
                await delete_topics(bootstrap, new_topic)
