"""The log interface: what every backend (embedded SQLite, Apache Kafka) provides.

The log is partitioned by session: every event of a session lands in the partition that
``partition_for(session_id, partitions)`` names, so one consumer owns a session at a time and
sees its events in order. Offsets are per-partition positions, increasing but not necessarily
contiguous. Per-session order is also carried by ``Event.version`` (1, 2, 3, ... no gaps); an
append names the version it expects the session to be at, which is the seed's state_version
optimistic lock applied to the log itself.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, AsyncGenerator, Callable, Iterable, Mapping, Protocol, Sequence

import structlog

from ..errors import ConcurrencyError, DuplicateSubmissionError, LogError, TurnlogError
from ..events import Event, SessionCreated, SessionForked, SnapshotTaken
from .submissions import NEW_SESSIONS

if TYPE_CHECKING:
    from ..fold import SessionState

PENDING = -1
"""The offset of a submission that is not sequenced yet (``LogRecord.pending``)."""
SESSIONS_PAGE = 1000
"""Sessions ``EventLog.sessions`` asks ``list_sessions`` for at a time."""
log = structlog.get_logger("turnlog.log")


@dataclass(frozen=True, slots=True)
class LogRecord:
    """An event with its position on the log: its partition and offset."""

    partition: int
    offset: int
    """``PENDING`` for a submission not sequenced yet (``EventLog.submit``)."""
    event: Event

    @property
    def pending(self) -> bool:
        """A submission the log took but has not sequenced yet: its event has version 0 and no
        position (on Kafka, from a process that does not own the partition)."""
        return self.offset == PENDING


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """A session as the log lists it (``EventLog.sessions``), without reading its events."""

    session_id: str
    partition: int
    version: int
    """Its last version: how many events it has."""


History = Callable[[int], Sequence[Event]]
"""A session's events after a version, as the admitting writer holds them."""


@dataclass(frozen=True, slots=True)
class Admitted:
    """A submission taken: the session's next events it becomes (its own event among them,
    keeping its event id)."""

    events: list[Event]


@dataclass(frozen=True, slots=True)
class Refused:
    """A submission that cannot be taken, and why: its submitter gets ``error`` (on Kafka the
    record goes to the dead-letter topic with it)."""

    error: TurnlogError


Admission = Admitted | Refused


class AdmissionPolicy(Protocol):
    """What a submitted event becomes on its session (``turnlog.engine.admission``): the
    engine's rules, handed to the log by whoever builds the owner side (``EventLog.admit_with``)
    so that a log never decides what a record means for a session."""

    def admit(self, state: SessionState, event: Event, history: History) -> Admission:
        """``event`` on the session folded as ``state`` (never changed); ``history(v)``: the
        session's events after version ``v``."""
        ...


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (signed 32-bit), so Java/Go producers keyed by session id agree with us."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    end = length - length % 4
    for i in range(0, end, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = length % 4
    if tail >= 3:
        h ^= data[end + 2] << 16
    if tail >= 2:
        h ^= data[end + 1] << 8
    if tail >= 1:
        h ^= data[end]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


@lru_cache(maxsize=65536)
def partition_for(session_id: str, partitions: int) -> int:
    """Stable partition of a session: Kafka's default keyed partitioner on the session id."""
    return (murmur2(session_id.encode()) & 0x7FFFFFFF) % partitions


def page_of(partition: int, versions: dict[str, int], after: str, limit: int) -> list[SessionSummary]:
    """The sessions of ``versions`` (id -> last version) after ``after``, in id order, at most ``limit``."""
    wanted = sorted(sid for sid in versions if sid > after)[: max(limit, 0)]
    return [SessionSummary(sid, partition, versions[sid]) for sid in wanted]


def holds_state(event: Event) -> bool:
    """A snapshot a session can be loaded from: a SnapshotTaken that is not a restore point."""
    return isinstance(event, SnapshotTaken) and event.holds_state


def first_state_snapshot(events: Sequence[Event]) -> int | None:
    """The version of the first snapshot in ``events`` that holds a state, or None."""
    return next((e.version for e in events if holds_state(e)), None)


def pending_record(event: Event, partitions: int) -> LogRecord:
    """A submission taken but not sequenced yet, as ``EventLog.submit`` returns it."""
    return LogRecord(
        partition_for(event.session_id, partitions), PENDING, dataclasses.replace(event, version=0)
    )


def check_batch(events: Sequence[Event], expected_version: int) -> str:
    """Validate that a batch is one session's next versions; return the session id."""
    if not events:
        raise LogError("append needs at least one event")
    session_id = events[0].session_id
    for i, event in enumerate(events):
        if event.session_id != session_id:
            raise LogError(
                f"one append must hold one session's events; got {session_id} and {event.session_id}"
            )
        if event.version != expected_version + 1 + i:
            raise LogError(
                f"session {session_id}: event {i} ({event.type}) has version {event.version}, "
                f"expected {expected_version + 1 + i} (versions are contiguous)"
            )
    return session_id


class EventLog(abc.ABC):
    """A durable, partitioned, append-only log of session events."""

    partitions: int
    admission: AdmissionPolicy | None = None
    """The rules this log's owner admits submissions by (``admit_with``); only the Kafka owner
    asks them (its inbox), the other backends' writers apply them themselves."""

    def admit_with(self, policy: AdmissionPolicy) -> AdmissionPolicy:
        """Hand the log the rules submissions are admitted by (``AgentSessions`` and
        ``TurnWorker`` do); the first one handed over stays. Returns the one in force."""
        if self.admission is None:
            self.admission = policy
        return self.admission

    @abc.abstractmethod
    async def append(
        self, events: Sequence[Event], *, expected_version: int, redoable: bool = False
    ) -> list[LogRecord]:
        """Append one session's next events atomically; durable when this returns.

        Raises ConcurrencyError if the session is not at ``expected_version``.

        ``redoable``: the caller can redo what the batch records if it is lost (a model call
        about to be made, results of tools that may run again), so a log may return once the
        batch is checked and ordered, before it is durable: the embedded log returns before
        the batch's COMMIT (its fsync in ``power`` durability) and commits it with the next
        append that waits, or when its hold ends (5 ms by default); readers see it only after
        that COMMIT. If the batch is then lost, the session's next append fails with
        LogUnavailableError. A batch holding a submission is never treated so (what a producer
        handed in is acknowledged).
        """

    async def submit(self, event: Event) -> list[LogRecord]:
        """Append a producer's event (``submissions.SUBMITTABLE``) at the session's next version,
        which the log assigns; durable when this returns. Returns the records it became, with
        their positions: the event itself (on Kafka, what the owner's admission policy made of
        it: ``admit_with``), or, for a repeat, the record already on the log.

        A producer outside the session's writer cannot know that version, and must not lose it
        to another append: the log assigns it where it orders appends. The embedded log reads the
        session's head inside the write transaction that appends it (``_append_next``), so
        concurrent submissions get consecutive versions and none is refused; the Kafka log hands
        the event to the partition's owner through its inbox topic (see docs/architecture.md).
        From a Kafka process that does not own the partition (or whose own sequencer has not
        sequenced it within 30 s) nothing is sequenced yet: it returns one pending record
        (``LogRecord.pending``: the event with version 0, offset ``PENDING``), and the owner
        sequences it later (``sequenced`` waits for it).

        Idempotent: an event the session already holds (the same event id, or a user message with
        the same message id, ``turnlog.engine.log.submissions``) is not appended again; the record
        already on the log is returned.
        """
        try:
            if isinstance(event, NEW_SESSIONS):  # a new session: version 1 or nothing
                return await self.append([event], expected_version=0)
            return [await self._append_next(event)]
        except DuplicateSubmissionError as held:
            return await self._held_submission(held)

    async def _append_next(self, event: Event) -> LogRecord:
        """Append ``event`` (a submission of an existing session) at the session's next version,
        read where the log orders its appends, so it never loses a version race: a writer that
        appended first only moves it one version on. Returns its record. Raises
        SessionNotFoundError for a session with no events, DuplicateSubmissionError for a
        submission the session holds."""
        raise NotImplementedError(f"{type(self).__name__} sequences no submissions: implement _append_next")

    async def _held_submission(self, held: DuplicateSubmissionError) -> list[LogRecord]:
        """The record a repeated submission names, as the log holds it."""
        log.info("log.submission_repeated", session=held.session_id, key=held.key, version=held.version)
        return (await self.read_session_records(held.session_id, held.version - 1))[:1]

    async def sequenced(self, record: LogRecord, timeout: float) -> LogRecord | None:
        """A submission's record once it is sequenced (a pending one: on Kafka, from a process
        that does not own its partition), or None if it is not on the log within ``timeout``
        seconds. Raises ConcurrencyError if a session it would open was opened by another event."""
        if not record.pending:
            return record
        event = record.event
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if (found := await self._find_sequenced(event)) is not None:
                return found
            left = deadline - loop.time()
            if left <= 0:
                return None
            await self.wait_for_session(event.session_id, min(left, 0.2))

    async def _find_sequenced(self, event: Event) -> LogRecord | None:
        """``event``'s record if the log holds it; ConcurrencyError if a session it would open
        was opened by another event."""
        records = await self.read_session_records(event.session_id, event.basis_version)
        found = next((r for r in records if r.event.event_id == event.event_id), None)
        if found is not None:
            return found
        first = records[0].event if records and records[0].event.version == 1 else None
        if isinstance(event, (SessionCreated, SessionForked)) and first is not None:
            raise ConcurrencyError(event.session_id, 0, await self.session_version(event.session_id))
        return None

    async def wait_for_session(self, session_id: str, timeout: float) -> None:
        """Wait at most ``timeout`` for news that may concern the session (a request another
        process applies to it): ``wait_for_append`` unless the log knows better. Callers read
        the session again after it, whatever woke them."""
        await self.wait_for_append(timeout)

    async def readiness_problem(self) -> str | None:
        """None if the log can serve now; else what keeps it from serving, and what to do (a
        health check). This default reads a partition's end."""
        await self.end_offset(0)
        return None

    def owned_partitions(self) -> Sequence[int]:
        """The partitions this process may append to (all of them, except on Kafka, where the
        consumer group assigns them)."""
        return range(self.partitions)

    async def read_session_records_through(
        self, session_id: str, after_version: int, version: int
    ) -> list[LogRecord]:
        """``read_session_records`` for a caller that knows the session's ``version`` is committed
        (a live notice of it arrived): a log whose reader already holds that version may answer
        from what it holds, without asking whether more was appended since (on Kafka, a round
        trip to the broker for the partition's end). It may return records beyond ``version``."""
        return await self.read_session_records(session_id, after_version)

    @abc.abstractmethod
    async def read_session(self, session_id: str, after_version: int = 0) -> list[Event]:
        """A session's events with version > after_version, in order."""

    async def latest_snapshot(self, session_id: str, at_or_before: int | None = None) -> Event | None:
        """The session's newest ``SnapshotTaken`` event that holds a state (``holds_state``:
        not a restore point) with version <= ``at_or_before`` (any version if None), or None
        (engine.snapshots).

        Loading a session starts from it (and from its keyframe, looked up with
        ``at_or_before``), so a backend should answer without reading the session's history:
        the SQLite log walks its (session, version) index back from the end to the newest batch
        with a snapshot, and decodes only that. This default reads the session and
        is correct for any backend, but O(history).
        """
        for event in reversed(await self.read_session(session_id)):
            if holds_state(event) and (at_or_before is None or event.version <= at_or_before):
                return event
        return None

    async def snapshots_between(self, session_id: str, first: int, last: int) -> list[Event]:
        """The session's snapshots that hold a state with ``first <= version <= last``, in order: a
        delta snapshot's chain (engine.snapshots.chain_of). This default reads the session from
        ``first``; the SQLite log reads only the batches from ``first``'s snapshot to ``last``
        and decodes only their snapshots."""
        events = await self.read_session(session_id, first - 1)
        return [e for e in events if holds_state(e) and e.version <= last]

    async def versions_of(self, session_id: str, types: Sequence[str], before: int) -> list[tuple[int, str]]:
        """(version, type) of the session's events of ``types`` below version ``before``, in order.

        For old snapshots that do not say which event each message came from. This default
        reads the session; the SQLite log answers from its table without decoding an event."""
        wanted = set(types)
        events = await self.read_session(session_id)
        return [(e.version, e.type) for e in events if e.type in wanted and e.version < before]

    async def read_session_records(self, session_id: str, after_version: int = 0) -> list[LogRecord]:
        """A session's events with version > after_version, with their log positions, in order.

        This default scans the session's partition; backends with a per-session index override it.
        """
        partition, offset, found = self.partition_of(session_id), 0, []
        while records := await self.read_partition(partition, offset):
            found += [
                r for r in records if r.event.session_id == session_id and r.event.version > after_version
            ]
            offset = records[-1].offset + 1
        return found

    @abc.abstractmethod
    async def session_version(self, session_id: str) -> int:
        """The session's last version (0 if it has no events)."""

    async def sessions(
        self, *, partitions: Iterable[int] | None = None, page: int = SESSIONS_PAGE
    ) -> AsyncGenerator[SessionSummary, None]:
        """Every session of the log (or of ``partitions``), partition by partition and by id
        within one: a stable order. Streamed ``page`` sessions at a time (``list_sessions``),
        so a large log is never listed at once."""
        for partition in range(self.partitions) if partitions is None else partitions:
            after = ""
            while True:
                found = await self.list_sessions(partition, after=after, limit=page)
                for summary in found:
                    yield summary
                if len(found) < page:
                    break
                after = found[-1].session_id

    async def list_sessions(
        self, partition: int, *, after: str = "", limit: int = SESSIONS_PAGE
    ) -> list[SessionSummary]:
        """One page of a partition's sessions: those whose id sorts after ``after``, in id
        order, at most ``limit``. This default scans the partition's records (correct for
        any backend, O(its history) a page); the backends answer from their indexes."""
        versions: dict[str, int] = {}
        offset = 0
        while records := await self.read_partition(partition, offset):
            for record in records:
                versions[record.event.session_id] = record.event.version
            offset = records[-1].offset + 1
        return page_of(partition, versions, after, limit)

    @abc.abstractmethod
    async def read_partition(self, partition: int, offset: int, limit: int = 500) -> list[LogRecord]:
        """Records of a partition at positions >= offset, in order, at most ``limit``."""

    @abc.abstractmethod
    async def end_offset(self, partition: int) -> int:
        """The offset the next record of the partition will have at least."""

    async def partitions_to_read(self, offsets: Mapping[int, int]) -> list[int]:
        """Of the partitions in ``offsets``, in order, those a follower's pass reads from its
        offset there: here all of them (a read that finds nothing costs no more than asking).
        The Kafka log leaves out those with no record at or after it, asking for every
        partition's end in one request, where a read asks for its own partition's."""
        return sorted(offsets)

    @abc.abstractmethod
    async def committed(self, group: str, partition: int) -> int:
        """The next offset a consumer group should read (0 if it never committed)."""

    @abc.abstractmethod
    async def commit(self, group: str, partition: int, offset: int) -> None:
        """Record that ``group`` has processed every record of ``partition`` before ``offset``."""

    @abc.abstractmethod
    async def wait_for_append(self, timeout: float) -> None:
        """Return when something may have been appended, or after ``timeout`` seconds."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    def partition_of(self, session_id: str) -> int:
        return partition_for(session_id, self.partitions)
