"""Shared pieces of the context tests: a session on a real SQLite log whose model answers by
rule and records what it was sent (tests/tool_harness.py), and the provider's rules for a
valid history."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Sequence

from tests import tool_harness
from tests.tool_harness import Session
from turnlog.engine import ChatMessage, FunctionModel, SqliteEventLog, Tool
from turnlog.engine import events as ev
from turnlog.engine.models.base import ModelRequest, ModelResponse


async def open_session(
    tmp_path: Path,
    answer: Callable[[ModelRequest], ModelResponse | str],
    tools: Sequence[Tool] = (),
    **options: Any,
) -> Session:
    """A session on a fresh SQLite log whose model answers with ``answer`` (and records requests)."""
    log = SqliteEventLog(tmp_path / "log.db", partitions=2)
    return await tool_harness.open_session(log, FunctionModel(answer, name="rule-model"), tools, **options)


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
