"""One session's timeline for the viewer: the projections' rows, placed on the log and completed
with what the projections do not hold.

The projection rows (turns, model calls, tool calls, state changes, messages) get the log version
they start at and come in log order (the order they happened); model calls get their retries and
whether their model is priced (a cost of 0 for an unpriced model means "unknown"). ``position`` is
the log position of the session's last event, for a reader that follows the event stream from it.
Every event of a kind the projections do not cover (approvals, guard stops, fallbacks, snapshots,
cancels, forks, context and memory events, and any kind added later) is listed in ``events`` with
its fields, so nothing on the log is missing from the timeline.
"""

from __future__ import annotations

from typing import Any

from turnlog.engine import events as ev
from turnlog.engine.agent import AgentDirectory
from turnlog.engine.log.base import EventLog
from turnlog.projections import queries
from turnlog.projections.store import ProjectionStore

from .access import event_json, priced

PROJECTED: frozenset[type[ev.Event]] = frozenset(
    {
        ev.SessionCreated,
        ev.UserMessageReceived,
        ev.TurnStarted,
        ev.StateChanged,
        ev.ModelCallStarted,
        ev.ModelCallFinished,
        ev.AuxiliaryModelCall,
        ev.AssistantMessage,
        ev.ToolCallRequested,
        ev.ToolCallStarted,
        ev.ToolCallFinished,
        ev.TurnFinished,
    }
)
"""Event kinds the projection rows of a timeline already show in full."""


async def session_timeline(
    log: EventLog, store: ProjectionStore, agents: AgentDirectory, session_id: str, agent_id: str
) -> dict[str, Any]:
    rows = queries.session_timeline(store, session_id)
    records = await log.read_session_records(session_id)
    events = [r.event for r in records]
    started = {(e.turn_id, e.step): e.version for e in events if isinstance(e, ev.ModelCallStarted)}
    retries = {(e.turn_id, e.step): e.retries for e in events if isinstance(e, ev.ModelCallFinished)}
    requested = {(e.turn_id, e.call_id): e.version for e in events if isinstance(e, ev.ToolCallRequested)}
    turn_started = {e.turn_id: e.version for e in events if isinstance(e, ev.TurnStarted)}
    for m in rows["model_calls"]:
        key = (m["turn_id"], m["step"])
        # the engine's own calls (summaries, memory extraction) are rows with step = -version
        m["version"] = started.get(key) if m["step"] >= 0 else -m["step"]
        m["retries"] = retries.get(key, 0)
        m["priced"] = priced(agents, agent_id, str(m["model_name"]))
    for c in rows["tool_calls"]:
        c["version"] = requested.get((c["turn_id"], c["call_id"]))
    for t in rows["turns"]:
        t["version"] = turn_started.get(t["turn_id"])
    for name in ("turns", "model_calls", "tool_calls"):  # the tables order them by their random ids
        rows[name].sort(key=_log_order)
    rows["events"] = [event_json(e) for e in events if type(e) not in PROJECTED]
    rows["position"] = records[-1].offset if records else -1  # follow the event stream from here
    return rows


def _log_order(row: dict[str, Any]) -> tuple[int, int]:
    """Rows by the log version they start at; rows with none (direct tool invocations have no
    request event) after them, by time."""
    version = row.get("version")
    at = int(row.get("started_at_ms") or row.get("created_at_ms") or 0)
    return (0, version) if version is not None else (1, at)
