"""The embedded log's live channel (engine.log.local_live) over real Unix sockets: logs that share
one file hear each other's appends at once, a held append is announced only once it is committed,
deltas never overtake the events they follow, and missing or stale peers cost nothing.

The two logs of a test live in one process, like two processes would (each its own connection
and group commit); tests/test_cli_serve.py runs `turnlog serve --no-worker` and `turnlog worker`
as two real processes."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import threading
from pathlib import Path
from typing import AsyncIterator

import pytest

from turnlog.engine import SqliteEventLog
from turnlog.engine import events as ev
from turnlog.engine.log.local_live import socket_dir
from turnlog.engine.stream import Committed, LiveItem, ModelDelta, ModelWaiting

DEADLINE_S = 30.0
"""How long a test waits for what the channel should deliver at once (a failure, not a measure)."""


@pytest.fixture
async def two(tmp_path: Path) -> AsyncIterator[tuple[SqliteEventLog, SqliteEventLog]]:
    """Two logs on one file, both on the channel (hold_s 1 s: a held append stays uncommitted
    until its timer, unless something commits it)."""
    path = tmp_path / "log.db"
    first, second = (
        SqliteEventLog(path, partitions=2, hold_s=1.0),
        SqliteEventLog(path, partitions=2, hold_s=1.0),
    )
    try:
        await first.share_live("a")
        await second.share_live("b")
        yield first, second
    finally:
        await first.close()
        await second.close()


def created(sid: str) -> ev.SessionCreated:
    return ev.SessionCreated(session_id=sid, version=1, agent_id="a", user_id="u", model="m")


def message(sid: str, version: int) -> ev.UserMessageReceived:
    return ev.UserMessageReceived(session_id=sid, version=version, message_id=f"m{version}", text="hi")


async def heard(items: AsyncIterator[LiveItem], n: int) -> list[LiveItem]:
    async def take() -> list[LiveItem]:
        return [await anext(items) for _ in range(n)]

    return await asyncio.wait_for(take(), DEADLINE_S)


async def test_an_append_wakes_the_other_logs_waits_and_streams(
    two: tuple[SqliteEventLog, SqliteEventLog],
) -> None:
    first, second = two
    items = second.live.items()  # type: ignore[union-attr]
    listening = asyncio.ensure_future(heard(items, 1))
    await asyncio.sleep(0)  # the listener's queue exists before the append
    waiting = asyncio.ensure_future(second.wait_for_append(3600))  # only the channel can wake it soon
    await first.submit(created("s1"))
    await asyncio.wait_for(waiting, DEADLINE_S)
    assert await listening == [Committed("s1", 1, "SessionCreated")]
    assert [e.version for e in await second.read_session("s1")] == [1]

    waiting = asyncio.ensure_future(first.wait_for_append(3600))  # and the other way
    await second.append([message("s1", 2)], expected_version=1)
    await asyncio.wait_for(waiting, DEADLINE_S)


async def test_a_held_append_is_announced_once_committed_and_its_deltas_follow(
    two: tuple[SqliteEventLog, SqliteEventLog],
) -> None:
    first, second = two
    await first.submit(created("s1"))
    items = second.live.items()  # type: ignore[union-attr]
    assert await heard(items, 1) == [Committed("s1", 1, "SessionCreated")]

    started = ev.ModelCallStarted(
        session_id="s1", version=2, turn_id="t1", step=0, model="m", message_count=1, tools_offered=0
    )
    await first.append([started], expected_version=1, redoable=True)  # held: returned, not committed
    assert first.group is not None and first.group.behind()
    first.live.publish(ModelDelta("s1", "t1", 0, "Hel"))  # type: ignore[union-attr]
    first.live.publish(ModelDelta("s1", "t1", 0, "lo"))  # type: ignore[union-attr]

    notice = await heard(items, 1)
    assert notice == [Committed("s1", 2, "ModelCallStarted")]
    # read the file as another process would, on a thread with no hold to commit: the event is there
    assert committed_version(first.path, "s1") == 2
    assert await heard(items, 2) == [ModelDelta("s1", "t1", 0, "Hel"), ModelDelta("s1", "t1", 0, "lo")]
    wait = ModelWaiting("s1", "t1", 1, "m", "2 calls are in flight to the endpoint", ahead=3)
    first.live.publish(wait)  # type: ignore[union-attr]  # a call held by its endpoint's limits
    first.live.publish(ModelWaiting("s1", "t1", 1, "m", "", waiting=False))  # type: ignore[union-attr]
    assert await heard(items, 2) == [wait, ModelWaiting("s1", "t1", 1, "m", "", waiting=False)]


def committed_version(path: Path, sid: str) -> int:
    """The session's last version as a fresh log on another thread (its own loop) reads it."""
    found: list[int] = []

    def read() -> None:
        async def go() -> int:
            log = SqliteEventLog(path, partitions=2)
            try:
                return await log.session_version(sid)
            finally:
                await log.close()

        try:
            found.append(asyncio.run(go()))
        except sqlite3.OperationalError:  # "database is locked": a transaction is still open
            found.append(-1)

    thread = threading.Thread(target=read)
    thread.start()
    thread.join()  # the loop waits: nothing commits the held append meanwhile
    return found[0]


async def test_missing_stale_and_departed_peers_cost_nothing(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    place = socket_dir(path)
    place.mkdir(parents=True)
    stale = place / "worker-1-dead.sock"  # a process that died without removing its socket
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(stale))
    dead.close()
    (place / "notes.sock").write_text("not a socket")

    alone = SqliteEventLog(path, partitions=2)
    try:
        await alone.share_live("a")  # no peer to hear it: appends go on, waits fall back to polling
        assert not stale.exists()
        await alone.submit(created("s1"))
        other = SqliteEventLog(path, partitions=2)
        await other.share_live("b")
        items = other.live.items()  # type: ignore[union-attr]
        await alone.append([message("s1", 2)], expected_version=1)
        assert await heard(items, 1) == [Committed("s1", 2, "UserMessageReceived")]
        await other.close()  # gone: the next appends are not slowed or failed by it
        for version in range(3, 6):
            await alone.append([message("s1", version)], expected_version=version - 1)
        alone.live.publish(ModelDelta("s1", "t", 0, "x"))  # type: ignore[union-attr]
        assert await alone.session_version("s1") == 5
    finally:
        await alone.close()
    assert sorted(p.name for p in place.iterdir()) == ["notes.sock"]  # each removed its own socket


async def test_a_log_that_cannot_open_the_channel_runs_without_it(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    socket_dir(path).write_text("a file where the socket directory would go")
    log = SqliteEventLog(path, partitions=2)
    try:
        await log.share_live("a")  # logged, not raised: the others poll
        await log.submit(created("s1"))
        log.live.publish(ModelDelta("s1", "t", 0, "x"))  # type: ignore[union-attr]
        assert await log.session_version("s1") == 1
    finally:
        await log.close()
