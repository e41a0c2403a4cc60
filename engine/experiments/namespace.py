"""Where experiments live on the log: their own session-id namespace.

Every session an experiment writes (its manifest and one replay per recorded session) has an id
that starts with ``EXPERIMENT_PREFIX``. The log, the projector and the viewer treat them like any
session (every replay stays inspectable); production listings, analytics, spend and long-term
memory leave them out by this prefix (``turnlog.projections.queries``, ``turnlog.projections.analytics``,
``turnlog.consumers.memory``). A prefix, not a topic or a log file of its own, so one log, one projector
and one viewer serve both, and a replay's events are read with the same calls as its origin's.
"""

from __future__ import annotations

import hashlib

EXPERIMENT_PREFIX = "exp-"
MANIFEST_AGENT = "turnlog.experiment"
"""The agent id of an experiment's manifest session (never run: it holds the definition)."""


def is_experiment_session(session_id: str) -> bool:
    return session_id.startswith(EXPERIMENT_PREFIX)


def manifest_id(experiment_id: str) -> str:
    """The session whose SessionCreated holds the experiment's definition."""
    return f"{EXPERIMENT_PREFIX}{experiment_id}"


def replay_id(experiment_id: str, origin_session_id: str) -> str:
    """The replay of ``origin_session_id`` in the experiment: derived, so a resumed run finds the
    replays a killed one made (its progress is the log itself)."""
    digest = hashlib.sha256(origin_session_id.encode()).hexdigest()[:16]
    return f"{EXPERIMENT_PREFIX}{experiment_id}-{digest}"


def sql_exclusion(column: str = "session_id") -> str:
    """A SQL condition true for production sessions only (the prefix has no LIKE wildcard)."""
    return f"{column} NOT LIKE '{EXPERIMENT_PREFIX}%'"
