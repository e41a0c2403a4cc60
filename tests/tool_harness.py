"""Shared helpers for the tool-layer tests: a session on a real SQLite log, driven through
AgentSessions, and views of what landed on the log and in the projections."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from turnlog.engine import (
    Agent,
    AgentDirectory,
    AgentSessions,
    ChatMessage,
    FunctionModel,
    SqliteEventLog,
    Tool,
)
from turnlog.engine import events as ev
from turnlog.engine.models.base import ModelRequest
from turnlog.projections import SqliteProjectionStore
from turnlog.projections.rebuild import catch_up

AGENT = "helper"


@dataclass
class Session:
    api: AgentSessions
    log: SqliteEventLog
    sid: str
    model: FunctionModel
    agent: Agent

    async def send(self, text: str) -> list[Any]:
        return [item async for item in self.api.send_user_message(self.sid, text)]

    async def decide(self, call_id: str, decision: Any, **kw: Any) -> list[Any]:
        return [item async for item in self.api.decide_tool_call(self.sid, call_id, decision, **kw)]

    async def events(self) -> list[ev.Event]:
        return await self.log.read_session(self.sid)

    async def of(self, cls: type[ev.E]) -> list[ev.E]:
        """This session's events of one type, in log order."""
        return of(await self.events(), cls)

    def last_request(self) -> ModelRequest:
        return self.model.requests[-1]

    async def history(self) -> list[ChatMessage]:
        return await self.api.get_history(self.sid, limit=1000)

    async def project(self, path: Any) -> SqliteProjectionStore:
        store = SqliteProjectionStore(path)
        await catch_up(self.log, store)
        return store


async def open_session(
    log: SqliteEventLog,
    model: FunctionModel,
    tools: Sequence[Tool] = (),
    *,
    role: str = "user",
    **options: Any,
) -> Session:
    agent = Agent(AGENT, model, list(tools), **options)
    api = AgentSessions(log, AgentDirectory([agent]))
    info = await api.create_session(AGENT, "user-1", role=role)
    return Session(api, log, info.session_id, model, agent)


def of(events: Sequence[Any], cls: type[ev.E]) -> list[ev.E]:
    return [e for e in events if isinstance(e, cls)]


def path(events: Sequence[ev.Event]) -> list[tuple[str, str, str]]:
    return [(e.from_state, e.to_state, e.cause) for e in events if isinstance(e, ev.StateChanged)]


def tool_results(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    return [m for m in messages if m.role == "tool"]


def since_user(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    last = max(i for i, m in enumerate(messages) if m.role == "user")
    return list(messages[last + 1 :])
