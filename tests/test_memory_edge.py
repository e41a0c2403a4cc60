"""The embedded default memory store, Qdrant Edge in-process (issue 20), on disk with the real
offline embedder: users never see each other's memories, a crashed process's writes are there
after a restart (and still deduplicated against), a damaged or locked folder is a clear error
that never fails a turn, and ``open_store`` picks the engine a folder needs."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import structlog

from tests.context_support import open_session
from turnlog.engine import MemoryPolicy
from turnlog.engine import events as ev
from turnlog.engine.errors import ConfigurationError, MemoryStoreError
from turnlog.engine.memory.base import Memory
from turnlog.engine.memory.edge import EdgeMemoryStore
from turnlog.engine.memory.embedders import UniversalSentenceEncoder
from turnlog.engine.memory.qdrant import QdrantMemoryStore
from turnlog.engine.memory.stores import ENGINE_ENV, open_store
from turnlog.engine.models.base import ModelRequest

REPO = Path(__file__).resolve().parent.parent
FACT = "The user prefers DHL Express for every replacement shipment."
RESTATED = "For every replacement shipment the user prefers DHL Express."


@pytest.fixture(scope="module")
def embedder() -> UniversalSentenceEncoder:
    return UniversalSentenceEncoder()


@pytest.fixture
async def store(embedder: UniversalSentenceEncoder, tmp_path: Path) -> AsyncIterator[EdgeMemoryStore]:
    opened = EdgeMemoryStore(embedder, path=str(tmp_path / "memory"))
    try:
        yield opened
    finally:
        await opened.close()


def python(code: str) -> subprocess.Popen[str]:
    """Another process running ``code`` against this worktree's engine."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A process that opened the store in ``tmp_path/memory``, wrote a fact, and keeps it open
    until its stdin closes."""
    proc = python(
        f"""
        import asyncio, sys
        from turnlog.engine.memory.edge import EdgeMemoryStore

        async def main():
            store = EdgeMemoryStore(path={str(tmp_path / "memory")!r})
            await store.remember("u1", {FACT!r}, "preference")
            print("ready", flush=True)
            await asyncio.to_thread(sys.stdin.readline)
            await store.close()

        asyncio.run(main())
        """
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the holder has the store open (or died)
    assert line.strip() == "ready", proc.communicate()[1] if proc.poll() is not None else line
    try:
        yield proc
    finally:
        if proc.returncode is None:  # not already let go by the test
            proc.communicate("\n", timeout=120)


async def test_users_see_only_their_own_memories_among_many(store: EdgeMemoryStore) -> None:
    """The same texts for 40 users (user-1 and user-10 among them): every search, count and
    history stays inside the one user it names."""
    texts = [FACT, "订单1042被承运商弄丢了", "Refund orders that are more than 5 days late"]
    users = [f"user-{i}" for i in range(40)]
    facts = [
        Memory(memory_id=f"{u:08x}-{t:04x}-4000-8000-000000000000", user_id=user, text=text,
               tag="preference" if t == 0 else "conclusion", valid_from_ms=1)
        for u, user in enumerate(users)
        for t, text in enumerate(texts)
    ]  # fmt: skip
    await store.remember_many(facts)
    mine = {user: {f.memory_id for f in facts if f.user_id == user} for user in users}
    for user in users:
        found = await store.search(user, "which carrier ships replacements?", limit=50)
        assert {m.memory_id for m in found} == mine[user]
        assert {m.user_id for m in found} == {user}
        tagged = await store.search(user, "which carrier ships replacements?", tags=["preference"], limit=50)
        assert [m.text for m in tagged] == [FACT]
        assert await store.count(user) == 3
    assert await store.search("user-100", FACT) == []
    someone_elses = next(iter(mine["user-10"]))
    assert await store.history("user-1", someone_elses) == []
    assert [m.memory_id for m in await store.history("user-10", someone_elses)] == [someone_elses]


async def test_a_crashed_writer_keeps_its_memories_and_dedup_still_holds(
    embedder: UniversalSentenceEncoder, tmp_path: Path
) -> None:
    """A process writes a fact and its restatement, then dies without closing the store; the
    next process finds the current version, the history, and writes nothing for a repeat."""
    path = tmp_path / "memory"
    writer = python(
        f"""
        import asyncio, os
        from turnlog.engine.memory.edge import EdgeMemoryStore

        async def main():
            store = EdgeMemoryStore(path={str(path)!r})
            first = await store.remember("u1", {FACT!r}, "preference", time_ms=1000)
            second = await store.remember("u1", {RESTATED!r}, "preference", time_ms=2000)
            print(first.memory.memory_id, second.memory.memory_id, second.superseded is not None, flush=True)
            os._exit(0)  # no close, no flush

        asyncio.run(main())
        """
    )
    out, err = writer.communicate(timeout=300)
    assert writer.returncode == 0, err
    first_id, second_id, superseded = out.split()
    assert superseded == "True"

    store = EdgeMemoryStore(embedder, path=str(path))
    try:
        found = await store.search("u1", "Which carrier for replacements?")
        assert [m.memory_id for m in found] == [second_id]
        versions = await store.history("u1", first_id)
        assert [(v.memory_id, v.valid_to_ms) for v in versions] == [(first_id, 2000), (second_id, None)]
        replay = await store.remember("u1", FACT, "preference", time_ms=1000)
        assert replay.memory.memory_id == second_id and replay.superseded is None
        again = await store.remember("u1", RESTATED + " ", "preference", time_ms=3000)
        assert again.memory.memory_id == second_id
        assert (await store.count("u1"), await store.count("u1", current_only=False)) == (1, 2)
    finally:
        await store.close()


async def test_a_folder_open_in_another_process_is_a_clear_error_until_it_closes(
    embedder: UniversalSentenceEncoder, tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    store = EdgeMemoryStore(embedder, path=str(tmp_path / "memory"))
    try:
        with pytest.raises(MemoryStoreError, match="open in another process.*url="):
            await store.search("u1", "carrier")
        holder.communicate("\n", timeout=120)  # the holder closes the store and exits
        assert holder.returncode == 0
        assert [m.text for m in await store.search("u1", "carrier")] == [FACT]
    finally:
        await store.close()


def damage_config(path: Path) -> None:
    (path / "edge_config.json").write_text("{not json")


def damage_segments(path: Path) -> None:
    for version in path.glob("segments/*/version.info"):
        version.write_bytes(b"\0garbage")


def damage_wal(path: Path) -> None:
    for part in path.glob("wal/open-*"):
        with part.open("r+b") as f:
            f.write(os.urandom(4096))


@pytest.mark.parametrize("damage", [damage_config, damage_segments, damage_wal])
async def test_a_damaged_folder_says_so_and_what_to_do(
    embedder: UniversalSentenceEncoder, tmp_path: Path, damage: object
) -> None:
    path = tmp_path / "memory"
    first = EdgeMemoryStore(embedder, path=str(path))
    await first.remember("u1", FACT, "preference")
    await first.close()
    assert callable(damage)
    damage(path)
    second = EdgeMemoryStore(embedder, path=str(path))
    try:
        with pytest.raises(MemoryStoreError, match="damaged: move it aside"):
            await second.search("u1", "carrier")
        with pytest.raises(MemoryStoreError, match="damaged"):
            await second.remember("u1", FACT, "preference")
    finally:
        await second.close()


async def test_a_folder_of_something_else_is_refused(
    embedder: UniversalSentenceEncoder, tmp_path: Path
) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("buy milk")
    store = EdgeMemoryStore(embedder, path=str(tmp_path / "notes"))
    try:
        with pytest.raises(MemoryStoreError, match="not a Qdrant Edge store"):
            await store.search("u1", "milk")
    finally:
        await store.close()
    assert (tmp_path / "notes" / "todo.txt").read_text() == "buy milk"


def answer(request: ModelRequest) -> str:
    return "Let me arrange the replacement shipments."


async def turn_with(store: EdgeMemoryStore, tmp_path: Path) -> tuple[list[str], list[dict]]:
    """One turn of an agent whose memory is ``store``: its finish reasons and the warnings logged."""
    with structlog.testing.capture_logs() as logs:
        session = await open_session(tmp_path, answer, memory=MemoryPolicy(store))
        await session.send("Which carrier should ship the replacements?")
    assert not await session.of(ev.MemoriesRetrieved)
    reasons = [f.reason for f in await session.of(ev.TurnFinished)]
    return reasons, [entry for entry in logs if entry["event"] == "memory.search_failed"]


async def test_a_damaged_store_never_fails_a_turn(embedder: UniversalSentenceEncoder, tmp_path: Path) -> None:
    path = tmp_path / "memory"
    first = EdgeMemoryStore(embedder, path=str(path))
    await first.remember("user-1", FACT, "preference")
    await first.close()
    damage_segments(path)
    store = EdgeMemoryStore(embedder, path=str(path))
    try:
        reasons, warnings = await turn_with(store, tmp_path)
    finally:
        await store.close()
    assert reasons == ["answered"]
    assert len(warnings) == 1 and "damaged: move it aside" in warnings[0]["error"]


async def test_a_locked_store_never_fails_a_turn(
    embedder: UniversalSentenceEncoder, tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    store = EdgeMemoryStore(embedder, path=str(tmp_path / "memory"))
    try:
        reasons, warnings = await turn_with(store, tmp_path)
    finally:
        await store.close()
    assert reasons == ["answered"]
    assert len(warnings) == 1 and "open in another process" in warnings[0]["error"]


async def test_open_store_picks_the_engine_a_folder_needs(
    embedder: UniversalSentenceEncoder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENGINE_ENV, raising=False)
    made_by_local_mode = QdrantMemoryStore(embedder, path=str(tmp_path / "old"))
    await made_by_local_mode.remember("u1", FACT, "preference")
    await made_by_local_mode.close()

    old = open_store(tmp_path / "old", embedder=embedder)
    new = open_store(tmp_path / "new", embedder=embedder)
    try:
        assert isinstance(old, QdrantMemoryStore) and isinstance(new, EdgeMemoryStore)
        assert [m.text for m in await old.search("u1", "carrier")] == [FACT]
        await new.remember("u1", FACT, "preference")
        assert (tmp_path / "new" / "edge_config.json").is_file()
    finally:
        await asyncio.gather(old.close(), new.close())

    monkeypatch.setenv(ENGINE_ENV, "local")
    chosen = open_store(tmp_path / "other", embedder=embedder)
    await chosen.close()
    assert isinstance(chosen, QdrantMemoryStore)
    assert isinstance(open_store(url="http://127.0.0.1:9", embedder=embedder), QdrantMemoryStore)
    monkeypatch.setenv(ENGINE_ENV, "faiss")
    with pytest.raises(ConfigurationError, match="TURNLOG_MEMORY_ENGINE=edge or local"):
        open_store(tmp_path / "x", embedder=embedder)
