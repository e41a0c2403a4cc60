"""The embedded log answers this process's reads of what it appended last from the records it
holds (engine/log/sqlite_recent.py): every such read equals what a process reading the file
gets, with another process appending to the same partitions and sessions in between, after an
erasure in either process, and it is answered without the file when it can be."""

from __future__ import annotations

import random
from pathlib import Path

from tests.erasure_support import markers_of, planted
from turnlog.engine import events as ev
from turnlog.engine.crypto.cipher import ContentCipher
from turnlog.engine.crypto.fields import scrubbed
from turnlog.engine.log.base import LogRecord
from turnlog.engine.log.sqlite import SqliteEventLog
from turnlog.engine.log.sqlite_recent import RecentRecords

PARTITIONS = 2


def session_in(partition: int, tag: str) -> str:
    """A session id that the log puts in ``partition``."""
    n = 0
    while True:
        sid = f"{tag}-{n}"
        if SqliteEventLog.partition_of(_SHAPE, sid) == partition:
            return sid
        n += 1


class _Shape:
    partitions = PARTITIONS


_SHAPE = _Shape()


async def paged(log: SqliteEventLog, partition: int, limit: int) -> list[LogRecord]:
    """The partition read from 0 the way a consumer reads it: ``limit`` records at a time."""
    out: list[LogRecord] = []
    offset = 0
    while records := await log.read_partition(partition, offset, limit):
        out += records
        offset = records[-1].offset + 1
    return out


async def as_the_file_has_it(path: Path, partition: int) -> list[LogRecord]:
    fresh = SqliteEventLog(path, partitions=PARTITIONS)
    try:
        return await paged(fresh, partition, 500)
    finally:
        await fresh.close()


async def test_reads_of_what_this_process_appended_equal_the_files(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    log, other = SqliteEventLog(path, partitions=PARTITIONS), SqliteEventLog(path, partitions=PARTITIONS)
    try:
        ours, theirs, both = session_in(0, "ours"), session_in(0, "theirs"), session_in(1, "both")
        events = {sid: planted(sid, f"M{sid}") for sid in (ours, theirs, both)}
        for i, _ in enumerate(events[ours]):  # one event of each kind at a time, interleaved
            await log.append([events[ours][i]], expected_version=i)
            await other.append([events[theirs][i]], expected_version=i)
            writer = log if i % 3 else other  # the session both processes write to
            await writer.append([events[both][i]], expected_version=i)
        log.recent.hits = 0
        for partition in range(PARTITIONS):
            for limit in (1, 3, 500):
                assert await paged(log, partition, limit) == await as_the_file_has_it(path, partition)
        assert log.recent.hits > 0, "the records this process appended were read from the file"

        last = len(events[ours])
        for after in range(last):
            through = await log.read_session_records_through(ours, after, last)
            assert [r.event for r in through] == events[ours][after:]
        whole = await log.read_session_records_through(both, 0, last)  # the other wrote some of it
        assert [r.event for r in whole] == events[both]
        assert whole == await other.read_session_records(both)
    finally:
        await log.close()
        await other.close()


async def test_an_erasure_in_another_process_reaches_the_records_held(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    log, other = SqliteEventLog(path, partitions=PARTITIONS), SqliteEventLog(path, partitions=PARTITIONS)
    try:
        gone, kept = session_in(0, "gone"), session_in(0, "kept")
        erased, still = planted(gone, "GONExq"), planted(kept, "KEPTxq")
        await log.append(erased, expected_version=0)
        await log.append(still, expected_version=0)
        assert [r.event for r in await log.read_partition(0, 0)] == erased + still  # held, plain

        cipher = other.records.sealer
        assert isinstance(cipher, ContentCipher)
        assert cipher.keys.destroy([gone], "e1", ev.now_ms()) == [gone]
        cipher.forget(gone)

        read = [r.event for r in await paged(log, 0, 1)]  # from the second on, from what is held
        assert read == [scrubbed(e) for e in erased] + still
        assert not markers_of(read, "GONExq")
        assert read == [r.event for r in await as_the_file_has_it(path, 0)]
        through = await log.read_session_records_through(gone, 0, len(erased))
        assert [r.event for r in through] == [scrubbed(e) for e in erased]
    finally:
        await log.close()
        await other.close()


async def test_content_appended_after_its_session_was_erased_here_reads_erased(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    log = SqliteEventLog(path, partitions=PARTITIONS)
    try:
        sid = session_in(1, "late")
        first = planted(sid, "EARLYxq")
        await log.append(first, expected_version=0)
        cipher = log.records.sealer
        assert isinstance(cipher, ContentCipher)
        assert cipher.keys.destroy([sid], "e1", ev.now_ms()) == [sid]
        cipher.forget(sid)  # what the eraser does in this process, before the erasure's event
        assert not markers_of([r.event for r in await paged(log, 1, 1)], "EARLYxq")
        late = ev.UserMessageReceived(
            session_id=sid, version=len(first) + 1, message_id="late", text="LATExq"
        )
        await log.append([late], expected_version=len(first))
        read = [r.event for r in await paged(log, 1, 1)]
        assert not markers_of(read, "EARLYxq") and not markers_of(read, "LATExq")
        assert read == [r.event for r in await as_the_file_has_it(path, 1)]
        through = await log.read_session_records_through(sid, len(first), len(first) + 1)
        assert [r.event.text for r in through] == [scrubbed(late).text]
    finally:
        await log.close()


async def test_a_session_read_from_what_is_held_stops_at_what_another_process_appended(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log.db"
    log, other = SqliteEventLog(path, partitions=PARTITIONS), SqliteEventLog(path, partitions=PARTITIONS)
    try:
        sid = session_in(0, "shared")
        events = planted(sid, "SHAREDxq")
        half = len(events) // 2
        await log.append(events[:half], expected_version=0)
        log.recent.hits = 0
        assert [r.event for r in await log.read_session_records(sid, 1)] == events[1:half]
        assert log.recent.hits == 1, "what this process appended last was read from the file"
        await other.append(events[half:], expected_version=half)  # the session goes on elsewhere
        read = await log.read_session_records(sid, 1)
        assert [r.event for r in read] == events[1:]
        assert read == await other.read_session_records(sid, 1)
        assert await log.read_session(sid, len(events)) == []
    finally:
        await log.close()
        await other.close()


async def test_what_is_held_is_bounded_by_weight_and_the_rest_is_read_from_the_file(
    tmp_path: Path,
) -> None:
    """The held records weigh at most the budget (their share of each append's encoded bytes
    plus an overhead each); the oldest go first, and reads of them go to the file, unchanged."""
    from turnlog.engine.log import sqlite_recent

    log = SqliteEventLog(tmp_path / "log.db", partitions=PARTITIONS)
    budget = 3 * sqlite_recent.RECORD_OVERHEAD + 2_000  # a few records, whatever their size
    log.recent = sqlite_recent.RecentRecords(budget_bytes=budget)
    try:
        sid = session_in(0, "bounded")
        events = planted(sid, "BOUNDEDzq")
        for i, event in enumerate(events):
            await log.append([event], expected_version=i)
            assert 0 < log.recent.weight <= budget
        first_held = next(v + 1 for v in range(len(events)) if log.recent.held_through(sid, v) is not None)
        assert 1 < first_held < len(events), "the budget keeps a few of the newest records"
        log.recent.hits = 0
        assert [r.event for r in await log.read_session_records(sid)] == events  # from the file
        assert log.recent.hits == 0
        assert [r.event for r in await log.read_session_records(sid, len(events) - 1)] == events[-1:]
        assert log.recent.hits == 1  # the newest is held
    finally:
        await log.close()


def a_scan_of(held: dict[int, LogRecord], partition: int, offset: int, limit: int) -> list[LogRecord] | None:
    """What a partition read from the held records is: position by position from ``offset``
    while every position is held, the partition's records among them."""
    run: list[LogRecord] = []
    while (record := held.get(offset)) is not None and len(run) < limit:
        if record.partition == partition:
            run.append(record)
        offset += 1
    return run or None


def test_a_partition_read_of_the_held_records_is_the_scan_of_every_position() -> None:
    """Appends of several partitions interleaved with other processes' (holes), a group
    commit's appends returning out of order, erasures, eviction by weight and a lost held
    append: after each, every partition's read from every position is what a scan of every
    held position gives (the per-partition positions only skip the scan)."""
    rng = random.Random(46)
    for _ in range(20):
        recent, position, versions = RecentRecords(budget_bytes=rng.choice([4_000, 40_000, 10**9])), 0, {}
        for _ in range(150):
            position += rng.choice([0, 0, 0, 1, 5])  # another process's records in between
            sid = f"s{rng.randrange(6)}"
            count = rng.randint(1, 4)
            appends = []
            for _ in range(rng.choice([1, 1, 2])):  # two appends of one group commit
                versions[sid] = versions.get(sid, 0) + count
                first = versions[sid] - count
                partition = int(sid[1:]) % 3
                events = [
                    ev.SessionCreated(session_id=sid, version=first + i + 1, agent_id="a", user_id="u")
                    for i in range(count)
                ]
                appends.append(([LogRecord(partition, position + i, e) for i, e in enumerate(events)], first))
                position += count
            for records, first in reversed(appends) if rng.random() < 0.3 else appends:
                recent.add(records, first, 200)
            if rng.random() < 0.05:
                recent.drop_session(f"s{rng.randrange(6)}")
            if rng.random() < 0.01:
                recent.clear()
            for partition in range(3):
                for offset in range(max(0, position - 60), position + 1):
                    limit = rng.choice([1, 3, 500])
                    expected = a_scan_of(recent._at, partition, offset, limit)
                    assert recent.partition_run(partition, offset, limit) == expected
