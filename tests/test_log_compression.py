"""The embedded log's values compressed with the shipped zstd dictionary (engine.log.zdict):
new rows are compressed, rows of older files (plain Avro) still read, and a value the
shipped dictionaries cannot read is refused with a message that says what to do."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import zstandard

from engine import codec
from engine import events as ev
from engine.errors import MalformedEventError
from engine.log import zdict
from engine.log.sqlite import SqliteEventLog


def _turn(sid: str, start: int, n: int) -> list[ev.Event]:
    out: list[ev.Event] = []
    for v in range(start, start + n):
        if v == 1:
            out.append(ev.SessionCreated(session_id=sid, version=1, agent_id="support", user_id="u-1"))
        else:
            text = f"Where is my parcel {v}? It left the warehouse last week and the tracking page says nothing."
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
    assert sum(len(v) for _, v in rows) < 0.8 * sum(len(codec.encode(e)) for e in written)


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
