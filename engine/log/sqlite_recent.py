"""The records this process appended last, decoded, for this process's readers.

In one embedded process every consumer (the turn worker, the projector, analytics, observability,
memory) and every event stream reads what was just appended, and each read of the file
decompresses, decodes and decrypts the same records again: five to six times per event. The log
keeps the records it appended last, as ``append`` returned them, as many as ``BUDGET_BYTES``
allows by their estimated weight (a round of turns of a few hundred sessions, so a POST's fold of
what the turn worker appended since the last one is held too), and answers a read
from them when every record it returns is held here. It never answers with anything a read of
the file would not give once this process's writes are committed (the log waits for that
first, as for any read):

* only this process's appends are held: a read that reaches a position or a version another
  process wrote, or one older than the oldest held, reads the file;
* a redoable append whose COMMIT failed after it returned empties it (``clear``): its positions
  may be taken by other appends;
* an erased session's records are dropped (``drop_session``): when this process appends the
  erasure, and when the cipher finds another process erased it, so its content reads as erased,
  as it does from the file.

A partition's read takes the partition's own held positions (``PartitionPositions``) when every
position from where it starts is held (``_Solid``), so it does not step over the records of the
other partitions (a scan over every position is the fallback).
"""

from __future__ import annotations

import bisect
from collections import deque
from itertools import islice
from typing import Sequence

from .base import LogRecord

BUDGET_BYTES = 16 << 20
"""What the held records may weigh: the oldest go first past it."""
RECORD_OVERHEAD = 400
"""A decoded record's weight beyond its share of the append's encoded bytes (the event object,
its fields, the record and the indexes' entries)."""


class RecentRecords:
    """The records this process appended last, by position and by session, within
    ``budget_bytes`` (module docstring for when a read may be answered from them)."""

    def __init__(self, budget_bytes: int = BUDGET_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self.weight = 0
        """The held records' estimated bytes."""
        self._order: deque[tuple[LogRecord, int]] = deque()
        self._at: dict[int, LogRecord] = {}
        """By position: positions are the log's, over all partitions."""
        self._sessions: dict[str, deque[LogRecord]] = {}
        """Each session's held records of consecutive versions, oldest first."""
        self._forgotten: deque[str] = deque()
        """Sessions found erased (``forget``, any thread), dropped before the next read."""
        self._partitions: dict[int, PartitionPositions] = {}
        """Each partition's held positions, so a read skips the other partitions' records."""
        self._solid = _Solid()
        self.hits = 0
        """Reads answered from here (for tests and benchmarks)."""

    def add(self, records: Sequence[LogRecord], expected_version: int, encoded_bytes: int) -> None:
        """Hold the records of one append (the session's versions after ``expected_version``),
        ``encoded_bytes`` long as the log stores them uncompressed."""
        if not records or self.budget_bytes <= 0:
            return
        session_id = records[0].event.session_id
        tail = self._sessions.get(session_id)
        if tail is None or tail[-1].event.version != expected_version:  # another process's in between
            tail = self._sessions[session_id] = deque()
        weight = encoded_bytes // len(records) + RECORD_OVERHEAD
        positions = self._partitions.setdefault(records[0].partition, PartitionPositions())
        for record in records:
            self._order.append((record, weight))
            self._at[record.offset] = record
            tail.append(record)
            positions.add(record.offset)
            self._solid.add(record.offset)
        self.weight += weight * len(records)
        while self.weight > self.budget_bytes and self._order:
            evicted, evicted_weight = self._order.popleft()
            self.weight -= evicted_weight
            self._evict(evicted)

    def partition_run(self, partition: int, offset: int, limit: int) -> list[LogRecord] | None:
        """The partition's records from ``offset`` on (at most ``limit``) as far as every
        position from ``offset`` is held (a position is the log's: the partitions' records
        interleave); None if none is."""
        self._drop_forgotten()
        at = self._at
        if self._solid.holds_from(offset):  # every position from offset on is held
            positions = self._partitions.get(partition)
            held = positions.from_(offset, limit) if positions is not None else []
            if not held:
                return None
            self.hits += 1
            return [at[p] for p in held]
        run: list[LogRecord] = []
        record = at.get(offset)
        while record is not None and len(run) < limit:
            if record.partition == partition:
                run.append(record)
            offset += 1
            record = at.get(offset)
        if not run:
            return None
        self.hits += 1
        return run

    def session_after(self, session_id: str, after_version: int, through: int) -> list[LogRecord] | None:
        """The session's records with version > ``after_version``, when every one of them up to
        ``through`` is held; else None."""
        last = self.held_through(session_id, after_version)
        if last is None or last < through:
            return None
        self.hits += 1
        tail = self._sessions[session_id]  # consecutive versions: skip to the first one wanted
        return list(islice(tail, max(after_version + 1 - tail[0].event.version, 0), None))

    def forget(self, session_id: str) -> None:
        """The session was erased (the cipher's listener: any thread, so only noted here)."""
        self._forgotten.append(session_id)

    def _drop_forgotten(self) -> None:
        while self._forgotten:
            self.drop_session(self._forgotten.popleft())

    def held_through(self, session_id: str, after_version: int) -> int | None:
        """The last version held of the session when every one after ``after_version`` up to
        it is held; else None."""
        self._drop_forgotten()
        tail = self._sessions.get(session_id)
        if not tail or tail[0].event.version > after_version + 1:
            return None
        return tail[-1].event.version

    def drop_session(self, session_id: str) -> None:
        """Forget the session's records (it was erased): its reads go to the file."""
        for record in self._sessions.pop(session_id, ()):
            if self._at.get(record.offset) is record:
                del self._at[record.offset]
                self._solid.lost(record.offset)

    def clear(self) -> None:
        self.weight = 0
        self._order.clear()
        self._at.clear()
        self._sessions.clear()
        self._partitions.clear()
        self._solid = _Solid()

    def _evict(self, record: LogRecord) -> None:
        self._partitions[record.partition].evicted(record.offset)  # also one an erasure dropped
        if self._at.get(record.offset) is record:
            del self._at[record.offset]
            self._solid.lost(record.offset)
        session_id = record.event.session_id
        tail = self._sessions.get(session_id)
        if tail and tail[0] is record:
            tail.popleft()
            if not tail:
                del self._sessions[session_id]


class PartitionPositions:
    """One partition's held positions, ascending (appends of a group commit may be added out of
    order); evicted ones leave from the front."""

    def __init__(self) -> None:
        self._positions: list[int] = []
        self._start = 0
        """Positions before it are evicted (dropped from the list in chunks)."""

    def add(self, position: int) -> None:
        if not self._positions or position > self._positions[-1]:
            self._positions.append(position)
        else:
            bisect.insort(self._positions, position, lo=self._start)

    def evicted(self, position: int) -> None:
        i = bisect.bisect_left(self._positions, position, lo=self._start)
        if i < len(self._positions) and self._positions[i] == position:
            if i == self._start:
                self._start += 1
            else:
                del self._positions[i]
        if self._start > 1024 and self._start * 2 > len(self._positions):
            del self._positions[: self._start]
            self._start = 0

    def from_(self, position: int, limit: int) -> list[int]:
        """Up to ``limit`` held positions from ``position`` on."""
        i = bisect.bisect_left(self._positions, position, lo=self._start)
        return self._positions[i : i + limit]


class _Solid:
    """Where the held positions run without a hole to the last one: from ``start`` to ``last``
    every position is held. A hole (another process's record, an evicted or erased one) moves
    ``start`` past it; a position added below ``start`` leaves it (a read from there checks
    each position instead)."""

    def __init__(self) -> None:
        self.start = self.last = -1

    def add(self, position: int) -> None:
        if self.last < 0 or position > self.last + 1:
            self.start = position  # the first, or a hole before it
        if position > self.last:
            self.last = position

    def lost(self, position: int) -> None:
        if position >= self.start:
            self.start = position + 1

    def holds_from(self, position: int) -> bool:
        return 0 <= self.start <= position <= self.last
