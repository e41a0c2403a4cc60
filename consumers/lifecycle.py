"""The lifecycle sweeper (issue 43): closes idle sessions as expired and has the content of
sessions closed longer than their retention erased, by their agents' ``Lifecycle``.

Each sweep reads the projections' ``sessions`` rows past a limit (projections/lifecycle.py: by
the indexed time of the last event or of the close, never a session's history) and acts on
each through the log, so it is safe with several sweepers and across restarts:

* an expiry is ``AgentSessions.expire``: a close request carrying the version the sweeper read,
  which the admission rule (engine.expiry) takes only if the session is still there and idle,
  so a second sweeper, a stale read or a message that came meanwhile refuses it; where another
  process owns the partition (Kafka) the request goes through the inbox to the owner;
* an erasure is the deployment's ``Eraser`` (idempotent by contract), after a claim in
  ``lifecycle_erasures`` so two sweepers do not erase one session at once, marked done when it
  returns: a sweeper killed mid-way leaves a claim whose lease runs out, and the session is
  erased again by whoever sweeps next.

Where the log assigns partitions (Kafka), a sweeper in a worker handles only the sessions of
the partitions it owns (``owned_only``), so the fleet splits the work as it splits the turns;
``turnlog lifecycle`` (owning none) handles every session. The clock is injectable: the tests
move it, and never wait for real time to pass.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import structlog

from turnlog.engine import events as ev
from turnlog.engine import expiry
from turnlog.engine.agent import AgentDirectory, Lifecycle
from turnlog.engine.erasure import SessionEraser
from turnlog.engine.errors import ConcurrencyError, ConfigurationError, SessionError, TurnlogError
from turnlog.engine.session import AgentSessions
from turnlog.engine.turn import Clock
from turnlog.projections.lifecycle import AgentFilter, Candidate, LifecycleStore
from turnlog.projections.store import ProjectionStore

log = structlog.get_logger("turnlog.lifecycle")

SWEEP_EVERY_S = 30.0
"""The longest time between sweeps; a shorter limit sweeps more often (a tenth of the shortest
limit, at least every ``MIN_SWEEP_EVERY_S``), so a session closes within about a tenth of its
limit of when it is due."""
MIN_SWEEP_EVERY_S = 0.1
PAGE = 500
"""Sessions read per query of a sweep."""
CLAIM_LEASE_MS = 10 * 60 * 1000
"""How long an erasure claim keeps other sweepers off a session (a sweeper that died erasing it
leaves it to the next after this)."""
RETENTION = "retention"
"""The reason an erasure is asked for: the session was closed longer than its retention."""
ACTOR = expiry.ACTOR
"""Who asks for the erasure (as for an expiry): ``lifecycle``."""


@dataclass
class Sweep:
    """What one sweep did."""

    expired: list[str] = field(default_factory=list)
    """Sessions closed as expired (their close is on the log, or in the owner's inbox)."""
    erased: list[str] = field(default_factory=list)
    refused: int = 0
    """Expiries the log refused: the session moved on since the projections saw it."""


@dataclass(frozen=True)
class _Policy:
    """One limit (ms) over the sessions of some agents."""

    limit_ms: int
    agents: AgentFilter


class LifecycleSweeper:
    """Expires idle sessions and erases the content of sessions closed past their retention,
    one sweep every ``interval_s`` until ``stop()`` (see the module docstring)."""

    def __init__(
        self,
        api: AgentSessions,
        store: ProjectionStore,
        *,
        eraser: SessionEraser | None = None,
        clock: Clock = ev.now_ms,
        interval_s: float | None = None,
        name: str = "lifecycle",
        owned_only: bool = True,
        page: int = PAGE,
        claim_lease_ms: int = CLAIM_LEASE_MS,
    ) -> None:
        self.api = api
        self.sessions = LifecycleStore(store)
        self.eraser = eraser
        self.clock = clock
        self.name = name
        self.owned_only = owned_only
        self.page = page
        self.claim_lease_ms = claim_lease_ms
        self.expiries = _policies(api.agents, "idle_expiry_ms")
        self.retentions = _policies(api.agents, "retain_closed_ms")
        limits = [p.limit_ms / 1000 for p in (*self.expiries, *self.retentions)]
        self.interval_s = interval_s or max(MIN_SWEEP_EVERY_S, min([SWEEP_EVERY_S * 10, *limits]) / 10)
        """Seconds between sweeps (``run``): given, or from the limits (``SWEEP_EVERY_S``)."""
        if self.retentions and eraser is None:
            raise ConfigurationError(
                "a Lifecycle sets retain_closed_for, but this sweeper has no eraser to erase closed "
                "sessions' content with: the log encrypts nothing (on Kafka, set TURNLOG_KEYSTORE "
                "and TURNLOG_MASTER_KEY in every process), or give LifecycleSweeper(eraser=...); "
                "or drop retain_closed_for (--retain-closed-for, TURNLOG_RETAIN_CLOSED_FOR)"
            )
        self._asked: dict[str, int] = {}
        """Expiries asked for and not yet seen closed or refused for good: session -> version
        read. Not asked again at that version (an inbox request waits for the owner)."""
        self._stop = asyncio.Event()

    async def sweep_once(self) -> Sweep:
        """One pass: expire what is idle past its limit, then erase what is closed past its
        retention, both as of the clock now."""
        sweep = Sweep()
        now = self.clock()
        seen: set[str] = set()
        for policy in self.expiries:
            await self._pages(self._idle(policy, now), lambda c: self._expire(c, now, sweep, seen))
        self._asked = {sid: v for sid, v in self._asked.items() if sid in seen}  # the rest closed or moved
        for policy in self.retentions:
            await self._pages(self._due(policy, now), lambda c: self._erase(c, sweep))
        return sweep

    async def run(self) -> None:
        """Sweep every ``interval_s`` until ``stop()``; a failed sweep is logged and retried."""
        log.info(
            "lifecycle.start", sweeper=self.name, expiries=len(self.expiries), retentions=len(self.retentions)
        )
        while not self._stop.is_set():
            try:
                sweep = await self.sweep_once()
                if sweep.expired or sweep.erased:
                    log.info("lifecycle.swept", expired=len(sweep.expired), erased=len(sweep.erased))
            except Exception:
                log.exception("lifecycle.sweep_failed", sweeper=self.name)
            try:
                await asyncio.wait_for(self._stop.wait(), self.interval_s)
            except TimeoutError:
                pass
        log.info("lifecycle.stop", sweeper=self.name)

    def stop(self) -> None:
        self._stop.set()

    # -- one sweep ---------------------------------------------------------------------------

    def _idle(self, policy: _Policy, now: int) -> Callable[[tuple[int, str] | None], list[Candidate]]:
        states = sorted(str(s) for s in expiry.IDLE_STATES)
        return lambda after: self.sessions.idle(
            policy.agents, states, now - policy.limit_ms, after, self.page
        )

    def _due(self, policy: _Policy, now: int) -> Callable[[tuple[int, str] | None], list[Candidate]]:
        lease = now - self.claim_lease_ms
        return lambda after: self.sessions.due_for_erasure(
            policy.agents, now - policy.limit_ms, lease, after, self.page
        )

    async def _pages(
        self,
        read: Callable[[tuple[int, str] | None], list[Candidate]],
        act: Callable[[Candidate], Awaitable[None]],
    ) -> None:
        after: tuple[int, str] | None = None
        while candidates := read(after):
            for candidate in candidates:
                if self._mine(candidate.session_id):
                    await act(candidate)
            last = candidates[-1]
            after = (last.at_ms, last.session_id)

    def _mine(self, session_id: str) -> bool:
        if not self.owned_only:
            return True
        return self.api.log.partition_of(session_id) in self.api.log.owned_partitions()

    async def _expire(self, candidate: Candidate, now: int, sweep: Sweep, seen: set[str]) -> None:
        sid = candidate.session_id
        seen.add(sid)
        if self._asked.get(sid) == candidate.version:
            return  # asked at this version already: the owner has it, or refused it
        self._asked[sid] = candidate.version
        try:
            await self.api.expire(sid, candidate.version, now)
        except (ConcurrencyError, SessionError) as exc:  # moved on, busy, or closed by another
            sweep.refused += 1
            log.debug("lifecycle.expiry_refused", session=sid, reason=str(exc))
            return
        except TurnlogError:
            del self._asked[sid]  # the log could not take it now: the next sweep asks again
            raise
        sweep.expired.append(sid)

    async def _erase(self, candidate: Candidate, sweep: Sweep) -> None:
        assert self.eraser is not None
        sid = candidate.session_id
        if not await self.sessions.claim(sid, self.name, self.clock(), self.claim_lease_ms):
            return  # another sweeper erases it now, or did
        try:
            await self.eraser.erase_session(sid, RETENTION, actor=ACTOR)
        except Exception:  # its claim's lease runs out, and a later sweep tries again
            log.exception("lifecycle.erase_failed", session=sid)
            return
        await self.sessions.erased(sid, self.clock())
        sweep.erased.append(sid)


def sweeper_for(api: AgentSessions, store: ProjectionStore, **options: Any) -> LifecycleSweeper | None:
    """A ``LifecycleSweeper(api, store, **options)``, or None when no agent (nor the default)
    sets a limit: a program that runs one when configured, and touches nothing otherwise."""
    return LifecycleSweeper(api, store, **options) if configured(api.agents) else None


def configured(agents: AgentDirectory) -> bool:
    """Whether any agent, or the deployment default, sets a lifecycle limit."""
    return bool(_policies(agents, "idle_expiry_ms") or _policies(agents, "retain_closed_ms"))


def _policies(agents: AgentDirectory, limit: str) -> list[_Policy]:
    """One policy per distinct limit among the agents that set their own lifecycle, and one for
    the deployment default over every other agent (those of no configured agent included)."""
    own = {a.agent_id: a.lifecycle for a in agents if a.lifecycle is not None}
    by_limit: dict[int, list[str]] = {}
    for agent_id, lifecycle in own.items():
        value = _limit(lifecycle, limit)
        if value is not None:
            by_limit.setdefault(value, []).append(agent_id)
    policies = [
        _Policy(ms, AgentFilter(tuple(sorted(ids)), include=True)) for ms, ids in sorted(by_limit.items())
    ]
    default = _limit(agents.lifecycle, limit)
    if default is not None:
        policies.append(_Policy(default, AgentFilter(tuple(sorted(own)), include=False)))
    return policies


def _limit(lifecycle: Lifecycle, name: str) -> int | None:
    value: int | None = getattr(lifecycle, name)
    return value


__all__ = ["LifecycleSweeper", "Sweep", "configured", "sweeper_for"]
