"""Which recorded sessions an experiment replays: by agent, time range, user, ids, or a random
sample of N of those that match.

Sessions are found on the log itself (each partition's SessionCreated and SessionForked
records), so selection works the same on both backends and needs no projection. Experiment
sessions are never selected.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from .. import events as ev
from ..errors import InputError, NoSessionsSelectedError
from ..log.base import EventLog
from .namespace import is_experiment_session

SCAN_PAGE = 2000


@dataclass(frozen=True)
class Selection:
    agent_id: str | None = None
    user_id: str | None = None
    since_ms: int | None = None
    """Sessions created at or after this time (ms since the epoch)."""
    until_ms: int | None = None
    """Sessions created before this time."""
    session_ids: tuple[str, ...] = ()
    """Exactly these sessions (the other filters still apply)."""
    sample: int | None = None
    """A random sample of this many of the sessions that match."""
    seed: int = field(default=0)
    """The sample's random seed (the same seed picks the same sessions)."""

    def describe(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if v not in (None, (), 0) or k == "sample"}


@dataclass(frozen=True)
class Candidate:
    session_id: str
    agent_id: str
    user_id: str
    time_ms: int


async def select_sessions(log: EventLog, selection: Selection) -> list[str]:
    """The ids of the recorded sessions ``selection`` names, oldest first."""
    if selection.sample is not None and selection.sample < 1:
        raise InputError("a sample must be at least 1 session")
    wanted = set(selection.session_ids)
    found = [c for c in await recorded_sessions(log, wanted or None) if _matches(c, selection)]
    missing = wanted - {c.session_id for c in found}
    if missing:
        raise NoSessionsSelectedError(
            f"no recorded session {sorted(missing)[0]!r} matches the selection "
            "(unknown id, an experiment's own session, or filtered out by agent, user or time)"
        )
    found.sort(key=lambda c: (c.time_ms, c.session_id))
    ids = [c.session_id for c in found]
    if selection.sample is not None and selection.sample < len(ids):
        ids = sorted(random.Random(selection.seed).sample(ids, selection.sample), key=ids.index)
    if not ids:
        raise NoSessionsSelectedError(
            "no recorded session matches the selection; widen it (agent, user, time range)"
        )
    return ids


async def recorded_sessions(log: EventLog, only: set[str] | None = None) -> list[Candidate]:
    """Every production session on the log (its first event), or those in ``only``."""
    if only is not None:
        heads = [(await log.read_session(sid))[:1] for sid in only if not is_experiment_session(sid)]
        return [c for head in heads for c in _candidates(head)]
    found: list[Candidate] = []
    for partition in range(log.partitions):
        offset = 0
        while True:
            records = await log.read_partition(partition, offset, SCAN_PAGE)
            if not records:
                break
            found += _candidates([r.event for r in records if r.event.version == 1])
            offset = records[-1].offset + 1
    return [c for c in found if not is_experiment_session(c.session_id)]


def _candidates(events: list[ev.Event]) -> list[Candidate]:
    out = []
    for e in events:
        if isinstance(e, ev.SessionCreated):
            out.append(Candidate(e.session_id, e.agent_id, e.user_id, e.time_ms))
        elif isinstance(e, ev.SessionForked):
            out.append(Candidate(e.session_id, e.agent_id, "", e.time_ms))
    return out


def _matches(c: Candidate, s: Selection) -> bool:
    return (
        (s.agent_id is None or c.agent_id == s.agent_id)
        and (s.user_id is None or c.user_id == s.user_id)
        and (s.since_ms is None or c.time_ms >= s.since_ms)
        and (s.until_ms is None or c.time_ms < s.until_ms)
    )
