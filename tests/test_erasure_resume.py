"""An erasure SIGKILLed halfway is finished by the next process to the same result (issue 43):
`turnlog erase --user` is killed once some of the user's sessions are done and before all are;
the next `turnlog erase` resumes the request it left pending. Then every session of the user is
erased once (one erasure event each, one key destroyed each), the projections equal a rebuild,
no planted string is in any file, and the other user's sessions are untouched."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from tests.agentpkg.desk import directory
from tests.erasure_support import hits
from tests.test_layout import REPO
from turnlog.consumers.projector import Projector
from turnlog.engine import AgentSessions
from turnlog.engine import events as ev
from turnlog.engine.crypto.fields import ERASED_TEXT
from turnlog.engine.log.sqlite import SqliteEventLog
from turnlog.projections.rebuild import rebuild
from turnlog.projections.schema import READ_MODELS
from turnlog.projections.store import SqliteProjectionStore

SESSIONS = 240
BATCH = 20
WAIT_S = 120.0


async def populate(home: Path, user: str, count: int, marker: str) -> list[str]:
    """``count`` sessions of ``user`` on the embedded log in ``home``, each one turn (a lookup and
    an answer), projected; their ids."""
    log = SqliteEventLog(home / "log.db", compress=False)
    store = SqliteProjectionStore(home / "projections.db")
    api = AgentSessions(log, directory(), producer="test")
    sids = []
    try:
        for i in range(count):
            sid = (await api.create_session("desk", user)).session_id
            async for _ in api.send_user_message(sid, f"where is order A-{i}? {marker}-{i}"):
                pass
            sids.append(sid)
        await Projector(log, store).catch_up()
    finally:
        store.close()
        await log.close()
    return sids


def erase(home: Path, *args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "turnlog", "erase", "--home", str(home), "--batch", str(BATCH)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [*command, "--agents", "tests.agentpkg.desk:directory", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def done_and_total(home: Path) -> tuple[int, int]:
    """The pending request's sessions done and covered, as the key store says (0, 0 before it)."""
    path = home / "log.keys.db"
    if not path.exists():
        return 0, 0
    with sqlite3.connect(path, timeout=10) as db:
        try:
            row = db.execute(
                "SELECT sum(done), count(*) FROM erasure_sessions s JOIN erasures e USING (erasure_id) "
                "WHERE e.state = 'pending'"
            ).fetchone()
        except sqlite3.OperationalError:  # the tables are not made yet
            return 0, 0
    return int(row[0] or 0), int(row[1] or 0)


async def test_an_erasure_killed_halfway_is_finished_by_the_next_process(tmp_path: Path) -> None:
    home = tmp_path / "home"
    alice = await populate(home, "alice", SESSIONS, "zqalice")
    bob = await populate(home, "bob", 3, "bqbob")

    killed = erase(home, "--user", "alice")
    deadline = time.monotonic() + WAIT_S
    while not (0 < done_and_total(home)[0] < SESSIONS):
        assert killed.poll() is None, (
            f"the erasure ended before it could be killed: {killed.stdout and killed.stdout.read()}"
        )
        assert time.monotonic() < deadline, "the erasure made no progress"
        await asyncio.sleep(0.01)
    os.kill(killed.pid, signal.SIGKILL)
    killed.communicate()
    done, total = done_and_total(home)
    assert total == SESSIONS and 0 < done < SESSIONS, "killed halfway: the request is pending"

    resumed = erase(home)  # no subject: it finishes what is pending
    out, _ = resumed.communicate(timeout=WAIT_S)
    assert resumed.returncode == 0, out
    assert f"resumed user alice: {SESSIONS} session(s)" in out
    assert done_and_total(home) == (0, 0)

    log = SqliteEventLog(home / "log.db")
    store = SqliteProjectionStore(home / "projections.db")
    rebuilt = SqliteProjectionStore(tmp_path / "rebuilt.db")
    try:
        for sid in alice:
            events = await log.read_session(sid)
            assert [type(e) for e in events].count(ev.SessionErased) == 1, sid
            assert {e.text for e in events if isinstance(e, ev.UserMessageReceived)} == {ERASED_TEXT}
        for sid in bob:
            events = await log.read_session(sid)
            assert not any(isinstance(e, ev.SessionErased) for e in events)
            assert all("bqbob" in e.text for e in events if isinstance(e, ev.UserMessageReceived))
        await Projector(log, store).catch_up()
        await rebuild(log, rebuilt)
        assert {t: store.table(t) for t in READ_MODELS} == {t: rebuilt.table(t) for t in READ_MODELS}
    finally:
        rebuilt.close()
        store.close()
        await log.close()
    with sqlite3.connect(home / "log.keys.db") as db:
        erased = db.execute(
            "SELECT count(*) FROM data_keys WHERE user_id = 'alice' AND wrapped IS NULL"
        ).fetchone()
    assert erased[0] == SESSIONS
    assert hits([home], ["zqalice"]) == {}
    assert hits([home], ["bqbob"]) != {}  # bob's messages are in the projections, in the clear
