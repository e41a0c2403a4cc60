"""The embedded log's storage: values compressed with the shipped zstd dictionary
(engine.log.zdict), sessions named by a key (layout 2), and files of older releases (layout 1,
plain Avro values) migrated on open; a value the shipped dictionaries cannot read is refused
with a message that says what to do."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest
import zstandard

from engine import codec
from engine import events as ev
from engine.errors import ConcurrencyError, MalformedEventError
from engine.log import zdict
from engine.log.sqlite import SqliteEventLog
from engine.log.submissions import submission_keys


def _turn(sid: str, start: int, n: int) -> list[ev.Event]:
    out: list[ev.Event] = []
    for v in range(start, start + n):
        if v == 1:
            out.append(ev.SessionCreated(session_id=sid, version=1, agent_id="support", user_id="u-1"))
        else:
            text = f"Where is my parcel {v}? It left the warehouse last week" + " and tracking says nothing."
            out.append(
                ev.UserMessageReceived(
                    session_id=sid, version=v, message_id=ev.new_id(), text=text, causation_id=ev.new_id()
                )
            )
    return out


def _stored(path: Path) -> list[tuple[str, bytes]]:
    with sqlite3.connect(path) as db:
        return [(t, bytes(v)) for t, v in db.execute("SELECT type, value FROM events ORDER BY position")]


async def test_new_values_are_stored_compressed_with_the_shipped_dictionary(tmp_path: Path) -> None:
    log = SqliteEventLog(tmp_path / "log.db")
    written = _turn("6a0b4c2e9f3d41b7a8e5c1d2f3a4b5c6", 1, 20)
    await log.append(written, expected_version=0)
    assert await log.read_session(written[0].session_id) == written
    await log.close()
    rows = _stored(tmp_path / "log.db")
    assert all(v[:4] == zdict.ZSTD_MAGIC for _, v in rows)
    assert {zstandard.get_frame_parameters(v).dict_id for _, v in rows} == {zdict.DICT_ID}
    assert sum(len(v) for _, v in rows) < 0.9 * sum(len(codec.encode(e)) for e in written)


async def test_a_log_written_uncompressed_opens_reads_and_goes_on_compressed(tmp_path: Path) -> None:
    """An older turnlog wrote plain Avro values: the file needs no migration."""
    path = tmp_path / "old.db"
    old = SqliteEventLog(path, compress=False)
    first = _turn("s1", 1, 10)
    await old.append(first, expected_version=0)
    await old.close()
    assert all(v[:2] == codec.MAGIC for _, v in _stored(path))

    log = SqliteEventLog(path)
    assert await log.read_session("s1") == first
    more = _turn("s1", 11, 5)
    await log.append(more, expected_version=10)
    assert await log.read_session("s1") == first + more
    assert [r.event for r in await log.read_partition(log_partition(log, "s1"), 0, 100)] == first + more
    await log.close()
    kinds = [v[:2] == codec.MAGIC for _, v in _stored(path)]
    assert kinds == [True] * 10 + [False] * 5


def log_partition(log: SqliteEventLog, sid: str) -> int:
    from engine.log.base import partition_for

    return partition_for(sid, log.partitions)


def test_a_value_that_does_not_shrink_is_stored_as_it_is() -> None:
    event = ev.UserMessageReceived(session_id="s", version=2, message_id="m", text=bytes(range(256)).hex())
    value = codec.encode(event)
    tiny = codec.encode(ev.SessionClosed(session_id="s", version=3, reason="", actor=""))
    assert zdict.unpack(zdict.pack(value)) == value
    assert zdict.pack(tiny) in (tiny, zdict.pack(tiny))  # whichever is shorter
    assert len(zdict.pack(tiny)) <= len(tiny)


def test_a_value_compressed_with_a_dictionary_this_turnlog_lacks_is_refused() -> None:
    samples = [codec.encode(e) for i in range(300) for e in _turn(f"s{i}", 1, 3)]
    other = zstandard.ZstdCompressionDict(zstandard.train_dictionary(4096, samples, dict_id=99).as_bytes())
    foreign = zstandard.ZstdCompressor(dict_data=other).compress(samples[0])
    with pytest.raises(MalformedEventError, match="zstd dictionary 99, which this turnlog does not ship"):
        zdict.unpack(foreign)


async def test_a_corrupt_compressed_value_names_its_position(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    log = SqliteEventLog(path)
    await log.append(_turn("s1", 1, 3), expected_version=0)
    with sqlite3.connect(path) as db:
        (value,) = db.execute("SELECT value FROM events WHERE version = 2").fetchone()
        broken = bytes(value[:-4]) + b"\xff\xff\xff\xff"
        db.execute("UPDATE events SET value = ? WHERE version = 2", (broken,))
    with pytest.raises(MalformedEventError, match=r"offset 2: corrupt"):
        await log.read_session("s1")
    await log.close()


def test_the_dictionary_ships_with_the_package() -> None:
    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert '"engine.log" = ["*.zdict"]' in pyproject
    assert zdict.dictionary_path(zdict.DICT_ID).stat().st_size > 1024


LAYOUT_1 = """
CREATE TABLE events (
    position   INTEGER PRIMARY KEY,
    partition  INTEGER NOT NULL,
    session_id TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    type       TEXT    NOT NULL,
    value      BLOB    NOT NULL,
    UNIQUE (session_id, version)
);
CREATE INDEX events_by_partition ON events (partition, position);
CREATE INDEX snapshots_by_session ON events (session_id, version) WHERE type = 'SnapshotTaken';
CREATE TABLE group_offsets (
    group_id    TEXT    NOT NULL,
    partition   INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    PRIMARY KEY (group_id, partition)
);
CREATE TABLE log_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO log_meta VALUES ('partitions', '4');
CREATE TABLE submissions (
    session_id TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    PRIMARY KEY (session_id, key)
) WITHOUT ROWID;
INSERT INTO log_meta VALUES ('submissions_indexed', '1');
"""
"""The tables as turnlog wrote them before layout 2 (verbatim)."""


def _layout_1_file(path: Path, sessions: dict[str, list[ev.Event]]) -> None:
    """A log file as an older turnlog left it: positions interleaved across sessions."""
    from engine.log.base import partition_for

    rows = []
    position = 0
    for v in range(max(len(evs) for evs in sessions.values())):
        for sid, evs in sessions.items():
            if v < len(evs):
                position += 1
                e = evs[v]
                rows.append((position, partition_for(sid, 4), sid, e.version, e.type, codec.encode(e)))
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.executescript(LAYOUT_1)
        db.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)", rows)
        keys = [
            (e.session_id, k, e.version) for evs in sessions.values() for e in evs for k in submission_keys(e)
        ]
        db.executemany("INSERT INTO submissions VALUES (?, ?, ?)", keys)
        db.execute("INSERT INTO group_offsets VALUES ('projector', 1, 3)")


def _snapshot(sid: str, version: int) -> ev.SnapshotTaken:
    return ev.SnapshotTaken(
        session_id=sid, version=version, state_format=4, status="FINISHED", last_tool="", turns=1,
        input_tokens=0, output_tokens=0, message_count=0, keyframe_version=0, state_json="{}" * 200,
    )  # fmt: skip


async def test_a_layout_1_file_is_migrated_on_open_and_reads_as_before(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    sessions = {f"{i:032x}": _turn(f"{i:032x}", 1, 40) for i in range(1, 21)}
    sid = next(iter(sessions))
    sessions[sid].append(_snapshot(sid, 41))
    _layout_1_file(path, sessions)
    before = path.stat().st_size
    with contextlib.closing(sqlite3.connect(path)) as db:
        old_positions = dict(db.execute("SELECT position, session_id || ':' || version FROM events"))

    await SqliteEventLog(path, partitions=4).close()
    assert path.stat().st_size < 0.8 * before, "the space the old layout took is given back"
    log = SqliteEventLog(path, partitions=4)
    for s, written in sessions.items():
        assert await log.read_session(s) == written
        assert await log.session_version(s) == len(written)
    assert await log.latest_snapshot(sid) == sessions[sid][-1]
    assert await log.versions_of(sid, ["SessionCreated"], 99) == [(1, "SessionCreated")]
    assert await log.committed("projector", 1) == 3
    positions = {}
    for p in range(4):
        for record in await log.read_partition(p, 0, 1000):
            positions[record.offset] = f"{record.event.session_id}:{record.event.version}"
    assert positions == old_positions, "every event keeps its partition and offset"
    more = _turn(sid, 42, 3)
    await log.append(more, expected_version=41)
    assert await log.read_session(sid, 41) == more
    await log.close()

    with contextlib.closing(sqlite3.connect(path)) as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(events)")}
        assert "session_id" not in columns and "session" in columns
        values = [bytes(v) for (v,) in db.execute("SELECT value FROM events")]
    assert all(v[:4] == zdict.ZSTD_MAGIC for v in values if len(v) > 150), "old values compressed"
    reopened = SqliteEventLog(path, partitions=4)  # migrated once: opens as layout 2
    assert await reopened.read_session(sid) == sessions[sid] + more
    await reopened.close()


async def test_a_session_key_taken_by_a_refused_append_is_given_back(tmp_path: Path) -> None:
    log = SqliteEventLog(tmp_path / "log.db")
    await log.append(_turn("a", 1, 2), expected_version=0)
    with pytest.raises(ConcurrencyError):
        await log.append(_turn("b", 2, 1), expected_version=1)  # "b" has no events
    await log.append(_turn("b", 1, 2), expected_version=0)
    await log.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "log.db")) as db:
        assert db.execute("SELECT session_id, key FROM sessions ORDER BY key").fetchall() == [
            ("a", 1),
            ("b", 2),
        ]
