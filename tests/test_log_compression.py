"""The embedded log's storage: a row per append whose records are compressed together with the
shipped zstd dictionary (layout 3: engine.log.sqlite_batch, engine.log.zdict), sessions named by
a key, and files of older releases (layout 1: a row per event with its session id and a plain
Avro value; layout 2: a row per event, each value compressed alone) migrated on open; a value
the shipped dictionaries cannot read is refused with a message that says what to do."""

from __future__ import annotations

import contextlib
import importlib.util
import sqlite3
from pathlib import Path

import pytest
import zstandard

from turnlog.engine import codec
from turnlog.engine import events as ev
from turnlog.engine.errors import ConcurrencyError, MalformedEventError
from turnlog.engine.log import LogRecord, zdict
from turnlog.engine.log.sqlite import SqliteEventLog
from turnlog.engine.log.sqlite_batch import split_batch
from turnlog.engine.log.sqlite_layout import layout
from turnlog.engine.log.submissions import submission_keys


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


def _stored(path: Path) -> list[tuple[int, bytes]]:
    """(event count, stored value) of each batch, in position order."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        return [(n, bytes(v)) for n, v in db.execute("SELECT count, value FROM batches ORDER BY position")]


async def test_an_append_is_one_row_compressed_with_the_shipped_dictionary(tmp_path: Path) -> None:
    log = SqliteEventLog(tmp_path / "log.db", encrypt=False)  # the records as the codec writes them
    sid = "6a0b4c2e9f3d41b7a8e5c1d2f3a4b5c6"
    written = _turn(sid, 1, 20)
    await log.append(written[:12], expected_version=0)
    await log.append(written[12:], expected_version=12)
    assert await log.read_session(sid) == written
    await log.close()
    rows = _stored(tmp_path / "log.db")
    assert [n for n, _ in rows] == [12, 8]
    assert all(v[:4] == zdict.ZSTD_MAGIC for _, v in rows)
    assert {zstandard.get_frame_parameters(v).dict_id for _, v in rows} == {zdict.DICT_ID}
    alone = sum(len(zdict.pack(codec.encode(e))) for e in written)
    assert sum(len(v) for _, v in rows) < 0.8 * alone, "records compressed together share their context"
    assert [codec.decode(r) for _, v in rows for r in split_batch(v)] == written


async def test_a_log_written_uncompressed_opens_reads_and_goes_on_compressed(tmp_path: Path) -> None:
    """An older turnlog wrote plain Avro values: the file needs no migration."""
    path = tmp_path / "old.db"
    old = SqliteEventLog(path, compress=False)
    first = _turn("s1", 1, 10)
    await old.append(first, expected_version=0)
    await old.close()
    assert all(v[:4] != zdict.ZSTD_MAGIC for _, v in _stored(path))

    log = SqliteEventLog(path)
    assert await log.read_session("s1") == first
    more = _turn("s1", 11, 5)
    await log.append(more, expected_version=10)
    assert await log.read_session("s1") == first + more
    assert [r.event for r in await log.read_partition(log_partition(log, "s1"), 0, 100)] == first + more
    await log.close()
    assert [v[:4] == zdict.ZSTD_MAGIC for _, v in _stored(path)] == [False, True]


def log_partition(log: SqliteEventLog, sid: str) -> int:
    from turnlog.engine.log.base import partition_for

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


async def test_a_corrupt_compressed_batch_names_where_it_starts(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    log = SqliteEventLog(path)
    await log.append(_turn("s1", 1, 3), expected_version=0)
    await log.append(_turn("s1", 4, 2), expected_version=3)
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        (value,) = db.execute("SELECT value FROM batches WHERE version = 4").fetchone()
        broken = bytes(value[:-4]) + b"\xff\xff\xff\xff"
        db.execute("UPDATE batches SET value = ? WHERE version = 4", (broken,))
    await log.close()
    reader = SqliteEventLog(path)  # a reader of the file (the writer holds what it appended last)
    with pytest.raises(MalformedEventError, match=r"offsets from 4: corrupt compressed value"):
        await reader.read_session("s1")
    assert [r.event.version for r in await reader.read_partition(log_partition(reader, "s1"), 0, 3)] == [
        1,
        2,
        3,
    ]
    await reader.close()


def test_the_dictionary_ships_with_the_package() -> None:
    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert '"turnlog.engine.log" = ["*.zdict"]' in pyproject
    assert zdict.dictionary_path(zdict.DICT_ID).stat().st_size > 1024


async def test_the_dictionary_trainer_makes_a_dictionary_from_engine_sessions() -> None:
    """scripts/train_zdict.py runs the engine on generated sessions and trains on their records:
    they decode as events of many types, and its dictionary compresses them better than none."""
    path = Path(__file__).resolve().parent.parent / "scripts" / "train_zdict.py"
    spec = importlib.util.spec_from_file_location("train_zdict", path)
    assert spec is not None and spec.loader is not None
    trainer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trainer)
    records = await trainer.corpus(sessions=3, turns=4)
    types = {codec.decode(r).type for r in records}
    assert {"SessionCreated", "ToolCallFinished", "SnapshotTaken", "TurnFinished"} <= types
    trained = zstandard.ZstdCompressionDict(trainer.train(records, size=2048, dict_id=99))
    with_dict = zstandard.ZstdCompressor(level=zdict.LEVEL, dict_data=trained)
    plain = zstandard.ZstdCompressor(level=zdict.LEVEL)
    assert trained.dict_id() == 99
    assert sum(len(with_dict.compress(r)) for r in records) < sum(len(plain.compress(r)) for r in records)


OLD_SIDE_TABLES = """
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
"""The tables beside the events that layouts 1 and 2 share (verbatim, 4 partitions)."""

LAYOUT_1 = (
    """
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
"""
    + OLD_SIDE_TABLES
)
"""The tables as turnlog wrote them before layout 2 (verbatim)."""


def _layout_1_file(path: Path, sessions: dict[str, list[ev.Event]]) -> None:
    """A log file as an older turnlog left it: positions interleaved across sessions."""
    from turnlog.engine.log.base import partition_for

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
        assert layout(db) == 3 and not db.execute("PRAGMA table_info(events)").fetchall()
    rows = _stored(path)
    assert all(v[:4] == zdict.ZSTD_MAGIC for _, v in rows), "old values compressed"
    reopened = SqliteEventLog(path, partitions=4)  # migrated once: opens as layout 3
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


LAYOUT_2 = (
    """
CREATE TABLE sessions (key INTEGER PRIMARY KEY, session_id TEXT NOT NULL UNIQUE);
CREATE TABLE events (
    position   INTEGER PRIMARY KEY,
    partition  INTEGER NOT NULL,
    session    INTEGER NOT NULL,
    version    INTEGER NOT NULL,
    type       TEXT    NOT NULL,
    value      BLOB    NOT NULL,
    UNIQUE (session, version)
);
CREATE INDEX events_by_partition ON events (partition, position);
CREATE INDEX snapshots_by_session ON events (session, version) WHERE type = 'SnapshotTaken';
"""
    + OLD_SIDE_TABLES
)
"""The tables as turnlog wrote them in layout 2 (verbatim): a row per event."""


def _layout_2_file(path: Path, runs: list[list[ev.Event]]) -> dict[int, str]:
    """A layout-2 file whose appends were ``runs``, in this order; position -> session:version."""
    from turnlog.engine.log.base import partition_for

    keys: dict[str, int] = {}
    rows: list[tuple[int, int, int, int, str, bytes]] = []
    for run in runs:
        for e in run:
            key = keys.setdefault(e.session_id, len(keys) + 1)
            value = zdict.pack(codec.encode(e))
            rows.append((len(rows) + 1, partition_for(e.session_id, 4), key, e.version, e.type, value))
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.executescript(LAYOUT_2)
        db.executemany("INSERT INTO sessions VALUES (?, ?)", [(k, s) for s, k in keys.items()])
        db.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)", rows)
        db.execute("INSERT INTO group_offsets VALUES ('projector', 2, 7)")
    return {r[0]: f"{next(s for s, k in keys.items() if k == r[2])}:{r[3]}" for r in rows}


async def test_a_layout_2_file_is_migrated_on_open_keeping_every_offset(tmp_path: Path) -> None:
    path = tmp_path / "layout2.db"
    a, b = "a" * 32, "b" * 32
    sessions = {a: _turn(a, 1, 150) + [_snapshot(a, 151)], b: _turn(b, 1, 30)}
    runs = [sessions[a][:100], sessions[b][:10], sessions[a][100:], sessions[b][10:]]
    old_positions = _layout_2_file(path, runs)
    bad = next(p for p, name in old_positions.items() if name == f"{b}:5")
    with contextlib.closing(sqlite3.connect(path)) as db, db:  # one value the old file had broken
        db.execute("UPDATE events SET value = ? WHERE position = ?", (zdict.ZSTD_MAGIC + b"\x00broken", bad))

    log = SqliteEventLog(path, partitions=4)
    assert await log.read_session(a) == sessions[a]
    assert await log.read_session(b, 5) == sessions[b][5:]
    with pytest.raises(MalformedEventError, match=rf"offsets from {bad}: corrupt compressed value"):
        await log.read_session(b)
    assert await log.latest_snapshot(a) == sessions[a][-1]
    assert await log.session_version(a) == 151 and await log.session_version(b) == 30
    assert await log.committed("projector", 2) == 7
    positions, skipped = {}, []
    for p in range(4):
        offset = 0
        while (page := await _page(log, p, offset, 7)) != []:
            if page is None:  # the broken value: a consumer stops there; step over it
                skipped.append(offset)
                offset += 1
                continue
            positions.update({r.offset: f"{r.event.session_id}:{r.event.version}" for r in page})
            offset = page[-1].offset + 1
    assert skipped == [bad]
    assert positions == {p: name for p, name in old_positions.items() if p != bad}, "offsets kept"
    await log.append(_turn(a, 152, 2), expected_version=151)
    await log.close()

    rows = _stored(path)
    assert len(rows) < 10, "runs of one session become batches of up to MIGRATED_BATCH events"
    assert sum(n for n, _ in rows) == 183
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert layout(db) == 3


async def _page(log: SqliteEventLog, partition: int, offset: int, limit: int) -> list[LogRecord] | None:
    """``read_partition``, or the records up to an undecodable one, or None at it."""
    try:
        return await log.read_partition(partition, offset, limit)
    except MalformedEventError:
        return None if limit == 1 else await _page(log, partition, offset, 1)
