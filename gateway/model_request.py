"""What one model call was sent, rebuilt from the log.

The log records a model call's answer, not its request: the request is a function of the
session's history at that point (the fold of every event before its ModelCallStarted), the
agent's system prompt, and the closing note when tools were withdrawn. This rebuilds it the way
the turn loop builds it, and says whether the result has the message count the log recorded
(it would not if the agent's system prompt changed since).
"""

from __future__ import annotations

from typing import Any

from turnlog.engine import events as ev
from turnlog.engine.agent import AgentDirectory
from turnlog.engine.fold import fold
from turnlog.engine.log.base import EventLog
from turnlog.engine.messages import ChatMessage
from turnlog.engine.turn import build_request


def _json(message: ChatMessage) -> dict[str, Any]:
    return {
        "role": message.role,
        "content": message.content,
        "tool_calls": [
            {"id": c.call_id, "name": c.name, "arguments": c.arguments_json} for c in message.tool_calls
        ],
        "tool_call_id": message.tool_call_id,
        "name": message.name,
    }


async def sent_messages(
    log: EventLog, agents: AgentDirectory, session_id: str, turn_id: str, step: int
) -> dict[str, Any] | None:
    """The messages of model call ``step`` of turn ``turn_id``, or None if there is no such call."""
    events = await log.read_session(session_id)
    started = next(
        (e for e in events if isinstance(e, ev.ModelCallStarted) and e.turn_id == turn_id and e.step == step),
        None,
    )
    if started is None:
        return None
    state = fold(session_id, [e for e in events if e.version < started.version])
    agent = agents.get(state.agent_id) if state.agent_id in agents else None
    if agent is None:
        messages = list(state.messages)
    else:
        closing = started.tools_offered == 0 and len(agent.tools) > 0
        messages = list(build_request(state, agent, closing).messages)
    return {
        "model": started.model,
        "tools_offered": started.tools_offered,
        "message_count": started.message_count,
        "exact": len(messages) == started.message_count,
        "messages": [_json(m) for m in messages],
    }
