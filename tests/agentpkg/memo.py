"""An agent with long-term memory for the memory-in-the-running-system tests: a message that
starts with "remember:" makes its model call the built-in ``remember`` tool; any other message
is answered with what the turn was told it remembers. The store is Qdrant local mode in
``HOME/memory`` (the worker's home)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from turnlog.engine import (
    Agent,
    AgentDirectory,
    FunctionModel,
    MemoryPolicy,
    ModelRequest,
    ModelResponse,
    call,
    reply,
)


def answer(request: ModelRequest) -> ModelResponse | str:
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    asked = request.messages[last_user].content
    if request.messages[-1].role == "tool":
        return "noted"
    if asked.startswith("remember:"):
        fact = asked.removeprefix("remember:").strip()
        return reply("", call("remember", {"fact": fact, "tag": "preference"}, f"remember-{last_user}"))
    told = [m.content for m in request.messages if m.role == "system" and "remember" in m.content.lower()]
    return "I was told: " + json.dumps(told)


def build(context: Any) -> AgentDirectory:
    from turnlog.engine.memory.stores import open_store

    store = open_store(Path(context.home) / "memory")
    memory = MemoryPolicy(store, min_score=0.0)  # any stored fact is shown: the test asks about it
    return AgentDirectory([Agent.build("memo", FunctionModel(answer, name="memo-model"), memory=memory)])
