"""What the lifecycle sweeper (consumers/lifecycle.py) finds in the projections, and the one
table of its own it keeps there.

It never reads a session's history: the ``sessions`` rows carry the time of each session's last
event (``update_time_ms``) and of its close (``closed_at_ms``), both indexed
(``schema.INDEXES``), so a sweep reads only the sessions past a limit, oldest first, a page at a
time.

``lifecycle_erasures`` records which closed sessions the sweeper has had erased after their
retention, and which it is erasing now (a claim with a lease), so two sweepers do not erase one
session at once and a restarted one does not erase again what is done. It is not a read model
(nothing on the log makes it): ``turnlog rebuild`` and a projection schema change leave it, as
they leave the analytics tables. Lost, it costs one more (idempotent) erasure per session.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Sequence

from turnlog.engine.experiments.namespace import sql_exclusion

from .store import ProjectionStore, Row, Writer

ERASURES_DDL = """
    CREATE TABLE IF NOT EXISTS lifecycle_erasures (
        session_id  TEXT PRIMARY KEY,
        claimed_by  TEXT NOT NULL,
        claimed_ms  BIGINT NOT NULL,
        erased_ms   BIGINT
    )"""
PRODUCTION = sql_exclusion()
"""Experiment replays never expire (their runner resumes them) and are not erased by age."""

_CLAIM = (
    "INSERT INTO lifecycle_erasures (session_id, claimed_by, claimed_ms, erased_ms) VALUES (?, ?, ?, NULL) "
    "ON CONFLICT (session_id) DO UPDATE SET claimed_by = excluded.claimed_by, "
    "claimed_ms = excluded.claimed_ms WHERE lifecycle_erasures.erased_ms IS NULL "
    "AND (lifecycle_erasures.claimed_ms <= ? OR lifecycle_erasures.claimed_by = excluded.claimed_by)"
)
"""Take a session to erase: new, or its claim's lease ran out (a sweeper that died erasing it),
or it is this sweeper's own (restarted); never one erased already."""


@dataclass(frozen=True)
class Candidate:
    """A session past a lifecycle limit, as its ``sessions`` row says."""

    session_id: str
    agent_id: str
    version: int
    """The row's ``state_version``: an expiry is taken only if the log is still there."""
    at_ms: int
    """The time the limit counts from: its last event (expiry), or its close (retention)."""


@dataclass(frozen=True)
class AgentFilter:
    """Which sessions a policy covers: of the agents named (``include``), or of every agent but
    those (``exclude``: the deployment default, for every agent without a policy of its own)."""

    agent_ids: tuple[str, ...]
    include: bool

    def sql(self) -> tuple[str, list[str]]:
        if not self.agent_ids:
            return ("1 = 1" if not self.include else "1 = 0"), []
        marks = ", ".join("?" for _ in self.agent_ids)
        return f"agent_id {'IN' if self.include else 'NOT IN'} ({marks})", list(self.agent_ids)


class LifecycleStore:
    """The sweeper's reads of the ``sessions`` rows, and its erasure claims, in ``store``."""

    def __init__(self, store: ProjectionStore) -> None:
        self.store = store
        store.write(_create)

    def idle(
        self,
        agents: AgentFilter,
        states: Sequence[str],
        before_ms: int,
        after: tuple[int, str] | None,
        limit: int,
    ) -> list[Candidate]:
        """Open sessions in one of ``states`` whose last event is at or before ``before_ms``,
        oldest first, after the keyset ``after`` (time, id)."""
        where, params = agents.sql()
        marks = ", ".join("?" for _ in states)
        sql = (
            "SELECT session_id, agent_id, state_version, update_time_ms AS at_ms FROM sessions "
            f"WHERE closed = ? AND update_time_ms <= ? AND current_state IN ({marks}) AND {where} "
            f"AND {PRODUCTION}"
        )
        rows = self._page(sql, [False, before_ms, *states, *params], "update_time_ms", after, limit)
        return [_candidate(r) for r in rows]

    def due_for_erasure(
        self,
        agents: AgentFilter,
        closed_before_ms: int,
        live_claims_after_ms: int,
        after: tuple[int, str] | None,
        limit: int,
    ) -> list[Candidate]:
        """Closed sessions closed at or before ``closed_before_ms`` that are not erased yet nor
        claimed by a sweeper since ``live_claims_after_ms``, oldest close first."""
        where, params = agents.sql()
        sql = (
            "SELECT session_id, agent_id, state_version, closed_at_ms AS at_ms FROM sessions "
            f"WHERE closed = ? AND closed_at_ms <= ? AND {where} AND {PRODUCTION} AND NOT EXISTS ("
            "SELECT 1 FROM lifecycle_erasures e WHERE e.session_id = sessions.session_id "
            "AND (e.erased_ms IS NOT NULL OR e.claimed_ms > ?))"
        )
        values: list[object] = [True, closed_before_ms, *params, live_claims_after_ms]
        return [_candidate(r) for r in self._page(sql, values, "closed_at_ms", after, limit)]

    def _page(
        self, sql: str, params: list[object], column: str, after: tuple[int, str] | None, limit: int
    ) -> list[Row]:
        if after is not None:
            sql += f" AND ({column} > ? OR ({column} = ? AND session_id > ?))"
            params = [*params, after[0], after[0], after[1]]
        return self.store._query(f"{sql} ORDER BY {column}, session_id LIMIT ?", [*params, limit])

    async def claim(self, session_id: str, by: str, now_ms: int, lease_ms: int) -> bool:
        """Take the session to erase now (see ``_CLAIM``); False if another sweeper holds it or it
        is erased already."""
        params = (session_id, by, now_ms, now_ms - lease_ms)
        return await self.store.write_async(partial(_run, _CLAIM, params)) == 1

    async def erased(self, session_id: str, now_ms: int) -> None:
        """The session's erasure returned: it is never taken again."""
        sql = "UPDATE lifecycle_erasures SET erased_ms = ? WHERE session_id = ?"
        await self.store.write_async(partial(_run, sql, (now_ms, session_id)))

    def erasures(self) -> list[Row]:
        """Every row of the table, by session (tests, an operator's look)."""
        return self.store._query("SELECT * FROM lifecycle_erasures ORDER BY session_id")


def _candidate(row: Row) -> Candidate:
    return Candidate(row["session_id"], row["agent_id"], int(row["state_version"]), int(row["at_ms"]))


def _create(writer: Writer) -> None:
    writer.execute(ERASURES_DDL)


def _run(sql: str, params: Sequence[object], writer: Writer) -> int:
    return writer.execute(sql, params)
