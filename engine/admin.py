"""Admin tools on the log (seed §8, the design card's "admins replay sessions from snapshots"):
list a session's snapshots, fork a new session from any of them, replay a session read-only.

Nothing here changes an existing session: a fork is a new session whose first event,
``SessionForked``, carries the origin's state at the snapshot and names its origin. Continue a
fork like any session (``AgentSessions.run_pending`` finishes an inherited turn,
``send_user_message`` starts a new one), e.g. with another agent and model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator

from . import events as ev
from . import snapshots
from .errors import SessionNotFoundError, SnapshotNotFoundError
from .fold import SessionState
from .log.base import EventLog


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """What had happened by one snapshot (the state body stays on the log)."""

    session_id: str
    version: int
    status: str
    last_tool: str
    turns: int
    input_tokens: int
    output_tokens: int
    message_count: int
    time_ms: int
    turn_id: str | None


@dataclass(frozen=True, slots=True)
class ReplayStep:
    """One event of a replay and the session as folded up to and including it.

    ``state`` is the replay's own fold, advanced in place by the next step: read it, copy
    what you need, do not change it.
    """

    event: ev.Event
    state: SessionState


class SessionAdmin:
    def __init__(self, log: EventLog, *, producer: str = "admin") -> None:
        self.log = log
        self.producer = producer

    async def snapshots(self, session_id: str) -> list[SnapshotInfo]:
        """Every snapshot of the session, oldest first."""
        events = await self._events(session_id)
        return [_info(e) for e in events if isinstance(e, ev.SnapshotTaken)]

    async def fork(
        self,
        session_id: str,
        version: int,
        *,
        new_session_id: str | None = None,
        agent_id: str | None = None,
        model: str | None = None,
    ) -> ev.SessionForked:
        """Start a new session from the snapshot at ``version`` of ``session_id``.

        The fork has the origin's history and state up to the snapshot, its own id, and the
        origin's agent unless ``agent_id`` names another (to continue with another model).
        """
        snapshot = await self._snapshot_at(session_id, version)
        keyframe = None
        if snapshot.keyframe_version:
            found = await self.log.latest_snapshot(session_id, at_or_before=snapshot.keyframe_version)
            keyframe = found if isinstance(found, ev.SnapshotTaken) else None
        origin = snapshots.restore(snapshot, keyframe)  # refuses an unreadable snapshot before we write
        forked = ev.SessionForked(
            session_id=new_session_id or ev.new_id(),
            version=1,
            producer=self.producer,
            causation_id=snapshot.event_id,
            origin_session_id=session_id,
            origin_version=snapshot.version,
            agent_id=agent_id or origin.agent_id,
            model=model if model is not None else origin.model,
            state_format=snapshots.FORMAT,
            state_json=snapshots.encode_state(origin),  # self-contained: every message
        )
        # through the inbox where another process owns the fork's partition (then version 0)
        submitted = await self.log.submit(forked)
        assert isinstance(submitted, ev.SessionForked)
        return submitted

    async def replay(
        self, session_id: str, *, from_version: int = 0, to_version: int | None = None
    ) -> AsyncIterator[ReplayStep]:
        """The session's events from ``from_version + 1`` on, each with the state it leads to.

        Read-only: folds a private copy and writes nothing.
        """
        state = SessionState(session_id)
        for event in await self._events(session_id):
            if to_version is not None and event.version > to_version:
                return
            state.apply(event)
            if event.version > from_version:
                yield ReplayStep(event, state)

    async def _events(self, session_id: str) -> list[ev.Event]:
        events = await self.log.read_session(session_id)
        if not events:
            raise SessionNotFoundError(session_id)
        return events

    async def _snapshot_at(self, session_id: str, version: int) -> ev.SnapshotTaken:
        found = await self.log.latest_snapshot(session_id, at_or_before=version)
        if isinstance(found, ev.SnapshotTaken) and found.version == version:
            return found
        available = [s.version for s in await self.snapshots(session_id)]
        raise SnapshotNotFoundError(session_id, version, available)


def _info(e: ev.SnapshotTaken) -> SnapshotInfo:
    return SnapshotInfo(
        e.session_id,
        e.version,
        e.status,
        e.last_tool,
        e.turns,
        e.input_tokens,
        e.output_tokens,
        e.message_count,
        e.time_ms,
        e.correlation_id,
    )


__all__ = ["ReplayStep", "SessionAdmin", "SnapshotInfo"]
