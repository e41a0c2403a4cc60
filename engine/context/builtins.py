"""Tools the engine itself provides to a session, next to the agent's own.

* ``recall_history(query)``: search what was cut from the context (offered once anything was);
* ``update_task_state(op, values)``: change the agent's declared task state;
* ``remember(fact, tag)``: keep a fact in the user's long-term memory (a ``MemoryNoted`` event
  that the memory consumer stores off the turn's path).

They are ordinary tools to the rest of the engine (validated, guarded, recorded like any), so a
model calls them the same way natively or through prompt-written calls. What they need of the
session reaches them through ``session_scope``, set by the turn loop around a tool batch. Their
lasting effect is an event the turn loop adds after the batch (``events_for``), decided from the
call's arguments over the folded state, so a resumed turn decides the same.
"""

from __future__ import annotations

import contextvars
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from .. import events as ev
from ..errors import ConfigurationError, ToolFailure
from ..log.base import EventLog
from ..memory.base import MemoryTag
from ..tools import Tool, ToolRegistry
from ..tools.permissions import tools_for_role
from . import archive, task_state

log = structlog.get_logger("turnlog.context")

if TYPE_CHECKING:
    from ..agent import Agent
    from ..fold import SessionState
    from ..writer import SessionWriter

RECALL = "recall_history"
UPDATE_STATE = "update_task_state"
REMEMBER = "remember"
NAMES = frozenset({RECALL, UPDATE_STATE, REMEMBER})


@dataclass(frozen=True, slots=True)
class SessionScope:
    log: EventLog
    session_id: str
    task_state: dict[str, Any]


_scope: contextvars.ContextVar[SessionScope] = contextvars.ContextVar("turnlog_session_scope")


def session_scope(log: EventLog, state: SessionState) -> contextvars.Token[SessionScope]:
    """Make the session visible to built-in tools run from this task (and tasks it starts)."""
    return _scope.set(SessionScope(log, state.session_id, dict(state.task_state)))


def end_scope(token: contextvars.Token[SessionScope]) -> None:
    _scope.reset(token)


def _current() -> SessionScope:
    try:
        return _scope.get()
    except LookupError:
        raise ToolFailure("this built-in tool runs only inside a session's turn") from None


async def _recall(query: str, limit: int = 5) -> str:
    scope = _current()
    found = archive.search(
        await archive.load_archive(scope.log, scope.session_id), query, max(1, min(limit, 20))
    )
    if not found:
        return f"Nothing in this session's archive matches {query!r}."
    return "Archived messages of this session, oldest first:\n" + "\n".join(
        m.quoted() for m in sorted(found, key=lambda m: m.ref)
    )


def _recall_tool() -> Tool:
    return Tool(
        name=RECALL,
        description=(
            "Search this session's earlier messages that are no longer in your context (they were "
            "summarised or cut). Use it when you need an exact earlier detail: an id, a number, what "
            "the user said."
        ),
        parameters={
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "description": "words to look for"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 20, "default": 5},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        handler=_recall,
        idempotent=True,
        max_result_chars=6000,
    )


def _state_tool(schema: type[Any]) -> Tool:
    async def update(op: str, values: dict[str, Any] | None = None) -> dict[str, Any]:
        after = task_state.apply(schema, _current().task_state, op, values or {})
        return {"op": op, "state": after}

    return Tool(
        name=UPDATE_STATE,
        description=(
            "Change the task state shown to you in every step. op=set replaces the fields given in "
            "values (a new value replaces the old one, lists included); op=overwrite replaces the "
            "whole state; op=reset returns it to its defaults."
        ),
        parameters=task_state.tool_parameters(schema),
        handler=update,
        idempotent=True,
    )


async def _remember(fact: str, tag: str) -> str:
    _current()
    return f"Noted for the long term ({tag}): {fact}"


def _remember_tool() -> Tool:
    return Tool(
        name=REMEMBER,
        description=(
            "Keep a fact about this user for future sessions: a preference, a business conclusion, "
            "or an agreement. Use it when the user asks you to remember something."
        ),
        parameters={
            "type": "object",
            "properties": {
                "fact": {"type": "string", "minLength": 3, "maxLength": 1000},
                "tag": {"type": "string", "enum": [str(t) for t in MemoryTag]},
            },
            "required": ["fact", "tag"],
            "additionalProperties": False,
        },
        handler=_remember,
        idempotent=True,
    )


def _cache(agent: Agent) -> dict[Any, Any]:
    """Per-agent memo kept on the agent itself (an Agent is immutable, so it never goes stale)."""
    return agent.__dict__.setdefault("_builtin_tools_cache", {})


def builtin_tools(agent: Agent) -> dict[str, Tool]:
    """The built-ins this agent's sessions may get, by name (made once per agent)."""
    cache = _cache(agent)
    tools: dict[str, Tool] | None = cache.get("builtins")
    if tools is None:
        clash = NAMES & set(agent.tools.names)
        if clash:
            raise ConfigurationError(
                f"agent {agent.agent_id}: {', '.join(sorted(clash))} is a built-in tool name; rename yours"
            )
        tools = {RECALL: _recall_tool()}
        if agent.task_state is not None:
            tools[UPDATE_STATE] = _state_tool(agent.task_state)
        if agent.memory is not None and agent.memory.remember_tool:
            tools[REMEMBER] = _remember_tool()
        cache["builtins"] = tools
    return tools


def session_tools(agent: Agent, state: SessionState) -> ToolRegistry:
    """The tools a session has now: its role's share of the agent's tools and the built-ins
    (recall only once something was archived)."""
    archived = state.archived > 0
    cache = _cache(agent)
    key = (state.role, archived)
    view: ToolRegistry | None = cache.get(key)
    if view is None:
        builtins = builtin_tools(agent)
        extra = [t for name, t in builtins.items() if name != RECALL or archived]
        view = cache[key] = ToolRegistry([*tools_for_role(agent.tools, state.role), *extra])
    return view


def events_for(
    w: SessionWriter, agent: Agent, turn_id: str, call_id: str, tool_name: str, arguments_json: str
) -> None:
    """The event a successful built-in call leaves (none for recall)."""
    if tool_name not in NAMES or tool_name == RECALL:
        return
    args = json.loads(arguments_json)
    if tool_name == UPDATE_STATE and agent.task_state is not None:
        before = w.state.task_state or task_state.defaults(agent.task_state)
        try:
            after = task_state.apply(
                agent.task_state, w.state.task_state, args["op"], args.get("values") or {}
            )
        except ToolFailure as exc:  # valid alone, but not after a sibling call of the same batch
            log.warning("task_state.update_dropped", call=call_id, error=str(exc))
            return
        w.add(
            ev.TaskStateChanged,
            turn_id=turn_id,
            call_id=call_id,
            op=args["op"],
            patch_json=json.dumps(task_state.json_patch(before, after), ensure_ascii=False),
            state_json=json.dumps(after, ensure_ascii=False),
            correlation_id=turn_id,
        )
    elif tool_name == REMEMBER:
        w.add(
            ev.MemoryNoted,
            turn_id=turn_id,
            call_id=call_id,
            user_id=w.state.user_id,
            text=args["fact"],
            tag=args["tag"],
            correlation_id=turn_id,
        )
