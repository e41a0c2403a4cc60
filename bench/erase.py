#!/usr/bin/env python
"""Erasing a user with many sessions (issue 43): `turnlog erase --user` on the embedded log, in
one go and SIGKILLed halfway then resumed by the next `turnlog erase`.

    PYTHONPATH=. .venv/bin/python bench/erase.py [--sessions 1000] [--others 100] [--out ...]

A home is filled once: ``--sessions`` sessions of the user erased and ``--others`` of another
user, each one turn (a lookup and an answer: 13 events), projected. Then, each on a copy of it:

* ``one go``: `turnlog erase --user` in a process of its own, wall time from its start to its exit
  (Python start and imports included);
* ``killed``: the same, SIGKILLed once some batches are done and before all are (the key store's
  progress), then `turnlog erase` (no subject: it finishes what is pending); the two wall times.

Each copy is then checked: every session of the user has exactly one SessionErased and its key
destroyed, its messages read ``[erased]``, the projections equal a rebuild, no planted string is
in any file, and the other user's sessions are untouched. The two copies' sessions must show the
same events (types per session). Results: a table on stdout and JSON (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.engine_version import fingerprint  # noqa: E402
from turnlog.consumers.projector import Projector  # noqa: E402
from turnlog.engine import AgentSessions  # noqa: E402
from turnlog.engine import events as ev  # noqa: E402
from turnlog.engine.crypto.fields import ERASED_TEXT  # noqa: E402
from turnlog.engine.log.sqlite import SqliteEventLog  # noqa: E402
from turnlog.projections.rebuild import rebuild  # noqa: E402
from turnlog.projections.schema import READ_MODELS  # noqa: E402
from turnlog.projections.store import SqliteProjectionStore  # noqa: E402

AGENTS = "tests.agentpkg.desk:directory"
USER, OTHER = "erased-user", "other-user"
MARK, KEEP = "zqplanted", "bqkept"


async def populate(home: Path, sessions: int, others: int) -> float:
    from tests.agentpkg.desk import directory

    log = SqliteEventLog(home / "log.db")
    store = SqliteProjectionStore(home / "projections.db")
    api = AgentSessions(log, directory(), producer="bench")
    start = time.perf_counter()
    try:
        for i in range(sessions + others):
            user, mark = (USER, MARK) if i < sessions else (OTHER, KEEP)
            sid = (await api.create_session("desk", user)).session_id
            async for _ in api.send_user_message(sid, f"where is order A-{i}? {mark}-{i}"):
                pass
        await Projector(log, store).catch_up()
    finally:
        store.close()
        await log.close()
    return time.perf_counter() - start


def erase(home: Path, *args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "turnlog", "erase", "--home", str(home), "--agents", AGENTS, *args]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def progress(home: Path) -> tuple[int, int]:
    """(sessions done, sessions covered) of the pending erasure; (0, 0) when none is."""
    with sqlite3.connect(home / "log.keys.db", timeout=10) as db:
        row = db.execute(
            "SELECT sum(done), count(*) FROM erasure_sessions JOIN erasures USING (erasure_id) "
            "WHERE state = 'pending'"
        ).fetchone()
    return int(row[0] or 0), int(row[1] or 0)


def one_go(home: Path, batch: int) -> dict[str, Any]:
    start = time.perf_counter()
    proc = erase(home, "--user", USER, "--batch", str(batch))
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(out)
    return {"erase_s": round(time.perf_counter() - start, 2), "output": out.strip().splitlines()[-1]}


def killed(home: Path, batch: int, sessions: int) -> dict[str, Any]:
    start = time.perf_counter()
    proc = erase(home, "--user", USER, "--batch", str(batch))
    done = 0
    while not (0 < done < sessions):
        if proc.poll() is not None:
            raise RuntimeError("the erasure ended before it could be killed: use more sessions")
        time.sleep(0.01)
        done = progress(home)[0] if (home / "log.keys.db").exists() else 0
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    first = time.perf_counter() - start
    at_kill = progress(home)
    start = time.perf_counter()
    resumed = erase(home, "--batch", str(batch))
    out, _ = resumed.communicate()
    if resumed.returncode != 0:
        raise RuntimeError(out)
    return {
        "killed_after_s": round(first, 2),
        "done_at_kill": at_kill[0],
        "resume_s": round(time.perf_counter() - start, 2),
        "output": out.strip().splitlines()[-1],
    }


async def check(home: Path, scratch: Path) -> dict[str, list[str]]:
    """Every invariant of a finished erasure; each session's event types (to compare copies)."""
    log = SqliteEventLog(home / "log.db")
    store = SqliteProjectionStore(home / "projections.db")
    rebuilt = SqliteProjectionStore(scratch / f"rebuilt-{home.name}.db")
    shapes: dict[str, list[str]] = {}
    try:
        async for summary in log.sessions():
            events = await log.read_session(summary.session_id)
            texts = {e.text for e in events if isinstance(e, ev.UserMessageReceived)}
            erased = [e for e in events if isinstance(e, ev.SessionErased)]
            first = events[0]
            assert isinstance(first, ev.SessionCreated)
            if first.user_id == USER:
                assert len(erased) == 1 and texts == {ERASED_TEXT}, summary.session_id
            else:
                assert not erased and all(KEEP in t for t in texts), summary.session_id
            shapes[summary.session_id] = [e.type for e in events]
        await Projector(log, store).catch_up()
        await rebuild(log, rebuilt)
        assert {t: store.table(t) for t in READ_MODELS} == {t: rebuilt.table(t) for t in READ_MODELS}
    finally:
        rebuilt.close()
        store.close()
        await log.close()
    for path in home.rglob("*"):
        assert not path.is_file() or MARK.encode() not in path.read_bytes(), f"{MARK} in {path}"
    with sqlite3.connect(home / "log.keys.db") as db:
        live = db.execute("SELECT count(*) FROM data_keys WHERE user_id = ? AND wrapped IS NOT NULL", (USER,))
        assert live.fetchone()[0] == 0
    return shapes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=1000, help="the erased user's sessions (default 1000)")
    ap.add_argument("--others", type=int, default=100, help="another user's sessions, kept (default 100)")
    ap.add_argument("--batch", type=int, default=200, help="sessions per key-store transaction (default 200)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "erase.json")
    a = ap.parse_args()
    os.environ.setdefault("TURNLOG_MASTER_KEY", base64.b64encode(os.urandom(32)).decode())
    with tempfile.TemporaryDirectory(prefix="turnlog-erase-") as tmp:
        root = Path(tmp)
        filled = root / "filled"
        fill_s = asyncio.run(populate(filled, a.sessions, a.others))
        print(f"filled {a.sessions} + {a.others} sessions in {fill_s:.1f} s", file=sys.stderr, flush=True)
        shutil.copytree(filled, root / "one-go")
        shutil.copytree(filled, root / "killed")
        results = {
            "one_go": one_go(root / "one-go", a.batch),
            "killed": killed(root / "killed", a.batch, a.sessions),
        }
        same = asyncio.run(check(root / "one-go", root)) == asyncio.run(check(root / "killed", root))
        assert same, "the killed and resumed erasure left other events than the one in one go"
    doc = {
        "settings": {"sessions": a.sessions, "others": a.others, "batch": a.batch},
        "engine": fingerprint(),
        "fill_s": round(fill_s, 1),
        "results": results,
        "same_result": same,
        "loadavg": os.getloadavg(),
    }
    a.out.write_text(json.dumps(doc, indent=1))
    one, kill = results["one_go"], results["killed"]
    print(f"| erase {a.sessions} sessions of a user | wall (s) |\n|---|---:|")
    print(f"| in one go (`turnlog erase --user`, process start included) | {one['erase_s']} |")
    print(
        f"| SIGKILLed after {kill['killed_after_s']} s ({kill['done_at_kill']} sessions done), "
        f"then `turnlog erase` resumed it | {kill['resume_s']} |"
    )
    print(f"same result: {same}; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
