"""The key store: every session's data key (wrapped by the master key), apart from the log, and
the erasure requests with their progress.

It lives apart from the log on purpose: destroying a row is what erases a session, and the log
is immutable (a Kafka topic cannot delete on time: compaction keeps a key's latest value until
it runs, and a tombstone still names the key). The embedded log's store is a SQLite file beside
it (``SqliteKeyStore``), the distributed backend's a PostgreSQL table (``PostgresKeyStore``);
both are ``engine.crypto.keystore_sql.SqlKeyStore``. Losing the store loses the content of every
session whose key it held: back it up with the log (docs/architecture.md says how).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

Scope = str
"""``user`` (every session of a user) or ``session`` (one session)."""


@dataclass(frozen=True, slots=True)
class DataKey:
    """One session's key row."""

    session_id: str
    user_id: str
    """The session's user ("" when the key was made for a session whose user was not known:
    one written before encryption, continued after)."""
    master_key_id: str
    wrapped: bytes | None
    """The data key wrapped by the master key; None once the session is erased."""
    created_ms: int
    erased_ms: int | None = None
    erasure_id: str | None = None

    @property
    def erased(self) -> bool:
        return self.wrapped is None


@dataclass(frozen=True, slots=True)
class ErasureRecord:
    """An erasure request as the key store keeps it: recorded before anything is done, so a
    process that dies halfway leaves it ``pending`` for the next one."""

    erasure_id: str
    scope: Scope
    subject: str
    """The user id or the session id."""
    reason: str
    actor: str
    state: str
    """``pending`` until every step ran, then ``done``."""
    requested_ms: int
    finished_ms: int | None
    sessions: int
    """Sessions the request covers."""
    done: int
    """Of them, sessions whose per-session steps have all run."""


class KeyStore(Protocol):
    """What ``ContentCipher`` and ``Eraser`` need of a key store (synchronous: a lookup is one
    indexed read; the cipher calls it from the log's codec path)."""

    def get(self, session_id: str) -> DataKey | None: ...

    def put(self, key: DataKey) -> DataKey:
        """Store ``key`` unless the session has one; return the session's row (another process
        may have made it first: then theirs)."""
        ...

    def sessions_of(self, user_id: str) -> list[str]: ...

    def destroy(self, session_ids: Sequence[str], erasure_id: str, now_ms: int) -> list[str]:
        """Erase the sessions' keys (a session without a row gets an erased one, so no key is
        ever made for it); return the sessions erased by this call."""
        ...

    def erased_since(self, seq: int) -> tuple[int, list[str]]:
        """The store's erasure sequence number now and the sessions erased after ``seq``."""
        ...

    def begin_erasure(self, record: ErasureRecord, session_ids: Sequence[str]) -> ErasureRecord:
        """Record a request and the sessions it covers (one transaction)."""
        ...

    def pending_erasures(
        self, scope: Scope | None = None, subject: str | None = None
    ) -> list[ErasureRecord]: ...

    def erasure(self, erasure_id: str) -> ErasureRecord | None: ...

    def erasure_sessions(self, erasure_id: str, *, done: bool) -> list[str]: ...

    def sessions_done(self, erasure_id: str, session_ids: Sequence[str]) -> None: ...

    def finish_erasure(self, erasure_id: str, now_ms: int) -> None: ...

    def purge(self) -> None:
        """Make destroyed keys leave the storage files (secure delete, checkpoint, vacuum)."""
        ...

    def close(self) -> None: ...
