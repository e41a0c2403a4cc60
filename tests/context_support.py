"""Shared pieces of the context tests: a session harness on a real SQLite log, a model that
answers by rule and records what it was sent, and the provider's rules for a valid history."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from engine import Agent, AgentDirectory, AgentSessions, ChatMessage, FunctionModel, SqliteEventLog, Tool
from engine import events as ev
from engine.models.base import ModelRequest, ModelResponse

AGENT = "ctx"


@dataclass
class Session:
    api: AgentSessions
    log: SqliteEventLog
    sid: str
    model: FunctionModel
    agent: Agent
    streamed: list[Any] = field(default_factory=list)

    async def send(self, text: str) -> list[Any]:
        items = [item async for item in self.api.send_user_message(self.sid, text)]
        self.streamed += items
        return items

    async def events(self) -> list[ev.Event]:
        return await self.log.read_session(self.sid)

    async def of(self, cls: type[ev.E]) -> list[ev.E]:
        return [e for e in await self.events() if isinstance(e, cls)]

    def last_request(self) -> ModelRequest:
        return self.model.requests[-1]


async def open_session(
    tmp_path: Path,
    answer: Callable[[ModelRequest], ModelResponse | str],
    tools: Sequence[Tool] = (),
    *,
    user: str = "user-1",
    **options: Any,
) -> Session:
    log = SqliteEventLog(tmp_path / "log.db", partitions=2)
    model = FunctionModel(answer, name="rule-model")
    agent = Agent(AGENT, model, list(tools), **options)
    api = AgentSessions(log, AgentDirectory([agent]))
    info = await api.create_session(AGENT, user)
    return Session(api, log, info.session_id, model, agent)


def last_user_text(request: ModelRequest) -> str:
    return next(m.content for m in reversed(request.messages) if m.role == "user")


def provider_problems(messages: Sequence[ChatMessage]) -> list[str]:
    """What an OpenAI-style provider would reject: a tool result not answering a call of the
    assistant message right before its run of results, or a call left without its result."""
    problems = []
    open_calls: set[str] = set()
    for i, m in enumerate(messages):
        if m.role == "tool":
            if m.tool_call_id not in open_calls:
                problems.append(f"#{i}: tool result {m.tool_call_id} answers no open call")
            open_calls.discard(m.tool_call_id or "")
            continue
        if open_calls:
            problems.append(f"#{i}: calls {sorted(open_calls)} have no result before a {m.role} message")
        open_calls = {c.call_id for c in m.tool_calls} if m.role == "assistant" else set()
    if open_calls:
        problems.append(f"calls {sorted(open_calls)} have no result at the end")
    return problems


def section_tokens(started: ev.ModelCallStarted) -> dict[str, int]:
    return dict(json.loads(started.section_tokens_json))
