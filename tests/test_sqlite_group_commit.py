"""The embedded log's group commit (engine/log/sqlite_commit.py), above all in
``durability="power"``: the appends of many sessions share one transaction, so one fsync; each
append returns only once its transaction is committed, is checked against its own session
alone, and a failed COMMIT fails exactly the appends it carried."""

from __future__ import annotations

import asyncio
import selectors
import sqlite3
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Callable

import pytest

from turnlog.engine import SqliteEventLog
from turnlog.engine import events as ev
from turnlog.engine.errors import ConcurrencyError, ConfigurationError, LogUnavailableError
from turnlog.engine.log.sqlite import MAX_HOLD_S, Durability
from turnlog.engine.log.sqlite_commit import PROBE_EVERY, RUN_NOW_IN_A_ROW, GroupCommit

SESSIONS = 100
APPENDS = 5


def turn_started(sid: str, version: int, n: int = 0) -> ev.TurnStarted:
    return ev.TurnStarted(session_id=sid, version=version, turn_id=f"t-{sid}-{n}", message_id="m")


async def create(log: SqliteEventLog, sids: list[str]) -> None:
    await asyncio.gather(
        *(log.submit(ev.SessionCreated(session_id=s, version=1, agent_id="a", user_id="u")) for s in sids)
    )


def group_of(log: SqliteEventLog) -> GroupCommit:
    assert log.group is not None, "a log in a file commits in groups"
    return log.group


@pytest.mark.parametrize("durability", ["power", "process"])
async def test_appends_of_many_sessions_share_commits_and_each_is_durable_when_it_returns(
    log_path: Path, durability: Durability
) -> None:
    log = SqliteEventLog(log_path, durability=durability)
    reader = SqliteEventLog(log_path)  # another connection, as another process would read
    sids = [f"s-{i:03d}" for i in range(SESSIONS)]
    seen_at_return: list[bool] = []
    try:
        await create(log, sids)

        async def session(sid: str) -> None:
            for n in range(APPENDS):
                version = 2 + n
                await log.append([turn_started(sid, version, n)], expected_version=version - 1)
                # it returned: its transaction is committed, so any other connection sees it
                seen_at_return.append(await reader.session_version(sid) >= version)

        await asyncio.gather(*(session(sid) for sid in sids))
        group = group_of(log)
        appends = SESSIONS * (1 + APPENDS)
        assert group.writes == appends
        assert group.commits < appends / 4, f"{group.commits} commits for {appends} appends"
        assert group._db is not None
        (synchronous,) = group._db.execute("PRAGMA synchronous").fetchone()
        assert synchronous == (2 if durability == "power" else 1), "power: FULL, every commit is an fsync"
    finally:
        await log.close()
        await reader.close()
    assert seen_at_return == [True] * (SESSIONS * APPENDS)

    reopened = SqliteEventLog(log_path)
    try:
        for sid in sids:
            records = await reopened.read_session_records(sid)
            assert [r.event.version for r in records] == list(range(1, 2 + APPENDS))
            assert [r.event.turn_id for r in records[1:]] == [f"t-{sid}-{n}" for n in range(APPENDS)]
            offsets = [r.offset for r in records]
            assert offsets == sorted(offsets), "a session's events are in version order on its partition"
    finally:
        await reopened.close()


async def test_a_conflicting_append_fails_alone_and_its_batch_commits(log_path: Path) -> None:
    log = SqliteEventLog(log_path, durability="power")
    sids = [f"c-{i:02d}" for i in range(32)]
    stale, held = sids[3], sids[9]
    try:
        await create(log, sids)
        await log.submit(ev.UserMessageReceived(session_id=held, version=0, message_id="m1", text="hi"))
        before = group_of(log).commits

        def append(sid: str):  # type: ignore[no-untyped-def]
            if sid == stale:  # it thinks the session is new
                return log.append([turn_started(sid, 1)], expected_version=0)
            if sid == held:  # a message the session already holds, appended again
                again = ev.UserMessageReceived(session_id=sid, version=3, message_id="m1", text="hi")
                return log.append([again], expected_version=2)
            return log.append([turn_started(sid, 2)], expected_version=1)

        results = await asyncio.gather(*(append(sid) for sid in sids), return_exceptions=True)
        failed = {sid: r for sid, r in zip(sids, results, strict=True) if isinstance(r, Exception)}
        assert set(failed) == {stale, held}
        assert isinstance(failed[stale], ConcurrencyError)
        assert "m1" in str(failed[held])
        assert group_of(log).commits - before < len(sids) - 2, "the others shared commits"
        for sid in sids:
            types = [e.type for e in await log.read_session(sid)]
            if sid == stale:
                assert types == ["SessionCreated"]
            elif sid == held:
                assert types == ["SessionCreated", "UserMessageReceived"]
            else:
                assert types == ["SessionCreated", "TurnStarted"]
    finally:
        await log.close()


def power_writer(log_path: Path, factory: type[sqlite3.Connection]) -> Callable[[], sqlite3.Connection]:
    """A group commit's ``connect`` for ``log_path`` in ``power`` mode, through ``factory``."""

    def connect() -> sqlite3.Connection:
        db = sqlite3.connect(log_path, isolation_level=None, check_same_thread=False, factory=factory)
        db.execute("PRAGMA synchronous=FULL")
        return db

    return connect


class FailingCommits(sqlite3.Connection):
    """A connection whose COMMIT fails while ``failing`` is set (a full or broken disk)."""

    failing = False

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:  # type: ignore[override]
        if sql == "COMMIT" and FailingCommits.failing:
            raise sqlite3.OperationalError("disk I/O error")
        return super().execute(sql, *args)  # type: ignore[arg-type]


async def test_a_failed_commit_fails_every_append_it_carried_and_none_is_on_the_log(log_path: Path) -> None:
    log = SqliteEventLog(log_path, durability="power")
    log.group = GroupCommit(power_writer(log_path, FailingCommits), held_rows=log.held_rows)
    sids = [f"f-{i:02d}" for i in range(16)]
    try:
        await create(log, sids)
        FailingCommits.failing = True
        try:
            results = await asyncio.gather(
                *(log.append([turn_started(s, 2)], expected_version=1) for s in sids),
                return_exceptions=True,
            )
        finally:
            FailingCommits.failing = False
        assert all(isinstance(r, LogUnavailableError) for r in results), results
        assert "none of them is on the log" in str(results[0])
        for sid in sids:
            assert await log.session_version(sid) == 1

        # the log goes on: the same appends, retried, commit
        await asyncio.gather(*(log.append([turn_started(s, 2)], expected_version=1) for s in sids))
        for sid in sids:
            assert [e.type for e in await log.read_session(sid)] == ["SessionCreated", "TurnStarted"]
    finally:
        FailingCommits.failing = False
        await log.close()


class TimedCommits(sqlite3.Connection):
    """A connection that records which thread ran each COMMIT, and can make COMMITs slow."""

    delay_s = 0.0
    threads: list[str] = []

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:  # type: ignore[override]
        if sql == "COMMIT":
            TimedCommits.threads.append(threading.current_thread().name)
            time.sleep(TimedCommits.delay_s)
        return super().execute(sql, *args)  # type: ignore[arg-type]


@pytest.mark.parametrize("slow", [False, True], ids=["fast-disk", "slow-disk"])
async def test_a_slow_commit_runs_off_the_loop_and_a_fast_one_on_it(log_path: Path, slow: bool) -> None:
    """Where the COMMIT runs follows how long COMMITs take: on the loop while they are fast
    (no thread hop), on the commit thread once they are slow, with one in PROBE_EVERY back on
    the loop to measure the disk again. Every append is on the log either way."""
    log = SqliteEventLog(log_path, durability="power")
    # fast: no COMMIT is slow enough to leave the loop; slow: every one is far slower than it allows
    log.group = GroupCommit(
        power_writer(log_path, TimedCommits), inline_below_s=0.002 if slow else 60.0, held_rows=log.held_rows
    )
    TimedCommits.delay_s, TimedCommits.threads = (0.02 if slow else 0.0), []
    sids = [f"c-{i}" for i in range(40)]
    try:
        for sid in sids:  # one append at a time: a transaction, so a COMMIT, each
            await log.submit(ev.SessionCreated(session_id=sid, version=1, agent_id="a", user_id="u"))
        on_loop = [name == threading.current_thread().name for name in TimedCommits.threads]
        assert len(on_loop) == len(sids)
        if not slow:
            assert all(on_loop), TimedCommits.threads
        else:
            assert on_loop[0], "the first COMMIT is timed on the loop"
            off = [i for i, here in enumerate(on_loop) if not here]
            assert off and off[0] == 1, TimedCommits.threads
            probes = [i for i, here in enumerate(on_loop) if here and i > 0]
            assert probes == list(range(PROBE_EVERY, len(sids), PROBE_EVERY)), TimedCommits.threads
        for sid in sids:
            assert await log.session_version(sid) == 1
    finally:
        TimedCommits.delay_s = 0.0
        await log.close()


class CountingSelector(selectors.DefaultSelector):
    """Counts the event loop's turns: a loop polls its selector once a turn."""

    polls = 0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        self.polls += 1
        return super().select(timeout)


@pytest.mark.parametrize("durability", ["power", "process"])
def test_a_lone_write_commits_at_once_and_the_loop_still_turns(
    log_path: Path, durability: Durability
) -> None:
    """A write with no other write queued and nothing else ready to run is committed inside
    the call, without waiting for a turn of the loop, but at most RUN_NOW_IN_A_ROW in a row: a
    task that only appends still lets the loop poll its sockets."""
    appends = 5 * (RUN_NOW_IN_A_ROW + 1)
    selector = CountingSelector()

    async def append_alone() -> int:
        log = SqliteEventLog(log_path, durability=durability)
        if durability == "power":  # a disk fast enough for the COMMIT to stay on the loop
            log.group = GroupCommit(
                power_writer(log_path, sqlite3.Connection), inline_below_s=60.0, held_rows=log.held_rows
            )
        try:
            await create(log, ["solo"])
            start = selector.polls
            for version in range(2, 2 + appends):
                await log.append([turn_started("solo", version, version)], expected_version=version - 1)
            turns = selector.polls - start
            group = group_of(log)
            assert group.commits == group.writes == 1 + appends, "a transaction for each write"
            assert [e.version for e in await log.read_session("solo")] == list(range(1, 2 + appends))
            return turns
        finally:
            await log.close()

    loop = asyncio.SelectorEventLoop(selector)
    try:
        turns = loop.run_until_complete(append_alone())
    finally:
        loop.close()
    # one write in RUN_NOW_IN_A_ROW + 1 waits for the loop: two turns (its transaction's, its wake-up)
    waited = appends // (RUN_NOW_IN_A_ROW + 1)
    assert waited <= turns <= 2 * waited + 1, f"{turns} turns of the loop for {appends} appends"


async def test_offsets_and_appends_share_commits(log_path: Path) -> None:
    log = SqliteEventLog(log_path, partitions=2, durability="power")
    try:
        await create(log, ["o-1", "o-2"])
        await asyncio.gather(
            log.commit("workers", 0, 7),
            log.commit("workers", 1, 9),
            log.append([turn_started("o-1", 2)], expected_version=1),
        )
        assert (await log.committed("workers", 0), await log.committed("workers", 1)) == (7, 9)
        assert await log.session_version("o-1") == 2
    finally:
        await log.close()
    reopened = SqliteEventLog(log_path, partitions=2)
    try:
        assert await reopened.committed("workers", 1) == 9
    finally:
        await reopened.close()


@pytest.mark.parametrize("path", [":memory:"])
async def test_an_in_memory_database_commits_each_append_alone(path: str) -> None:
    log = SqliteEventLog(path, durability="power")
    try:
        assert log.group is None
        await create(log, ["m-1"])
        assert await log.session_version("m-1") == 1
    finally:
        await log.close()


@pytest.mark.parametrize("durability", ["power", "process"])
async def test_two_logs_on_one_file_in_one_loop_append_side_by_side(
    log_path: Path, durability: Durability
) -> None:
    """The write lock is never held across an await: a second log object on the same file (a
    gateway and a worker in one process) appending at the same time does not wait on it."""
    first = SqliteEventLog(log_path, durability=durability)
    second = SqliteEventLog(log_path, durability=durability)
    sids = [f"two-{i:02d}" for i in range(20)]
    try:
        await asyncio.gather(
            *(
                (first if i % 2 else second).submit(
                    ev.SessionCreated(session_id=sid, version=1, agent_id="a", user_id="u")
                )
                for i, sid in enumerate(sids)
            )
        )
        await asyncio.gather(
            *(
                (second if i % 2 else first).append([turn_started(sid, 2)], expected_version=1)
                for i, sid in enumerate(sids)
            )
        )
        for sid in sids:
            assert [e.type for e in await first.read_session(sid)] == ["SessionCreated", "TurnStarted"]
    finally:
        await first.close()
        await second.close()


async def test_a_write_cancelled_before_its_transaction_is_withdrawn(log_path: Path) -> None:
    log = SqliteEventLog(log_path, durability="power")
    try:
        await create(log, ["w-1", "w-2"])
        withdrawn = asyncio.ensure_future(log.append([turn_started("w-1", 2)], expected_version=1))
        kept = asyncio.ensure_future(log.append([turn_started("w-2", 2)], expected_version=1))
        await asyncio.sleep(0)  # both queued, their transaction not yet run
        withdrawn.cancel()
        await kept
        with pytest.raises(asyncio.CancelledError):
            await withdrawn
        assert (await log.session_version("w-1"), await log.session_version("w-2")) == (1, 2)
    finally:
        await log.close()


@pytest.mark.parametrize("durability", ["power", "process"])
async def test_a_write_alone_that_fails_part_way_leaves_none_of_its_writes(
    log_path: Path, durability: Durability
) -> None:
    """A batch of one write runs without a savepoint: its failure rolls the transaction back."""
    log = SqliteEventLog(log_path, durability=durability)
    group = group_of(log)

    def half_then_fail(db: sqlite3.Connection) -> None:
        db.execute("INSERT INTO log_meta VALUES ('half', 'written')")
        raise ValueError("the job broke after its first write")

    try:
        with pytest.raises(ValueError, match="broke after"):
            await group.write(half_then_fail)
        await create(log, ["after"])  # the connection takes the next write
        reader = SqliteEventLog(log_path)  # another connection, as another process would read
        try:
            assert [e.type for e in await reader.read_session("after")] == ["SessionCreated"]
        finally:
            await reader.close()
        with closing(sqlite3.connect(log_path)) as db:
            assert db.execute("SELECT value FROM log_meta WHERE key = 'half'").fetchone() is None
        assert group.commits == group.writes == 1
    finally:
        await log.close()


def held_log(
    log_path: Path,
    factory: type[sqlite3.Connection] = sqlite3.Connection,
    *,
    hold_s: float = 60.0,
    partitions: int = 8,
) -> SqliteEventLog:
    """A ``power`` log whose redoable appends stay held until something commits them (the
    hold timer far off, unless ``hold_s`` says otherwise)."""
    log = SqliteEventLog(log_path, durability="power", partitions=partitions)
    log.group = GroupCommit(
        power_writer(log_path, factory), inline_below_s=60.0, hold_s=hold_s, held_rows=log.held_rows
    )
    return log


def version_elsewhere(log_path: Path, sid: str) -> int:
    """The session's version as another process reads it (a connection of its own)."""
    with closing(sqlite3.connect(log_path)) as db:
        row = db.execute(
            "SELECT b.version + b.count - 1 FROM batches b JOIN sessions s ON b.session = s.key "
            "WHERE s.session_id = ? ORDER BY b.version DESC LIMIT 1",
            (sid,),
        ).fetchone()
    return 0 if row is None else int(row[0])


async def seen_elsewhere(log_path: Path, sid: str, version: int) -> bool:
    """Whether another process sees the session at ``version`` within 10 s, the loop turning
    meanwhile (a hold's timer fires on it)."""
    for _ in range(1000):
        if version_elsewhere(log_path, sid) == version:
            return True
        await asyncio.sleep(0.01)
    return False


async def test_redoable_appends_are_held_and_committed_with_the_next_append_that_waits(
    log_path: Path,
) -> None:
    """A redoable append returns once checked and ordered; it is committed together with the
    next append that waits for its COMMIT: one COMMIT (one fsync) for all of them. Until then
    another process does not see it, so nothing it read can be rolled back by a power loss."""
    log = held_log(log_path)
    try:
        await create(log, ["h"])
        group = group_of(log)
        commits = group.commits
        for version in range(2, 5):
            records = await log.append(
                [turn_started("h", version, version)], expected_version=version - 1, redoable=True
            )
            assert [r.event.version for r in records] == [version]
        assert group.commits == commits, "nothing committed yet"
        assert version_elsewhere(log_path, "h") == 1, "another process sees only what is committed"
        with pytest.raises(ConcurrencyError):  # the held appends count for the version check
            await log.append([turn_started("h", 2, 99)], expected_version=1)
        await log.append([turn_started("h", 5, 5)], expected_version=4)  # waits: commits all four
        assert group.commits == commits + 1
        assert version_elsewhere(log_path, "h") == 5
        assert [e.version for e in await log.read_session("h")] == [1, 2, 3, 4, 5]
    finally:
        await log.close()


async def test_a_read_in_this_process_commits_the_held_appends_first(log_path: Path) -> None:
    """What a writer was told is appended, a reader in its process reads: a read commits the
    held appends before it runs."""
    log = held_log(log_path)
    try:
        await create(log, ["r"])
        await log.append([turn_started("r", 2)], expected_version=1, redoable=True)
        assert version_elsewhere(log_path, "r") == 1
        assert await log.session_version("r") == 2
        assert version_elsewhere(log_path, "r") == 2, "the read committed it"
        end = await log.end_offset(log.partition_of("r"))
        assert [r.offset for r in await log.read_partition(log.partition_of("r"), 0)][-1] == end - 1
    finally:
        await log.close()


async def test_a_read_waits_for_a_held_commit_running_off_the_loop(log_path: Path) -> None:
    """On a slow disk the COMMIT of held appends runs on the commit thread like any other; a
    read in this process waits for it, and reads them."""
    log = SqliteEventLog(log_path, durability="power")
    log.group = GroupCommit(
        power_writer(log_path, TimedCommits), inline_below_s=0.002, hold_s=60.0, held_rows=log.held_rows
    )
    TimedCommits.delay_s, TimedCommits.threads = 0.02, []
    try:
        await create(log, ["slow"])  # its COMMIT, timed on the loop, is slow: the next ones leave it
        await log.append([turn_started("slow", 2)], expected_version=1, redoable=True)
        assert version_elsewhere(log_path, "slow") == 1
        assert await log.session_version("slow") == 2
        assert len(TimedCommits.threads) == 2
        assert TimedCommits.threads[-1] != threading.current_thread().name, "the held COMMIT left the loop"
        assert version_elsewhere(log_path, "slow") == 2
    finally:
        TimedCommits.delay_s = 0.0
        await log.close()


async def test_a_second_log_on_the_file_in_this_thread_does_not_wait_for_a_hold(log_path: Path) -> None:
    """A second log on the same file, in the same thread, opens, appends and reads while the
    first holds a transaction open: the hold is committed first, so it never waits for a write
    lock that only this thread's loop (the hold's timer) could release, and it reads the held
    append."""
    first = held_log(log_path)
    try:
        await create(first, ["one"])
        await first.append([turn_started("one", 2)], expected_version=1, redoable=True)
        second = SqliteEventLog(log_path, durability="power")  # opening writes (partitions, migrations)
        try:
            assert version_elsewhere(log_path, "one") == 2, "opening committed the hold"
            await first.append([turn_started("one", 3)], expected_version=2, redoable=True)
            await create(second, ["two"])  # takes the write lock: the new hold is committed first
            assert await second.session_version("one") == 3
            await first.append([turn_started("one", 4)], expected_version=3, redoable=True)
            assert await second.session_version("one") == 4, "a read commits the hold first"
        finally:
            await second.close()
    finally:
        await first.close()


async def test_held_appends_are_committed_after_the_hold_and_at_close(log_path: Path) -> None:
    """Nothing else coming, the hold ends on its timer (other processes then see the appends),
    and ``close`` commits what is still held."""
    log = held_log(log_path, hold_s=0.01)
    try:
        await create(log, ["t"])
        await log.append([turn_started("t", 2)], expected_version=1, redoable=True)
        assert await seen_elsewhere(log_path, "t", 2)
    finally:
        await log.close()
    log = held_log(log_path)
    try:
        await log.append([turn_started("t", 3)], expected_version=2, redoable=True)
    finally:
        await log.close()
    assert version_elsewhere(log_path, "t") == 3, "close committed the held append"


async def test_the_hold_is_a_log_option(log_path: Path) -> None:
    """``hold_s`` bounds the hold (0: the loop's next turn commits); out of range is refused,
    since a held transaction keeps other processes' writers waiting."""
    for wrong in (-0.001, MAX_HOLD_S + 1):
        with pytest.raises(ConfigurationError, match="hold_s must be from 0 to"):
            SqliteEventLog(log_path, hold_s=wrong)
    log = SqliteEventLog(log_path, durability="power", hold_s=0.0)
    try:
        await create(log, ["z"])
        await log.append([turn_started("z", 2)], expected_version=1, redoable=True)
        assert await seen_elsewhere(log_path, "z", 2)
        assert group_of(log).commits == 2, "its own COMMIT, on the loop's next turn"
    finally:
        await log.close()


async def test_a_failing_append_does_not_undo_the_held_ones_it_joins(log_path: Path) -> None:
    """An append that joins the held transaction and fails (a lost version race) rolls back
    alone: the held appends of other sessions commit with the next."""
    log = held_log(log_path)
    try:
        await create(log, ["a", "b"])
        await log.append([turn_started("a", 2)], expected_version=1, redoable=True)
        with pytest.raises(ConcurrencyError):
            await log.append([turn_started("b", 3)], expected_version=2, redoable=True)
        await log.append([turn_started("b", 2)], expected_version=1)
        assert (version_elsewhere(log_path, "a"), version_elsewhere(log_path, "b")) == (2, 2)
    finally:
        await log.close()


async def test_a_held_append_whose_commit_fails_fails_its_sessions_next_append(log_path: Path) -> None:
    """A redoable append returned, then its COMMIT failed (a full disk): it is not on the log,
    and its session's next append says so (once) instead of a misleading version race; the
    session then goes on from what the log holds."""
    log = held_log(log_path, FailingCommits)
    try:
        await create(log, ["x", "y"])
        await log.append([turn_started("x", 2)], expected_version=1, redoable=True)
        FailingCommits.failing = True
        try:
            with pytest.raises(LogUnavailableError, match="none of them is on the log"):
                await log.append([turn_started("y", 2)], expected_version=1)  # commits x's with it
        finally:
            FailingCommits.failing = False
        assert await log.session_version("x") == 1
        partition = log.partition_of("x")
        first = (await log.read_partition(partition, 0))[0].offset
        held = await log.read_partition(partition, first)  # not from the records it held (sqlite_recent)
        assert [(r.event.session_id, r.event.type) for r in held if r.event.session_id == "x"] == [
            ("x", "SessionCreated")
        ]
        with pytest.raises(LogUnavailableError, match="returned before its COMMIT") as lost:
            await log.append([turn_started("x", 3)], expected_version=2)
        assert "Fold the session again" in str(lost.value)
        await log.append([turn_started("x", 2)], expected_version=1)  # from what the log holds
        await log.append([turn_started("y", 2)], expected_version=1)
        assert (version_elsewhere(log_path, "x"), version_elsewhere(log_path, "y")) == (2, 2)
    finally:
        FailingCommits.failing = False
        await log.close()


async def test_a_submission_is_never_held(log_path: Path) -> None:
    """What a producer handed in is acknowledged: a batch holding a submission waits for its
    COMMIT even when its writer calls it redoable."""
    log = held_log(log_path)
    try:
        await create(log, ["s"])
        message = ev.UserMessageReceived(session_id="s", version=2, message_id="m-1", text="hi", user_id="u")
        await log.append([message], expected_version=1, redoable=True)
        assert version_elsewhere(log_path, "s") == 2
    finally:
        await log.close()


async def test_an_append_queued_while_a_held_commit_leaves_the_loop_waits_for_it(log_path: Path) -> None:
    """On a slow disk, a read (or the hold's timer) may send the held appends' COMMIT to the
    commit thread between an append being queued and its transaction starting: that
    transaction starts only once the COMMIT has returned, on a connection out of its
    transaction (before the fix it began inside it and the append failed with sqlite's
    "cannot start a transaction within a transaction")."""
    log = SqliteEventLog(log_path, durability="power")
    log.group = GroupCommit(
        power_writer(log_path, TimedCommits), inline_below_s=0.002, hold_s=60.0, held_rows=log.held_rows
    )
    TimedCommits.delay_s, TimedCommits.threads = 0.02, []
    try:
        await create(log, ["held", "next"])  # slow, timed on the loop: the next COMMITs leave it
        await log.append([turn_started("held", 2)], expected_version=1, redoable=True)
        # the append is queued (the read is ready to run), then the read commits the hold
        records, version = await asyncio.gather(
            log.append([turn_started("next", 2)], expected_version=1), log.session_version("held")
        )
        assert [r.event.version for r in records] == [2] and version == 2
        assert TimedCommits.threads[-1] != threading.current_thread().name, "the held COMMIT left the loop"
        assert version_elsewhere(log_path, "held") == version_elsewhere(log_path, "next") == 2
    finally:
        TimedCommits.delay_s = 0.0
        await log.close()
