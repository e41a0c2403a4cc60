"""What a Kafka log process knows of one partition of the events topic: its committed records in
offset order, and each session's events, version and whether it is closed.

The owner of a partition builds it by reading the partition (read_committed) after fencing the
previous owner, then adds its own appends as they commit, so it is exact: the expected-version
check of ``append`` is made against it. A process that does not own the partition catches it
up from Kafka before answering a read.

A partition taken over through the session index (``kafka_sessions``) starts at the index's
watermark (``base``): sessions the index names are ``unloaded`` until the owner folds their
records on demand (``load``); a consumer that asks for records before ``base`` gets the ones
their sessions' folds took (``taken``). Past its memory budget the index moves ``base`` on and
unloads the sessions at rest the same way (``trim``; ``kafka_held`` says why and how).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, fields
from typing import Any, Collection, Sequence

from ..errors import LogError, TurnlogError
from ..events import Event, SessionClosed
from ..fold import SessionState
from ..states import RESTING
from .base import LogRecord
from .kafka_held import UNBOUNDED, WINDOW_SHARE, HeldCounts, record_bytes, window_start
from .kafka_records import Poison, decode_record, inbox_offset_of, poison_of
from .kafka_sessions import SessionEntry, add_run
from .sealing import PLAIN, RecordCodec
from .submissions import submission_keys


@dataclass
class PartitionIndex:
    partition: int
    records: list[LogRecord] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    """records[i].offset, for bisecting."""
    sessions: dict[str, list[Event]] = field(default_factory=dict)
    session_records: dict[str, list[LogRecord]] = field(default_factory=dict)
    """Each session's records (its events with their offsets), for per-session reads."""
    states: dict[str, SessionState] = field(default_factory=dict)
    """Each session's fold: a record that breaks it is poison and stays out of the index."""
    poison: list[Poison] = field(default_factory=list)
    """Records of the partition left out of the index, in offset order (engine.log.kafka_poison)."""
    dead_sources: set[str] = field(default_factory=set)
    """Sources already in the dead-letter topic (read by the owner when it takes the partition)."""
    closed: set[str] = field(default_factory=set)
    submissions: dict[str, dict[str, int]] = field(default_factory=dict)
    """Each session's submission keys (engine.log.submissions) and the version that holds each:
    an inbox record whose key its session holds is not sequenced again."""
    next_offset: int = 0
    """Where reading the partition from Kafka continues (past records and transaction markers)."""
    own_marker: bool = False
    """The owner's last transaction ended with events here: its commit marker is at next_offset."""
    runs: dict[str, list[list[int]]] = field(default_factory=dict)
    """Each session's records as runs of offsets (``kafka_sessions.SessionEntry.runs``)."""
    dirty: set[str] = field(default_factory=set)
    """Sessions changed since the owner last wrote their session index entries."""
    unloaded: dict[str, SessionEntry] = field(default_factory=dict)
    """Sessions the session index names whose records are not read yet (``load``)."""
    base: int = 0
    """``records`` holds the partition from this offset (the index's watermark at takeover)."""
    inbox_next: int = 0
    """The partition's next inbox offset to sequence, as its events say (``INBOX_HEADER``, the
    session index's watermark, the owner's own sequencing): the inbox records below it are on
    the partition, whatever offset the owners' group committed last."""
    codec: RecordCodec = PLAIN
    """How the partition's records decode (the log's sealer), and what an erasure scrubs."""
    budget: int = UNBOUNDED
    """The bytes (``kafka_held.record_bytes``) past which ``trim`` unloads idle sessions."""
    weights: list[int] = field(default_factory=list)
    """records[i]'s estimated bytes."""
    session_bytes: dict[str, int] = field(default_factory=dict)
    """Each loaded session's records' estimated bytes."""
    window_bytes: int = 0
    """The estimated bytes of ``records`` (the window: the partition from ``base`` on)."""
    outside_bytes: int = 0
    """The estimated bytes of the loaded sessions' records before ``base``."""
    trim_at: int = 0
    """``trim`` works once the index holds more than this and the budget."""
    counts: HeldCounts = field(default_factory=HeldCounts)
    """Sessions unloaded and read back (shared by the process's indexes, kept by ``reset``)."""

    def reset(self) -> None:
        """Forget everything read (a takeover from the session index that failed half-way)."""
        fresh = PartitionIndex(self.partition, codec=self.codec, budget=self.budget, counts=self.counts)
        for name in [f.name for f in fields(self)]:
            setattr(self, name, getattr(fresh, name))

    def version(self, session_id: str) -> int:
        if (entry := self.unloaded.get(session_id)) is not None:
            return entry.version
        events = self.sessions.get(session_id)
        return events[-1].version if events else 0

    def add(
        self, records: Sequence[LogRecord], next_offset: int | None = None
    ) -> list[tuple[LogRecord, str]]:
        """Index the records that fold into their sessions; return the others with the reason."""
        rejected: list[tuple[LogRecord, str]] = []
        for record in records:
            if record.offset < self.next_offset:
                continue  # already read (our own append, read back by a catch-up)
            self._need(record.event.session_id)
            if (reason := self._fold_in(record.event)) is not None:
                rejected.append((record, reason))
                self.next_offset = record.offset + 1
                continue
            weight = record_bytes(record.event)
            self.records.append(record)
            self.offsets.append(record.offset)
            self.weights.append(weight)
            self.window_bytes += weight
            self._index_session(record, weight)
            self.dirty.add(record.event.session_id)
        if records:
            self.next_offset = max(self.next_offset, records[-1].offset + 1)
        if next_offset is not None:
            self.next_offset = max(self.next_offset, next_offset)
        return rejected

    def _index_session(self, record: LogRecord, weight: int) -> None:
        event = record.event
        self.session_bytes[event.session_id] = self.session_bytes.get(event.session_id, 0) + weight
        self.sessions.setdefault(event.session_id, []).append(event)
        self.session_records.setdefault(event.session_id, []).append(record)
        add_run(self.runs.setdefault(event.session_id, []), record.offset)
        if isinstance(event, SessionClosed):
            self.closed.add(event.session_id)
        elif self.codec.erases(event):
            self._scrub(event.session_id)
        if keys := submission_keys(event):
            held = self.submissions.setdefault(event.session_id, {})
            for key in keys:
                held.setdefault(key, event.version)

    def _scrub(self, session_id: str) -> None:
        """The session was erased: its events held here decoded read as erased from now on,
        as a fresh read of them would (its fold scrubbed itself on the erasure)."""
        scrubbed = [
            LogRecord(r.partition, r.offset, self.codec.scrub(r.event))
            for r in self.session_records[session_id]
        ]
        self.session_records[session_id] = scrubbed
        self.sessions[session_id] = [r.event for r in scrubbed]
        for record in scrubbed:
            i = bisect.bisect_left(self.offsets, record.offset)
            if i < len(self.offsets) and self.offsets[i] == record.offset:
                self.records[i] = record

    def load(self, session_id: str, records: Sequence[LogRecord]) -> None:
        """Fold an unloaded session from its records before ``base`` (read through its session
        index entry, in offset order); records of other sessions, and ones that break the fold
        (poison, dead-lettered before the index was written), are left out as every reader does."""
        entry = self.unloaded.pop(session_id)
        self.counts.loaded += 1
        for record in records:
            if record.event.session_id == session_id and self._fold_in(record.event) is None:
                weight = record_bytes(record.event)
                if record.offset < self.base:  # from ``base`` on, the window holds it already
                    self.outside_bytes += weight
                self._index_session(record, weight)
        if self.version(session_id) != entry.version:
            raise LogError(
                f"partition {self.partition}: session {session_id} reads back at "
                f"v{self.version(session_id)}, its session index entry says v{entry.version}; "
                "the index is corrupt: delete the topic's .sessions topic and restart the owners "
                "(they read the partition in full)"
            )

    @property
    def held_bytes(self) -> int:
        """The estimated bytes of every record the index holds (``kafka_held``)."""
        return self.window_bytes + self.outside_bytes

    def trim(self, keep: Collection[str] = ()) -> None:
        """Past the budget: keep a quarter of it as the window (``base`` moves on) and unload
        sessions at rest written before it, least recently written first, down to half the
        budget, but none in ``keep`` (``kafka_held``). Called between reads and commits, never
        between a session's load and its use by the same caller."""
        if self.held_bytes <= max(self.budget, self.trim_at):
            return
        self._rebase(window_start(self.weights, self.budget // WINDOW_SHARE))
        pinned = {p.session_id for p in self.poison if p.source not in self.dead_sources}
        held_back = False
        for _, session_id in sorted(
            (records[-1].offset, sid)
            for sid, records in self.session_records.items()
            if records[-1].offset < self.base
        ):
            if self.held_bytes <= self.budget // 2:
                break
            if session_id in keep:
                held_back = True
            elif session_id not in pinned and not (entry := self.entry(session_id)).live:
                self._unload(session_id, entry)
        # a budget the live sessions fill: work again after half a budget more, not every batch;
        # but at the next call if only ``keep`` held sessions back
        self.trim_at = 0 if held_back else self.held_bytes + self.budget // 2

    def _rebase(self, start: int) -> None:
        """Drop ``records[:start]`` from the window; a loaded session keeps its share of them."""
        for record, weight in zip(self.records[:start], self.weights[:start], strict=True):
            self.window_bytes -= weight
            if record.event.session_id in self.states:
                self.outside_bytes += weight
        self.base = self.offsets[start] if start < len(self.offsets) else self.next_offset
        del self.records[:start], self.offsets[:start], self.weights[:start]

    def _unload(self, session_id: str, entry: SessionEntry) -> None:
        """Forget the session's records and fold, keeping its entry (``load`` reads it again)."""
        self.unloaded[session_id] = entry
        self.counts.unloaded += 1
        self.outside_bytes -= self.session_bytes.pop(session_id, 0)
        for kept in (self.sessions, self.session_records, self.states, self.submissions, self.runs):
            kept.pop(session_id, None)
        self.closed.discard(session_id)

    def entry(self, session_id: str) -> SessionEntry:
        """The session's session index entry as of ``next_offset``."""
        if (unloaded := self.unloaded.get(session_id)) is not None:
            return unloaded
        state = self.states[session_id]
        closed = session_id in self.closed
        live = not closed and (state.turn is not None or bool(state.inbox) or state.status not in RESTING)
        runs = tuple((start, end) for start, end in self.runs.get(session_id, []))
        return SessionEntry(self.version(session_id), closed, live, runs)

    def unsettled_poison(self) -> bool:
        """Whether a poison record is not dead-lettered yet (the index waits: a takeover that
        starts past it would not know it)."""
        return any(p.source not in self.dead_sources for p in self.poison)

    def _need(self, session_id: str) -> None:
        if session_id in self.unloaded:
            raise LogError(
                f"partition {self.partition}: session {session_id} is used before it is loaded from "
                "the session index (a bug in engine.log.kafka)"
            )

    def held_submission(self, event: Event) -> tuple[str, int] | None:
        """The first key of ``event`` its session already holds, and the version holding it."""
        self._need(event.session_id)
        held = self.submissions.get(event.session_id)
        if held:
            for key in submission_keys(event):
                if key in held:
                    return key, held[key]
        return None

    def continues_at(self, records: Sequence[LogRecord]) -> bool:
        """Whether the owner's just-committed ``records`` sit right where the index ends (after
        the marker of the owner's last commit); if not, another producer wrote in between."""
        expected = self.next_offset + (1 if self.own_marker else 0)
        return [r.offset for r in records] == list(range(expected, expected + len(records)))

    def add_poison(self, poison: Poison, offset: int) -> None:
        self.poison.append(poison)
        self.next_offset = max(self.next_offset, offset + 1)

    def add_consumed(self, msg: Any, entry: LogRecord | Poison | None = None) -> None:
        """Add a consumed events-topic record (``entry``: already decoded) to the index, or to
        its poison (kafka_poison)."""
        if entry is None:
            entry = decode_record(self.partition, msg, self.codec)
        if isinstance(entry, Poison):
            self.add_poison(entry, msg.offset)  # not an owner's record: its headers say nothing
            return
        if (inbox := inbox_offset_of(msg)) is not None:
            self.inbox_next = max(self.inbox_next, inbox)
        for record, reason in self.add([entry]):
            self.add_poison(poison_of(msg, reason, record.event.session_id), record.offset)

    def _fold_in(self, event: Event) -> str | None:
        sid = event.session_id
        state = self.states.get(sid) or SessionState(sid)
        try:
            state.apply(event)
        except (TurnlogError, ValueError, KeyError) as exc:
            return f"{event.type} v{event.version} breaks session {sid}'s fold: {exc}"
        self.states[sid] = state
        return None

    def taken(self, record: LogRecord) -> LogRecord | None:
        """The indexed record at ``record``'s offset if its (loaded) session's fold took it."""
        indexed = self.session_records.get(record.event.session_id, [])
        i = bisect.bisect_left(indexed, record.offset, key=lambda r: r.offset)
        return indexed[i] if i < len(indexed) and indexed[i].offset == record.offset else None

    def read(self, offset: int, limit: int) -> list[LogRecord]:
        start = bisect.bisect_left(self.offsets, offset)
        return self.records[start : start + limit]

    def holds_from(self, offset: int) -> bool:
        """Whether the partition has a record at or after ``offset`` as far as indexed (below
        the window's base: assumed so, those records are read from Kafka)."""
        return offset < self.base or bisect.bisect_left(self.offsets, offset) < len(self.offsets)

    def session_records_after(self, session_id: str, after_version: int) -> list[LogRecord]:
        self._need(session_id)
        return self.session_records.get(session_id, [])[after_version:]

    def session_after(self, session_id: str, after_version: int) -> list[Event]:
        self._need(session_id)
        events = self.sessions.get(session_id, [])
        # versions are 1..n without gaps, so version v sits at index v - 1
        return events[after_version:]
