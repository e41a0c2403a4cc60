"""The session index of a Kafka log: a compacted ``<topic>.sessions`` topic, so that a new owner
takes a partition over in time bounded by its live sessions, not by its history.

Partition ``p`` of the index describes events partition ``p``. Each record's key is a session
id and its value a ``SessionEntry``: where the session's records are (runs of offsets), its
version, whether it is closed and whether it is live (a turn running, messages waiting, or not
at rest). One more record, key ``WATERMARK``, says up to which events offset the entries are
complete, and the partition's next inbox offset to sequence as of that offset. The owner writes
the entries of the sessions that changed, then the watermark, inside one of its partition
transactions (at most every ``INDEX_EVERY_S``, and when it closes): a fenced zombie cannot
write the index, and the index is never ahead of the events.

A takeover reads the index (one record per session once compacted), folds the live sessions
from their records (a per-session read of their runs), reads the events after the watermark,
and loads any other session the first time something asks for it. No watermark (an index never
written, or deleted) means the full read from offset 0; an index that lags means a longer read
after its watermark. Both are correct, only slower.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition

from ..errors import LogError

WATERMARK = b"\x00watermark"
"""The key of the record holding the events offset the entries are complete up to."""
INDEX_EVERY_S = 1.0
"""How often an owner that appends writes the entries of the sessions it changed."""
RUN_GAP = 64
"""Offsets between two records of a session under which they share one run (a per-session read
reads the few records in between and drops them)."""


@dataclass(frozen=True, slots=True)
class SessionEntry:
    """What a takeover knows of a session before reading it."""

    version: int
    closed: bool
    live: bool
    runs: tuple[tuple[int, int], ...]
    """Half-open offset ranges of the events partition that hold every record of the session."""


@dataclass
class SessionIndex:
    """One index partition as read: the watermark (None if never written) and the entries."""

    watermark: int | None = None
    inbox_next: int = 0
    """The partition's next inbox offset to sequence as of the watermark (0: not recorded)."""
    entries: dict[str, SessionEntry] = field(default_factory=dict)


def add_run(runs: list[list[int]], offset: int) -> None:
    """Extend a session's runs with the record at ``offset`` (offsets come in order)."""
    if runs and offset - runs[-1][1] < RUN_GAP:
        runs[-1][1] = offset + 1
    else:
        runs.append([offset, offset + 1])


def encode_entry(entry: SessionEntry) -> bytes:
    doc = {"v": entry.version, "c": entry.closed, "l": entry.live, "r": [list(r) for r in entry.runs]}
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_entry(value: bytes) -> SessionEntry:
    doc = json.loads(value)
    runs = tuple((int(start), int(end)) for start, end in doc["r"])
    return SessionEntry(int(doc["v"]), bool(doc["c"]), bool(doc["l"]), runs)


def encode_watermark(offset: int, inbox_next: int) -> bytes:
    return json.dumps({"o": offset, "i": inbox_next}).encode()


def apply_record(index: SessionIndex, key: bytes | None, value: bytes | None) -> None:
    """Fold one index record into ``index`` (later records replace earlier ones)."""
    if key is None or value is None:
        return
    try:
        if key == WATERMARK:
            doc = json.loads(value)
            index.watermark, index.inbox_next = int(doc["o"]), int(doc.get("i", 0))
        else:
            index.entries[key.decode()] = decode_entry(value)
    except (ValueError, KeyError, TypeError) as exc:
        raise LogError(f"a corrupt session index record ({key!r}): {exc}") from exc


async def read_index(reader: AIOKafkaConsumer, tp: TopicPartition, timeout_s: float) -> SessionIndex:
    """Every committed record of one index partition, folded (the caller holds the reader)."""
    index = SessionIndex()
    async with asyncio.timeout(timeout_s):
        end = (await reader.end_offsets([tp]))[tp]
        if end == 0:
            return index
        reader.assign([tp])
        reader.resume(tp)
        reader.seek(tp, 0)
        while await reader.position(tp) < end:
            batch = await reader.getmany(tp, timeout_ms=50, max_records=5000)
            for msg in batch.get(tp, []):
                apply_record(index, msg.key, msg.value)
        reader.pause(tp)
    return index


def merged(runs: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Runs of several sessions as few ranges to read, in offset order."""
    out: list[list[int]] = []
    for start, end in sorted(runs):
        if out and start - out[-1][1] < RUN_GAP:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(start, end) for start, end in out]


async def read_runs(
    reader: AIOKafkaConsumer, tp: TopicPartition, wanted: dict[str, SessionEntry]
) -> dict[str, list[Any]]:
    """The consumed records of the ``wanted`` sessions (by key), read range by range, in offset
    order per session. The reader is assigned ``tp`` and left resumed: the caller pauses it or
    seeks it back to where it was reading."""
    keys = {sid.encode(): sid for sid in wanted}
    found: dict[str, list[Any]] = {sid: [] for sid in wanted}
    if reader.assignment() != {tp}:
        reader.assign([tp])
    reader.resume(tp)
    for start, end in merged(r for entry in wanted.values() for r in entry.runs):
        reader.seek(tp, start)
        while await reader.position(tp) < end:
            batch = await reader.getmany(tp, timeout_ms=50, max_records=1000)
            for msg in batch.get(tp, []):
                if msg.offset < end and (sid := keys.get(msg.key)) is not None:
                    found[sid].append(msg)
    return found
