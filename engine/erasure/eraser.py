"""``Eraser``: erase a session's or a user's content (crypto-shredding, issue 43).

A request is recorded in the key store first (scope, subject, the sessions it covers), so it is
durable before anything happens and a process that dies halfway leaves it pending for the next
(``resume``). Then, for the sessions a batch at a time, each step safe to run again:

1. the erasure goes on each session's log (``AgentSessions.record_erasure``: an open session is
   force-finished in the same commit, its running turn stopped; on Kafka by the partition's
   owner), idempotent by an event id derived from the request and the session;
2. the keys are destroyed in one key-store transaction (this process's cipher forgets them; other
   processes drop theirs on the erasure event, or on their next read of the embedded log);
3. the deployment's steps run (``ErasureStep``: the projections refolded, memories deleted);
4. the sessions are marked done.

At the end the steps finish (purge the projections' files, compact the memory store), the key
store is purged, and the request is done. docs/architecture.md, "Data lifecycle", has the rest.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol, Sequence

import structlog

from ..crypto.cipher import ContentCipher
from ..crypto.keystore import ErasureRecord, Scope
from ..errors import ConfigurationError, SessionNotFoundError
from ..events import SessionErased, new_id, now_ms
from ..session import AgentSessions

log = structlog.get_logger("turnlog.erasure")
BATCH = 200
"""Sessions whose keys are destroyed in one key-store transaction (and marked done together)."""
CONCURRENCY = 64
"""Sessions whose erasure events are being appended at once (the log's group commit shares them)."""
SessionFinder = Callable[[str], Awaitable[Sequence[str]]]
"""A user's sessions the key store does not know (written before encryption): the projections'."""


@dataclass(frozen=True)
class ErasureReport:
    """What an erasure request did (``Eraser.erase_session`` / ``erase_user`` / ``resume``)."""

    erasure_id: str
    scope: Scope
    subject: str
    state: str
    """``done`` once every step ran."""
    sessions: int
    """Sessions the request covers."""
    erased_now: int
    """Of them, the sessions whose keys this call destroyed (0 when it had been done before)."""
    unerasable: tuple[str, ...] = ()
    """Sessions that had no key: written before encryption, their log records keep plaintext
    (``turnlog migrate-encrypt`` copies such a log into an encrypted one)."""


class ErasureStep(Protocol):
    """What a deployment adds to an erasure: the projections (projections/erasure.py), the
    long-term memories (``MemoryForgetter``)."""

    name: str

    async def erased(self, record: ErasureRecord, session_ids: Sequence[str]) -> None:
        """The sessions' keys are destroyed: remove what is derived from their content."""
        ...

    async def finished(self, record: ErasureRecord, resumed: bool) -> None:
        """Every session of the request is done: make what was removed leave the storage files
        (``resumed``: the request was begun by a process that died, which may have removed
        things it did not purge)."""
        ...


class SessionEraser(Protocol):
    """What a caller that erases sessions needs (the lifecycle sweeper's retention)."""

    async def erase_session(self, session_id: str, reason: str, *, actor: str = "admin") -> ErasureReport: ...


def erasure_event_id(erasure_id: str, session_id: str) -> str:
    """The erasure event's id for a session: the same on every attempt, so a repeat is skipped."""
    return hashlib.sha256(f"{erasure_id}\x1f{session_id}".encode()).hexdigest()[:32]


class Eraser:
    """Erases content for one deployment: its API (the log), its cipher (the key store) and
    its steps. ``find_sessions``: a user's sessions beyond the key store's."""

    def __init__(
        self,
        api: AgentSessions,
        cipher: ContentCipher,
        steps: Sequence[ErasureStep] = (),
        *,
        find_sessions: SessionFinder | None = None,
        clock: Callable[[], int] = now_ms,
        batch: int = BATCH,
    ) -> None:
        self.api = api
        self.cipher = cipher
        self.keys = cipher.keys
        self.steps = list(steps)
        self.find_sessions = find_sessions
        self.clock = clock
        if batch < 1:
            raise ConfigurationError(f"an erasure's batch is at least 1 session, not {batch}")
        self.batch = batch
        """Sessions per key-store transaction: the work a crash can make the next process redo."""
        self._lock = asyncio.Lock()

    @staticmethod
    def cipher_of(api: AgentSessions) -> ContentCipher:
        """The content cipher of the API's log; ConfigurationError if it encrypts nothing."""
        records = getattr(api.log, "records", None)
        sealer = getattr(records, "sealer", None)
        if not isinstance(sealer, ContentCipher):
            raise ConfigurationError(
                f"this log ({type(api.log).__name__}) does not encrypt content, so nothing can be erased: "
                "the embedded log encrypts by default; a Kafka deployment needs TURNLOG_KEYSTORE "
                "(a PostgreSQL DSN) in every process (docs/architecture.md, 'Data lifecycle')"
            )
        return sealer

    async def erase_session(self, session_id: str, reason: str, *, actor: str = "admin") -> ErasureReport:
        return await self._erase("session", session_id, reason, actor)

    async def erase_user(self, user_id: str, reason: str, *, actor: str = "admin") -> ErasureReport:
        return await self._erase("user", user_id, reason, actor)

    async def resume(self) -> list[ErasureReport]:
        """Finish every request a process left pending (a crash, a kill), oldest first."""
        async with self._lock:
            return [await self._run(record, resumed=True) for record in self.keys.pending_erasures()]

    async def _erase(self, scope: Scope, subject: str, reason: str, actor: str) -> ErasureReport:
        async with self._lock:
            pending = self.keys.pending_erasures(scope, subject)
            if pending:  # a request for the same subject that a crash cut: finish that one
                return await self._run(pending[0], resumed=True)
            if scope == "session" and (earlier := self._done_before(subject)) is not None:
                return earlier
            sessions = await self._sessions(scope, subject)
            live = [sid for sid in sessions if not _erased(self.keys.get(sid))]
            request = ErasureRecord(
                new_id(), scope, subject, reason, actor, "pending", self.clock(), None, 0, 0
            )
            record = self.keys.begin_erasure(request, live)
            log.info("erasure.requested", erasure=record.erasure_id, scope=scope, sessions=len(live))
            return await self._run(record, resumed=False)

    def _done_before(self, session_id: str) -> ErasureReport | None:
        """The report of the request that erased the session already, if one did."""
        key = self.keys.get(session_id)
        earlier = (
            self.keys.erasure(key.erasure_id) if key is not None and key.erased and key.erasure_id else None
        )
        if earlier is None or earlier.state != "done":
            return None
        return ErasureReport(
            earlier.erasure_id, earlier.scope, earlier.subject, earlier.state, earlier.sessions, 0,
            self._unerasable(earlier),
        )  # fmt: skip

    async def _sessions(self, scope: Scope, subject: str) -> list[str]:
        if scope == "session":
            if self.keys.get(subject) is None and await self.api.log.session_version(subject) == 0:
                raise SessionNotFoundError(subject)
            return [subject]
        found = set(self.keys.sessions_of(subject))
        if self.find_sessions is not None:
            found.update(await self.find_sessions(subject))
        return sorted(found)

    async def _run(self, record: ErasureRecord, *, resumed: bool) -> ErasureReport:
        todo = self.keys.erasure_sessions(record.erasure_id, done=False)
        erased_now = 0
        for i in range(0, len(todo), self.batch):
            batch = todo[i : i + self.batch]
            await self._on_logs(record, batch)
            destroyed = self.keys.destroy(batch, record.erasure_id, self.clock())
            erased_now += len(destroyed)
            for sid in batch:
                self.cipher.forget(sid)
            for step in self.steps:
                await step.erased(record, batch)
            self.keys.sessions_done(record.erasure_id, batch)
        for step in self.steps:
            await step.finished(record, resumed)
        self.keys.purge()
        self.keys.finish_erasure(record.erasure_id, self.clock())
        done = self.keys.erasure(record.erasure_id) or record
        log.info("erasure.done", erasure=record.erasure_id, sessions=done.sessions, erased_now=erased_now)
        return ErasureReport(
            record.erasure_id,
            record.scope,
            record.subject,
            done.state,
            done.sessions,
            erased_now,
            self._unerasable(record),
        )

    async def _on_logs(self, record: ErasureRecord, session_ids: Sequence[str]) -> None:
        """The erasure event on each session's log, ``CONCURRENCY`` at a time."""
        gate = asyncio.Semaphore(CONCURRENCY)
        user = record.subject if record.scope == "user" else ""

        async def one(sid: str) -> None:
            key = self.keys.get(sid)
            erased = SessionErased(
                session_id=sid,
                version=0,
                event_id=erasure_event_id(record.erasure_id, sid),
                erasure_id=record.erasure_id,
                scope=record.scope,
                reason=record.reason,
                actor=record.actor,
                user_id=key.user_id if key is not None and key.user_id else user,
                producer=self.api.producer,
            )
            async with gate:
                try:
                    await self.api.record_erasure(erased)
                except SessionNotFoundError:  # a key made for a session whose first append failed
                    log.info("erasure.no_session_on_log", erasure=record.erasure_id, session=sid)

        await asyncio.gather(*(one(sid) for sid in session_ids))

    def _unerasable(self, record: ErasureRecord) -> tuple[str, ...]:
        """The request's sessions that had no key when it erased them (their row is a tombstone
        the erasure made, naming no master key)."""
        found = []
        for sid in self.keys.erasure_sessions(record.erasure_id, done=True):
            key = self.keys.get(sid)
            if key is not None and key.erasure_id == record.erasure_id and not key.master_key_id:
                found.append(sid)
        return tuple(found)


def _erased(key: object) -> bool:
    return key is not None and getattr(key, "erased", False)
