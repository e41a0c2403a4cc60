"""Held appends' rows (engine/log/sqlite_held.py): a redoable append is checked against the
session's head in memory and its row waits until the transaction's next other write or its
COMMIT, where each session's consecutive held appends become one ``batches`` row. What the file
holds after the COMMIT is exactly what was appended, at the positions the appends returned."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from tests.test_sqlite_group_commit import create, group_of, held_log, turn_started, version_elsewhere
from turnlog.engine import SqliteEventLog
from turnlog.engine import events as ev
from turnlog.engine.errors import ConcurrencyError, LogUnavailableError
from turnlog.engine.log.base import LogRecord
from turnlog.engine.log.sqlite_held import MAX_ROW_EVENTS


def step(sid: str, version: int, n: int) -> list[ev.Event]:
    """``n`` events of one session from ``version`` on (a tool step's worth)."""
    return [turn_started(sid, version + i, version + i) for i in range(n)]


def snapshot(sid: str, version: int) -> ev.SnapshotTaken:
    return ev.SnapshotTaken(
        session_id=sid, version=version, state_format=5, status="PROCESSING", last_tool="t",
        turns=1, input_tokens=0, output_tokens=0, message_count=version, keyframe_version=0,
        state_json=f'{{"v": {version}}}',
    )  # fmt: skip


def rows_elsewhere(log_path: Path, sid: str) -> list[tuple[int, int, int]]:
    """The session's rows as another process reads them: (position, version, count)."""
    with closing(sqlite3.connect(log_path)) as db:
        return db.execute(
            "SELECT b.position, b.version, b.count FROM batches b JOIN sessions s ON b.session = s.key "
            "WHERE s.session_id = ? ORDER BY b.version",
            (sid,),
        ).fetchall()


async def held(log: SqliteEventLog, events: list[ev.Event]) -> list[LogRecord]:
    return await log.append(events, expected_version=events[0].version - 1, redoable=True)


async def test_a_turns_held_steps_become_one_row_at_their_commit(log_path: Path) -> None:
    """Three held steps of one session: nothing in the file until the append that waits, then
    one row for the three (and one for that append); every event reads back at the position
    its append returned, and the held head counts for the version check in memory."""
    log = held_log(log_path)
    try:
        await create(log, ["s"])
        appended = [r for v in (2, 5, 8) for r in await held(log, step("s", v, 3))]
        assert rows_elsewhere(log_path, "s") == [(1, 1, 1)], "held rows wait in memory"
        with pytest.raises(ConcurrencyError):  # checked against the held head, not the file's
            await log.append(step("s", 5, 1), expected_version=4, redoable=True)
        commits = group_of(log).commits
        appended += await log.append(step("s", 11, 2), expected_version=10)
        assert group_of(log).commits == commits + 1
        assert rows_elsewhere(log_path, "s") == [(1, 1, 1), (2, 2, 9), (11, 11, 2)]
        assert [(r.offset, r.event) for r in appended] == [
            (r.offset, r.event) for r in await log.read_session_records("s", 1)
        ]
        partition = await log.read_partition(log.partition_of("s"), 0)
        assert [(r.offset, r.event) for r in partition][1:] == [(r.offset, r.event) for r in appended]
        assert [e.version for e in await log.read_session("s", 6)] == list(range(7, 13))
    finally:
        await log.close()


async def test_interleaved_sessions_keep_a_row_to_one_sessions_consecutive_events(log_path: Path) -> None:
    """Held appends of two sessions in turn cannot share rows (a row's positions are
    consecutive); a session's appends that follow each other do."""
    log = held_log(log_path, partitions=1)
    try:
        await create(log, ["a", "b"])
        appended: list[LogRecord] = []
        for version in (2, 3):
            appended += await held(log, step("a", version, 1))
            appended += await held(log, step("b", version, 1))
        appended += await held(log, step("a", 4, 1)) + await held(log, step("a", 5, 1))
        await log.append(step("b", 4, 1), expected_version=3)
        assert [count for _, _, count in rows_elsewhere(log_path, "a")] == [1, 1, 1, 2]
        assert [count for _, _, count in rows_elsewhere(log_path, "b")] == [1, 1, 1, 1]
        everything = await log.read_partition(0, 0)
        assert [r.offset for r in everything] == list(range(1, 10))
        assert [(r.offset, r.event) for r in everything if r.event.version > 1][:-1] == [
            (r.offset, r.event) for r in appended
        ]
    finally:
        await log.close()


async def test_a_row_of_held_steps_stays_within_its_bound(log_path: Path) -> None:
    """A reader that wants one event of a row decompresses all of it: a row of held appends
    stays within ``MAX_ROW_EVENTS`` events (an append is never split)."""
    per_append = 10
    log = held_log(log_path)
    try:
        await create(log, ["long"])
        for n in range(10):
            await held(log, step("long", 2 + n * per_append, per_append))
        await log.append(step("long", 2 + 10 * per_append, 1), expected_version=1 + 10 * per_append)
        fits = MAX_ROW_EVENTS // per_append * per_append
        assert [count for _, _, count in rows_elsewhere(log_path, "long")] == [1, fits, 100 - fits, 1]
        assert [e.version for e in await log.read_session("long")] == list(range(1, 103))
    finally:
        await log.close()


async def test_the_snapshots_of_a_row_of_held_steps_are_found(log_path: Path) -> None:
    """A row of a turn's held steps holds a snapshot per step: the newest is the one loaded,
    any earlier one is found at or before its version, and a range returns each once."""
    log = held_log(log_path)
    try:
        await create(log, ["snap"])
        for version in (2, 4, 6):
            await held(log, [turn_started("snap", version), snapshot("snap", version + 1)])
        await log.append(step("snap", 8, 1), expected_version=7)
        assert [count for _, _, count in rows_elsewhere(log_path, "snap")] == [1, 6, 1]
        newest = await log.latest_snapshot("snap")
        assert newest is not None and newest.version == 7 and newest.state_json == '{"v": 7}'
        earlier = await log.latest_snapshot("snap", at_or_before=6)
        assert earlier is not None and earlier.version == 5
        assert await log.latest_snapshot("snap", at_or_before=2) is None
        assert [e.version for e in await log.snapshots_between("snap", 4, 7)] == [5, 7]
    finally:
        await log.close()


async def test_held_rows_the_file_refuses_fail_the_append_after_them_and_then_their_writers(
    log_path: Path,
) -> None:
    """Held rows that cannot be written (here a trigger refuses rows of several appends, as a
    full disk would refuse them) fail the append that needed them first, then the COMMIT:
    nothing of them is on the log and their session's next append says so, once."""
    log = held_log(log_path)
    try:
        await create(log, ["x", "y"])
        with closing(sqlite3.connect(log_path)) as db:
            db.execute(
                "CREATE TRIGGER full BEFORE INSERT ON batches WHEN NEW.count > 1 "
                "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"
            )
        await held(log, step("x", 2, 1))
        await held(log, step("x", 3, 1))
        with pytest.raises(LogUnavailableError, match="could not write the appends held before this one"):
            await log.append(step("y", 2, 1), expected_version=1)
        assert await log.session_version("x") == 1, "the read committed the hold: the rows were refused again"
        with pytest.raises(LogUnavailableError, match="returned before its COMMIT"):
            await log.append(step("x", 2, 1), expected_version=1)
        await log.append(step("x", 2, 1), expected_version=1)  # from what the log holds
        await log.append(step("y", 2, 1), expected_version=1)
        assert (version_elsewhere(log_path, "x"), version_elsewhere(log_path, "y")) == (2, 2)
    finally:
        await log.close()
