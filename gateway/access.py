"""What every session route shares: the session named in the path if the caller may see it, its
projection row, and the answer for what a POST wrote (the events with their log positions)."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any, Sequence

from starlette.requests import Request

from turnlog.engine import events as ev
from turnlog.engine.agent import AgentDirectory
from turnlog.engine.errors import SessionNotFoundError
from turnlog.engine.fold import SessionState
from turnlog.engine.log.base import LogRecord

from .http import not_found, principal_of

if TYPE_CHECKING:
    from .parts import GatewayParts as Gateway

HEAVY: frozenset[type[ev.Event]] = frozenset({ev.SnapshotTaken, ev.SessionForked})
"""Events whose ``state_json`` (a whole session state) is too large to send back: sent as a size."""


async def owned_state(gw: Gateway, request: Request) -> SessionState:
    """The session named in the path, if the caller may see it; 404 alike otherwise."""
    session_id = request.path_params["session_id"]
    principal = principal_of(request)
    try:
        state = await gw.api.get_state(session_id)
    except SessionNotFoundError:
        raise not_found(session_id) from None
    if state.user_id != principal.user and not principal.is_admin:
        raise not_found(session_id)
    return state


async def projected(gw: Gateway, state: SessionState) -> dict[str, Any]:
    """The session's projection row, caught up at least to the state we just folded."""
    row = await gw.projection(state.session_id, state.version)
    if row is None:
        raise not_found(state.session_id)
    return session_json(row, gw.api.agents)


async def session_view(gw: Gateway, state: SessionState) -> dict[str, Any]:
    """The projection row, plus from the fold: whether a turn runs (it can be cancelled) and the
    tool calls waiting for a decision. The projector writes on its own thread, so its row can be
    ahead of the state folded a moment ago: then the state is folded again, so both describe the
    same version (a paused row always comes with its waiting calls)."""
    row = await projected(gw, state)
    for _ in range(3):
        if int(row["state_version"]) <= state.version:
            break
        state = await gw.api.get_state(state.session_id)
        row = await projected(gw, state)
    return {**row, "turn_running": state.turn is not None, "pending_approvals": pending_approvals(state)}


def session_json(row: dict[str, Any], agents: AgentDirectory) -> dict[str, Any]:
    """A sessions row as JSON, with ``priced``: whether its cost is known (see ``priced``)."""
    out = dict(row)
    out["closed"] = bool(out.get("closed"))
    out["priced"] = priced(agents, str(out["agent_id"]), str(out["model_name"]))
    return json.loads(json.dumps(out))


def priced(agents: AgentDirectory, agent_id: str, model: str) -> bool:
    """Whether the agent's price table prices ``model``. A call of an unpriced model records a
    cost of 0, which means "unknown", not "free"; readers show it so."""
    if agent_id not in agents:
        return False
    prices = agents.get(agent_id).prices
    return prices is not None and prices.price_for(model) is not None


def pending_approvals(state: SessionState) -> list[dict[str, Any]]:
    """The tool calls waiting for the user's decision (PAUSED_FOR_USER), from the fold."""
    return [
        {
            "call_id": c.call_id,
            "tool_name": c.tool_name,
            "arguments": _json_or_text(c.arguments_json),
            "iteration": c.iteration,
        }
        for c in state.pending_approvals
    ]


def event_json(event: ev.Event) -> dict[str, Any]:
    """An event's fields as JSON, with its type; heavy state bodies replaced by their size."""
    names = _FIELDS.get(type(event))
    if names is None:
        names = _FIELDS[type(event)] = tuple(f.name for f in dataclasses.fields(event))
    body = {name: _plain(getattr(event, name)) for name in names}
    if type(event) in HEAVY:
        body["state_json_chars"] = len(body.pop("state_json"))
    body["type"] = event.type
    return body


_FIELDS: dict[type[ev.Event], tuple[str, ...]] = {}
"""Each event type's field names, in order."""


def _plain(value: Any) -> Any:
    """A field's value as ``dataclasses.asdict`` gives it (a tuple of specs as a tuple of dicts),
    without its deep copy of every field: an event's values are immutable."""
    if isinstance(value, tuple):
        return tuple(
            dataclasses.asdict(v) if dataclasses.is_dataclass(v) and not isinstance(v, type) else _plain(v)
            for v in value
        )
    return value


def written(gw: Gateway, records: Sequence[LogRecord]) -> list[dict[str, Any]]:
    """What a route wrote, each event with its log position (the records the engine returned:
    nothing is read back); live streams hear of them.

    A submission not sequenced yet (a pending record: on Kafka, from a process that does not
    own the session's partition) has no position to report: ``position`` is None."""
    out = []
    for record in records:
        gw.hub.publish(record.event)
        where = (None, None) if record.pending else (record.offset, record.partition)
        out.append({**event_json(record.event), "position": where[0], "partition": where[1]})
    return out


def _json_or_text(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw
