"""The embedded SQLite log: order, the optimistic lock, partitions, group offsets, corruption and
durability across a killed process."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path

import pytest

from turnlog.engine import events as ev
from turnlog.engine.errors import ConcurrencyError, ConfigurationError, LogError, MalformedEventError
from turnlog.engine.log import EventLog, SqliteEventLog, murmur2, partition_for
from turnlog.engine.log.sqlite_batch import pack_batch, split_batch
from turnlog.engine.log.sqlite_layout import SNAPSHOTS_FROM

REPO = Path(__file__).resolve().parent.parent
TRACEMALLOC = tracemalloc.__file__


def msg(session_id: str, version: int, text: str = "hello") -> ev.UserMessageReceived:
    return ev.UserMessageReceived(
        session_id=session_id, version=version, message_id=f"m{version}-{text}", text=text
    )


def session_in(partition: int, partitions: int, prefix: str = "s") -> str:
    return next(
        f"{prefix}{i}" for i in range(10_000) if partition_for(f"{prefix}{i}", partitions) == partition
    )


async def versions(log: SqliteEventLog, session_id: str) -> list[int]:
    return [e.version for e in await log.read_session(session_id)]


# --- append and read_session --------------------------------------------------------------------


async def test_append_then_read_session_in_version_order(log: SqliteEventLog) -> None:
    written = [msg("a", 1, "one"), msg("a", 2, "two")]
    records = await log.append(written, expected_version=0)
    written.append(msg("a", 3, "three"))
    records += await log.append(written[2:], expected_version=2)
    await log.append([msg("b", 1)], expected_version=0)  # another session does not interleave

    assert await log.read_session("a") == written
    assert await log.read_session("a", after_version=1) == written[1:]
    assert await log.read_session("a", after_version=3) == []
    assert await log.read_session("nobody") == []
    assert await log.session_version("a") == 3
    assert await log.session_version("nobody") == 0
    assert [r.event for r in records] == written
    assert {r.partition for r in records} == {partition_for("a", 4)} == {log.partition_of("a")}
    offsets = [r.offset for r in records]
    assert offsets == sorted(set(offsets))


async def test_a_session_another_process_starts_is_read_once_it_is_there(log_path: Path) -> None:
    """A reader keeps the session keys it found (they never change) but not an absence: a
    session another process appends after a read that found nothing is read the next time."""
    reader, writer = SqliteEventLog(log_path, partitions=4), SqliteEventLog(log_path, partitions=4)
    try:
        assert await reader.read_session("late") == []
        await writer.append([msg("late", 1, "one")], expected_version=0)
        assert await versions(reader, "late") == [1]
        await writer.append([msg("late", 2, "two")], expected_version=1)
        assert await versions(reader, "late") == [1, 2]  # its kept key reads what came after
    finally:
        await reader.close()
        await writer.close()


def test_session_keys_keep_what_they_found_up_to_their_bound(tmp_path: Path) -> None:
    from turnlog.engine.log.sqlite_layout import SessionKeys

    db = sqlite3.connect(tmp_path / "keys.db")
    db.execute("CREATE TABLE sessions (key INTEGER PRIMARY KEY, session_id TEXT NOT NULL UNIQUE)")
    db.executemany("INSERT INTO sessions (session_id) VALUES (?)", [("a",), ("b",), ("c",)])
    keys = SessionKeys(kept=2)
    assert [keys.of(db, s) for s in ("a", "b", "nobody")] == [1, 2, None]
    db.execute("DELETE FROM sessions")  # (never done to a log: shows what is answered from memory)
    assert keys.of(db, "a") == 1 and keys.of(db, "b") == 2
    db.execute("INSERT INTO sessions (key, session_id) VALUES (3, 'c')")
    assert keys.of(db, "c") == 3  # the bound drops the oldest found, "a"
    assert keys.of(db, "a") is None and keys.of(db, "b") == 2


async def test_stale_expected_version_raises_concurrency_error_and_writes_nothing(
    log: SqliteEventLog,
) -> None:
    first = msg("a", 1, "mine")
    await log.append([first], expected_version=0)

    with pytest.raises(ConcurrencyError, match="expected version 0 but the log is at 1") as caught:
        await log.append([msg("a", 1, "theirs"), msg("a", 2, "theirs too")], expected_version=0)
    assert (caught.value.expected, caught.value.actual) == (0, 1)
    assert await log.read_session("a") == [first]

    with pytest.raises(ConcurrencyError):  # ahead of the log is as wrong as behind it
        await log.append([msg("a", 3)], expected_version=2)
    assert await log.read_session("a") == [first]

    await log.append([msg("a", 2)], expected_version=1)  # the lock released: the log is still usable
    assert await versions(log, "a") == [1, 2]


@pytest.mark.parametrize(
    ("batch", "expected_version", "problem"),
    [
        ([msg("a", 1), msg("a", 3)], 0, "expected 2 .versions are contiguous"),
        ([msg("a", 2)], 0, "has version 2, expected 1"),
        ([msg("a", 1), msg("b", 2)], 0, "one append must hold one session's events"),
        ([], 0, "at least one event"),
    ],
    ids=["gap", "does-not-follow", "two-sessions", "empty"],
)
async def test_malformed_batch_raises_log_error_and_writes_nothing(
    log: SqliteEventLog, batch: list[ev.Event], expected_version: int, problem: str
) -> None:
    with pytest.raises(LogError, match=problem) as caught:
        await log.append(batch, expected_version=expected_version)
    assert type(caught.value) is LogError  # a bug in the caller, not a lost race
    assert await log.session_version("a") == 0 and await log.session_version("b") == 0
    assert await log.end_offset(log.partition_of("a")) == 0


# --- partitions ---------------------------------------------------------------------------------


async def test_read_partition_returns_only_its_records_in_offset_order(log_path: Path) -> None:
    log = SqliteEventLog(log_path, partitions=2)
    try:
        s0, s1, s0b = session_in(0, 2, "x"), session_in(1, 2, "y"), session_in(0, 2, "z")
        for v in (1, 2, 3):
            for sid in (s0, s1, s0b):
                await log.append([msg(sid, v, f"{sid}-{v}")], expected_version=v - 1)

        zero = await log.read_partition(0, 0)
        assert [(r.event.session_id, r.event.version) for r in zero] == [
            (s0, 1),
            (s0b, 1),
            (s0, 2),
            (s0b, 2),
            (s0, 3),
            (s0b, 3),
        ]
        assert all(r.partition == 0 for r in zero)
        offsets = [r.offset for r in zero]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
        one = await log.read_partition(1, 0)
        assert [(r.event.session_id, r.event.version) for r in one] == [(s1, 1), (s1, 2), (s1, 3)]

        page = await log.read_partition(0, 0, limit=2)
        assert page == zero[:2]
        rest = await log.read_partition(0, page[-1].offset + 1, limit=500)
        assert rest == zero[2:]
        assert await log.read_partition(0, zero[-1].offset + 1) == []
        assert await log.end_offset(0) > zero[-1].offset
        assert await log.read_partition(0, await log.end_offset(0)) == []

        with pytest.raises(LogError, match="partition 2 out of range 0..1"):
            await log.read_partition(2, 0)
        with pytest.raises(LogError, match="out of range"):
            await log.end_offset(-1)
    finally:
        await log.close()


def snapshot(session_id: str, version: int) -> ev.SnapshotTaken:
    return ev.SnapshotTaken(
        session_id=session_id, version=version, state_format=4, status="PROCESSING", last_tool="",
        turns=1, input_tokens=0, output_tokens=0, message_count=0, keyframe_version=0, state_json="{}",
    )  # fmt: skip


async def test_reads_start_and_end_inside_an_append(log: EventLog) -> None:
    """SQLite stores an append as one row: every read must still start and stop at any event
    of it, and find a snapshot wherever it sits in its append."""
    a, b = "appends-a", "appends-b"
    first = await log.append([msg(a, v) for v in range(1, 6)], expected_version=0)
    await log.append([msg(b, 1), msg(b, 2)], expected_version=0)
    last = await log.append([msg(a, 6), snapshot(a, 7), snapshot(a, 8), msg(a, 9)], expected_version=5)
    mine = first + last

    assert [e.version for e in await log.read_session(a, 3)] == [4, 5, 6, 7, 8, 9]
    assert [e.version for e in await log.read_session(a, 8)] == [9]
    assert await log.read_session(a, 9) == []
    assert await log.session_version(a) == 9 and await log.session_version(b) == 2
    records = await log.read_session_records(a, 6)
    assert [(r.offset, r.event.version) for r in records] == [(r.offset, r.event.version) for r in mine[6:]]

    partition = log.partition_of(a)
    page = await log.read_partition(partition, first[2].offset, limit=2)
    assert [(r.event.session_id, r.event.version) for r in page] == [(a, 3), (a, 4)]
    assert [r.offset for r in page] == [first[2].offset, first[3].offset]
    tail = await log.read_partition(partition, last[2].offset)
    assert [r.event.version for r in tail if r.event.session_id == a] == [8, 9]
    assert await log.end_offset(partition) > last[-1].offset

    latest = await log.latest_snapshot(a)
    assert latest is not None and latest.version == 8
    at_7 = await log.latest_snapshot(a, at_or_before=7)
    assert at_7 is not None and at_7.version == 7
    assert await log.latest_snapshot(a, at_or_before=6) is None
    assert [e.version for e in await log.snapshots_between(a, 8, 9)] == [8]
    assert [e.version for e in await log.snapshots_between(a, 1, 9)] == [7, 8]
    assert await log.versions_of(a, ["SnapshotTaken"], 8) == [(7, "SnapshotTaken")]
    assert await log.latest_snapshot(b) is None


async def test_snapshots_are_found_through_the_version_index_and_the_old_index_is_dropped(
    log_path: Path,
) -> None:
    """A file made with the partial index ``batches_with_snapshots`` loses it on open (a B-tree
    less in every COMMIT), and the snapshot lookups read the (session, version) index: a
    search, never a scan of the table."""
    a = "snapshot-index"
    old = SqliteEventLog(log_path)
    await old.append([msg(a, 1), snapshot(a, 2)], expected_version=0)
    await old.close()
    with sqlite3.connect(log_path) as db:
        db.execute(
            "CREATE INDEX batches_with_snapshots ON batches (session, snapshot) WHERE snapshot IS NOT NULL"
        )

    log = SqliteEventLog(log_path)
    try:
        await log.append([msg(a, 3), msg(a, 4), snapshot(a, 5)], expected_version=2)
        await log.append([msg(a, 6)], expected_version=5)
        indexes = {row[0] for row in log._db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "batches_with_snapshots" not in indexes
        latest = await log.latest_snapshot(a)
        assert latest is not None and latest.version == 5
        assert [e.version for e in await log.snapshots_between(a, 2, 6)] == [2, 5]
        plan = [row[3] for row in log._db.execute("EXPLAIN QUERY PLAN " + SNAPSHOTS_FROM, (1, 6, 6))]
        assert plan and all("SCAN" not in step for step in plan), plan
        version_index = "USING INDEX sqlite_autoindex_batches_1 (session=? AND version"
        assert sum(version_index in step for step in plan) == 2
    finally:
        await log.close()


KAFKA_MURMUR2 = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]


@pytest.mark.parametrize(("key", "expected"), KAFKA_MURMUR2)
def test_murmur2_matches_kafka(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


@pytest.mark.parametrize(("key", "hashed"), KAFKA_MURMUR2)
@pytest.mark.parametrize("partitions", [1, 3, 8, 12])
def test_partition_for_is_kafkas_default_partitioner(key: bytes, hashed: int, partitions: int) -> None:
    # Kafka: Utils.toPositive(Utils.murmur2(keyBytes)) % numPartitions
    assert partition_for(key.decode(), partitions) == (hashed & 0x7FFFFFFF) % partitions


def test_partition_for_is_stable_and_in_range() -> None:
    ids = [f"session-{i}" for i in range(500)]
    first = [partition_for(s, 8) for s in ids]
    assert first == [partition_for(s, 8) for s in ids]
    assert set(first) == set(range(8)), "500 ids should reach every partition"
    assert partition_for("21", 8) == 4  # pinned: a session's partition must never change across releases


# --- consumer group offsets ---------------------------------------------------------------------


async def test_group_offsets_are_per_group_and_partition(log_path: Path) -> None:
    log = SqliteEventLog(log_path, partitions=4)
    try:
        assert await log.committed("projector", 0) == 0
        await log.commit("projector", 0, 5)
        await log.commit("projector", 1, 7)
        await log.commit("notifier", 0, 2)
        assert await log.committed("projector", 0) == 5
        assert await log.committed("projector", 1) == 7
        assert await log.committed("projector", 2) == 0
        assert await log.committed("notifier", 0) == 2
        assert await log.committed("notifier", 1) == 0
        await log.commit("projector", 0, 11)
        assert await log.committed("projector", 0) == 11
        assert await log.committed("notifier", 0) == 2
        with pytest.raises(LogError, match="out of range"):
            await log.commit("projector", 4, 1)
    finally:
        await log.close()
    reopened = SqliteEventLog(log_path, partitions=4)
    try:
        assert await reopened.committed("projector", 0) == 11
        assert await reopened.committed("projector", 1) == 7
    finally:
        await reopened.close()


async def test_wait_for_append_wakes_on_append(log: SqliteEventLog) -> None:
    waiting = asyncio.create_task(log.wait_for_append(60))
    await asyncio.sleep(0)  # let it register
    assert not waiting.done()
    await log.append([msg("a", 1)], expected_version=0)
    await asyncio.wait_for(waiting, 10)  # a bound, not a timing assertion: it must not take 60 s


async def test_waits_that_time_out_leave_nothing_behind(log: EventLog) -> None:
    """Followers wait for appends in a loop, and a process may append nothing for hours (a Kafka
    gateway never appends): the waits that timed out must not pile up until the next append
    (each kept about 150 bytes: 750 kB here)."""
    await log.wait_for_append(0.001)  # what a first wait sets up once
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for _ in range(5000):
            await log.wait_for_append(0)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    kept = sum(
        s.size_diff for s in after.compare_to(before, "filename") if s.traceback[0].filename != TRACEMALLOC
    )
    assert kept < 150_000, f"{kept} bytes kept by 5,000 waits that timed out"
    waiting = asyncio.create_task(log.wait_for_append(60))
    await asyncio.sleep(0)
    await log.append([msg("a", 1)], expected_version=0)
    await asyncio.wait_for(waiting, 10)  # the next append still wakes a wait that is open


# --- configuration ------------------------------------------------------------------------------


async def test_reopening_with_another_partition_count_raises(log_path: Path) -> None:
    log = SqliteEventLog(log_path, partitions=4)
    await log.append([msg("a", 1)], expected_version=0)
    await log.close()
    with pytest.raises(ConfigurationError, match="created with 4 partitions, not 8"):
        SqliteEventLog(log_path, partitions=8)
    same = SqliteEventLog(log_path, partitions=4)
    try:
        assert await versions(same, "a") == [1]
    finally:
        await same.close()


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"partitions": 0}, "at least 1"),
        ({"durability": "eventually"}, "durability must be"),
    ],
)
def test_bad_options_raise_configuration_error(
    log_path: Path, options: dict[str, object], problem: str
) -> None:
    with pytest.raises(ConfigurationError, match=problem):
        SqliteEventLog(log_path, **options)  # type: ignore[arg-type]


# --- corruption ---------------------------------------------------------------------------------


@pytest.mark.usefixtures("sqlite_only")  # edits the SQLite file; Kafka: tests/test_log_kafka.py
async def test_corrupt_row_raises_malformed_naming_partition_and_offset(
    log: SqliteEventLog, log_path: Path
) -> None:
    """The append is one stored batch; its second record is overwritten with garbage."""
    records = await log.append([msg("a", 1), msg("a", 2), msg("a", 3)], expected_version=0)
    bad = records[1]
    with sqlite3.connect(log_path) as raw:
        query = "SELECT value FROM batches WHERE position = ?"
        (value,) = raw.execute(query, (records[0].offset,)).fetchone()
        parts = split_batch(bytes(value))
        parts[1] = b"\x00garbage bytes"
        raw.execute(
            "UPDATE batches SET value = ? WHERE position = ?",
            (pack_batch(parts, compress=True), records[0].offset),
        )
    raw.close()

    # a reader of the file (the writer reads what it appended from memory: engine/log/sqlite_recent.py)
    reader = SqliteEventLog(log_path, partitions=log.partitions)
    try:
        with pytest.raises(
            MalformedEventError, match=rf"partition {bad.partition} offset {bad.offset}: not a turnlog"
        ):
            await reader.read_session("a")
        with pytest.raises(MalformedEventError, match=rf"partition {bad.partition} offset {bad.offset}"):
            await reader.read_partition(bad.partition, 0)
        # records around it are still readable
        assert await versions_after(reader, "a", 2) == [3]
        assert [r.event.version for r in await reader.read_partition(bad.partition, 0, limit=1)] == [1]
    finally:
        await reader.close()


async def versions_after(log: SqliteEventLog, session_id: str, after: int) -> list[int]:
    return [e.version for e in await log.read_session(session_id, after)]


# --- durability across a killed process ---------------------------------------------------------

WRITER = """
import asyncio, sys
from turnlog.engine import events as ev
from turnlog.engine.log import SqliteEventLog

async def main():
    log = SqliteEventLog(sys.argv[1], partitions=4)
    sid = sys.argv[2]
    version = await log.session_version(sid)
    while True:
        version += 1
        event = ev.UserMessageReceived(
            session_id=sid, version=version, message_id=f"m{version}", text="x" * 200
        )
        await log.append([event], expected_version=version - 1)
        print(version, flush=True)

asyncio.run(main())
"""


@pytest.mark.parametrize("durability_runs", [1, 2], ids=["fresh", "second-writer-after-kill"])
async def test_appends_survive_a_killed_process(log_path: Path, durability_runs: int) -> None:
    printed: list[int] = []
    for _ in range(durability_runs):
        printed += kill_writer_after(log_path, "durable", at_least=200)

    log = SqliteEventLog(log_path, partitions=4)
    try:
        on_log = await versions(log, "durable")
    finally:
        await log.close()
    assert len(printed) >= 200 * durability_runs
    assert set(printed) <= set(on_log), "an append that returned was lost"
    assert on_log == list(range(1, len(on_log) + 1)), "versions are contiguous from 1"


def kill_writer_after(log_path: Path, session_id: str, *, at_least: int) -> list[int]:
    """Run WRITER, SIGKILL it once it has printed ``at_least`` versions; every version it printed."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(log_path), session_id],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    watchdog = threading.Timer(120, proc.kill)  # a hung writer fails the test instead of hanging it
    watchdog.start()
    printed: list[int] = []
    try:
        assert proc.stdout is not None
        while len(printed) < at_least:
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(
                    f"writer exited early: {proc.wait()} {proc.stderr.read() if proc.stderr else ''}"
                )
            printed.append(int(line))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        printed += [int(line) for line in proc.stdout.read().split()]  # printed before the kill landed
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert proc.returncode == -signal.SIGKILL
    return printed
